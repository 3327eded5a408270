// Ctrl-C under `loomctl wait` (issue 49: it used to detach in silence while the job trained on):
// the real loomctl binary follows a job of a stub JobService (a real gRPC server on loopback)
// that stays RUNNING; the test sends it SIGINT once the job was read, and checks what loomctl
// says and does. Without a terminal the default (ask) detaches.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "proto/job_service.grpc.pb.h"
#include "tests/testing/subprocess.h"

namespace loom {
namespace {

class RunningJob final : public loom::v1::JobService::Service {
 public:
  grpc::Status GetJob(grpc::ServerContext*, const loom::v1::GetJobRequest* req,
                      loom::v1::Job* job) override {
    ++get_calls_;
    job->set_id(req->job_id());
    job->set_phase(cancelled_.load() > 0 ? loom::v1::JOB_PHASE_STOPPING
                                         : loom::v1::JOB_PHASE_RUNNING);
    return grpc::Status::OK;
  }
  grpc::Status CancelJob(grpc::ServerContext*, const loom::v1::CancelJobRequest* req,
                         loom::v1::Job* job) override {
    {
      absl::MutexLock lock(&mu_);
      cancelled_id_ = req->job_id();
    }
    ++cancelled_;
    job->set_id(req->job_id());
    job->set_phase(loom::v1::JOB_PHASE_STOPPING);
    job->set_message("stop requested; ranks write a final checkpoint");
    return grpc::Status::OK;
  }
  int get_calls() const { return get_calls_.load(); }
  int cancelled() const { return cancelled_.load(); }
  std::string cancelled_id() {
    absl::MutexLock lock(&mu_);
    return cancelled_id_;
  }

 private:
  std::atomic<int> get_calls_{0};
  std::atomic<int> cancelled_{0};
  absl::Mutex mu_;
  std::string cancelled_id_;
};

class LoomctlInterruptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  void TearDown() override { server_->Shutdown(); }

  struct Run {
    int code = -1;
    std::string output;
  };
  // loomctl wait job-1 with `flags`; SIGINT once it has read the job (when `interrupt`).
  Run WaitAndInterrupt(const std::vector<std::string>& flags, bool interrupt) {
    const std::string log =
        absl::StrCat(std::getenv("TEST_TMPDIR"), "/loomctl_interrupt_", runs_++, ".log");
    std::vector<std::string> argv = {testing::RunfilePath("services/cli/loomctl"),
                                     "--scheduler=" + address_};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back("wait");
    argv.push_back("job-1");
    auto p = testing::Subprocess::Start(argv, log);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return {};
    if (interrupt) {
      // The first GetJob comes after loomctl installed its SIGINT handler.
      const absl::Time deadline = absl::Now() + absl::Seconds(30);
      while (service_.get_calls() == 0 && absl::Now() < deadline && p->Running()) {
        absl::SleepFor(absl::Milliseconds(10));  // polling a condition, with a deadline
      }
      EXPECT_GT(service_.get_calls(), 0);
      kill(p->pid(), SIGINT);
    }
    Run run;
    run.code = testing::ExitCode(p->Wait(absl::Seconds(30)));
    run.output = ReadFile(log).value_or("");
    return run;
  }

  RunningJob service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  int runs_ = 0;
};

TEST_F(LoomctlInterruptTest, WithoutATerminalCtrlCDetachesSayingHowToComeBack) {
  const Run run = WaitAndInterrupt({}, /*interrupt=*/true);
  EXPECT_EQ(run.code, 130) << run.output;
  EXPECT_NE(run.output.find("job-1; it keeps running (RUNNING)"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("loomctl wait job-1"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("loomctl cancel job-1"), std::string::npos) << run.output;
  EXPECT_EQ(service_.cancelled(), 0);
}

TEST_F(LoomctlInterruptTest, OnInterruptCancelCancelsTheJob) {
  const Run run = WaitAndInterrupt({"--on_interrupt=cancel"}, /*interrupt=*/true);
  EXPECT_EQ(run.code, 130) << run.output;
  EXPECT_EQ(service_.cancelled(), 1);
  EXPECT_EQ(service_.cancelled_id(), "job-1");
  EXPECT_NE(run.output.find("cancelling job-1 (STOPPING"), std::string::npos) << run.output;
}

TEST_F(LoomctlInterruptTest, AnUnknownOnInterruptIsAUsageErrorBeforeAnyCall) {
  const Run run = WaitAndInterrupt({"--on_interrupt=later"}, /*interrupt=*/false);
  EXPECT_EQ(run.code, 3) << run.output;  // INVALID_ARGUMENT
  EXPECT_NE(run.output.find("--on_interrupt: \"later\" is not one of ask, detach, cancel"),
            std::string::npos)
      << run.output;
  EXPECT_EQ(service_.get_calls(), 0);
}

}  // namespace
}  // namespace loom
