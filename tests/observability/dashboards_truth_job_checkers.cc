// The checkers of the per-job panels (job-detail.json and the per-rank checkpoint panels of
// checkpoints.json) of the truth test (dashboards_truth.h): each job at its last scrape.
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

void DashboardsTruth::AddJobCheckers(CheckerTable& c) {
  const std::string jd = "job-detail.json", cp = "checkpoints.json";

  // ---- Job detail: per job, at its last scrape
  // ------------------------------------------------------
  auto ev = [](const std::string& field) {
    return [field](const JobRun& r, int rank) { return Num(r.last_step.at(rank), field); };
  };
  c[{jd, "Step"}] = [this, ev](const Panel& p) {
    CheckFinalPerRank(p, 0, ev("step"), 0, nullptr, "(truth: the rank's last step event)");
    for (const auto& [id, run] : runs_) {
      // Rank 0 is what the scheduler reports.
      auto got = PerRank(p, 0, id, run.t_last);
      EXPECT_EQ((got[{run.final.attempt(), 0}]), run.final.progress().step())
          << Where(p, 0) << " " << run.label << ": vs GetJob progress.step";
    }
  };
  c[{jd, "Loss"}] = [this, ev](const Panel& p) {
    // 1e-12 relative: the /metrics text carries 16 significant digits of a double.
    CheckFinalPerRank(p, 0, ev("loss"), 1e-12, nullptr,
                      "(train; truth: the rank's last step event)");
    for (const auto& [id, run] : runs_) {
      auto got = PerRank(p, 0, id, run.t_last);
      EXPECT_NEAR((got[{run.final.attempt(), 0}]), run.final.progress().loss(),
                  1e-12 * run.final.progress().loss())
          << Where(p, 0) << " " << run.label << " (job " << id << "): vs GetJob progress.loss";
    }
    // The shared jobs' losses differ: the comparison above tells them apart.
    EXPECT_NE(Run("shared-zenflow").final.progress().loss(),
              Run("shared-superoffload").final.progress().loss());
    CheckFinalPerRank(
        p, 1, [](const JobRun& r, int rank) { return Num(r.last_eval.at(rank), "loss"); }, 1e-12,
        [](const JobRun& r) { return r.last_eval.count(0) > 0; },
        "(held-out; truth: the rank's last eval event)");
    for (const auto& [id, run] : runs_) {
      if (!run.final.progress().has_eval_loss()) continue;
      auto got = PerRank(p, 1, id, run.t_last);
      EXPECT_NEAR((got[{run.final.attempt(), 0}]), run.final.progress().eval_loss(),
                  1e-12 * run.final.progress().eval_loss())
          << Where(p, 1) << " " << run.label << ": vs GetJob progress.eval_loss";
    }
  };
  c[{jd, "Step time"}] = [this, ev](const Panel& p) { CheckFinalPerRank(p, 0, ev("step_time_s")); };
  c[{jd, "Model states per rank"}] = [this, ev](const Panel& p) {
    CheckFinalPerRank(p, 0, ev("param_bytes"));
    CheckFinalPerRank(p, 1, ev("grad_bytes"));
    CheckFinalPerRank(p, 2, ev("optimizer_state_bytes"));
  };
  c[{jd, "Peak memory per step"}] = [this, ev](const Panel& p) {
    CheckFinalPerRank(p, 0, ev("peak_bytes"));
    CheckFinalPerRank(p, 1, ev("buffer_bytes"));
    CheckFinalPerRank(p, 2, ev("cached_bytes"));
  };
  c[{jd, "Job model-state memory (all ranks)"}] = [this](const Panel& p) {
    for (const auto& [id, run] : runs_) {
      double want = 0;
      for (const auto& [rank, e] : run.last_step) {
        want += Num(e, "param_bytes") + Num(e, "grad_bytes") + Num(e, "optimizer_state_bytes");
      }
      auto got = PerRank(p, 0, id, run.t_last);
      ASSERT_EQ(got.size(), 1u) << Where(p, 0) << " " << run.label;
      EXPECT_EQ(got.begin()->second, want) << Where(p, 0) << " " << run.label << " (job " << id
                                           << "): vs the sum of its ranks' last step events";
    }
  };
  c[{jd, "ZeRO-3: gathered peak / partition"}] = [this](const Panel& p) {
    CheckFinalPerRank(
        p, 0,
        [](const JobRun& r, int rank) {
          return Num(r.last_step.at(rank), "peak_gathered_bytes") /
                 Num(r.last_step.at(rank), "partition_bytes");
        },
        // The worker exports both gauges for every ZeRO stage (of a stage-2 job: its peak
        // buffers over its fp32 master bytes), so the ZenFlow (stage 2) job has a series too.
        1e-12);
  };
  c[{jd, "Step time vs. median of the job (communication and stragglers)"}] =
      [this](const Panel& p) {
        CheckFinalPerRank(
            p, 0,
            [](const JobRun& r, int rank) {
              std::vector<double> s;
              for (const auto& [k, e] : r.last_step) s.push_back(Num(e, "step_time_s"));
              std::sort(s.begin(), s.end());
              const double median =
                  s.size() % 2 ? s[s.size() / 2] : (s[s.size() / 2 - 1] + s[s.size() / 2]) / 2;
              return Num(r.last_step.at(rank), "step_time_s") / median;
            },
            1e-12);
      };
  c[{jd, "Communication and stall time per step"}] = [this, ev](const Panel& p) {
    CheckFinalPerRank(p, 0, ev("comm_s"));
    CheckFinalPerRank(p, 1, [](const JobRun& r, int rank) {
      return Num(r.last_step.at(rank), "comm_s") + Num(r.last_step.at(rank), "data_s");
    });
    CheckFinalPerRank(p, 2, ev("step_time_s"));
  };
  c[{jd, "Stall share of step time"}] = [this](const Panel& p) {
    CheckFinalPerRank(
        p, 0,
        [](const JobRun& r, int rank) {
          const json& e = r.last_step.at(rank);
          return (Num(e, "comm_s") + Num(e, "data_s")) / std::max(Num(e, "step_time_s"), 1e-9);
        },
        1e-12);
  };
  auto zenflow = [](const JobRun& r) { return r.params.zero == kZenFlowZero; };
  auto superoffload = [](const JobRun& r) { return r.params.zero == kSuperOffloadZero; };
  c[{jd, "ZenFlow: wait on the CPU optimizer"}] = [this, ev, zenflow](const Panel& p) {
    CheckFinalPerRank(p, 0, ev("zenflow_stall_s"), 1e-12, zenflow);
    CheckFinalPerRank(p, 1, ev("step_time_s"), 1e-12, zenflow);
  };
  c[{jd, "ZenFlow: selection and update interval"}] = [this, ev, zenflow](const Panel& p) {
    CheckFinalPerRank(p, 0, ev("zenflow_selected_mass_fraction"), 1e-12, zenflow);
    CheckFinalPerRank(p, 1, ev("zenflow_update_interval"), 1e-12, zenflow);
  };
  c[{jd, "ZenFlow: bytes moved per second"}] = [this, zenflow](const Panel& p) {
    // The counter behind the rate holds the bytes the attempt moved (the trainer's cumulative
    // count); the rate over the attempt is that over its duration.
    for (const auto& [id, run] : runs_) {
      Vars v;
      v.rate_interval = "5s";
      auto got = PerRank(p, 0, id, run.t_last, v);
      if (!zenflow(run)) {
        EXPECT_TRUE(got.empty()) << Where(p, 0) << " " << run.label
                                 << ": series of a job without ZenFlow";
        continue;
      }
      EXPECT_EQ(got.size(), 1u) << Where(p, 0) << " " << run.label;
      std::vector<PromSample> counter = Eval(
          absl::StrCat("loom_trainer_zenflow_moved_bytes_total{job_id=\"", id, "\"}"), run.t_last);
      ASSERT_EQ(counter.size(), 1u);
      EXPECT_EQ(counter[0].value, Num(run.last_step.at(0), "zenflow_bytes_moved"))
          << "loom_trainer_zenflow_moved_bytes_total of " << run.label << " vs its last step event";
    }
  };
  auto counter_equals_event = [this](const std::string& metric, const std::string& field,
                                     const std::string& extra_labels,
                                     const std::function<bool(const JobRun&)>& only) {
    for (const auto& [id, run] : runs_) {
      std::vector<PromSample> got =
          Eval(absl::StrCat(metric, "{job_id=\"", id, "\"", extra_labels, "}"), run.t_last);
      if (!only(run)) {
        EXPECT_TRUE(got.empty()) << metric << ": series of " << run.label;
        continue;
      }
      ASSERT_EQ(got.size(), static_cast<size_t>(run.params.ranks)) << metric << " " << run.label;
      for (const PromSample& s : got) {
        int rank = std::stoi(s.labels.at("rank"));
        EXPECT_EQ(s.value, Num(run.last_step.at(rank), field))
            << metric << " of " << run.label << " rank " << rank << " vs its last step event";
      }
    }
  };
  c[{jd, "SuperOffload: speculation"}] = [this, superoffload,
                                          counter_equals_event](const Panel& p) {
    counter_equals_event("loom_trainer_superoffload_speculated_sub_groups_total",
                         "speculated_sub_groups", "", superoffload);
    counter_equals_event("loom_trainer_superoffload_speculation_hits_total", "speculation_hits", "",
                         superoffload);
    counter_equals_event("loom_trainer_superoffload_speculation_paused_sub_groups_total",
                         "speculation_paused", "", superoffload);
    counter_equals_event("loom_trainer_superoffload_speculation_no_buffer_sub_groups_total",
                         "speculation_no_buffer", "", superoffload);
    for (size_t i = 0; i < p.exprs.size(); ++i) {
      Vars v;
      v.rate_interval = "5s";
      for (const auto& [id, run] : runs_) {
        auto got = PerRank(p, i, id, run.t_last, v);
        EXPECT_EQ(got.size(), superoffload(run) ? 1u : 0u) << Where(p, i) << " " << run.label;
        for (const auto& [k, val] : got) EXPECT_GE(val, 0) << Where(p, i);
      }
    }
  };
  c[{jd, "SuperOffload: hit ratio and overlap"}] = [this, ev, superoffload](const Panel& p) {
    CheckFinalPerRank(
        p, 0,
        [](const JobRun& r, int rank) {
          const double spec = Num(r.last_step.at(rank), "speculated_sub_groups");
          return spec > 0 ? Num(r.last_step.at(rank), "speculation_hits") / spec : 0.0;
        },
        1e-12, superoffload);
    CheckFinalPerRank(p, 1, ev("optimizer_overlap_fraction"), 1e-12, superoffload);
  };
  c[{jd, "SuperOffload: rollbacks and replays per minute"}] =
      [this, superoffload, counter_equals_event](const Panel& p) {
        counter_equals_event("loom_trainer_superoffload_rollbacks_total", "rollbacks_overflow",
                             ",reason=\"overflow\"", superoffload);
        counter_equals_event("loom_trainer_superoffload_rollbacks_total", "rollbacks_clip",
                             ",reason=\"clip\"", superoffload);
        counter_equals_event("loom_trainer_superoffload_replays_total", "replays",
                             ",reason=\"clip\"", superoffload);
        for (size_t i = 0; i < p.exprs.size(); ++i) {
          Vars v;
          v.rate_interval = "5s";
          for (const auto& [id, run] : runs_) {
            auto got = PerRank(p, i, id, run.t_last, v);
            EXPECT_EQ(got.size() > 0, superoffload(run)) << Where(p, i) << " " << run.label;
          }
        }
      };
  c[{jd, "SuperOffload: optimizer work per step"}] = [this, ev, superoffload](const Panel& p) {
    CheckFinalPerRank(p, 0, ev("optimizer_work_s"), 1e-12, superoffload);
  };
  c[{jd, "Activation checkpoints offloaded to host"}] = [this, ev](const Panel& p) {
    CheckFinalPerRank(p, 0, ev("activation_offload_bytes"));
  };
  // Throughput: the counter holds the job's tokens of the attempt's steps exactly; its rate over
  // windows inside a run agrees with the steps the scheduler saw per second.
  auto tokens_per_step = [](const JobRun& r) {
    return static_cast<double>(kMicroBatch) * kSequenceLength * r.params.ranks;
  };
  c[{jd, "Throughput"}] = [this, tokens_per_step](const Panel& p) {
    for (const auto& [id, run] : runs_) {
      for (const PromSample& s : Eval(absl::StrCat("loom_trainer_tokens_total{job_id=\"", id,
                                                   "\",attempt=\"", run.final.attempt(), "\"}"),
                                      run.t_last)) {
        const int rank = std::stoi(s.labels.at("rank"));
        EXPECT_EQ(s.value,
                  (Num(run.last_step.at(rank), "step") - run.start_step) * tokens_per_step(run))
            << "loom_trainer_tokens_total of " << run.label << " rank " << rank
            << ": the tokens of the attempt's steps (from step " << run.start_step << ")";
      }
    }
    CheckThroughput(p, 0, /*per_rank=*/false);
  };
  c[{jd, "Tokens per second per rank"}] = [this](const Panel& p) {
    CheckThroughput(p, 0, /*per_rank=*/true);
  };
  c[{jd, "Stall: time since last step"}] = [this](const Panel& p) {
    for (const auto& [id, run] : runs_) {
      // An ended rank does not age: nothing at its last scrape.
      auto got = PerRank(p, 0, id, run.t_last);
      EXPECT_TRUE(got.empty()) << Where(p, 0) << " " << run.label << ": an ended rank still ages";
    }
    CheckRunningAge(p, 0, /*since_start=*/false);
  };
  c[{jd, "Ranks of the job"}] = [this](const Panel& p) {
    CheckStable(p, 0, {}, {"job_id", "attempt", "rank", "instance"}, [this](const Snapshot& s) {
      if (Transitional(s)) return Unusable();
      std::map<std::string, double> out;
      for (const Job& j : s.jobs) {
        if (j.phase() != v1::JOB_PHASE_RUNNING) continue;
        for (int r = 0; r < j.rank_nodes_size(); ++r) {
          out[absl::StrCat("{job_id=", j.id(), ",attempt=", j.attempt(), ",rank=", r,
                           ",instance=", instance_of_node_[j.rank_nodes(r)], "}")] = 1;
        }
      }
      return out;
    });
  };
  c[{jd, "Accelerators of the job"}] = [this](const Panel& p) {
    // No API names the accelerator index: structural for it (each running rank of a node has
    // its own index below the node's slots), exact for the job, rank and node.
    CheckStable(p, 0, {}, {"job_id", "rank", "node"}, [](const Snapshot& s) {
      if (Transitional(s)) return Unusable();
      std::map<std::string, double> out;
      for (const Job& j : s.jobs) {
        if (j.phase() != v1::JOB_PHASE_RUNNING) continue;
        for (int r = 0; r < j.rank_nodes_size(); ++r) {
          out[absl::StrCat("{job_id=", j.id(), ",rank=", r, ",node=", j.rank_nodes(r), "}")] += 1;
        }
      }
      return out;
    });
    for (auto& [t, unused] : Grid("loom_rank_accelerator_info", {})) {
      std::map<std::string, std::set<std::string>> indices;
      std::map<std::string, int> count;
      for (const PromSample& s : Eval("loom_rank_accelerator_info", t)) {
        const std::string node = s.labels.at("node");
        const std::string idx = s.labels.at("accelerator_index");
        indices[node].insert(idx);
        ++count[node];
        EXPECT_TRUE(idx == "0" || idx == "1") << "accelerator_index " << idx << " on a 2-slot node";
      }
      for (const auto& [node, n] : count) {
        EXPECT_EQ(indices[node].size(), static_cast<size_t>(n))
            << "two running ranks of " << node << " share an accelerator index at run +"
            << (t - run_start_);
      }
    }
  };

  // ---- Checkpoints
  // ------------------------------------------------------------------------------------
  c[{cp, "Checkpoint age"}] = [this](const Panel& p) {
    for (const auto& [id, run] : runs_) {
      auto got = PerRank(p, 0, id, run.t_last);
      EXPECT_TRUE(got.empty()) << Where(p, 0) << " " << run.label
                               << ": an ended rank's checkpoint still ages";
    }
    CheckRunningAge(p, 0, /*since_start=*/true);
  };
  c[{cp, "Last checkpoint step"}] = [this](const Panel& p) {
    for (const auto& [id, run] : runs_) {
      auto got = PerRank(p, 0, id, run.t_last);
      EXPECT_EQ(got.size(), static_cast<size_t>(run.params.ranks))
          << Where(p, 0) << " " << run.label;
      EXPECT_EQ((got[{run.final.attempt(), 0}]), run.final.progress().last_checkpoint_step())
          << Where(p, 0) << " " << run.label << ": vs GetJob progress.last_checkpoint_step";
    }
    // After the resume (issue 53: it read 0): from its first sample on, attempt 2 shows the
    // checkpoint it resumed from, or one it wrote since (the attempt may pass its next
    // checkpoint before the first scrape), never less.
    const JobRun& r = Run("restarted");
    ASSERT_FALSE(r.first_after_resume.empty());
    ASSERT_EQ(r.final.attempt(), 2);
    EXPECT_GT(r.start_step, 0) << "attempt 2 did not resume from a checkpoint";
    const double t = r.first_after_resume.front().first;
    const std::string id = label_to_id_["restarted"];
    std::vector<PromSample> step =
        Eval(absl::StrCat("loom_trainer_step{job_id=\"", id, "\",attempt=\"2\"}"), t);
    ASSERT_EQ(step.size(), 1u);
    const double first = r.first_after_resume.front().second;
    const bool resumed_value = first == r.start_step;
    const bool written_since = first > r.start_step && first <= step[0].value &&
                               std::fmod(first, r.params.checkpoint_every) == 0;
    EXPECT_TRUE(resumed_value || written_since)
        << Where(p, 0) << " restarted: first sample of attempt 2 at " << Fmt(t) << " is " << first
        << "; resumed from " << r.start_step << ", at step " << step[0].value << ", every "
        << r.params.checkpoint_every;
    for (const auto& [time, value] : r.first_after_resume) {
      EXPECT_GE(value, r.start_step) << Where(p, 0) << " restarted at " << Fmt(time);
    }
    std::cout << "  restarted: first sample of attempt 2 at step " << step[0].value
              << " shows checkpoint " << first << " (resumed from " << r.start_step << ")\n";
    auto got = PerRank(p, 0, id, t);
    EXPECT_EQ((got[{2, 0}]), first) << Where(p, 0) << " after the resume";
  };
  c[{cp, "Steps since last checkpoint"}] = [this](const Panel& p) {
    for (const auto& [id, run] : runs_) {
      auto got = PerRank(p, 0, id, run.t_last);
      EXPECT_EQ((got[{run.final.attempt(), 0}]),
                run.final.progress().step() - run.final.progress().last_checkpoint_step())
          << Where(p, 0) << " " << run.label << ": vs GetJob step - last_checkpoint_step";
    }
    const JobRun& r = Run("restarted");
    ASSERT_FALSE(r.first_after_resume.empty());
    const double t = r.first_after_resume.front().first;
    std::vector<PromSample> step = Eval(
        absl::StrCat("loom_trainer_step{job_id=\"", label_to_id_["restarted"], "\",attempt=\"2\"}"),
        t);
    ASSERT_EQ(step.size(), 1u);
    auto got = PerRank(p, 0, label_to_id_["restarted"], t);
    EXPECT_EQ((got[{2, 0}]), step[0].value - r.first_after_resume.front().second)
        << Where(p, 0) << " restarted, first sample after the resume: steps past the checkpoint "
        << "the attempt shows (resumed from " << r.start_step << ")";
    EXPECT_LT((got[{2, 0}]), r.params.checkpoint_every) << Where(p, 0);
  };
}

}  // namespace loom::dashboards_truth
