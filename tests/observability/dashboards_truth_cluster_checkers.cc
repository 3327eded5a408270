// The checkers of the cluster-wide panels (cluster-overview.json, queues-fairness.json and the
// checkpoint service's panels of checkpoints.json) of the truth test (dashboards_truth.h).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "google/protobuf/util/json_util.h"
#include "proto/checkpoint_service.grpc.pb.h"
#include "services/cli/job_spec_yaml.h"
#include "tests/observability/dashboards_truth.h"

namespace loom::dashboards_truth {

void DashboardsTruth::AddClusterCheckers(CheckerTable& c) {
  const std::string co = "cluster-overview.json", qf = "queues-fairness.json",
                    cp = "checkpoints.json";
  const double t_sched = LastScrape("loom-scheduler");
  const double t_ckpt = LastScrape("loom-checkpoint");
  const double t_gw = LastScrape("loom-gateway");

  // ---- Scheduler gauges at stable instants ---------------------------------------------------
  auto phase_stat = [this](JobPhase phase) {
    return [this, phase](const Panel& p) {
      CheckStable(p, 0, {}, {}, [phase](const Snapshot& s) { return PhaseCount(s, phase); });
    };
  };
  c[{co, "Running jobs"}] = phase_stat(v1::JOB_PHASE_RUNNING);
  c[{co, "Pending jobs"}] = phase_stat(v1::JOB_PHASE_PENDING);
  c[{co, "Failed jobs"}] = phase_stat(v1::JOB_PHASE_FAILED);
  c[{co, "Live nodes"}] = [this](const Panel& p) {
    CheckStable(p, 0, {}, {}, [](const Snapshot& s) {
      int n = 0;
      for (const auto& node : s.nodes) n += node.live();
      return std::map<std::string, double>{{"{}", static_cast<double>(n)}};
    });
  };
  c[{co, "Lost nodes"}] = [this](const Panel& p) {
    CheckStable(p, 0, {}, {}, [](const Snapshot& s) {
      int n = 0;
      for (const auto& node : s.nodes) n += !node.live();
      return std::map<std::string, double>{{"{}", static_cast<double>(n)}};
    });
  };
  auto utilisation = [this](const Panel& p) {
    CheckStable(p, 0, {}, {}, [](const Snapshot& s) {
      double used = 0, all = 0;
      for (const auto& n : s.nodes) {
        if (!n.live()) continue;
        used += n.used_slots();
        all += n.used_slots() + n.free_slots();
      }
      return std::map<std::string, double>{{"{}", used / std::max(all, 1.0)}};
    });
  };
  c[{co, "Slot utilisation"}] = utilisation;
  c[{qf, "Slot utilisation"}] = utilisation;
  c[{co, "Jobs by phase"}] = [this](const Panel& p) {
    CheckStable(p, 0, {}, {"phase"}, [](const Snapshot& s) {
      std::map<std::string, double> out;
      for (const Job& j : s.jobs) out[absl::StrCat("{phase=", PhaseName(j.phase()), "}")] += 1;
      return out;
    });
  };
  c[{co, "Rank slots (live nodes)"}] = [this](const Panel& p) {
    CheckStable(p, 0, {}, {"state"}, [](const Snapshot& s) {
      std::map<std::string, double> out;
      for (const auto& n : s.nodes) {
        if (!n.live()) continue;
        out["{state=used}"] += n.used_slots();
        // A cordoned or draining node takes no new rank: its free slots are not free (an
        // operator pass read free=2 while a job waited on a full worker and a cordoned one).
        out[n.cordoned() || n.draining() ? "{state=cordoned}" : "{state=free}"] += n.free_slots();
      }
      return out;
    });
  };
  auto accelerators = [this](const Panel& p) {
    CheckStable(p, 0, {}, {"kind", "state"}, &DashboardsTruth::Accelerators);
  };
  c[{co, "Accelerators by kind and state"}] = accelerators;
  c[{qf, "Accelerators by kind and state"}] = accelerators;
  // Worker-side rank states: ended ranks are reported 5 heartbeats (2.5 s): 5 s of stability.
  c[{co, "Ranks by state"}] = [this](const Panel& p) {
    CheckStable(
        p, 0, {}, {"state"},
        [this](const Snapshot& s) {
          std::map<std::string, double> by_instance = RunningRanksByInstance(s);
          if (by_instance.count("unusable")) return by_instance;
          double n = 0;
          for (const auto& [k, v] : by_instance) n += v;
          return std::map<std::string, double>{{"{state=RANK_STATE_RUNNING}", n}};
        },
        /*before=*/5.0, 0.5, 1e-9, /*min_points=*/5);
  };
  c[{qf, "Slots per worker and running ranks"}] = [this](const Panel& p) {
    CheckStable(p, 0, {}, {"instance"}, [this](const Snapshot&) {
      std::map<std::string, double> out;
      for (const auto& [node, instance] : instance_of_node_)
        out[absl::StrCat("{instance=", instance, "}")] = 2;
      return out;
    });
    CheckStable(
        p, 1, {}, {"instance"}, [this](const Snapshot& s) { return RunningRanksByInstance(s); },
        /*before=*/5.0, 0.5, 1e-9, /*min_points=*/5);
  };

  // ---- Tenants and queues
  // -------------------------------------------------------------------------
  c[{qf, "Running jobs by tenant"}] = [this](const Panel& p) {
    CheckStable(p, 0, {}, {"tenant"}, [](const Snapshot& s) {
      std::map<std::string, double> out;
      for (const Job& j : s.jobs) {
        if (j.phase() == v1::JOB_PHASE_RUNNING) out[absl::StrCat("{tenant=", j.tenant(), "}")] += 1;
      }
      return out;
    });
  };
  c[{qf, "Pending jobs by tenant and queue"}] = [this](const Panel& p) {
    CheckStable(p, 0, {}, {"tenant", "queue"}, [](const Snapshot& s) {
      std::map<std::string, double> out;
      for (const Job& j : s.jobs) {
        if (j.phase() != v1::JOB_PHASE_PENDING) continue;
        out[absl::StrCat("{tenant=", j.tenant(), ",queue=",
                         j.spec().queue().empty() ? "default" : j.spec().queue(), "}")] += 1;
      }
      return out;
    });
  };
  c[{qf, "Share of running jobs by tenant"}] = [this](const Panel& p) {
    CheckStable(p, 0, {}, {"tenant"}, [](const Snapshot& s) {
      std::map<std::string, double> out;
      double all = 0;
      for (const Job& j : s.jobs) {
        if (j.phase() != v1::JOB_PHASE_RUNNING) continue;
        out[absl::StrCat("{tenant=", j.tenant(), "}")] += 1;
        all += 1;
      }
      for (auto& [k, v] : out) v /= std::max(all, 1.0);
      return out;
    });
  };
  c[{qf, "Jobs by queue and phase"}] = [this](const Panel& p) {
    CheckStable(p, 0, {}, {"queue", "phase"}, [](const Snapshot& s) {
      std::map<std::string, double> out;
      static const std::set<std::string> kShown = {"PENDING", "ADMITTED", "STARTING", "RUNNING",
                                                   "RECOVERING"};
      for (const Job& j : s.jobs) {
        if (!kShown.count(PhaseName(j.phase()))) continue;
        out[absl::StrCat("{queue=", j.spec().queue().empty() ? "default" : j.spec().queue(),
                         ",phase=", PhaseName(j.phase()), "}")] += 1;
      }
      return out;
    });
  };
  c[{qf, "Pending jobs"}] = [this](const Panel& p) {
    const JobPhase phases[] = {v1::JOB_PHASE_PENDING, v1::JOB_PHASE_ADMITTED,
                               v1::JOB_PHASE_STARTING};
    for (size_t i = 0; i < 3; ++i) {
      const JobPhase phase = phases[i];
      // ADMITTED and STARTING last less than the stability window: then only their 0 is checked.
      CheckStable(
          p, i, {}, {}, [phase](const Snapshot& s) { return PhaseCount(s, phase); }, 3.0, 0.5, 1e-9,
          /*min_points=*/10);
    }
  };

  // ---- Counters over the whole run: exact counts ------------------------------------------------
  c[{co, "Phase transitions per minute"}] = [this, t_sched](const Panel& p) {
    std::string expr;
    std::map<std::string, double> got = WholeRunCounts(p, 0, t_sched, {"to"}, 60, &expr);
    std::map<std::string, double> want;
    for (const auto& [edge, n] : Transitions()) want[absl::StrCat("{to=", edge.second, "}")] += n;
    ExpectValues(p, 0, expr, got, want, 1e-6,
                 "\n  (counts = rate * window / 60; truth: WatchJob histories)");
  };
  c[{qf, "Submissions and admissions per minute"}] = [this, t_sched](const Panel& p) {
    std::string expr;
    auto transitions = Transitions();
    double left_pending = 0, finished = 0;
    for (const auto& [edge, n] : transitions) {
      if (edge.first == "PENDING") left_pending += n;
      if (edge.second == "SUCCEEDED" || edge.second == "FAILED" || edge.second == "CANCELLED")
        finished += n;
    }
    ExpectValues(p, 0, expr, WholeRunCounts(p, 0, t_sched, {}, 60, &expr),
                 {{"{}", static_cast<double>(submitted_)}}, 1e-6,
                 "\n  (truth: jobs the test submitted)");
    ExpectValues(p, 1, expr, WholeRunCounts(p, 1, t_sched, {}, 60, &expr), {{"{}", left_pending}},
                 1e-6, "\n  (truth: transitions out of PENDING in the histories)");
    ExpectValues(p, 2, expr, WholeRunCounts(p, 2, t_sched, {}, 60, &expr), {{"{}", finished}}, 1e-6,
                 "\n  (truth: jobs that ended)");
  };
  c[{qf, "Outcomes"}] = [this, t_sched](const Panel& p) {
    std::map<std::string, double> want;
    for (const auto& [id, run] : runs_)
      want[absl::StrCat("{to=", PhaseName(run.final.phase()), "}")] += 1;
    EXPECT_EQ(want["{to=FAILED}"], 1);
    EXPECT_EQ(want["{to=CANCELLED}"], 1);
    EXPECT_EQ(want["{to=SUCCEEDED}"], 4);
    const std::string expr = Substitute(p.exprs[0], {});
    ExpectValues(p, 0, expr, At(p, 0, {}, t_sched, {"to"}), want, 1e-6,
                 "\n  (at the scheduler's last scrape; truth: GetJob phases)");
    // At any other moment increase() extrapolates a little, never by a whole job.
    std::map<std::string, double> now = At(p, 0, {}, run_end_ + 0.5, {"to"});
    for (const auto& [k, v] : want) {
      EXPECT_NEAR(now[k], v, 0.1) << Where(p, 0) << " at a time between scrapes: " << k;
    }
  };
  c[{qf, "Restarts per hour by cause"}] = [this, t_sched](const Panel& p) {
    std::map<std::string, double> want;
    int restarts = 0;
    for (const auto& [id, run] : runs_) {
      restarts += run.final.user_restarts() + run.final.infra_restarts();
      for (const auto& [attempt, cls] : run.restart_class) {
        std::string cause = "other";
        switch (cls) {
          case v1::FAILURE_CLASS_USER:
            cause = "user";
            break;
          case v1::FAILURE_CLASS_INFRA:
            cause = "infra";
            break;
          case v1::FAILURE_CLASS_SETUP:
            cause = "setup";
            break;
          case v1::FAILURE_CLASS_OOM:
            cause = "oom";
            break;
          case v1::FAILURE_CLASS_PREEMPTED:
            cause = "preemption";
            break;
          default:
            break;
        }
        want[absl::StrCat("{cause=", cause, "}")] += 1;
      }
    }
    EXPECT_EQ(restarts, 4) << "user + infra restarts of the jobs (GetJob)";
    double sum = 0;
    for (const auto& [k, v] : want) sum += v;
    EXPECT_EQ(sum, restarts) << "restarts seen RECOVERING vs the jobs' restart counts";
    ExpectValues(p, 0, Substitute(p.exprs[0], {}), At(p, 0, {}, t_sched, {"cause"}), want, 1e-6,
                 "\n  (truth: each RECOVERING job's failure_class, GetJob)");
  };
  c[{qf, "Admission attempts per minute by result"}] = [this, t_sched](const Panel& p) {
    std::string expr;
    std::map<std::string, double> got = WholeRunCounts(p, 0, t_sched, {"result"}, 60, &expr);
    double placements = 0;
    for (const auto& [edge, n] : Transitions()) {
      // A restarted job is placed again from RECOVERING: an admitted attempt too.
      if ((edge.first == "PENDING" || edge.first == "RECOVERING") &&
          (edge.second == "ADMITTED" || edge.second == "STARTING")) {
        placements += n;
      }
    }
    EXPECT_NEAR(got["{result=admitted}"], placements, 1e-6)
        << Where(p, 0) << "\n  query: " << expr << "\n  admitted attempts vs placements (PENDING "
        << "or RECOVERING -> ADMITTED/STARTING in the histories): " << Describe(got);
    // The 2-rank job waited for slots: counted as no_capacity, never as anything that did not
    // happen (no quota, every job fits, equal priorities, no preemption).
    EXPECT_GE(got["{result=no_capacity}"], 1) << Where(p, 0) << " " << Describe(got);
    for (const char* r : {"quota", "infeasible", "preempting", "other"}) {
      EXPECT_EQ(got[absl::StrCat("{result=", r, "}")], 0)
          << Where(p, 0) << " " << r << ": " << Describe(got);
    }
  };
  c[{co, "Submissions per group commit"}] = [this, t_sched](const Panel& p) {
    // The test submits one job at a time: one commit per job.
    Vars v;
    v.rate_interval = WholeRun(t_sched);
    ExpectValues(p, 0, Substitute(p.exprs[0], v), At(p, 0, v, t_sched, {}), {{"{}", 1.0}}, 1e-9,
                 "\n  (sequential submissions: one job per group commit)");
    std::string expr;
    ExpectValues(p, 1, expr, WholeRunCounts(p, 1, t_sched, {}, 1, &expr),
                 {{"{}", static_cast<double>(submitted_)}}, 1e-6, "\n  (commits = submissions)");
  };
  c[{co, "Scheduling cycle duration"}] = [this, t_sched](const Panel& p) {
    // Truth: the scheduler's cycle trace (one line per cycle, its duration in microseconds, as
    // the server times it around the cycle, which includes the histogram's own timing).
    auto trace = ReadFile(absl::StrCat(tmp_, "/cycles.trace"));
    ASSERT_TRUE(trace.ok()) << trace.status();
    // increase() counts from the first scrape in its window: the cycles of the scheduler's start
    // before Prometheus' first scrape of it are in the trace only.
    double t_first = t_sched;
    for (const PromSample& s :
         Eval(absl::StrCat("up{job=\"loom-scheduler\"}[", WholeRun(t_sched), "]"), t_sched)) {
      t_first = std::min(t_first, s.time);
    }
    std::vector<double> durations;
    for (absl::string_view line : absl::StrSplit(*trace, '\n', absl::SkipEmpty())) {
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      double end_us = 0, took_us = 0;
      if (f.size() < 3 || !absl::SimpleAtod(f[0], &end_us) || !absl::SimpleAtod(f[1], &took_us) ||
          f[2] != "1")
        continue;
      // Before the first or after the last scrape.
      if (end_us / 1e6 <= t_first || end_us / 1e6 > t_sched) continue;
      durations.push_back(took_us / 1e6);
    }
    const std::vector<double> bounds = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                        0.025,  0.05,    0.1,    0.25,  0.5,    1.0};
    ExpectQuantileInBucket(p, 0, 0.5, durations, bounds, t_sched, WholeRun(t_sched),
                           /*or_below=*/true);
    ExpectQuantileInBucket(p, 1, 0.99, durations, bounds, t_sched, WholeRun(t_sched),
                           /*or_below=*/true);
  };
  c[{qf, "Queue wait (entering PENDING to placement)"}] = [this, t_sched](const Panel& p) {
    const std::vector<double> waits = QueueWaits();
    const std::vector<double> bounds = {0.01, 0.025, 0.05, 0.1,  0.25,  0.5,  1,
                                        2.5,  5,     15,   30,   60,    120,  300,
                                        600,  1800,  3600, 7200, 21600, 86400};
    // The buckets hold exactly the waits of the histories (1 ms slack at a bucket's bound).
    std::map<double, double> got;
    for (const PromSample& s :
         Eval(absl::StrCat("increase(loom_job_queue_wait_seconds_bucket[", WholeRun(t_sched), "])"),
              t_sched)) {
      got[std::strtod(s.labels.at("le").c_str(), nullptr)] = s.value;
    }
    for (double b : bounds) {
      int n = 0, near = 0;
      for (double w : waits) {
        n += w <= b;
        near += std::abs(w - b) < 0.001;
      }
      const double g = got[b];
      EXPECT_TRUE(std::abs(g - n) <= near + 1e-6)
          << "loom_job_queue_wait_seconds_bucket{le=" << b << "}: " << g << ", histories: " << n
          << " (waits " << absl::StrJoin(waits, ", ") << ")";
    }
    std::cout << "  queue waits (s): " << absl::StrJoin(waits, ", ") << "\n";
    for (size_t i = 0; i < 3; ++i) {
      const double q = i == 0 ? 0.5 : i == 1 ? 0.9 : 0.99;
      ExpectQuantileInBucket(p, i, q, waits, bounds, t_sched, WholeRun(t_sched),
                             /*or_below=*/false);
    }
  };

  // ---- Checkpoint service
  // ------------------------------------------------------------------------
  c[{cp, "Consolidations per hour"}] = [this, t_ckpt](const Panel& p) {
    std::map<std::string, double> want;
    for (const auto& [result, n] : consolidations_) want[absl::StrCat("{result=", result, "}")] = n;
    ExpectValues(p, 0, Substitute(p.exprs[0], {}), At(p, 0, {}, t_ckpt, {"result"}), want, 1e-6,
                 "\n  (truth: the ConsolidateCheckpoint calls the test made)");
  };
  c[{cp, "Consolidation duration"}] = [this, t_ckpt](const Panel& p) {
    const std::vector<double> bounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                        0.25,  0.5,    1,     2.5,  5,     10,   30,
                                        60,    120,    300,   600,  1800,  3600, 7200};
    ExpectQuantileInBucket(p, 0, 0.5, consolidation_seconds_, bounds, t_ckpt, WholeRun(t_ckpt),
                           true);
    ExpectQuantileInBucket(p, 1, 0.99, consolidation_seconds_, bounds, t_ckpt, WholeRun(t_ckpt),
                           true);
    Vars v;
    v.rate_interval = WholeRun(t_ckpt);
    std::vector<PromSample> mean = Eval(Substitute(p.exprs[2], v), t_ckpt);
    ASSERT_EQ(mean.size(), 1u) << Where(p, 2);
    double client_mean = 0;
    for (double s : consolidation_seconds_) client_mean += s / consolidation_seconds_.size();
    EXPECT_GT(mean[0].value, 0) << Where(p, 2);
    EXPECT_LE(mean[0].value, client_mean) << Where(p, 2) << ": the service's mean exceeds the "
                                          << "calls' mean as the client timed them";
  };
  c[{cp, "Safetensors bytes written"}] = [this, t_ckpt](const Panel& p) {
    std::error_code ec;
    const double bytes = static_cast<double>(std::filesystem::file_size(consolidated_path_, ec));
    EXPECT_FALSE(ec) << consolidated_path_;
    EXPECT_EQ(bytes, consolidated_bytes_) << "the file vs ConsolidateCheckpoint's total_bytes";
    std::string expr;
    ExpectValues(p, 0, expr, WholeRunCounts(p, 0, t_ckpt, {}, 1, &expr), {{"{}", bytes}}, 1e-6,
                 "\n  (truth: the size of the model.safetensors written)");
  };

  // ---- Workers and daemons ---------------------------------------------------------------------
  c[{co, "Heartbeats per second"}] = [this](const Panel& p) {
    // --heartbeat_interval=500ms: 2 per second each, none failing; over 20 s windows in the run.
    for (double t = run_start_ + 25; t < run_end_; t += 20) {
      Vars v;
      v.rate_interval = "20s";
      std::map<std::string, double> got = At(p, 0, v, t, {"instance", "result"});
      for (const auto& [node, instance] : instance_of_node_) {
        const double ok = got[absl::StrCat("{instance=", instance, ",result=ok}")];
        EXPECT_TRUE(ok > 1.7 && ok <= 2.05) << Where(p, 0) << " " << node << " at run +"
                                            << (t - run_start_) << " s: " << ok << "/s";
        EXPECT_EQ(got[absl::StrCat("{instance=", instance, ",result=error}")], 0)
            << Where(p, 0) << " " << node;
      }
    }
  };
  c[{co, "Heartbeat age"}] = [this](const Panel& p) {
    int points = 0;
    for (auto& [t, got] : Grid(Substitute(p.exprs[0], {}), {"instance"})) {
      ++points;
      ASSERT_EQ(got.size(), 2u) << Where(p, 0) << " at run +" << (t - run_start_) << ": "
                                << Describe(got);
      for (const auto& [k, v] : got) {
        // The last heartbeat at most 0.5 s (interval) + 1 s (scrape) old, plus 1.5 s for a
        // heartbeat or scrape late on a loaded 2-core machine (a lost worker is 10 s and more).
        ASSERT_TRUE(v >= -0.05 && v < 3.0)
            << Where(p, 0) << " " << k << " at run +" << (t - run_start_) << ": " << v;
      }
    }
    EXPECT_GT(points, 50);
  };
  c[{co, "Daemons up"}] = [this](const Panel& p) {
    std::map<std::string, double> want;
    for (const auto& [job, instance] : targets_)
      want[absl::StrCat("{job=", job, ",instance=", instance, "}")] = 1;
    for (auto& [t, got] : Grid(Substitute(p.exprs[0], {}), {"job", "instance"})) {
      ASSERT_EQ(got, want) << Where(p, 0) << " at run +" << (t - run_start_);
    }
  };

  // ---- Gateway: what the test sent
  // ------------------------------------------------------------------
  auto gateway_counts = [this](bool by_route) {
    std::map<std::string, double> want;
    for (const auto& [k, n] : gateway_sent_) {
      const auto& [route, method, code] = k;
      want[by_route ? absl::StrCat("{route=", route, ",code=", code, "}")
                    : absl::StrCat("{code=", code, "}")] += n;
    }
    return want;
  };
  c[{co, "Gateway requests per second by route and status"}] = [this, t_gw,
                                                                gateway_counts](const Panel& p) {
    std::string expr;
    ExpectValues(p, 0, expr, WholeRunCounts(p, 0, t_gw, {"route", "code"}, 1, &expr),
                 gateway_counts(true), 1e-6,
                 "\n  (counts = rate * window; truth: the requests the test sent)");
  };
  c[{co, "Gateway requests by status class (last hour)"}] = [this, t_gw,
                                                             gateway_counts](const Panel& p) {
    ExpectValues(p, 0, Substitute(p.exprs[0], {}), At(p, 0, {}, t_gw, {"code"}),
                 gateway_counts(false), 1e-6, "\n  (truth: the requests the test sent)");
  };
  c[{co, "Gateway error ratio (5xx)"}] = [this, t_gw](const Panel& p) {
    Vars v;
    v.rate_interval = WholeRun(t_gw);
    const std::string expr = Substitute(p.exprs[0], v);
    std::vector<PromSample> got = Eval(expr, t_gw);
    // No request of the test was answered with a 5xx: the ratio is 0 (not "no data").
    ASSERT_EQ(got.size(), 1u) << Where(p, 0) << ": no value where the truth is 0 (no 5xx of "
                              << gateway_latencies_.size() << " requests)\n  query: " << expr;
    EXPECT_EQ(got[0].value, 0) << Where(p, 0);
  };
  c[{co, "Gateway latency (excluding streams)"}] = [this, t_gw](const Panel& p) {
    const std::vector<double> bounds = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                        0.5,    1,     2.5,    5,     10,   30,    32,   60,  300};
    ExpectQuantileInBucket(p, 0, 0.5, gateway_latencies_, bounds, t_gw, WholeRun(t_gw), true);
    ExpectQuantileInBucket(p, 1, 0.99, gateway_latencies_, bounds, t_gw, WholeRun(t_gw), true);
  };
}

}  // namespace loom::dashboards_truth
