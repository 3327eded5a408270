// `loomctl resume JOB [--wait] [--wait_for_capacity]` (issue 49) against a stub JobService (a
// real gRPC server on loopback port 0): the request it sends, the line it prints, its exit status
// on a refusal, and --wait following the resumed job to its end.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/file_util.h"
#include "proto/job_service.grpc.pb.h"
#include "tests/testing/subprocess.h"

namespace loom {
namespace {

// Resumes "job-1" (FAILED at attempt 3, checkpoint at step 1200); any other id is NOT_FOUND and
// "job-running" FAILED_PRECONDITION, as the scheduler answers. GetJob says SUCCEEDED.
class ResumeStub final : public loom::v1::JobService::Service {
 public:
  grpc::Status ResumeJob(grpc::ServerContext*, const loom::v1::ResumeJobRequest* req,
                         loom::v1::Job* job) override {
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(*req);
    }
    if (req->job_id() == "job-running") {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "job job-running is RUNNING: only a FAILED or CANCELLED job can be "
                          "resumed");
    }
    if (req->job_id() != "job-1") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "job " + req->job_id() + " not found");
    }
    job->set_id("job-1");
    job->set_phase(loom::v1::JOB_PHASE_PENDING);
    job->set_reason("Resumed");
    job->set_attempt(3);
    job->mutable_progress()->set_step(1200);
    job->mutable_progress()->set_last_checkpoint_step(1200);
    return grpc::Status::OK;
  }
  grpc::Status GetJob(grpc::ServerContext*, const loom::v1::GetJobRequest* req,
                      loom::v1::Job* job) override {
    job->set_id(req->job_id());
    job->set_phase(loom::v1::JOB_PHASE_SUCCEEDED);
    job->set_attempt(4);
    job->set_message("all 2 ranks succeeded");
    return grpc::Status::OK;
  }
  std::vector<loom::v1::ResumeJobRequest> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

 private:
  absl::Mutex mu_;
  std::vector<loom::v1::ResumeJobRequest> requests_;
};

struct CliRun {
  int code;
  std::string output;
};

class LoomctlResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  CliRun Run(std::vector<std::string> args) {
    const std::string log =
        absl::StrCat(std::getenv("TEST_TMPDIR"), "/loomctl_resume_", ++runs_, ".log");
    args.insert(args.begin(), {testing::RunfilePath("services/cli/loomctl"),
                               "--scheduler=" + address_, "resume"});
    auto p = testing::Subprocess::Start(args, log);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return {-1, ""};
    const int status = p->Wait(absl::Seconds(60));
    return {testing::ExitCode(status), *ReadFile(log)};
  }

  ResumeStub service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  int runs_ = 0;
};

TEST_F(LoomctlResumeTest, PrintsWhereTheJobResumesAndPassesWaitForCapacity) {
  CliRun run = Run({"job-1"});
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("job-1: PENDING, resumes from step 1200 (attempt 4)"),
            std::string::npos)
      << run.output;
  run = Run({"job-1", "--wait_for_capacity"});
  EXPECT_EQ(run.code, 0) << run.output;
  const std::vector<loom::v1::ResumeJobRequest> sent = service_.requests();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].job_id(), "job-1");
  EXPECT_FALSE(sent[0].wait_for_capacity());
  EXPECT_TRUE(sent[1].wait_for_capacity());
}

TEST_F(LoomctlResumeTest, RefusalsExitWithTheirGrpcCode) {
  CliRun run = Run({"job-running"});
  EXPECT_EQ(run.code, 9) << run.output;  // FAILED_PRECONDITION
  EXPECT_NE(run.output.find("is RUNNING"), std::string::npos) << run.output;
  run = Run({"job-nope"});
  EXPECT_EQ(run.code, 5) << run.output;  // NOT_FOUND
  run = Run({});
  EXPECT_EQ(run.code, 2) << run.output;  // usage: no JOB_ID
  EXPECT_NE(run.output.find("missing JOB_ID"), std::string::npos) << run.output;
}

TEST_F(LoomctlResumeTest, WaitFollowsTheResumedJobToItsEnd) {
  CliRun run = Run({"job-1", "--wait"});
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("resumes from step 1200"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("job-1 SUCCEEDED"), std::string::npos) << run.output;
  // A bad --on_interrupt is refused before the job is resumed.
  run = Run({"job-1", "--wait", "--on_interrupt=bogus"});
  EXPECT_NE(run.code, 0) << run.output;
  EXPECT_EQ(service_.requests().size(), 1u);
}

}  // namespace
}  // namespace loom
