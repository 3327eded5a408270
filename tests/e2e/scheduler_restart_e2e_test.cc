// End to end (issue 18, issue 11): the scheduler dies or is restarted while a job trains, and the
// same attempt carries on. Real loom-scheduler, loom-checkpoint and two loom-worker daemons on
// loopback, real loom-trainer ranks (ZeRO-3 over Gloo), a real SQLite file:
//   * kill -9 of the scheduler mid-job, restarted on the same port: the workers reconnect
//     (bounded backoff, --reconnect_backoff_max), the restarted scheduler gives them its
//     re-registration grace and re-adopts the running ranks;
//   * the same through scripts/local_cluster.sh: `restart scheduler` (SIGTERM) and kill -9 +
//     `restart scheduler`, each mid-job; `restart` of the other daemons keeps their addresses.
// Each outage lasts until every worker has seen its heartbeats fail (so the reconnect delay is
// part of what is tested). Proof of "the same attempt continued": a step strictly between 0 and
// the total is observed before the outage, a later step of attempt 1 while RUNNING after it, the
// job succeeds as attempt 1, no node is declared lost and no worker ran an attempt 2.
// The daemons and polls are the shared fixture's (tests/e2e/testing/e2e_cluster.h).
#include <grpcpp/grpcpp.h>

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/daemon.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "tests/e2e/testing/e2e_cluster.h"
#include "tests/testing/subprocess.h"

namespace loom {
namespace {

using ::loom::e2e::Eventually;
using ::loom::e2e::MetricSample;
using ::loom::testing::RunfilePath;
using ::loom::testing::Subprocess;

// Long enough that the job outlives two scheduler outages (each several seconds of failed
// heartbeats and a restart, fixed in wall time) on a fast, idle machine: at 2,000 steps the job
// (about 65 steps/s there once the in-memory optimizer became the fused kernel) ended during the
// second outage of RestartSchedulerMidJobKeepsItsAddressAndTheAttempt. On a machine 3x slower
// the two cases take about 10 minutes of the large size's 15.
constexpr int kSteps = 6000;

std::string JobYaml() {
  return absl::StrCat("name: e2e-restart", e2e::kTinyModelYaml, R"(deepspeed_config:
  train_micro_batch_size_per_gpu: 4
  gradient_accumulation_steps: 1
  optimizer: {type: AdamW, params: {lr: 0.003}}
  zero_optimization: {stage: 3}
resources: {num_ranks: 2, accelerator: cpu}
training: {steps: )",
                      kSteps, R"(, sequence_length: 32, seed: 5, eval_batches: 1}
checkpoint: {interval_steps: 100000}
)");
}

bool FileExists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

double Heartbeats(const std::string& worker_metrics_url, const char* result) {
  return MetricSample(worker_metrics_url,
                      absl::StrCat("loom_worker_heartbeats_total{result=\"", result, "\"}"));
}

// What both tests share: a job client and the checks around one scheduler outage.
class RestartTestBase : public e2e::E2EClusterTest {
 protected:
  // GetJob; UNAVAILABLE (a scheduler being restarted) answers false.
  bool Get(const std::string& id, loom::v1::Job* job) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    loom::v1::GetJobRequest req;
    req.set_job_id(id);
    grpc::Status s = jobs_->GetJob(&ctx, req, job);
    if (!s.ok() && s.error_code() != grpc::StatusCode::UNAVAILABLE) {
      ADD_FAILURE() << "GetJob " << id << ": " << s.error_message();
    }
    return s.ok();
  }

  std::string Submit() { return E2EClusterTest::Submit(JobYaml()).id(); }

  // Waits until attempt 1 of the job is RUNNING at a step > `after` (and < the total: still
  // training, so the step comes from the running ranks). Returns that step, or -1.
  int64_t WaitForRunningStepAfter(const std::string& id, int64_t after, absl::Duration timeout) {
    loom::v1::Job job;
    const bool ok = Eventually(
        [&] {
          return Get(id, &job) && job.phase() == loom::v1::JOB_PHASE_RUNNING &&
                 job.progress().step() > after;
        },
        timeout);
    if (!ok) {
      ADD_FAILURE() << "job " << id << " never RUNNING past step " << after << ": "
                    << loom::v1::JobPhase_Name(job.phase()) << " step " << job.progress().step()
                    << " attempt " << job.attempt() << " (" << job.message() << ")";
      return -1;
    }
    EXPECT_EQ(job.attempt(), 1) << job.message();
    EXPECT_LT(job.progress().step(), kSteps) << "the job ended before the outage";
    return job.progress().step();
  }

  loom::v1::Job WaitForEnd(const std::string& id, absl::Duration timeout) {
    loom::v1::Job job;
    Eventually(
        [&] {
          return Get(id, &job) && (job.phase() == loom::v1::JOB_PHASE_SUCCEEDED ||
                                   job.phase() == loom::v1::JOB_PHASE_FAILED ||
                                   job.phase() == loom::v1::JOB_PHASE_CANCELLED);
        },
        timeout);
    return job;
  }

  // Waits until every worker has had `n` more failed heartbeats than in `errors_before`: the
  // scheduler is down and each worker's channel is in reconnect backoff.
  void WaitForFailedHeartbeats(const std::vector<std::string>& worker_metrics,
                               const std::vector<double>& errors_before, int n) {
    for (size_t i = 0; i < worker_metrics.size(); ++i) {
      EXPECT_TRUE(Eventually(
          [&] { return Heartbeats(worker_metrics[i], "error") >= errors_before[i] + n; },
          absl::Seconds(30)))
          << "worker " << i << " did not notice the scheduler outage";
    }
  }

  // Waits until every worker heartbeated successfully again; returns how long that took.
  absl::Duration WaitForHeartbeatsBack(const std::vector<std::string>& worker_metrics) {
    const absl::Time back = absl::Now();
    std::vector<double> ok_before;
    for (const std::string& m : worker_metrics) ok_before.push_back(Heartbeats(m, "ok"));
    for (size_t i = 0; i < worker_metrics.size(); ++i) {
      EXPECT_TRUE(Eventually([&] { return Heartbeats(worker_metrics[i], "ok") > ok_before[i]; },
                             absl::Seconds(30)))
          << "worker " << i << " never heartbeated the restarted scheduler";
    }
    return absl::Now() - back;
  }

  // The end of a job that lived through scheduler outages as one attempt.
  void ExpectSucceededAsOneAttempt(const std::string& id, const std::string& scheduler_metrics,
                                   const std::vector<std::string>& work_dirs) {
    loom::v1::Job job = WaitForEnd(id, absl::Minutes(8));
    ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_SUCCEEDED) << job.message();
    EXPECT_EQ(job.attempt(), 1);
    EXPECT_EQ(job.progress().step(), kSteps);
    // No node was declared lost (the restarted scheduler's view) and none ran an attempt 2.
    EXPECT_EQ(MetricSample(scheduler_metrics, "loom_nodes{state=\"lost\"}"), 0);
    EXPECT_EQ(MetricSample(scheduler_metrics, "loom_nodes{state=\"live\"}"), 2);
    for (const std::string& dir : work_dirs) {
      EXPECT_TRUE(FileExists(absl::StrCat(dir, "/", id, "/attempt_1/rank_0.log")) ||
                  FileExists(absl::StrCat(dir, "/", id, "/attempt_1/rank_1.log")))
          << dir;
      EXPECT_FALSE(FileExists(absl::StrCat(dir, "/", id, "/attempt_2"))) << dir;
    }
  }
};

// The daemons started directly, as the other end-to-end tests do.
class SchedulerRestartE2ETest : public RestartTestBase {
 protected:
  void SetUp() override {
    RestartTestBase::SetUp();
    // The scheduler with its defaults (heartbeat timeout, re-registration grace) and the
    // workers' default --reconnect_backoff_max: the delay under test.
    e2e::ClusterOptions options;
    options.workers_share_checkpoint_root = false;
    const absl::Status started = StartCluster(options);
    ASSERT_TRUE(started.ok()) << started;
    for (int i = 0; i < 2; ++i) {
      worker_metrics_.push_back(worker_infos_[i].metrics_url);
      work_dirs_.push_back(absl::StrCat(tmp_, "/work-", i));
    }
  }

  std::vector<std::string> worker_metrics_, work_dirs_;
};

TEST_F(SchedulerRestartE2ETest, SchedulerKilledMidJobReadoptsTheSameAttempt) {
  const std::string id = Submit();
  ASSERT_FALSE(id.empty());
  // Mid-run: a step strictly between 0 and the total, observed just before the kill.
  const int64_t before_kill = WaitForRunningStepAfter(id, 0, absl::Minutes(2));
  ASSERT_GT(before_kill, 0);
  ASSERT_LT(before_kill, kSteps);
  std::vector<double> errors;
  for (const std::string& m : worker_metrics_) errors.push_back(Heartbeats(m, "error"));

  const std::string old_address = scheduler_info_.grpc_address;
  scheduler_->Kill();  // SIGKILL
  WaitForFailedHeartbeats(worker_metrics_, errors, 5);
  ASSERT_TRUE(
      StartScheduler("scheduler-2", old_address.substr(old_address.rfind(':') + 1)).ok());
  ASSERT_EQ(scheduler_info_.grpc_address, old_address);
  // Within a couple of seconds (reconnect backoff capped at 1 s, heartbeats every 200 ms).
  const absl::Duration reconnect = WaitForHeartbeatsBack(worker_metrics_);
  EXPECT_LT(reconnect, absl::Seconds(3)) << "workers took " << reconnect << " to come back";

  // The re-adopted attempt continued: attempt 1 running at a later step under the new scheduler.
  const int64_t after = WaitForRunningStepAfter(id, before_kill, absl::Minutes(1));
  EXPECT_GT(after, before_kill);
  ExpectSucceededAsOneAttempt(id, scheduler_info_.metrics_url, work_dirs_);
}

// scripts/local_cluster.sh, run as a user runs it (LOOM_HOME in the test's directory, LOOM_BIN
// the test's runfiles).
class LocalClusterRestartTest : public RestartTestBase {
 protected:
  void SetUp() override {
    RestartTestBase::SetUp();
    home_ = absl::StrCat(tmp_, "/loom-home");
    int code = Script({"start", "--workers", "2"});
    ASSERT_EQ(code, 0) << Output();
    started_ = true;
    Connect(Ready("scheduler").grpc_address);
    worker_metrics_ = {Ready("worker-0").metrics_url, Ready("worker-1").metrics_url};
  }
  void TearDown() override {
    if (started_) {
      EXPECT_EQ(Script({"stop"}), 0) << Output();
    }
  }

  // Runs the script with `args`; returns its exit code (output in Output()).
  int Script(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"/usr/bin/env", absl::StrCat("LOOM_HOME=", home_),
                                     absl::StrCat("LOOM_BIN=", RunfilePath("")), "/bin/bash",
                                     RunfilePath("scripts/local_cluster.sh")};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string out = absl::StrCat(tmp_, "/local_cluster.out");
    ::unlink(out.c_str());
    auto p = Subprocess::Start(argv, out);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? testing::ExitCode(p->Wait(absl::Minutes(2))) : -1;
  }
  std::string Output() { return testing::Tail(absl::StrCat(tmp_, "/local_cluster.out")); }

  ReadyInfo Ready(const std::string& name) {
    absl::StatusOr<ReadyInfo> info = ReadReadyFile(absl::StrCat(home_, "/cluster/", name, ".json"));
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? *info : ReadyInfo();
  }
  pid_t Pid(const std::string& name) {
    auto text = ReadFile(absl::StrCat(home_, "/cluster/", name, ".pid"));
    int pid = -1;
    if (!text.ok() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &pid)) return -1;
    return pid;
  }

  // One scheduler outage mid-job: `kill9` = SIGKILL first, then `restart scheduler`.
  int64_t OutageMidJob(const std::string& id, int64_t before, bool kill9) {
    std::vector<double> errors;
    for (const std::string& m : worker_metrics_) errors.push_back(Heartbeats(m, "error"));
    const ReadyInfo old = Ready("scheduler");
    if (kill9) {
      EXPECT_EQ(::kill(Pid("scheduler"), SIGKILL), 0);
      WaitForFailedHeartbeats(worker_metrics_, errors, 5);
    }
    EXPECT_EQ(Script({"restart", "scheduler"}), 0) << Output();
    const ReadyInfo now = Ready("scheduler");
    EXPECT_EQ(now.grpc_address, old.grpc_address);
    EXPECT_EQ(now.metrics_url, old.metrics_url);
    const absl::Duration reconnect = WaitForHeartbeatsBack(worker_metrics_);
    EXPECT_LT(reconnect, absl::Seconds(3)) << "workers took " << reconnect << " to come back";
    const int64_t after = WaitForRunningStepAfter(id, before, absl::Minutes(1));
    EXPECT_GT(after, before);
    return after;
  }

  std::string home_;
  bool started_ = false;
  std::vector<std::string> worker_metrics_;
};

TEST_F(LocalClusterRestartTest, RestartSchedulerMidJobKeepsItsAddressAndTheAttempt) {
  const std::string id = Submit();
  ASSERT_FALSE(id.empty());
  const int64_t first = WaitForRunningStepAfter(id, 0, absl::Minutes(2));
  ASSERT_GT(first, 0);
  const int64_t second = OutageMidJob(id, first, /*kill9=*/false);
  OutageMidJob(id, second, /*kill9=*/true);
  ExpectSucceededAsOneAttempt(id, Ready("scheduler").metrics_url,
                              {absl::StrCat(home_, "/work/worker-0"),
                               absl::StrCat(home_, "/work/worker-1")});

  // Every other daemon restarts on its address too; the gateway then serves the job again.
  for (const char* name : {"checkpoint", "gateway", "worker-1"}) {
    const ReadyInfo old = Ready(name);
    ASSERT_EQ(Script({"restart", name}), 0) << name << ": " << Output();
    const ReadyInfo now = Ready(name);
    EXPECT_EQ(now.grpc_address, old.grpc_address) << name;
    EXPECT_EQ(now.metrics_url, old.metrics_url) << name;
    EXPECT_EQ(now.http_url, old.http_url) << name;
  }
  EXPECT_TRUE(Eventually(
      [&] {
        auto body = testing::HttpGet(absl::StrCat(Ready("gateway").http_url, "/v1/jobs/", id));
        return body.ok() && absl::StrContains(*body, "SUCCEEDED");
      },
      absl::Seconds(20)));
  // The restarted worker registers again (its /readyz).
  const std::string worker_base = Ready("worker-1").metrics_url.substr(
      0, Ready("worker-1").metrics_url.rfind("/metrics"));
  EXPECT_TRUE(Eventually([&] { return testing::HttpGet(worker_base + "/readyz").ok(); },
                         absl::Seconds(20)));
  // Bad input: an unknown daemon is refused naming what exists.
  EXPECT_EQ(Script({"restart", "no-such-daemon"}), 2);
  EXPECT_TRUE(absl::StrContains(Output(), "no daemon 'no-such-daemon'")) << Output();
}

}  // namespace
}  // namespace loom
