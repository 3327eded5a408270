#include "worker/worker_daemon.h"

#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace loom::worker {
namespace {

using ::loom::testing::StatusIs;

// Fake scheduler: records every request and replies with queued responses.
class FakeSchedulerClient : public SchedulerClient {
 public:
  absl::StatusOr<loom::v1::RegisterWorkerResponse> RegisterWorker(
      const loom::v1::RegisterWorkerRequest& request) override {
    absl::MutexLock l(&mu_);
    registrations.push_back(request);
    return loom::v1::RegisterWorkerResponse();
  }
  absl::StatusOr<loom::v1::HeartbeatResponse> Heartbeat(
      const loom::v1::HeartbeatRequest& request) override {
    absl::MutexLock l(&mu_);
    heartbeats.push_back(request);
    if (!next_status.ok()) {
      absl::Status s = next_status;
      next_status = absl::OkStatus();
      return s;
    }
    if (replies.empty()) return loom::v1::HeartbeatResponse();
    loom::v1::HeartbeatResponse r = replies.front();
    replies.pop_front();
    return r;
  }
  absl::Mutex mu_;
  std::vector<loom::v1::RegisterWorkerRequest> registrations;
  std::vector<loom::v1::HeartbeatRequest> heartbeats;
  std::deque<loom::v1::HeartbeatResponse> replies;
  absl::Status next_status;
};

std::string FakeTrainer() {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/loom/worker/testdata/fake_trainer.sh");
}

loom::v1::RankAssignment Assignment(const std::string& job, const std::string& name, int rank = 0) {
  loom::v1::RankAssignment a;
  a.set_job_id(job);
  a.set_attempt(1);
  a.set_rank(rank);
  a.set_world_size(1);
  a.set_master_addr("127.0.0.1");
  a.mutable_spec()->set_name(name);
  a.set_checkpoint_dir(absl::StrCat(std::getenv("TEST_TMPDIR"), "/ckpt"));
  return a;
}

// The job, attempt and rank labels' start of the per-rank series of the tests' jobs.
const std::string kOk = "attempt=\"1\",job_id=\"job-ok\",";
const std::string kSuper = "attempt=\"1\",job_id=\"job-super\",";
const std::string kHang = "attempt=\"1\",job_id=\"job-hang\",";

class WorkerDaemonTest : public ::testing::Test {
 protected:
  WorkerOptions Options(const std::string& trainer) {
    WorkerOptions o;
    o.node_id = "node-a";
    o.inventory.set_slots(2);
    o.inventory.set_accelerator(loom::v1::ACCELERATOR_KIND_CPU);
    o.trainer_path = trainer;
    o.work_dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/work");
    o.stop_grace = absl::Seconds(2);
    o.terminal_reports = 100;
    return o;
  }

  // Ticks until the last heartbeat reports `job` in `state`, or fails after 10 s.
  loom::v1::RankStatus TickUntil(WorkerDaemon& d, const std::string& job, loom::v1::RankState state) {
    absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      EXPECT_TRUE(d.Tick().ok());
      absl::MutexLock l(&client_.mu_);
      for (const auto& r : client_.heartbeats.back().ranks()) {
        if (r.job_id() == job && r.state() == state) return r;
      }
      client_.mu_.Unlock();
      absl::SleepFor(absl::Milliseconds(20));
      client_.mu_.Lock();
    }
    ADD_FAILURE() << "rank of " << job << " never reached " << loom::v1::RankState_Name(state);
    return {};
  }

  FakeSchedulerClient client_;
  prometheus::Registry registry_;
  WorkerMetrics metrics_{registry_};
};

TEST_F(WorkerDaemonTest, OptionsValidateNamesField) {
  WorkerOptions o = Options(FakeTrainer());
  o.inventory.set_slots(0);
  absl::Status s = o.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("inventory.slots"), std::string::npos) << s;
}

TEST_F(WorkerDaemonTest, RunsAssignedRankAndReportsProgressAndSuccess) {
  WorkerDaemon d(Options(FakeTrainer()), &client_, &metrics_);
  loom::v1::HeartbeatResponse start;
  *start.add_start() = Assignment("job-ok", "ok");
  client_.replies.push_back(start);
  ASSERT_TRUE(d.Tick().ok());
  ASSERT_EQ(client_.registrations.size(), 1u);
  EXPECT_EQ(client_.registrations[0].inventory().slots(), 2);

  loom::v1::RankStatus st = TickUntil(d, "job-ok", loom::v1::RANK_STATE_SUCCEEDED);
  EXPECT_EQ(st.rendezvous_port(), 43210);
  EXPECT_EQ(st.progress().step(), 2);
  EXPECT_DOUBLE_EQ(st.progress().loss(), 4.25);
  EXPECT_DOUBLE_EQ(st.progress().tokens_per_second(), 120);
  EXPECT_DOUBLE_EQ(st.progress().initial_eval_loss(), 5.5);
  EXPECT_DOUBLE_EQ(st.progress().eval_loss(), 4.5);
  EXPECT_EQ(st.progress().eval_step(), 2);  // the final evaluation, after the last step
  EXPECT_EQ(st.progress().last_checkpoint_step(), 2);
  EXPECT_EQ(st.exit_code(), 0);
  // The spec reached the trainer as JSON with proto field names.
  auto spec = absl::StrCat(Options(FakeTrainer()).work_dir, "/job-ok/attempt_1/spec.json");
  EXPECT_EQ(std::system(absl::StrCat("grep -q '\"name\"' ", spec).c_str()), 0);

  // Metrics saw the heartbeats.
  std::string text = prometheus::TextSerializer().Serialize(registry_.Collect());
  EXPECT_NE(text.find("loom_worker_heartbeats_total{result=\"ok\"}"), std::string::npos) << text;
  // The trainer gauges hold the succeeded rank's final step and loss, not the last running tick.
  for (const std::string& line : {"loom_trainer_step{" + kOk + "rank=\"0\"} 2\n",
                                  "loom_trainer_loss{" + kOk + "rank=\"0\"} 4.25\n",
                                  "loom_trainer_last_checkpoint_step{" + kOk + "rank=\"0\"} 2\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << " missing:\n" << text;
  }
}

TEST_F(WorkerDaemonTest, FailedRankReportsTrainerError) {
  WorkerDaemon d(Options(FakeTrainer()), &client_, &metrics_);
  loom::v1::HeartbeatResponse start;
  *start.add_start() = Assignment("job-fail", "fail");
  client_.replies.push_back(start);
  loom::v1::RankStatus st = TickUntil(d, "job-fail", loom::v1::RANK_STATE_FAILED);
  EXPECT_EQ(st.exit_code(), 3);
  EXPECT_EQ(st.error(), "CUDA out of memory (simulated)");
}

TEST_F(WorkerDaemonTest, CrashWithoutErrorEventReportsLastStderrLine) {
  WorkerDaemon d(Options(FakeTrainer()), &client_, &metrics_);
  loom::v1::HeartbeatResponse start;
  *start.add_start() = Assignment("job-crash", "crash");
  client_.replies.push_back(start);
  loom::v1::RankStatus st = TickUntil(d, "job-crash", loom::v1::RANK_STATE_FAILED);
  EXPECT_EQ(st.exit_code(), 139);
  EXPECT_EQ(st.error(), "fake trainer: segfault-like crash on rank 0");
}

TEST_F(WorkerDaemonTest, StopRequestStopsRunningRank) {
  WorkerDaemon d(Options(FakeTrainer()), &client_, &metrics_);
  loom::v1::HeartbeatResponse start;
  *start.add_start() = Assignment("job-hang", "hang");
  client_.replies.push_back(start);
  TickUntil(d, "job-hang", loom::v1::RANK_STATE_RUNNING);
  EXPECT_EQ(d.RunningRanks(), 1);
  loom::v1::HeartbeatResponse stop;
  *stop.add_stop() = Assignment("job-hang", "hang");
  {
    absl::MutexLock l(&client_.mu_);
    client_.replies.push_back(stop);
  }
  loom::v1::RankStatus st = TickUntil(d, "job-hang", loom::v1::RANK_STATE_STOPPED);
  EXPECT_EQ(st.exit_code(), 143);
  EXPECT_EQ(d.RunningRanks(), 0);
}

// Regression (break-it pass, 2026-12-05): two daemons with one --node_id both ran the same rank.
// Every registration and heartbeat carries this process's instance id; when the scheduler says
// another instance owns the node (ABORTED), the daemon stops its ranks, never registers again,
// and Run() returns (loom-worker then exits 1).
TEST_F(WorkerDaemonTest, SupersededInstanceStopsItsRanksAndShutsDown) {
  WorkerDaemon d(Options(FakeTrainer()), &client_, &metrics_);
  loom::v1::HeartbeatResponse start;
  *start.add_start() = Assignment("job-hang", "hang");
  client_.replies.push_back(start);
  TickUntil(d, "job-hang", loom::v1::RANK_STATE_RUNNING);
  {
    absl::MutexLock l(&client_.mu_);
    ASSERT_EQ(client_.registrations.size(), 1u);
    EXPECT_FALSE(d.instance_id().empty());
    EXPECT_EQ(client_.registrations[0].instance_id(), d.instance_id());
    EXPECT_EQ(client_.heartbeats.back().instance_id(), d.instance_id());
    client_.next_status = absl::AbortedError("node n1 was registered by another worker instance");
  }
  EXPECT_EQ(d.Tick().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(d.Superseded());
  EXPECT_FALSE(d.Registered());
  EXPECT_EQ(d.Tick().code(), absl::StatusCode::kFailedPrecondition);  // and stays out
  d.Run();  // returns at once: the daemon shut itself down
  {
    absl::MutexLock l(&client_.mu_);
    EXPECT_EQ(client_.registrations.size(), 1u);  // never registered again
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (d.RunningRanks() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(d.RunningRanks(), 0);  // the trainer was stopped (SIGTERM)
}

// Regression: loom-worker blocks SIGTERM in every thread (a sigwait thread handles it); trainers
// inherited that mask, ignored the worker's SIGTERM and were SIGKILLed after the grace period.
TEST_F(WorkerDaemonTest, TrainerStartsWithNoBlockedSignalsEvenIfTheDaemonBlocksSigterm) {
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGINT);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &block, &old), 0);
  WorkerDaemon d(Options(FakeTrainer()), &client_, &metrics_);
  loom::v1::HeartbeatResponse start;
  *start.add_start() = Assignment("job-mask", "sigmask");
  client_.replies.push_back(start);
  loom::v1::RankStatus st = TickUntil(d, "job-mask", loom::v1::RANK_STATE_FAILED);
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, &old, nullptr), 0);
  EXPECT_EQ(st.error(), "SigBlk=0000000000000000");
}

// SuperOffload's step-event counts reach Prometheus: cumulative counts as counters (not counted
// twice over repeated ticks), the hit rate from them, rollbacks and replays per reason, and the
// last step's overlap fraction; a job without SuperOffload exports none of these series.
TEST_F(WorkerDaemonTest, SuperOffloadRankExportsSpeculationRollbackAndOverlapMetrics) {
  WorkerDaemon d(Options(FakeTrainer()), &client_, &metrics_);
  loom::v1::HeartbeatResponse start;
  *start.add_start() = Assignment("job-super", "superoffload");
  client_.replies.push_back(start);
  TickUntil(d, "job-super", loom::v1::RANK_STATE_RUNNING);
  std::string text;
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    ASSERT_TRUE(d.Tick().ok());
    text = prometheus::TextSerializer().Serialize(registry_.Collect());
    const std::string done = "loom_trainer_last_checkpoint_step{" + kSuper + "rank=\"0\"} 2";
    if (text.find(done) != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(d.Tick().ok());  // a repeated tick must not count the same steps again
  text = prometheus::TextSerializer().Serialize(registry_.Collect());
  for (const std::string& line :
       {"loom_trainer_superoffload_speculated_sub_groups_total{" + kSuper + "rank=\"0\"} 8\n",
        "loom_trainer_superoffload_speculation_hits_total{" + kSuper + "rank=\"0\"} 6\n",
        "loom_trainer_superoffload_speculation_hit_ratio{" + kSuper + "rank=\"0\"} 0.75\n",
        "loom_trainer_superoffload_rollbacks_total{" + kSuper + "rank=\"0\",reason=\"overflow\"} 1\n",
        "loom_trainer_superoffload_rollbacks_total{" + kSuper + "rank=\"0\",reason=\"clip\"} 1\n",
        "loom_trainer_superoffload_replays_total{" + kSuper + "rank=\"0\",reason=\"clip\"} 1\n",
        "loom_trainer_superoffload_optimizer_overlap_ratio{" + kSuper + "rank=\"0\"} 0.875\n",
        "loom_trainer_superoffload_optimizer_work_seconds{" + kSuper + "rank=\"0\"} 0.25\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << " missing:\n" << text;
  }
  loom::v1::HeartbeatResponse stop;
  *stop.add_stop() = Assignment("job-super", "superoffload");
  {
    absl::MutexLock l(&client_.mu_);
    client_.replies.push_back(stop);
  }
  TickUntil(d, "job-super", loom::v1::RANK_STATE_STOPPED);
}

TEST_F(WorkerDaemonTest, RunningRankExportsStepTimeMemoryAndCheckpointGauges) {
  WorkerDaemon d(Options(FakeTrainer()), &client_, &metrics_);
  loom::v1::HeartbeatResponse start;
  *start.add_start() = Assignment("job-hang", "hang");
  client_.replies.push_back(start);
  TickUntil(d, "job-hang", loom::v1::RANK_STATE_RUNNING);
  const double before = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  // The fake trainer's step and checkpoint events arrive shortly after "started".
  std::string text;
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    ASSERT_TRUE(d.Tick().ok());
    text = prometheus::TextSerializer().Serialize(registry_.Collect());
    const std::string done = "loom_trainer_last_checkpoint_step{" + kHang + "rank=\"0\"} 1";
    if (text.find(done) != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  const std::string r0 = kHang + "rank=\"0\"}";
  for (const std::string& line :
       {"loom_trainer_step_seconds{" + r0 + " 0.25",
        "loom_trainer_zero_partition_bytes{" + r0 + " 4096",
        "loom_trainer_zero_gathered_peak_bytes{" + r0 + " 16384",
        "loom_trainer_last_checkpoint_step{" + r0 + " 1",
        "loom_trainer_communication_seconds{" + r0 + " 0.125",
        "loom_trainer_stall_seconds{" + r0 + " 0.1875",
        "loom_trainer_optimizer_rollbacks_total{" + r0 + " 2",
        "loom_trainer_param_bytes{" + r0 + " 1024",
        "loom_trainer_optimizer_state_bytes{" + r0 + " 8192",
        "loom_trainer_activation_offload_peak_bytes{" + r0 + " 512",
        "loom_trainer_memory_peak_bytes{" + r0 + " 9728",
        "loom_trainer_zenflow_stall_seconds{" + r0 + " 0.03125",
        "loom_trainer_zenflow_selected_mass_ratio{" + r0 + " 0.5",
        "loom_trainer_zenflow_update_interval_steps{" + r0 + " 4",
        "loom_trainer_zenflow_moved_bytes_total{" + r0 + " 65536"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << " missing:\n" << text;
  }
  // The step and checkpoint timestamps are current Unix times (within a minute of the test).
  for (const std::string& name : {"loom_trainer_last_step_timestamp_seconds{" + r0 + " ",
                                  "loom_trainer_last_checkpoint_timestamp_seconds{" + r0 + " ",
                                  std::string("\nloom_worker_last_heartbeat_timestamp_seconds ")}) {
    size_t at = text.find(name);
    ASSERT_NE(at, std::string::npos) << name << " missing:\n" << text;
    double t = std::strtod(text.c_str() + at + name.size(), nullptr);
    EXPECT_NEAR(t, before, 60) << name;
  }
  EXPECT_NE(text.find("loom_worker_rank_info{attempt=\"1\",job_id=\"job-hang\",rank=\"0\"} 1"),
            std::string::npos) << text;
  const std::string accel = absl::StrCat(
      "loom_rank_accelerator_info{accelerator_index=\"0\",job_id=\"job-hang\",node=\"",
      Options(FakeTrainer()).node_id, "\",rank=\"0\"} 1");
  EXPECT_NE(text.find(accel), std::string::npos) << accel << " missing:\n" << text;
  // Not a SuperOffload job: none of its series.
  EXPECT_EQ(text.find("loom_trainer_superoffload_speculation_hit_ratio{"), std::string::npos)
      << text;
  // Repeated ticks do not count the same rollbacks again.
  ASSERT_TRUE(d.Tick().ok());
  text = prometheus::TextSerializer().Serialize(registry_.Collect());
  EXPECT_NE(text.find("loom_trainer_optimizer_rollbacks_total{" + r0 + " 2\n"), std::string::npos)
      << text;
  loom::v1::HeartbeatResponse stop;
  *stop.add_stop() = Assignment("job-hang", "hang");
  {
    absl::MutexLock l(&client_.mu_);
    client_.replies.push_back(stop);
  }
  TickUntil(d, "job-hang", loom::v1::RANK_STATE_STOPPED);
  // The info series goes away with the rank, and so do its timestamps (an ended rank does not
  // age); the last values stay while the worker still reports the rank.
  text = prometheus::TextSerializer().Serialize(registry_.Collect());
  EXPECT_EQ(text.find("loom_worker_rank_info{"), std::string::npos) << text;
  EXPECT_EQ(text.find("loom_trainer_last_step_timestamp_seconds{"), std::string::npos) << text;
  EXPECT_EQ(text.find("loom_trainer_last_checkpoint_timestamp_seconds{"), std::string::npos);
  EXPECT_EQ(text.find("loom_rank_accelerator_info{"), std::string::npos) << text;
  EXPECT_NE(text.find("loom_trainer_step{" + r0 + " 1"), std::string::npos) << text;
}

// Issue 53: an attempt resumed from step 40 has checkpoint step 40 (it read 0 until the attempt
// wrote its own, 72 steps "at risk" where the truth was 32) and that checkpoint's commit time
// (it read the attempt's start, so a crash-looping job's checkpoint never aged), and its tokens
// are a counter.
TEST_F(WorkerDaemonTest, ResumedRankReportsTheCheckpointItResumedFrom) {
  WorkerDaemon d(Options(FakeTrainer()), &client_, &metrics_);
  // The step directory resumed from, committed at Unix time 1,700,000,000.5 (its newest file).
  const std::string step_dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/ckpt/step_40");
  std::filesystem::create_directories(step_dir);
  for (const char* name : {"rank_0.shard", "manifest_0.json"}) {
    const std::string path = absl::StrCat(step_dir, "/", name);
    std::ofstream(path) << "x";
    const long sec = std::string(name) == "manifest_0.json" ? 1700000000 : 1699999000;
    const struct timeval times[2] = {{sec, 500000}, {sec, 500000}};
    ASSERT_EQ(::utimes(path.c_str(), times), 0) << path;
  }
  loom::v1::HeartbeatResponse start;
  *start.add_start() = Assignment("job-resumed", "resumed");
  start.mutable_start(0)->set_resume_from(step_dir);
  client_.replies.push_back(start);
  TickUntil(d, "job-resumed", loom::v1::RANK_STATE_RUNNING);
  const std::string key = "{attempt=\"1\",job_id=\"job-resumed\",rank=\"0\"}";
  std::string text;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {  // until the step event has been read
    ASSERT_TRUE(d.Tick().ok());
    text = prometheus::TextSerializer().Serialize(registry_.Collect());
    if (text.find("loom_trainer_step" + key + " 42\n") != std::string::npos &&
        text.find("loom_trainer_tokens_total" + key + " 100\n") != std::string::npos) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_NE(text.find("loom_trainer_last_checkpoint_step" + key + " 40\n"), std::string::npos)
      << text;
  const std::string stamp = "loom_trainer_last_checkpoint_timestamp_seconds" + key + " ";
  const size_t at = text.find(stamp);
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_DOUBLE_EQ(std::stod(text.substr(at + stamp.size())), 1700000000.5) << text;
  EXPECT_NE(text.find("loom_trainer_tokens_total" + key + " 100\n"), std::string::npos) << text;
  {
    absl::MutexLock l(&client_.mu_);
    EXPECT_EQ(client_.heartbeats.back().ranks(0).progress().last_checkpoint_step(), 40);
  }
  loom::v1::HeartbeatResponse stop;
  *stop.add_stop() = Assignment("job-resumed", "resumed");
  {
    absl::MutexLock l(&client_.mu_);
    client_.replies.push_back(stop);
  }
  TickUntil(d, "job-resumed", loom::v1::RANK_STATE_STOPPED);
}

TEST_F(WorkerDaemonTest, DuplicateAssignmentStartsOneProcess) {
  WorkerDaemon d(Options(FakeTrainer()), &client_, &metrics_);
  loom::v1::HeartbeatResponse start;
  *start.add_start() = Assignment("job-hang", "hang");
  client_.replies.push_back(start);
  client_.replies.push_back(start);
  ASSERT_TRUE(d.Tick().ok());
  ASSERT_TRUE(d.Tick().ok());
  EXPECT_EQ(d.RunningRanks(), 1);
}

TEST_F(WorkerDaemonTest, UnstartableTrainerIsReportedAsFailedRank) {
  WorkerDaemon d(Options("/nonexistent/loom-trainer"), &client_, &metrics_);
  loom::v1::HeartbeatResponse start;
  *start.add_start() = Assignment("job-x", "ok");
  client_.replies.push_back(start);
  loom::v1::RankStatus st = TickUntil(d, "job-x", loom::v1::RANK_STATE_FAILED);
  EXPECT_NE(st.error().find("could not start the trainer"), std::string::npos) << st.error();
}

TEST_F(WorkerDaemonTest, ReRegistersWhenSchedulerForgetsNode) {
  WorkerDaemon d(Options(FakeTrainer()), &client_, &metrics_);
  ASSERT_TRUE(d.Tick().ok());
  client_.next_status = absl::NotFoundError("unknown node");
  EXPECT_EQ(d.Tick().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(d.Tick().ok());
  EXPECT_EQ(client_.registrations.size(), 2u);
}

TEST_F(WorkerDaemonTest, GracefulStopRequestCheckpointsAndStops) {
  WorkerDaemon d(Options(FakeTrainer()), &client_, &metrics_);
  loom::v1::HeartbeatResponse start;
  *start.add_start() = Assignment("job-graceful", "graceful");
  client_.replies.push_back(start);
  TickUntil(d, "job-graceful", loom::v1::RANK_STATE_RUNNING);
  loom::v1::HeartbeatResponse stop;
  *stop.add_stop() = Assignment("job-graceful", "graceful");
  stop.mutable_stop(0)->set_graceful_stop(true);
  {
    absl::MutexLock l(&client_.mu_);
    client_.replies.push_back(stop);
  }
  loom::v1::RankStatus st = TickUntil(d, "job-graceful", loom::v1::RANK_STATE_STOPPED);
  EXPECT_TRUE(st.graceful_stop());
  EXPECT_EQ(st.exit_code(), 0);
  EXPECT_EQ(st.progress().last_checkpoint_step(), 3);
}

// Regression (CI, 2026-12-05): rank 1 stopped on rank 0's SIGUSR1 before worker-1's own stop
// entry arrived, and was reported FAILED, which made the scheduler abandon a stop that had
// completed. A "stopped" event with a checkpoint step and exit 0 is a graceful stop either way.
TEST_F(WorkerDaemonTest, RankStoppedByAPeerBeforeItsOwnStopRequestIsAGracefulStop) {
  WorkerDaemon d(Options(FakeTrainer()), &client_, &metrics_);
  loom::v1::HeartbeatResponse start;
  *start.add_start() = Assignment("job-peer-stop", "peer_stopped");
  client_.replies.push_back(start);
  loom::v1::RankStatus st = TickUntil(d, "job-peer-stop", loom::v1::RANK_STATE_STOPPED);
  EXPECT_TRUE(st.graceful_stop());
  EXPECT_EQ(st.exit_code(), 0);
  EXPECT_EQ(st.progress().last_checkpoint_step(), 4);
  EXPECT_EQ(st.error(), "");
}

TEST_F(WorkerDaemonTest, OutputLinesReachTheSchedulerOnceAndAgainAfterAFailedHeartbeat) {
  WorkerDaemon d(Options(FakeTrainer()), &client_, &metrics_);
  loom::v1::HeartbeatResponse start;
  *start.add_start() = Assignment("job-logs", "graceful");
  client_.replies.push_back(start);
  TickUntil(d, "job-logs", loom::v1::RANK_STATE_RUNNING);
  // Heartbeats fail until one fails while carrying the trainer's stderr lines (the fake trainer
  // writes one every 50 ms; deadline 10 s): those must be sent again by the next heartbeat.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  bool failed_with_lines = false;
  while (!failed_with_lines && absl::Now() < deadline) {
    {
      absl::MutexLock l(&client_.mu_);
      client_.next_status = absl::UnavailableError("scheduler restarting");
    }
    EXPECT_THAT(d.Tick(), StatusIs(absl::StatusCode::kUnavailable, "scheduler restarting"));
    absl::MutexLock l(&client_.mu_);
    for (const auto& r : client_.heartbeats.back().ranks()) {
      for (const auto& line : r.log_lines()) {
        failed_with_lines |= line.text().find("fake trainer: tick") != std::string::npos;
      }
    }
    if (!failed_with_lines) {
      client_.mu_.Unlock();
      absl::SleepFor(absl::Milliseconds(20));  // poll interval
      client_.mu_.Lock();
    }
  }
  ASSERT_TRUE(failed_with_lines) << "no stderr line reached a heartbeat in 10 s";
  ASSERT_TRUE(d.Tick().ok());
  ASSERT_TRUE(d.Tick().ok());
  absl::MutexLock l(&client_.mu_);
  const size_t n = client_.heartbeats.size();
  ASSERT_GE(n, 3u);
  auto lines_of = [&](size_t i) {
    std::vector<loom::v1::RankLogLine> out;
    for (const auto& r : client_.heartbeats[i].ranks()) {
      for (const auto& line : r.log_lines()) out.push_back(line);
    }
    return out;
  };
  std::vector<loom::v1::RankLogLine> failed = lines_of(n - 3), retried = lines_of(n - 2);
  ASSERT_FALSE(failed.empty());
  ASSERT_GE(retried.size(), failed.size());
  // The failed heartbeat's lines are sent again, from the same sequence number.
  EXPECT_EQ(retried[0].sequence(), failed[0].sequence());
  EXPECT_EQ(retried[0].text(), failed[0].text());
  // Every successful heartbeat continues where the previous one stopped: no gaps, no repeats.
  int64_t last = 0;
  bool saw_stdout = false, saw_stderr = false;
  for (size_t i = 0; i < n; ++i) {
    if (i == n - 3) continue;  // the failed one
    for (const auto& line : lines_of(i)) {
      EXPECT_EQ(line.sequence(), last + 1) << line.text();
      last = line.sequence();
      saw_stdout |= line.stream() == "stdout" &&
                    line.text().find("{\"rendezvous\":") != std::string::npos;
      saw_stderr |= line.stream() == "stderr" &&
                    line.text().find("fake trainer: tick") != std::string::npos;
    }
  }
  EXPECT_TRUE(saw_stdout);
  EXPECT_TRUE(saw_stderr);
}

}  // namespace
}  // namespace loom::worker
