// The truth test's comparisons shared by the checkers (dashboards_truth.h): per-rank and
// whole-run values, histogram quantiles, throughput and age panels, alerts, template
// variables.
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

// Target `target` of `p` for job `id` at `time`: (attempt, rank) -> value; only series of `id`.
std::map<std::pair<int, int>, double> DashboardsTruth::PerRank(const Panel& p, size_t target,
                                                               const std::string& id, double time,
                                                               const Vars& base) {
  std::map<std::pair<int, int>, double> out;
  if (target >= p.exprs.size()) {
    ADD_FAILURE() << Where(p, target) << ": no such target";
    return out;
  }
  Vars v = base;
  v.job = id;
  const std::string expr = Substitute(p.exprs[target], v);
  // A panel with the $job variable shows that job only; one without (checkpoints.json) shows
  // every job, of which the checkers compare `id`'s series.
  const bool selects_job =
      absl::StrContains(p.exprs[target], "$job") || absl::StrContains(p.exprs[target], "${job}");
  for (const PromSample& s : Eval(expr, time)) {
    auto j = s.labels.find("job_id");
    const bool of_job = j != s.labels.end() && j->second == id;
    if (!selects_job && !of_job) continue;
    EXPECT_TRUE(of_job) << Where(p, target) << ": a series of another job in the panel of " << id
                        << ": " << Key(s, {"job_id", "attempt", "rank"}) << "\n  query: " << expr;
    int attempt = 0, rank = 0;
    if (s.labels.count("attempt")) (void)absl::SimpleAtoi(s.labels.at("attempt"), &attempt);
    if (s.labels.count("rank")) (void)absl::SimpleAtoi(s.labels.at("rank"), &rank);
    out[{attempt, rank}] = s.value;
  }
  return out;
}

// For every job of the run: target `target` at the job's last scrape holds exactly one series
// per rank of the final attempt, each equal to want(run, rank) (relative tolerance `tol`).
// `only` limits the jobs that must have series (the others must have none).
void DashboardsTruth::CheckFinalPerRank(const Panel& p, size_t target,
                                        const std::function<double(const JobRun&, int)>& want,
                                        double tol, const std::function<bool(const JobRun&)>& only,
                                        const std::string& what) {
  for (const auto& [id, run] : runs_) {
    const bool expected = only == nullptr || only(run);
    auto got = PerRank(p, target, id, run.t_last);
    const std::string expr = Substitute(p.exprs[target], Vars{.job = id});
    if (!expected) {
      EXPECT_TRUE(got.empty()) << Where(p, target) << " " << run.label
                               << ": series where none should be\n  query: " << expr;
      continue;
    }
    std::set<std::pair<int, int>> want_keys;
    for (int r = 0; r < run.params.ranks; ++r) want_keys.insert({run.final.attempt(), r});
    std::set<std::pair<int, int>> got_keys;
    for (const auto& [k, v] : got) got_keys.insert(k);
    EXPECT_EQ(got_keys, want_keys)
        << Where(p, target) << " " << run.label << " at " << Fmt(run.t_last)
        << ": (attempt, rank) series\n  query: " << expr;
    for (const auto& [k, v] : got) {
      const double w = want(run, k.second);
      EXPECT_NEAR(v, w, tol * std::max(1.0, std::abs(w)))
          << Where(p, target) << " " << run.label << " (job " << id << ") rank " << k.second
          << " at " << Fmt(run.t_last) << " " << what << "\n  query: " << expr;
    }
  }
}

// The counter/histogram window covering the whole run, ending at `t`: "<ms>ms".
std::string DashboardsTruth::WholeRun(double t) {
  return absl::StrCat(static_cast<int64_t>(std::ceil((t - run_start_ + 30) * 1000)), "ms");
}

// The value of target `target` of `p` at `t` keyed by `key_labels` (vars given).
std::map<std::string, double> DashboardsTruth::At(const Panel& p, size_t target, const Vars& v,
                                                  double t,
                                                  const std::vector<std::string>& key_labels) {
  std::map<std::string, double> out;
  if (target >= p.exprs.size()) {
    ADD_FAILURE() << Where(p, target) << ": no such target";
    return out;
  }
  for (const PromSample& s : Eval(Substitute(p.exprs[target], v), t)) {
    out[Key(s, key_labels)] = s.value;
  }
  return out;
}

// Exact comparison of a map of values (absent = 0 on both sides), within `tol` relative.
void DashboardsTruth::ExpectValues(const Panel& p, size_t target, const std::string& expr,
                                   std::map<std::string, double> got,
                                   std::map<std::string, double> want, double tol,
                                   const std::string& note) {
  auto strip = [](std::map<std::string, double>& m) {
    for (auto it = m.begin(); it != m.end();) it = it->second == 0 ? m.erase(it) : std::next(it);
  };
  strip(got);
  strip(want);
  bool same = got.size() == want.size();
  for (const auto& [k, v] : want) {
    auto it = got.find(k);
    same = same && it != got.end() && std::abs(it->second - v) <= tol * std::max(1.0, std::abs(v));
  }
  EXPECT_TRUE(same) << Where(p, target) << "\n  query: " << expr << "\n  expected "
                    << Describe(want) << "\n  got      " << Describe(got) << note;
}

// Counts over the whole run from a rate-per-minute (`per` = 60) or per-second (`per` = 1)
// panel target, evaluated at `t` (a scrape of its target): value * window / per.
std::map<std::string, double> DashboardsTruth::WholeRunCounts(
    const Panel& p, size_t target, double t, const std::vector<std::string>& key_labels, double per,
    std::string* expr_out) {
  Vars v;
  v.rate_interval = WholeRun(t);
  const double window = (std::ceil((t - run_start_ + 30) * 1000)) / 1000;
  *expr_out = Substitute(p.exprs[target], v);
  std::map<std::string, double> out = At(p, target, v, t, key_labels);
  for (auto& [k, val] : out) val = val * window / per;
  return out;
}

// Transitions of the run from the histories: (from, to) -> count.
std::map<std::pair<std::string, std::string>, int> DashboardsTruth::Transitions() {
  std::map<std::pair<std::string, std::string>, int> out;
  for (const auto& [id, run] : runs_) {
    std::string from = "UNSPECIFIED";
    for (const HistoryEntry& h : run.history) {
      out[{from, PhaseName(h.phase)}]++;
      from = PhaseName(h.phase);
    }
  }
  return out;
}

// Queue waits the scheduler observed (leaving PENDING for anything but CANCELLED), from the
// histories.
std::vector<double> DashboardsTruth::QueueWaits() {
  std::vector<double> out;
  for (const auto& [id, run] : runs_) {
    JobPhase from = v1::JOB_PHASE_UNSPECIFIED;
    double entered = Seconds(run.final.create_time());  // a requeued job waits from its requeue
    for (const HistoryEntry& h : run.history) {
      if (from == v1::JOB_PHASE_PENDING && h.phase != v1::JOB_PHASE_CANCELLED) {
        out.push_back(h.time - entered);
      }
      if (h.phase == v1::JOB_PHASE_PENDING && from != v1::JOB_PHASE_UNSPECIFIED) entered = h.time;
      from = h.phase;
    }
  }
  return out;
}

// Checks a histogram quantile target against true observations: the panel's value lies in
// the bucket (of `bounds`) that holds the true q-quantile of `truth` (or, `or_below`, in a
// lower bucket: the daemon's own timing is inside the test's).
void DashboardsTruth::ExpectQuantileInBucket(const Panel& p, size_t target, double q,
                                             const std::vector<double>& truth,
                                             const std::vector<double>& bounds, double t,
                                             const std::string& window, bool or_below) {
  Vars v;
  v.rate_interval = window;
  const std::string expr = Substitute(p.exprs[target], v);
  std::vector<PromSample> got = Eval(expr, t);
  ASSERT_EQ(got.size(), 1u) << Where(p, target) << "\n  query: " << expr;
  ASSERT_FALSE(truth.empty());
  const double true_q = RankQuantile(truth, q);
  const auto [lo, hi] = BucketOf(true_q, bounds);
  const double value = got[0].value;
  const bool ok = or_below ? (value > 0 && value <= hi) : (value >= lo && value <= hi);
  EXPECT_TRUE(ok) << Where(p, target) << " q=" << q << "\n  query: " << expr << "\n  true " << q
                  << "-quantile " << Fmt(true_q) << " of " << truth.size()
                  << " observations lies in bucket (" << lo << ", " << hi << "]; panel says "
                  << Fmt(value);
}

// Stable truth helpers over snapshots.
std::map<std::string, double> DashboardsTruth::PhaseCount(const Snapshot& s, JobPhase phase) {
  int n = 0;
  for (const Job& j : s.jobs) n += j.phase() == phase;
  return {{"{}", static_cast<double>(n)}};
}

// Marks a snapshot unusable for rank-level truth (a job between phases whose ranks may be
// starting or stopping).
bool DashboardsTruth::Transitional(const Snapshot& s) {
  for (const Job& j : s.jobs) {
    switch (j.phase()) {
      case v1::JOB_PHASE_ADMITTED:
      case v1::JOB_PHASE_STARTING:
      case v1::JOB_PHASE_STOPPING:
        return true;
      default:
        break;
    }
  }
  return false;
}

// Accelerators by kind and state from ListNodes (docs/metrics.md: allocated = slots ranks
// hold; the rest of a cordoned node's slots cordoned, of a lost node's lost).
std::map<std::string, double> DashboardsTruth::Accelerators(const Snapshot& s) {
  std::map<std::string, double> out;
  for (const v1::NodeInfo& n : s.nodes) {
    const int slots = n.used_slots() + n.free_slots();
    if (!n.live()) {
      out["{kind=cpu,state=lost}"] += slots;
      continue;
    }
    const int allocated = std::min(slots, n.used_slots());
    out["{kind=cpu,state=allocated}"] += allocated;
    out[n.cordoned() ? "{kind=cpu,state=cordoned}" : "{kind=cpu,state=free}"] += slots - allocated;
  }
  return out;
}

// Ranks running on each worker instance: the ranks of RUNNING jobs by their rank_nodes.
std::map<std::string, double> DashboardsTruth::RunningRanksByInstance(const Snapshot& s) {
  if (Transitional(s)) return Unusable();
  std::map<std::string, double> out;
  for (const Job& j : s.jobs) {
    if (j.phase() != v1::JOB_PHASE_RUNNING) continue;
    for (const std::string& node : j.rank_nodes())
      out[absl::StrCat("{instance=", instance_of_node_[node], "}")] += 1;
  }
  return out;
}

// Throughput (job) or per-rank throughput at grid points inside each job's final attempt where
// the job ran the whole window: vs the step rate the scheduler saw (progress.step of the
// sampled ListJobs) times the job's tokens per step; 30 % (the scheduler hears of steps at
// heartbeats, 0.5 s apart, within an 8 s window).
void DashboardsTruth::CheckThroughput(const Panel& p, size_t target, bool per_rank) {
  const std::vector<Snapshot> snaps = Snapshots();
  int compared = 0;
  for (const auto& [id, run] : runs_) {
    Vars v;
    v.job = id;
    v.rate_interval = "8s";
    const std::string expr = Substitute(p.exprs[target], v);
    std::map<double, std::map<std::string, double>> grid = Grid(expr, {"attempt", "rank"});
    for (auto& [t, got] : grid) {
      // The scheduler's step at t - 8 and t (same attempt, RUNNING throughout).
      const Job* before = nullptr;
      const Job* after = nullptr;
      double t_before = 0, t_after = 0;
      bool running = true;
      for (const Snapshot& s : snaps) {
        if (s.t1 < t - 9 || s.t0 > t) continue;
        for (const Job& j : s.jobs) {
          if (j.id() != id) continue;
          running =
              running && j.phase() == v1::JOB_PHASE_RUNNING && j.attempt() == run.final.attempt();
          if (before == nullptr && s.t0 >= t - 8.5) {
            before = &j;
            t_before = (s.t0 + s.t1) / 2;
          }
          after = &j;
          t_after = (s.t0 + s.t1) / 2;
        }
      }
      if (!running || before == nullptr || after == nullptr || t_after - t_before < 6 ||
          got.empty())
        continue;
      const double steps_per_s =
          (after->progress().step() - before->progress().step()) / (t_after - t_before);
      double want = steps_per_s * kMicroBatch * kSequenceLength * run.params.ranks;
      if (per_rank) want /= run.params.ranks;
      ++compared;
      for (const auto& [k, value] : got) {
        EXPECT_NEAR(value, want, 0.3 * want)
            << Where(p, target) << " " << run.label << " " << k << " at run +" << (t - run_start_)
            << "\n  query: " << expr;
      }
    }
  }
  EXPECT_GE(compared, 5) << Where(p, target) << ": too few windows inside a run";
}

// "time() - <timestamp>" panels of running ranks: at grid points where a job ran (RUNNING,
// same attempt) for the previous 3 s, one series per rank, each between 0 and 2 s (a step:
// the last step 0.5 s heartbeat + 1 s scrape old at most). `since_start` (checkpoints): between
// 0 and the time since the attempt started plus 2 s, the newest checkpoint being no older than
// the start; for an attempt that resumed from a checkpoint, between the time since the kill that
// ended the attempt before it (the checkpoint was committed before that) and the time since the
// first attempt started, as long as the attempt has not written a checkpoint of its own.
void DashboardsTruth::CheckRunningAge(const Panel& p, size_t target, bool since_start) {
  const std::vector<Snapshot> snaps = Snapshots();
  int compared = 0, compared_resumed = 0;
  for (const auto& [id, run] : runs_) {
    Vars v;
    v.job = id;
    const std::string expr = Substitute(p.exprs[target], v);
    double attempt_start = 0, first_start = 0;
    for (const HistoryEntry& h : run.history) {
      if (h.phase != v1::JOB_PHASE_STARTING) continue;
      if (h.attempt == run.final.attempt()) attempt_start = h.time;
      if (first_start == 0) first_start = h.time;
    }
    const bool resumed = since_start && run.start_step > 0;
    if (resumed) {
      EXPECT_GT(run.killed_after_checkpoint_at, 0) << run.label << ": resumed without a kill";
    }
    // Whether the resumed attempt still has the checkpoint it resumed from as its newest at t:
    // its last_checkpoint_step series (checked against the scheduler by its own panel) at t.
    auto still_resumed_checkpoint = [&](double t) {
      double step = -1;
      for (const auto& [time, value] : run.first_after_resume) {
        if (time <= t) step = value;
      }
      return step == static_cast<double>(run.start_step);
    };
    // A panel without the $job variable (checkpoints.json) shows every job: keep id's series.
    const std::string of_job = absl::StrCat("{job_id=", id, ",");
    for (auto& [t, all] : Grid(expr, {"job_id", "attempt", "rank"})) {
      std::map<std::string, double> got;
      for (const auto& [k, value] : all) {
        if (absl::StartsWith(k, of_job)) got[k] = value;
      }
      if (resumed && still_resumed_checkpoint(t)) {
        // The resumed attempt's series, however short the attempt: no older than the first
        // attempt, and at least as old as the kill that preceded the resume.
        const std::string of_attempt = absl::StrCat(",attempt=", run.final.attempt(), ",");
        const double low = t - run.killed_after_checkpoint_at - 0.05,
                     limit = t - first_start + 2;
        for (const auto& [k, age] : got) {
          if (!absl::StrContains(k, of_attempt)) continue;
          ++compared_resumed;
          EXPECT_TRUE(age >= low && age <= limit)
              << Where(p, target) << " " << run.label << " " << k << " at run +"
              << (t - run_start_) << ": " << age << " s (between " << low << " and " << limit
              << ": the checkpoint it resumed from is older than the kill)\n  query: " << expr;
        }
        continue;
      }
      auto truth = StableTruth(
          snaps,
          [&](const Snapshot& s) {
            for (const Job& j : s.jobs) {
              if (j.id() == id) {
                return std::map<std::string, double>{
                    {"running", j.phase() == v1::JOB_PHASE_RUNNING ? 1.0 : 0.0},
                    {"attempt", static_cast<double>(j.attempt())}};
              }
            }
            return std::map<std::string, double>{};
          },
          t, 3.0, 0.5);
      if (!truth.has_value() || (*truth)["running"] != 1 ||
          (*truth)["attempt"] != run.final.attempt())
        continue;
      ++compared;
      EXPECT_EQ(got.size(), static_cast<size_t>(run.params.ranks))
          << Where(p, target) << " " << run.label << " at run +" << (t - run_start_) << ": "
          << Describe(got);
      const double limit = since_start ? t - attempt_start + 2 : 2.0;
      for (const auto& [k, age] : got) {
        EXPECT_TRUE(age >= -0.05 && age <= limit)
            << Where(p, target) << " " << run.label << " " << k << " at run +" << (t - run_start_)
            << ": " << age << " s (limit " << limit << ")\n  query: " << expr;
      }
    }
  }
  EXPECT_GE(compared, 10) << Where(p, target);
  // The resumed job runs for seconds on the checkpoint it resumed from (issue 53: its age
  // restarted at the attempt's start, so LoomCheckpointTooOld could not fire for a crash loop).
  if (since_start) {
    EXPECT_GE(compared_resumed, 1) << Where(p, target) << ": no sample of the resumed attempt";
  }
}

// Alerts: during the whole run nothing fires (or is pending) but LoomRestartStorm, and that
// exactly when the jobs' restarts (user + infra, from the sampled ListJobs) in the last 30 min
// are more than 3: quiet with 3, firing from the 4th on.
void DashboardsTruth::CheckAlerts() {
  // The rule's own expression (from Prometheus' rules API), for the messages.
  std::string storm_expr;
  if (auto rules = prom_->Api("rules"); rules.ok()) {
    for (const json& g : (*rules)["groups"]) {
      for (const json& r : g["rules"]) {
        if (r.value("name", "") == "LoomRestartStorm") storm_expr = r.value("query", "");
      }
    }
  }
  auto RestartStormValue = [&](double t) {
    std::string out = storm_expr;
    const std::string bare = storm_expr.substr(0, storm_expr.rfind('>'));
    for (const PromSample& s : Eval(bare, t)) absl::StrAppend(&out, " -> ", Fmt(s.value));
    return out;
  };
  const std::vector<Snapshot> snaps = Snapshots();
  std::set<std::string> seen;
  for (const PromSample& s : Eval(
           absl::StrCat("ALERTS[", static_cast<int>(run_end_ - run_start_ + 60), "s]"), run_end_)) {
    seen.insert(absl::StrCat(s.labels.at("alertname"), "/", s.labels.at("alertstate")));
  }
  for (const std::string& a : seen) {
    EXPECT_EQ(a, "LoomRestartStorm/firing")
        << "an alert that should not have fired (or been pending)";
  }
  int compared = 0, with_storm = 0, at_three = 0;
  for (auto& [t, got] :
       Grid("count(ALERTS{alertname=\"LoomRestartStorm\",alertstate=\"firing\"}) or vector(0)",
            {})) {
    auto truth = StableTruth(
        snaps,
        [](const Snapshot& s) {
          double restarts = 0;
          for (const Job& j : s.jobs) restarts += j.user_restarts() + j.infra_restarts();
          return std::map<std::string, double>{{"restarts", restarts}};
        },
        t, 3.0, 0.5);
    if (!truth.has_value()) continue;
    const double restarts = (*truth)["restarts"];
    const double firing = got["{}"];
    ++compared;
    with_storm += restarts > 3;
    at_three += restarts == 3;
    EXPECT_EQ(firing, restarts > 3 ? 1 : 0)
        << "LoomRestartStorm at run +" << (t - run_start_) << " s with " << restarts
        << " restarts in the last 30 min (alerts.yml: more than 3); the rule's expression reads "
        << RestartStormValue(t);
  }
  EXPECT_GE(at_three, 3) << "the run did not hold 3 restarts long enough to see the rule quiet";
  EXPECT_GE(with_storm, 3) << "the run did not hold 4 restarts long enough to see the rule fire";
  // Every rule evaluated without error.
  auto groups = prom_->Api("rules");
  ASSERT_TRUE(groups.ok()) << groups.status();
  for (const json& g : (*groups)["groups"]) {
    for (const json& r : g["rules"]) EXPECT_EQ(r.value("health", ""), "ok") << r.dump();
  }
}

// The job-detail dashboard's variables list exactly the jobs that stepped, their workers and
// ranks (over the run).
void DashboardsTruth::CheckTemplateVariables() {
  std::set<std::string> jobs, instances, ranks;
  for (const auto& [id, run] : runs_) {
    jobs.insert(id);
    for (const std::string& node : run.final.rank_nodes())
      instances.insert(instance_of_node_[node]);
    for (int r = 0; r < run.params.ranks; ++r) ranks.insert(std::to_string(r));
  }
  // The failing job's attempts ran on whichever worker had a slot: take the nodes from the
  // step series' own instances of every attempt instead for instances.
  auto values = [this](const std::string& label, const std::string& match) {
    std::set<std::string> out;
    auto r = prom_->Api(absl::StrCat("label/", label, "/values"),
                        {{"match[]", match},
                         {"start", testing::PromTime(run_start_)},
                         {"end", testing::PromTime(run_end_)}});
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok())
      for (const json& v : *r) out.insert(v.get<std::string>());
    return out;
  };
  EXPECT_EQ(values("job_id", "loom_trainer_step"), jobs) << "job-detail $job";
  EXPECT_EQ(values("rank", "loom_trainer_step"), ranks) << "job-detail $rank";
  std::set<std::string> all_instances;
  for (const auto& [node, instance] : instance_of_node_) all_instances.insert(instance);
  std::set<std::string> got = values("instance", "loom_trainer_step");
  for (const std::string& i : instances)
    EXPECT_TRUE(got.count(i)) << "job-detail $instance lacks " << i;
  for (const std::string& i : got)
    EXPECT_TRUE(all_instances.count(i)) << "job-detail $instance: " << i;
  EXPECT_EQ(values("tenant", "loom_tenant_jobs"), std::set<std::string>{"default"})
      << "queues $tenant";
  EXPECT_EQ(values("queue", "loom_tenant_jobs"), (std::set<std::string>{"default", "research"}))
      << "queues $queue";
}

}  // namespace loom::dashboards_truth
