// Integration test: the real loom-scheduler service (SchedulerServer) on loopback port 0 with a
// real SQLite file, driven through its gRPC API by a "user" and two fake workers.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <prometheus/registry.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "proto/job_service.grpc.pb.h"
#include "proto/worker_service.grpc.pb.h"
#include "scheduler/test_job_spec.h"
#include "services/scheduler/scheduler_server.h"

namespace loom {
namespace {

using loom::v1::HeartbeatResponse;
using loom::v1::Job;
using loom::v1::JobSpec;

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

class SchedulerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.db_path = TmpDir() + "/scheduler_service_test.db";
    std::remove(options_.db_path.c_str());
    options_.schedule_interval = absl::Milliseconds(10);
    options_.scheduler.checkpoint_root = TmpDir() + "/checkpoints";
    options_.scheduler.validation.fortunes_dir = TmpDir() + "/fortunes";
    ASSERT_TRUE(MakeDirs(options_.scheduler.validation.fortunes_dir).ok());
    StartServer();
  }

  void StartServer() {
    absl::StatusOr<std::unique_ptr<SchedulerServer>> server = SchedulerServer::Start(options_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    ASSERT_GT(server_->port(), 0);
    auto channel = grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials());
    jobs_ = loom::v1::JobService::NewStub(channel);
    workers_ = loom::v1::WorkerService::NewStub(channel);
  }

  // Every call has a deadline.
  static std::unique_ptr<grpc::ClientContext> Ctx() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return ctx;
  }

  grpc::Status Submit(const JobSpec& spec, Job* job) {
    loom::v1::SubmitJobRequest req;
    *req.mutable_spec() = spec;
    loom::v1::SubmitJobResponse resp;
    grpc::Status s = jobs_->SubmitJob(Ctx().get(), req, &resp);
    *job = resp.job();
    return s;
  }

  grpc::Status GetJob(const std::string& id, Job* job) {
    loom::v1::GetJobRequest req;
    req.set_job_id(id);
    return jobs_->GetJob(Ctx().get(), req, job);
  }

  void ExpectInvalid(const JobSpec& spec, const std::string& field) {
    Job job;
    grpc::Status s = Submit(spec, &job);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_NE(s.error_message().find(field), std::string::npos)
        << "want '" << field << "' in: " << s.error_message();
  }

  void Register(const std::string& node) {
    loom::v1::RegisterWorkerRequest req;
    req.set_node_id(node);
    req.mutable_inventory()->set_accelerator(loom::v1::ACCELERATOR_KIND_CPU);
    req.mutable_inventory()->set_slots(1);
    req.mutable_inventory()->set_hostname(node);
    req.mutable_inventory()->set_address("127.0.0.1");
    loom::v1::RegisterWorkerResponse resp;
    grpc::Status s = workers_->RegisterWorker(Ctx().get(), req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_GT(resp.heartbeat_interval_ms(), 0);
  }

  HeartbeatResponse Beat(const std::string& node, std::vector<loom::v1::RankStatus> ranks = {}) {
    loom::v1::HeartbeatRequest req;
    req.set_node_id(node);
    for (auto& r : ranks) *req.add_ranks() = r;
    HeartbeatResponse resp;
    grpc::Status s = workers_->Heartbeat(Ctx().get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }

  // Heartbeats `node` until a reply satisfies `done` (the scheduling loop runs on its own
  // thread), for at most 10 s.
  HeartbeatResponse BeatUntil(const std::string& node, std::vector<loom::v1::RankStatus> ranks,
                              const std::function<bool(const HeartbeatResponse&)>& done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    HeartbeatResponse resp;
    do {
      resp = Beat(node, ranks);
      if (done(resp)) return resp;
      absl::SleepFor(absl::Milliseconds(5));
    } while (absl::Now() < deadline);
    ADD_FAILURE() << "condition not met within 10 s; last reply: " << resp.DebugString();
    return resp;
  }

  static loom::v1::RankStatus Rank(const std::string& job_id, int rank, loom::v1::RankState state,
                                   int port = 0) {
    loom::v1::RankStatus st;
    st.set_job_id(job_id);
    st.set_attempt(1);
    st.set_rank(rank);
    st.set_state(state);
    st.set_rendezvous_port(port);
    return st;
  }

  SchedulerServerOptions options_;
  std::unique_ptr<SchedulerServer> server_;
  std::unique_ptr<loom::v1::JobService::Stub> jobs_;
  std::unique_ptr<loom::v1::WorkerService::Stub> workers_;
};

google::protobuf::Value Num(double v) {
  google::protobuf::Value value;
  value.set_number_value(v);
  return value;
}

TEST_F(SchedulerServiceTest, InvalidSpecsAreRejectedNamingTheField) {
  JobSpec zero_ranks = ValidTestJobSpec();
  zero_ranks.mutable_resources()->set_num_ranks(0);
  ExpectInvalid(zero_ranks, "resources.num_ranks");

  JobSpec negative_steps = ValidTestJobSpec();
  negative_steps.mutable_training()->set_steps(-1);
  ExpectInvalid(negative_steps, "training.steps");

  JobSpec no_dataset = ValidTestJobSpec();
  no_dataset.clear_dataset();
  ExpectInvalid(no_dataset, "dataset.name or dataset.path");

  JobSpec bad_heads = ValidTestJobSpec();
  (*bad_heads.mutable_model()->mutable_config()->mutable_fields())["num_key_value_heads"] = Num(3);
  ExpectInvalid(bad_heads, "model.config.num_attention_heads");

  // A model family the engine does not implement is refused at submission, not at the trainer.
  JobSpec gpt2 = ValidTestJobSpec();
  google::protobuf::Value gpt2_type;
  gpt2_type.set_string_value("gpt2");
  (*gpt2.mutable_model()->mutable_config()->mutable_fields())["model_type"] = gpt2_type;
  ExpectInvalid(gpt2, "model.config.model_type: \"gpt2\" is not supported (supported: llama, "
                      "qwen2, qwen3, mistral)");

  JobSpec unknown_ds_key = ValidTestJobSpec();
  // A top-level key DeepSpeed does not read is a warning (as in DeepSpeed); one that looks like a
  // misspelling of a key Loom reads, and any unknown key inside a section, are refused.
  (*unknown_ds_key.mutable_deepspeed_config()->mutable_fields())["gradient_clippping"] = Num(1);
  ExpectInvalid(unknown_ds_key, "deepspeed_config.gradient_clippping");

  loom::v1::ListJobsRequest list;
  loom::v1::ListJobsResponse listed;
  ASSERT_TRUE(jobs_->ListJobs(Ctx().get(), list, &listed).ok());
  EXPECT_EQ(listed.jobs_size(), 0);
}

TEST_F(SchedulerServiceTest, JobLifecycleThroughTheRealServiceAndRestart) {
  Job submitted;
  grpc::Status s = Submit(ValidTestJobSpec(), &submitted);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_FALSE(submitted.id().empty());
  EXPECT_EQ(submitted.phase(), loom::v1::JOB_PHASE_PENDING);
  const std::string id = submitted.id();

  Register("worker-a");
  Register("worker-b");

  // Rank 0 first, with master_port 0 and the address of its node.
  HeartbeatResponse a = BeatUntil("worker-a", {}, [](const HeartbeatResponse& r) {
    return r.start_size() > 0;
  });
  ASSERT_EQ(a.start_size(), 1);
  EXPECT_EQ(a.start(0).job_id(), id);
  EXPECT_EQ(a.start(0).rank(), 0);
  EXPECT_EQ(a.start(0).world_size(), 2);
  EXPECT_EQ(a.start(0).master_port(), 0);
  EXPECT_EQ(a.start(0).master_addr(), "127.0.0.1");
  EXPECT_EQ(a.start(0).checkpoint_dir(), options_.scheduler.checkpoint_root + "/" + id);
  EXPECT_EQ(Beat("worker-b").start_size(), 0);  // rank 1 waits for the port

  // Rank 0 reports its rendezvous port; rank 1 is assigned with it.
  Beat("worker-a", {Rank(id, 0, loom::v1::RANK_STATE_STARTING, 29555)});
  HeartbeatResponse b = Beat("worker-b");
  ASSERT_EQ(b.start_size(), 1);
  EXPECT_EQ(b.start(0).rank(), 1);
  EXPECT_EQ(b.start(0).master_port(), 29555);
  EXPECT_EQ(b.start(0).master_addr(), "127.0.0.1");

  Beat("worker-a", {Rank(id, 0, loom::v1::RANK_STATE_RUNNING, 29555)});
  Beat("worker-b", {Rank(id, 1, loom::v1::RANK_STATE_RUNNING)});
  Job job;
  ASSERT_TRUE(GetJob(id, &job).ok());
  EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(job.rank_nodes_size(), 2);

  loom::v1::RankStatus done0 = Rank(id, 0, loom::v1::RANK_STATE_SUCCEEDED, 29555);
  done0.mutable_progress()->set_step(20);
  done0.mutable_progress()->set_loss(1.5);
  Beat("worker-a", {done0});
  Beat("worker-b", {Rank(id, 1, loom::v1::RANK_STATE_SUCCEEDED)});
  ASSERT_TRUE(GetJob(id, &job).ok());
  EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_SUCCEEDED);
  EXPECT_EQ(job.progress().step(), 20);

  // Metrics are the scheduler's, served from the injected registry.
  bool found = false;
  for (const auto& family : server_->registry().Collect()) {
    if (family.name != "loom_jobs") continue;
    for (const auto& m : family.metric) {
      for (const auto& l : m.label) {
        if (l.name == "phase" && l.value == "SUCCEEDED") {
          EXPECT_EQ(m.gauge.value, 1);
          found = true;
        }
      }
    }
  }
  EXPECT_TRUE(found);

  // Restart on the same database file: the job is still there, unchanged.
  server_->Shutdown(absl::Seconds(1));
  server_.reset();
  StartServer();
  Job after;
  s = GetJob(id, &after);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(after.phase(), loom::v1::JOB_PHASE_SUCCEEDED);
  EXPECT_EQ(after.attempt(), 1);
  EXPECT_EQ(after.progress().step(), 20);
  EXPECT_EQ(after.spec().training().steps(), 20);
  EXPECT_EQ(after.checkpoint_dir(), job.checkpoint_dir());

  // Cancelling a finished job is refused.
  loom::v1::CancelJobRequest cancel;
  cancel.set_job_id(id);
  Job cancelled;
  s = jobs_->CancelJob(Ctx().get(), cancel, &cancelled);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();

  // Unknown job and unknown worker are NOT_FOUND.
  EXPECT_EQ(GetJob("job-00000000", &after).error_code(), grpc::StatusCode::NOT_FOUND);
  loom::v1::HeartbeatRequest ghost;
  ghost.set_node_id("worker-ghost");
  HeartbeatResponse ignored;
  EXPECT_EQ(workers_->Heartbeat(Ctx().get(), ghost, &ignored).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(SchedulerServiceTest, CancelPendingJobAndListByPhase) {
  Job a, b;
  ASSERT_TRUE(Submit(ValidTestJobSpec(), &a).ok());
  ASSERT_TRUE(Submit(ValidTestJobSpec(), &b).ok());
  loom::v1::CancelJobRequest cancel;
  cancel.set_job_id(a.id());
  Job cancelled;
  grpc::Status s = jobs_->CancelJob(Ctx().get(), cancel, &cancelled);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(cancelled.phase(), loom::v1::JOB_PHASE_CANCELLED);

  loom::v1::ListJobsRequest list;
  list.set_phase(loom::v1::JOB_PHASE_PENDING);
  loom::v1::ListJobsResponse listed;
  ASSERT_TRUE(jobs_->ListJobs(Ctx().get(), list, &listed).ok());
  ASSERT_EQ(listed.jobs_size(), 1);
  EXPECT_EQ(listed.jobs(0).id(), b.id());
}

TEST_F(SchedulerServiceTest, RetriedSubmissionWithTheSameRequestIdCreatesOneJob) {
  loom::v1::SubmitJobRequest req;
  *req.mutable_spec() = ValidTestJobSpec();
  req.set_request_id("retry-me");
  loom::v1::SubmitJobResponse first, second;
  ASSERT_TRUE(jobs_->SubmitJob(Ctx().get(), req, &first).ok());
  ASSERT_TRUE(jobs_->SubmitJob(Ctx().get(), req, &second).ok());
  EXPECT_FALSE(first.deduplicated());
  EXPECT_TRUE(second.deduplicated());
  EXPECT_EQ(second.job().id(), first.job().id());
  req.mutable_spec()->set_name("something else");
  loom::v1::SubmitJobResponse clash;
  EXPECT_EQ(jobs_->SubmitJob(Ctx().get(), req, &clash).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  loom::v1::ListJobsResponse listed;
  ASSERT_TRUE(jobs_->ListJobs(Ctx().get(), loom::v1::ListJobsRequest(), &listed).ok());
  EXPECT_EQ(listed.jobs_size(), 1);
}

}  // namespace
}  // namespace loom
