// `loomctl wait` against a stub JobService (a real gRPC server on loopback port 0) that answers
// the first GetJob calls with CANCELLED, as a restarting scheduler does with the calls in flight,
// and then with a SUCCEEDED job. Regression (break-it pass, 2026-12-05): wait exited 1 ("the job
// ended unsuccessfully") with "CANCELLED: CANCELLED" while the job was still PENDING.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "proto/job_service.grpc.pb.h"
#include "tests/testing/subprocess.h"

namespace loom {
namespace {

class CancelThenSucceed final : public loom::v1::JobService::Service {
 public:
  explicit CancelThenSucceed(int cancels) : cancels_left_(cancels) {}
  grpc::Status GetJob(grpc::ServerContext*, const loom::v1::GetJobRequest* req,
                      loom::v1::Job* job) override {
    ++calls_;
    job->set_id(req->job_id());
    if (cancels_left_-- > 0) return grpc::Status(grpc::StatusCode::CANCELLED, "CANCELLED");
    job->set_phase(loom::v1::JOB_PHASE_SUCCEEDED);
    job->set_message("all 1 ranks succeeded");
    return grpc::Status::OK;
  }
  int calls() const { return calls_; }

 private:
  std::atomic<int> cancels_left_;
  std::atomic<int> calls_{0};
};

// A job that runs: each GetJob answers one more step (of 3), held-out loss at step 2, and the
// third answer is the job SUCCEEDED with its last step and evaluation (issue 45: those printed
// after the SUCCEEDED line).
class ThreeSteps final : public loom::v1::JobService::Service {
 public:
  grpc::Status GetJob(grpc::ServerContext*, const loom::v1::GetJobRequest* req,
                      loom::v1::Job* job) override {
    const int step = std::min(++calls_, 3);
    job->set_id(req->job_id());
    job->mutable_spec()->mutable_training()->set_steps(3);
    job->mutable_start_time()->set_seconds(1);
    job->set_phase(step < 3 ? loom::v1::JOB_PHASE_RUNNING : loom::v1::JOB_PHASE_SUCCEEDED);
    auto* p = job->mutable_progress();
    p->set_step(step);
    p->set_loss(5.0 - step);
    p->set_tokens_per_second(1234.0);
    p->set_has_eval_loss(true);
    p->set_initial_eval_loss(5.5);
    p->set_eval_step(step >= 2 ? step : 0);
    p->set_eval_loss(step >= 2 ? 6.0 - step : 5.5);
    return grpc::Status::OK;
  }

 private:
  std::atomic<int> calls_{0};
};

struct CliRun {
  int code;
  std::string output;
};

CliRun Wait(const std::string& address, const std::string& progress = "auto") {
  static int n = 0;
  const std::string log = absl::StrCat(std::getenv("TEST_TMPDIR"), "/loomctl_wait_", n++, ".log");
  auto p = testing::Subprocess::Start({testing::RunfilePath("services/cli/loomctl"),
                                       "--scheduler=" + address, "wait", "job-1",
                                       "--progress=" + progress},
                                      log);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return {-1, ""};
  const int status = p->Wait(absl::Seconds(60));
  return {testing::ExitCode(status), *ReadFile(log)};
}

TEST(LoomctlWaitTest, CallsCancelledByARestartingSchedulerAreRetried) {
  CancelThenSucceed service(/*cancels=*/3);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);
  const CliRun run = Wait(absl::StrCat("127.0.0.1:", port));
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("job-1 SUCCEEDED"), std::string::npos) << run.output;
  EXPECT_EQ(service.calls(), 4);  // three cancelled, then the answer
  server->Shutdown();
}

std::unique_ptr<grpc::Server> Serve(grpc::Service* service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

// Piped (auto): a line per step with the rate it has seen (ETA from the second step on), and
// the last step and evaluation before the SUCCEEDED line.
TEST(LoomctlWaitTest, PlainProgressHasAnEtaAndTheLastStepComesBeforeTheEnd) {
  ThreeSteps service;
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(&service, &port);
  ASSERT_NE(server, nullptr);
  const CliRun run = Wait(absl::StrCat("127.0.0.1:", port));
  EXPECT_EQ(run.code, 0) << run.output;
  const size_t step1 = run.output.find("  step 1/3 (33%)  loss 4.0000  held-out 5.5000 @0  1,234 "
                                       "tokens/s  elapsed ");
  const size_t step2 = run.output.find("  step 2/3 (66%)  loss 3.0000  held-out 4.0000 @2");
  const size_t step3 = run.output.find("  step 3/3 (100%)  loss 2.0000  held-out 3.0000 @3");
  const size_t eval3 = run.output.find("  held-out loss after step 3: 3.0000");
  const size_t succeeded = run.output.find("job-1 SUCCEEDED");
  ASSERT_NE(step1, std::string::npos) << run.output;
  ASSERT_NE(step2, std::string::npos) << run.output;
  ASSERT_NE(step3, std::string::npos) << run.output;
  ASSERT_NE(eval3, std::string::npos) << run.output;
  ASSERT_NE(succeeded, std::string::npos) << run.output;
  EXPECT_LT(step1, step2);
  EXPECT_LT(step3, succeeded) << run.output;
  EXPECT_LT(eval3, succeeded) << run.output;
  EXPECT_EQ(run.output.find("ETA", step1), run.output.find("ETA", step2)) << "no ETA at step 1";
  EXPECT_NE(run.output.find("ETA 0s", step3), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find('\r'), std::string::npos) << "plain lines when piped";
  server->Shutdown();
}

// --progress=line: the progress is redrawn in place (carriage return, erase line) and the last
// one is kept above the SUCCEEDED line.
TEST(LoomctlWaitTest, LiveProgressLineIsRedrawnInPlace) {
  ThreeSteps service;
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(&service, &port);
  ASSERT_NE(server, nullptr);
  const CliRun run = Wait(absl::StrCat("127.0.0.1:", port), "line");
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("\r\x1b[2Kstep 1/3 (33%)"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("\r\x1b[2Kstep 3/3 (100%)"), std::string::npos) << run.output;
  const size_t kept = run.output.find("ETA 0s\n[");
  ASSERT_NE(kept, std::string::npos) << run.output;
  EXPECT_NE(run.output.find("job-1 SUCCEEDED", kept), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("  step "), std::string::npos) << "no plain step lines";
  server->Shutdown();
}

}  // namespace
}  // namespace loom
