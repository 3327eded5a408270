// Integration test over real gRPC on loopback (port 0): WatchJob, StreamLogs, CancelJob and
// KillJob of the real SchedulerServer, with a fake worker driving the job through heartbeats.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "proto/job_service.grpc.pb.h"
#include "proto/worker_service.grpc.pb.h"
#include "scheduler/test_job_spec.h"
#include "services/scheduler/scheduler_server.h"

namespace loom {
namespace {

using loom::v1::Job;

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return ctx;
}

class JobStreamsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SchedulerServerOptions options;
    options.db_path = TmpDir() + "/job_streams_test.db";
    std::remove(options.db_path.c_str());
    options.schedule_interval = absl::Milliseconds(10);
    options.scheduler.checkpoint_root = TmpDir() + "/checkpoints";
    options.scheduler.validation.fortunes_dir = TmpDir() + "/fortunes";
    ASSERT_TRUE(MakeDirs(options.scheduler.validation.fortunes_dir).ok());
    absl::StatusOr<std::unique_ptr<SchedulerServer>> server = SchedulerServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto channel = grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials());
    jobs_ = loom::v1::JobService::NewStub(channel);
    workers_ = loom::v1::WorkerService::NewStub(channel);
    loom::v1::RegisterWorkerRequest reg;
    reg.set_node_id("node-a");
    reg.mutable_inventory()->set_accelerator(loom::v1::ACCELERATOR_KIND_CPU);
    reg.mutable_inventory()->set_slots(2);
    reg.mutable_inventory()->set_address("127.0.0.1");
    loom::v1::RegisterWorkerResponse reg_resp;
    ASSERT_TRUE(workers_->RegisterWorker(Ctx().get(), reg, &reg_resp).ok());
  }

  // `wait_for_capacity`: queue a gang larger than the registered nodes (refused at once without).
  Job Submit(int ranks, bool wait_for_capacity = false) {
    loom::v1::SubmitJobRequest req;
    *req.mutable_spec() = TestJobSpecWithRanks(ranks);
    req.set_wait_for_capacity(wait_for_capacity);
    loom::v1::SubmitJobResponse resp;
    grpc::Status s = jobs_->SubmitJob(Ctx().get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.job();
  }

  Job Get(const std::string& id) {
    loom::v1::GetJobRequest req;
    req.set_job_id(id);
    Job job;
    grpc::Status s = jobs_->GetJob(Ctx().get(), req, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job;
  }

  loom::v1::HeartbeatResponse Beat(std::vector<loom::v1::RankStatus> ranks = {}) {
    loom::v1::HeartbeatRequest req;
    req.set_node_id("node-a");
    for (auto& r : ranks) *req.add_ranks() = r;
    loom::v1::HeartbeatResponse resp;
    grpc::Status s = workers_->Heartbeat(Ctx().get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }

  static loom::v1::RankStatus Rank(const Job& job, int rank, loom::v1::RankState state,
                                   int port = 0) {
    loom::v1::RankStatus st;
    st.set_job_id(job.id());
    st.set_attempt(job.attempt());
    st.set_rank(rank);
    st.set_state(state);
    st.set_rendezvous_port(port);
    return st;
  }

  // Waits (heartbeating) until the scheduling loop placed the job; then drives all ranks RUNNING.
  Job RunJob(const Job& submitted) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    Job job = Get(submitted.id());
    while (job.phase() == loom::v1::JOB_PHASE_PENDING && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
      job = Get(submitted.id());
    }
    EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_STARTING);
    Beat({Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500)});
    std::vector<loom::v1::RankStatus> all;
    for (int r = 0; r < job.rank_nodes_size(); ++r) {
      all.push_back(Rank(job, r, loom::v1::RANK_STATE_RUNNING, r == 0 ? 29500 : 0));
    }
    Beat(all);
    job = Get(submitted.id());
    EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_RUNNING);
    return job;
  }

  static void AddLines(loom::v1::RankStatus* st, int first, int last, const std::string& prefix) {
    for (int s = first; s <= last; ++s) {
      loom::v1::RankLogLine* l = st->add_log_lines();
      l->set_sequence(s);
      l->set_text(absl::StrCat(prefix, s));
      l->set_stream("stderr");
    }
  }

  std::vector<loom::v1::LogLine> ReadLogs(const loom::v1::StreamLogsRequest& req,
                                          grpc::Status* status) {
    auto ctx = Ctx();
    auto reader = jobs_->StreamLogs(ctx.get(), req);
    std::vector<loom::v1::LogLine> out;
    loom::v1::LogLine line;
    while (reader->Read(&line)) out.push_back(line);
    *status = reader->Finish();
    return out;
  }

  static std::vector<std::string> Texts(const std::vector<loom::v1::LogLine>& lines) {
    std::vector<std::string> out;
    for (const auto& l : lines) out.push_back(l.text());
    return out;
  }

  std::unique_ptr<SchedulerServer> server_;
  std::unique_ptr<loom::v1::JobService::Stub> jobs_;
  std::unique_ptr<loom::v1::WorkerService::Stub> workers_;
};

TEST_F(JobStreamsTest, WatchJobSendsSnapshotThenChangesAndEndsOkAtTheTerminalPhase) {
  Job submitted = Submit(1);
  grpc::ClientContext ctx;  // no deadline: the stream lasts as long as the job
  loom::v1::WatchJobRequest req;
  req.set_job_id(submitted.id());
  auto reader = jobs_->WatchJob(&ctx, req);
  std::vector<loom::v1::JobEvent> events;
  std::thread read([&] {
    loom::v1::JobEvent e;
    while (reader->Read(&e)) events.push_back(e);
  });
  Job job = RunJob(submitted);
  for (int step = 1; step <= 5; ++step) {
    loom::v1::RankStatus st = Rank(job, 0, loom::v1::RANK_STATE_RUNNING);
    st.mutable_progress()->set_step(step);
    Beat({st});
  }
  loom::v1::KillJobRequest kill;
  kill.set_job_id(job.id());
  Job killed;
  ASSERT_TRUE(jobs_->KillJob(Ctx().get(), kill, &killed).ok());
  read.join();
  grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.front().type(), "Snapshot");
  EXPECT_EQ(events.front().job().id(), job.id());
  std::vector<loom::v1::JobPhase> phase_changes;
  for (const auto& e : events) {
    if (e.type() == "PhaseChanged") phase_changes.push_back(e.job().phase());
  }
  // PENDING (snapshot, unless placement was faster) -> STARTING -> RUNNING -> CANCELLED.
  ASSERT_GE(phase_changes.size(), 2u);
  EXPECT_EQ(phase_changes.back(), loom::v1::JOB_PHASE_CANCELLED);
  EXPECT_EQ(phase_changes[phase_changes.size() - 2], loom::v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(events.back().job().reason(), "Killed");
  // Progress reached the watcher (possibly coalesced): the newest step it saw before the end.
  int64_t max_step = 0;
  for (const auto& e : events) max_step = std::max(max_step, e.job().progress().step());
  EXPECT_EQ(max_step, 5);
}

// An ended job's stream replays its history (one "History" event per phase change, oldest
// first), then the snapshot, then ends.
TEST_F(JobStreamsTest, WatchJobOfAnEndedJobSendsItsHistoryTheSnapshotAndEnds) {
  // 3 ranks on the fixture's one 2-slot node: the scheduling loop (running every 200 ms) can never
  // place it, so its history is PENDING -> CANCELLED whatever the timing. (With 1 rank the loop
  // sometimes placed it between the submission and the cancel, and the history had STARTING.)
  // Asked to wait for capacity: without it a gang larger than the nodes is refused at once.
  Job job = Submit(3, /*wait_for_capacity=*/true);
  loom::v1::CancelJobRequest cancel;
  cancel.set_job_id(job.id());
  Job cancelled;
  ASSERT_TRUE(jobs_->CancelJob(Ctx().get(), cancel, &cancelled).ok());
  EXPECT_EQ(cancelled.phase(), loom::v1::JOB_PHASE_CANCELLED);  // never started: at once
  auto ctx = Ctx();
  loom::v1::WatchJobRequest req;
  req.set_job_id(job.id());
  auto reader = jobs_->WatchJob(ctx.get(), req);
  loom::v1::JobEvent e;
  ASSERT_TRUE(reader->Read(&e));
  EXPECT_EQ(e.type(), "History");
  EXPECT_EQ(e.job().phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_GT(e.time().seconds(), 0);
  ASSERT_TRUE(reader->Read(&e));
  EXPECT_EQ(e.type(), "History");
  EXPECT_EQ(e.job().phase(), loom::v1::JOB_PHASE_CANCELLED);
  EXPECT_EQ(e.job().reason(), "Cancelled");
  ASSERT_TRUE(reader->Read(&e));
  EXPECT_EQ(e.type(), "Snapshot");
  EXPECT_EQ(e.job().phase(), loom::v1::JOB_PHASE_CANCELLED);
  EXPECT_FALSE(reader->Read(&e));
  EXPECT_TRUE(reader->Finish().ok());
}

TEST_F(JobStreamsTest, WatchJobOfAnUnknownJobIsNotFound) {
  auto ctx = Ctx();
  loom::v1::WatchJobRequest req;
  req.set_job_id("job-00000000");
  auto reader = jobs_->WatchJob(ctx.get(), req);
  loom::v1::JobEvent e;
  EXPECT_FALSE(reader->Read(&e));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(JobStreamsTest, WatchJobClientCancelEndsTheStreamAndTheServerCarriesOn) {
  Job job = Submit(1);
  for (int round = 0; round < 3; ++round) {  // the server must release each watcher
    grpc::ClientContext ctx;
    loom::v1::WatchJobRequest req;
    req.set_job_id(job.id());
    auto reader = jobs_->WatchJob(&ctx, req);
    loom::v1::JobEvent e;
    ASSERT_TRUE(reader->Read(&e));
    EXPECT_EQ(e.type(), "Snapshot");
    ctx.TryCancel();
    while (reader->Read(&e)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_EQ(Get(job.id()).id(), job.id());
  Job running = RunJob(job);  // changes after the watchers left are fine
  EXPECT_EQ(running.phase(), loom::v1::JOB_PHASE_RUNNING);
}

TEST_F(JobStreamsTest, StreamLogsTailRankFilterAndFollow) {
  Job job = RunJob(Submit(2));
  loom::v1::RankStatus r0 = Rank(job, 0, loom::v1::RANK_STATE_RUNNING);
  loom::v1::RankStatus r1 = Rank(job, 1, loom::v1::RANK_STATE_RUNNING);
  AddLines(&r0, 1, 3, "zero-");
  AddLines(&r1, 1, 4, "one-");
  Beat({r0, r1});
  Beat({r0, r1});  // a retried heartbeat adds nothing

  grpc::Status status;
  loom::v1::StreamLogsRequest all;
  all.set_job_id(job.id());
  EXPECT_EQ(ReadLogs(all, &status).size(), 7u);
  EXPECT_TRUE(status.ok()) << status.error_message();

  loom::v1::StreamLogsRequest tail = all;
  tail.add_ranks(1);
  tail.set_tail_lines(2);
  std::vector<loom::v1::LogLine> lines = ReadLogs(tail, &status);
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(Texts(lines), (std::vector<std::string>{"one-3", "one-4"}));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].rank(), 1);
  EXPECT_EQ(lines[0].attempt(), 1);
  EXPECT_EQ(lines[0].sequence(), 3);
  EXPECT_EQ(lines[0].stream(), "stderr");

  // Follow rank 0: the retained lines, then new ones, until the job ends.
  grpc::ClientContext ctx;
  loom::v1::StreamLogsRequest follow = all;
  follow.add_ranks(0);
  follow.set_follow(true);
  auto reader = jobs_->StreamLogs(&ctx, follow);
  absl::Mutex mu;
  std::vector<std::string> got;
  std::thread read([&] {
    loom::v1::LogLine line;
    while (reader->Read(&line)) {
      absl::MutexLock lock(&mu);
      got.push_back(line.text());
    }
  });
  auto count = [&] {
    absl::MutexLock lock(&mu);
    return got.size();
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (count() < 3 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  loom::v1::RankStatus more0 = Rank(job, 0, loom::v1::RANK_STATE_RUNNING);
  loom::v1::RankStatus more1 = Rank(job, 1, loom::v1::RANK_STATE_RUNNING);
  AddLines(&more0, 4, 5, "zero-");
  AddLines(&more1, 5, 5, "one-");
  Beat({more0, more1});
  while (count() < 5 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  loom::v1::KillJobRequest kill;
  kill.set_job_id(job.id());
  Job killed;
  ASSERT_TRUE(jobs_->KillJob(Ctx().get(), kill, &killed).ok());
  read.join();
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(got, (std::vector<std::string>{"zero-1", "zero-2", "zero-3", "zero-4", "zero-5"}));
}

TEST_F(JobStreamsTest, StreamLogsErrors) {
  grpc::Status status;
  loom::v1::StreamLogsRequest req;
  req.set_job_id("job-00000000");
  EXPECT_TRUE(ReadLogs(req, &status).empty());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  Job job = Submit(1);
  req.set_job_id(job.id());
  req.set_tail_lines(-1);
  ReadLogs(req, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // A job without lines: an empty, finished stream.
  req.set_tail_lines(0);
  EXPECT_TRUE(ReadLogs(req, &status).empty());
  EXPECT_TRUE(status.ok());
  // Regression (break-it pass, 2026-12-05): a rank the job does not have streamed nothing with
  // OK (and a follower waited silently until the job ended).
  for (int32_t bad : {1, -1}) {
    req.clear_ranks();
    req.add_ranks(bad);
    ReadLogs(req, &status);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad;
    EXPECT_NE(status.error_message().find(absl::StrCat("ranks: rank ", bad, " is not in [0, 1)")),
              std::string::npos)
        << status.error_message();
  }
  req.clear_ranks();
  req.add_ranks(0);
  ReadLogs(req, &status);
  EXPECT_TRUE(status.ok());
}

TEST_F(JobStreamsTest, CancelAndKillErrors) {
  for (bool kill : {false, true}) {
    Job job;
    grpc::Status s;
    if (kill) {
      loom::v1::KillJobRequest req;
      req.set_job_id("job-00000000");
      s = jobs_->KillJob(Ctx().get(), req, &job);
    } else {
      loom::v1::CancelJobRequest req;
      req.set_job_id("job-00000000");
      s = jobs_->CancelJob(Ctx().get(), req, &job);
    }
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << kill;
  }
  Job job = Submit(1);
  loom::v1::KillJobRequest kill;
  kill.set_job_id(job.id());
  Job out;
  ASSERT_TRUE(jobs_->KillJob(Ctx().get(), kill, &out).ok());
  EXPECT_EQ(out.phase(), loom::v1::JOB_PHASE_CANCELLED);
  EXPECT_EQ(jobs_->KillJob(Ctx().get(), kill, &out).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  loom::v1::CancelJobRequest cancel;
  cancel.set_job_id(job.id());
  EXPECT_EQ(jobs_->CancelJob(Ctx().get(), cancel, &out).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(JobStreamsTest, CancelOfARunningJobIsGraceful) {
  Job job = RunJob(Submit(1));
  loom::v1::CancelJobRequest cancel;
  cancel.set_job_id(job.id());
  Job stopping;
  ASSERT_TRUE(jobs_->CancelJob(Ctx().get(), cancel, &stopping).ok());
  EXPECT_EQ(stopping.phase(), loom::v1::JOB_PHASE_STOPPING);
  loom::v1::HeartbeatResponse r = Beat({Rank(job, 0, loom::v1::RANK_STATE_RUNNING)});
  ASSERT_EQ(r.stop_size(), 1);
  EXPECT_TRUE(r.stop(0).graceful_stop());
  loom::v1::RankStatus done = Rank(job, 0, loom::v1::RANK_STATE_STOPPED);
  done.set_graceful_stop(true);
  done.mutable_progress()->set_step(3);
  done.mutable_progress()->set_last_checkpoint_step(3);
  Beat({done});
  Job cancelled = Get(job.id());
  EXPECT_EQ(cancelled.phase(), loom::v1::JOB_PHASE_CANCELLED);
  EXPECT_EQ(cancelled.reason(), "Cancelled");
  EXPECT_NE(cancelled.message().find("step 3"), std::string::npos) << cancelled.message();
}

// A watcher that does not read must not slow the scheduler down: 300 progress heartbeats go
// through promptly (events wait in gRPC's flow-control window and, beyond it, coalesce in the
// bounded subscription queue; job_events_test covers the queue), and the watcher later gets
// every phase change and the newest step.
TEST_F(JobStreamsTest, SlowWatcherDoesNotBlockHeartbeatsAndSeesTheNewestStep) {
  Job job = RunJob(Submit(1));
  grpc::ClientContext ctx;
  loom::v1::WatchJobRequest req;
  req.set_job_id(job.id());
  auto reader = jobs_->WatchJob(&ctx, req);
  loom::v1::JobEvent e;
  ASSERT_TRUE(reader->Read(&e));  // the snapshot; then the client stops reading for a while
  const absl::Time t0 = absl::Now();
  for (int step = 1; step <= 300; ++step) {
    loom::v1::RankStatus st = Rank(job, 0, loom::v1::RANK_STATE_RUNNING);
    st.mutable_progress()->set_step(step);
    st.mutable_progress()->set_loss(1.0 / step);
    Beat({st});
  }
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
  loom::v1::KillJobRequest kill;
  kill.set_job_id(job.id());
  Job killed;
  ASSERT_TRUE(jobs_->KillJob(Ctx().get(), kill, &killed).ok());
  int64_t previous_step = 0;
  loom::v1::JobPhase last_phase = loom::v1::JOB_PHASE_UNSPECIFIED;
  while (reader->Read(&e)) {
    EXPECT_GE(e.job().progress().step(), previous_step);  // in order, none repeated backwards
    previous_step = e.job().progress().step();
    last_phase = e.job().phase();
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(last_phase, loom::v1::JOB_PHASE_CANCELLED);
  EXPECT_EQ(previous_step, 300);
}

}  // namespace
}  // namespace loom
