// Starts the real loom-scheduler binary: waits for its ready file, checks gRPC health, submits a
// job, stops it with SIGTERM (exit code 0), restarts it on the same database and finds the job.

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/daemon.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "proto/job_service.grpc.pb.h"
#include "scheduler/test_job_spec.h"
#include "services/scheduler/testdata/health.grpc.pb.h"
#include "tests/testing/subprocess.h"

namespace loom {
namespace {

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

std::string BinaryPath() {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/loom/services/scheduler/loom-scheduler");
}

// A running loom-scheduler child process.
class Daemon {
 public:
  explicit Daemon(const std::string& name) : ready_file_(TmpDir() + "/" + name + ".ready") {
    std::remove(ready_file_.c_str());
    auto p = testing::Subprocess::Start({BinaryPath(), "--db=" + TmpDir() + "/daemon.db",
                                         "--checkpoint_root=" + TmpDir() + "/checkpoints",
                                         "--ready_file=" + ready_file_,
                                         "--fortunes_dir=" + TmpDir() + "/fortunes",
                                         "--schedule_interval_ms=20"},
                                        TmpDir() + "/" + name + ".log");
    EXPECT_TRUE(p.ok()) << p.status();
    if (p.ok()) process_ = std::make_unique<testing::Subprocess>(std::move(*p));
  }

  absl::StatusOr<ReadyInfo> WaitReady() { return testing::WaitReady(*process_, ready_file_); }

  // SIGTERM, then the exit code (-1 if it had to be killed).
  int Terminate() { return testing::ExitCode(process_->Stop(absl::Seconds(20))); }

 private:
  std::string ready_file_;
  std::unique_ptr<testing::Subprocess> process_;
};

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return ctx;
}

TEST(SchedulerDaemonTest, ServesHealthSurvivesRestartAndStopsOnSigterm) {
  ASSERT_TRUE(MakeDirs(TmpDir() + "/fortunes").ok());
  std::string job_id;
  {
    Daemon daemon("first");
    absl::StatusOr<ReadyInfo> ready = daemon.WaitReady();
    ASSERT_TRUE(ready.ok()) << ready.status();
    EXPECT_EQ(ready->name, "loom-scheduler");
    EXPECT_EQ(ready->metrics_url.rfind("http://127.0.0.1:", 0), 0u) << ready->metrics_url;
    auto channel = grpc::CreateChannel(ready->grpc_address, grpc::InsecureChannelCredentials());

    grpc::health::v1::HealthCheckResponse health;
    grpc::Status s = grpc::health::v1::Health::NewStub(channel)->Check(
        Ctx().get(), grpc::health::v1::HealthCheckRequest(), &health);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(health.status(), grpc::health::v1::HealthCheckResponse::SERVING);

    loom::v1::SubmitJobRequest req;
    *req.mutable_spec() = ValidTestJobSpec();
    loom::v1::SubmitJobResponse resp;
    s = loom::v1::JobService::NewStub(channel)->SubmitJob(Ctx().get(), req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    job_id = resp.job().id();
    EXPECT_EQ(daemon.Terminate(), 0);
  }
  {
    Daemon daemon("second");
    absl::StatusOr<ReadyInfo> ready = daemon.WaitReady();
    ASSERT_TRUE(ready.ok()) << ready.status();
    auto channel = grpc::CreateChannel(ready->grpc_address, grpc::InsecureChannelCredentials());
    loom::v1::GetJobRequest get;
    get.set_job_id(job_id);
    loom::v1::Job job;
    grpc::Status s = loom::v1::JobService::NewStub(channel)->GetJob(Ctx().get(), get, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_PENDING);
    EXPECT_EQ(job.reason(), "Unschedulable");  // no workers registered
    EXPECT_EQ(daemon.Terminate(), 0);
  }
}

TEST(SchedulerDaemonTest, MissingRequiredFlagExitsNonZero) {
  auto p = testing::Subprocess::Start({BinaryPath(), "--checkpoint_root=" + TmpDir()},
                                      TmpDir() + "/missing_db.log");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(testing::ExitCode(p->Wait()), 1);  // --db is required
}

}  // namespace
}  // namespace loom
