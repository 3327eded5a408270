// `loomctl wait` against a stub JobService (a real gRPC server on loopback port 0) that answers
// the first GetJob calls with CANCELLED, as a restarting scheduler does with the calls in flight,
// and then with a SUCCEEDED job. Regression (break-it pass, 2026-12-05): wait exited 1 ("the job
// ended unsuccessfully") with "CANCELLED: CANCELLED" while the job was still PENDING.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

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

struct CliRun {
  int code;
  std::string output;
};

CliRun Wait(const std::string& address) {
  const std::string log = absl::StrCat(std::getenv("TEST_TMPDIR"), "/loomctl_wait.log");
  auto p = testing::Subprocess::Start({testing::RunfilePath("services/cli/loomctl"),
                                       "--scheduler=" + address, "wait", "job-1"},
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

}  // namespace
}  // namespace loom
