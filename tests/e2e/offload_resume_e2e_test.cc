// Scheduler-driven resume of ZenFlow (issue 14) and SuperOffload (issue 15) jobs, end to end:
// the real loom-scheduler, loom-checkpoint and two loom-worker daemons on loopback, real
// loom-trainer ranks over Gloo (fp32 on CPU). For each technique an uninterrupted reference job
// runs first; then the same job is started again and, as soon as its first checkpoint is committed
// on disk, rank 1's trainer process is SIGKILLed. The scheduler restarts the job
// (attempt 2) from its last committed checkpoint (ZenFlow's own state file and SuperOffload's
// sub-group states are part of it), and every step's loss of both attempts equals the
// reference's bit for bit (the losses are read from the ranks' "step" events that the
// scheduler's StreamLogs returns per attempt, printed by the trainer with round-trip precision).
// The SuperOffload job's speculation counters are then scraped from the worker's Prometheus
// endpoint (worker/worker_metrics.h).
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <atomic>
#include <cstdint>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "storage/checkpoint/consolidate.h"
#include "tests/e2e/testing/e2e_cluster.h"
#include "tests/testing/subprocess.h"

namespace loom {
namespace {

using ::loom::e2e::TrainerPids;

constexpr int kSteps = 60;
constexpr int kCheckpointEvery = 10;

// The job: kTinyModelYaml on 2 ranks with `zero_optimization` (YAML, indented 4).
std::string JobYaml(const std::string& name, const std::string& zero) {
  return absl::StrCat("name: ", name, e2e::kTinyModelYaml, R"(deepspeed_config:
  train_micro_batch_size_per_gpu: 4
  gradient_accumulation_steps: 1
  gradient_clipping: 1.0
  optimizer: {type: AdamW, params: {lr: 0.003, betas: [0.9, 0.95], weight_decay: 0.01}}
  zero_optimization:
)",
                      zero, R"(resources: {num_ranks: 2, accelerator: cpu}
training: {steps: )",
                      kSteps, R"(, sequence_length: 32, seed: 5, eval_batches: 2}
checkpoint: {interval_steps: )",
                      kCheckpointEvery, R"(}
max_restarts: 2
max_infra_restarts: 2
)");
}

const char kZenFlowZero[] = R"(    stage: 2
    offload_optimizer: {device: cpu}
    zenflow: {topk_ratio: 0.25, select_strategy: step, select_interval: 4, update_interval: 2,
              overlap_step: true, full_warm_up_rounds: 1}
)";

const char kSuperOffloadZero[] = R"(    stage: 3
    sub_group_size: 20000
    reduce_bucket_size: 20000
    overlap_comm: true
    offload_optimizer: {device: cpu, super_offload: true, ratio: 0.5, cpuadam_cores_perc: 1.0}
)";

class OffloadResumeE2ETest : public e2e::E2EClusterTest {
 protected:
  void SetUp() override {
    E2EClusterTest::SetUp();
    const absl::Status started = StartCluster(e2e::FortunesCluster());
    ASSERT_TRUE(started.ok()) << started;
  }

  // Per attempt, step -> loss of rank 0's "step" events, and the eval events' losses in order.
  struct Trajectory {
    std::map<int, std::map<int64_t, double>> losses;
    std::map<int, std::vector<double>> evals;
  };
  Trajectory Events(const std::string& job_id) {
    Trajectory t;
    loom::v1::StreamLogsRequest req;
    req.set_job_id(job_id);
    req.add_ranks(0);
    auto ctx = Ctx();
    auto reader = jobs_->StreamLogs(ctx.get(), req);
    loom::v1::LogLine line;
    while (reader->Read(&line)) {
      if (line.stream() != "stdout") continue;
      nlohmann::json ev = nlohmann::json::parse(line.text(), nullptr, /*allow_exceptions=*/false);
      if (!ev.is_object()) continue;
      auto as_int = [](const nlohmann::json& v) {
        return v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>();
      };
      if (ev.contains("step") && ev["step"].is_object()) {
        const int64_t step = as_int(ev["step"]["step"]);
        EXPECT_EQ(t.losses[line.attempt()].count(step), 0u) << "step " << step << " twice";
        t.losses[line.attempt()][step] = ev["step"]["loss"].get<double>();
      } else if (ev.contains("eval") && ev["eval"].is_object()) {
        t.evals[line.attempt()].push_back(ev["eval"]["loss"].get<double>());
      }
    }
    EXPECT_TRUE(reader->Finish().ok());
    return t;
  }

  // Runs `zero` uninterrupted, then again with rank 1's trainer SIGKILLed mid-run; checks the
  // restart and the losses. Returns the killed job's id.
  std::string KillMidRunAndCompare(const std::string& name, const std::string& zero) {
    loom::v1::Job ref = WaitFor(Submit(JobYaml(name + "-ref", zero)).id(),
                                loom::v1::JOB_PHASE_SUCCEEDED, absl::Minutes(6));
    EXPECT_EQ(ref.phase(), loom::v1::JOB_PHASE_SUCCEEDED) << ref.message();
    EXPECT_EQ(ref.attempt(), 1);
    const Trajectory reference = Events(ref.id());
    const std::map<int64_t, double> want = reference.losses.count(1) ? reference.losses.at(1)
                                                                     : std::map<int64_t, double>{};
    EXPECT_EQ(want.size(), static_cast<size_t>(kSteps)) << "reference step events";

    loom::v1::Job job = Submit(JobYaml(name, zero));
    // Kill rank 1 as soon as a checkpoint is committed on disk. The scheduler's view of
    // progress trails the ranks by up to a heartbeat (200 ms here), and so does the workers'
    // step gauge (tried: kills landed 10-22 steps past checkpoint 10), while these 60 steps take
    // about 2 s: waiting for the scheduler to show a checkpoint and steps past it missed the whole
    // run once on a fast machine (a fresh-clone CI run: the job succeeded first). The trainers'
    // pids are found first; the checkpoint directory is then polled every 2 ms, well under one
    // step (~35 ms), so the kill lands within a step of the commit, 50 steps before the end.
    std::map<int, pid_t> trainers;
    EXPECT_TRUE(e2e::Eventually(
        [&] {
          trainers = TrainerPids(job.id());
          return trainers.size() == 2;
        },
        absl::Minutes(4), absl::Milliseconds(5)))
        << "the job's two trainers did not start\n"
        << DaemonLogs();
    if (trainers.size() != 2) return job.id();
    const std::string checkpoint_dir = absl::StrCat(ckpt_root_, "/", job.id());
    int64_t ckpt_seen = -1;
    EXPECT_TRUE(e2e::Eventually(
        [&] {
          if (::kill(trainers[1], 0) != 0) return true;  // rank 1 ended: fails below
          auto newest = storage::NewestCommittedCheckpoint(checkpoint_dir);
          if (newest.ok()) ckpt_seen = newest->step;
          return ckpt_seen >= kCheckpointEvery;
        },
        absl::Minutes(4), absl::Milliseconds(2)))
        << "no checkpoint committed in " << checkpoint_dir << "\n"
        << DaemonLogs();
    EXPECT_EQ(::kill(trainers[1], SIGKILL), 0);

    job = WaitFor(job.id(), loom::v1::JOB_PHASE_SUCCEEDED, absl::Minutes(6));
    EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_SUCCEEDED) << job.message();
    EXPECT_EQ(job.attempt(), 2) << "the scheduler did not restart the attempt";
    EXPECT_EQ(job.progress().step(), kSteps);

    const Trajectory got = Events(job.id());
    EXPECT_EQ(got.losses.count(1), 1u);
    EXPECT_EQ(got.losses.count(2), 1u);
    if (got.losses.count(1) == 0 || got.losses.count(2) == 0) return job.id();
    const std::map<int64_t, double>& first = got.losses.at(1);
    const std::map<int64_t, double>& second = got.losses.at(2);
    // Attempt 2 resumed from a committed checkpoint at or after the one seen before the kill
    // (not from step 0), which attempt 1 had stepped past: the kill was mid-run.
    const int64_t resumed_from = second.begin()->first - 1;
    EXPECT_GE(resumed_from, ckpt_seen);
    EXPECT_EQ(resumed_from % kCheckpointEvery, 0);
    // The kill lands on that checkpoint or a step past it (then that work is lost and redone).
    EXPECT_GE(first.rbegin()->first, resumed_from) << "attempt 2 resumed past attempt 1's steps";
    EXPECT_LT(first.rbegin()->first, kSteps);
    EXPECT_EQ(second.rbegin()->first, kSteps);
    EXPECT_EQ(second.size(), static_cast<size_t>(kSteps - resumed_from));
    // Bit for bit (fp32 on CPU, same world size): attempt 1 up to the kill and attempt 2 from the
    // checkpoint equal the uninterrupted run's losses.
    for (const auto* attempt : {&first, &second}) {
      for (const auto& [step, loss] : *attempt) {
        auto it = want.find(step);
        if (it == want.end()) {
          ADD_FAILURE() << name << ": step " << step << " not in the reference";
          continue;
        }
        EXPECT_EQ(loss, it->second) << name << " step " << step;
      }
    }
    // The final held-out loss too (the last eval event of each run).
    if (reference.evals.count(1) && got.evals.count(2)) {
      EXPECT_EQ(got.evals.at(2).back(), reference.evals.at(1).back());
    } else {
      ADD_FAILURE() << "eval events missing";
    }
    std::cerr << name << ": checkpoint " << ckpt_seen << " seen, killed after step "
              << first.rbegin()->first << ", attempt 2 resumed from step " << resumed_from
              << "\n";
    return job.id();
  }
};

TEST_F(OffloadResumeE2ETest, ZenFlowJobKilledMidRunResumesBitForBit) {
  KillMidRunAndCompare("e2e-zenflow", kZenFlowZero);
}

TEST_F(OffloadResumeE2ETest, SuperOffloadJobKilledMidRunResumesBitForBitAndExportsMetrics) {
  // The worker running rank 0 exports SuperOffload's series (a real trainer's step events;
  // clipping at 1.0 is active on these steps, so speculative steps are rolled back and replayed).
  // A rank's series exist only while its worker reports it (issue 53), so a thread scrapes every
  // worker while the jobs run and keeps the last scrape that had rank 0's series of the killed
  // job's second attempt (series labels: attempt, job_id, rank).
  // Only the killed job has an attempt 2, so a scrape with such a series is that job's.
  std::atomic<bool> done{false};
  absl::Mutex mu;
  std::string sampled;  // guarded by mu
  std::thread sampler([&] {
    const std::string want = "loom_trainer_superoffload_speculated_sub_groups_total{attempt=\"2\",";
    while (!done.load()) {
      for (const auto& info : worker_infos_) {
        absl::StatusOr<std::string> text = testing::HttpGet(info.metrics_url);
        if (!text.ok()) continue;
        for (absl::string_view line : absl::StrSplit(*text, '\n')) {
          if (absl::StartsWith(line, want) && absl::StrContains(line, ",rank=\"0\"}")) {
            absl::MutexLock l(&mu);
            sampled = *text;
            break;
          }
        }
      }
      absl::SleepFor(absl::Milliseconds(20));  // scrape period, not synchronisation
    }
  });
  const std::string id = KillMidRunAndCompare("e2e-superoffload", kSuperOffloadZero);
  done = true;
  sampler.join();
  absl::MutexLock l(&mu);
  ASSERT_FALSE(sampled.empty()) << "no scrape saw rank 0 of attempt 2 of " << id;
  const std::string key = absl::StrCat("{attempt=\"2\",job_id=\"", id, "\",rank=\"0\"");
  auto value = [&](const std::string& series) {
    for (absl::string_view line : absl::StrSplit(sampled, '\n')) {
      if (absl::StartsWith(line, series + " ")) {
        double v = -1;
        if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return v;
      }
    }
    ADD_FAILURE() << series << " missing:\n" << sampled;
    return -1.0;
  };
  const double speculated =
      value("loom_trainer_superoffload_speculated_sub_groups_total" + key + "}");
  const double hits = value("loom_trainer_superoffload_speculation_hits_total" + key + "}");
  const double ratio = value("loom_trainer_superoffload_speculation_hit_ratio" + key + "}");
  const double clip =
      value("loom_trainer_superoffload_rollbacks_total" + key + ",reason=\"clip\"}");
  const double replays =
      value("loom_trainer_superoffload_replays_total" + key + ",reason=\"clip\"}");
  const double overflow =
      value("loom_trainer_superoffload_rollbacks_total" + key + ",reason=\"overflow\"}");
  const double overlap = value("loom_trainer_superoffload_optimizer_overlap_ratio" + key + "}");
  EXPECT_GT(speculated, 0);
  EXPECT_GE(hits, 0);
  EXPECT_DOUBLE_EQ(hits + clip + overflow, speculated);
  EXPECT_EQ(replays, clip);
  EXPECT_EQ(overflow, 0);  // fp32: nothing overflows
  EXPECT_GE(ratio, 0);
  EXPECT_LE(ratio, 1);
  EXPECT_GE(overlap, 0);
  EXPECT_LE(overlap, 1);
}

}  // namespace
}  // namespace loom
