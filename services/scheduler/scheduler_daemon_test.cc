// Starts the real loom-scheduler binary: waits for its ready file, checks gRPC health, submits a
// job, stops it with SIGTERM (exit code 0), restarts it on the same database and finds the job.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

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
    std::vector<std::string> args = {
        BinaryPath(),
        "--db=" + TmpDir() + "/daemon.db",
        "--checkpoint_root=" + TmpDir() + "/checkpoints",
        "--ready_file=" + ready_file_,
        "--fortunes_dir=" + TmpDir() + "/fortunes",
        "--schedule_interval_ms=20",
    };
    const std::string log = TmpDir() + "/" + name + ".log";
    pid_ = fork();
    if (pid_ == 0) {
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }

  ~Daemon() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  // Polls the ready file (at most 30 s). Fails if the child exits first.
  absl::StatusOr<ReadyInfo> WaitReady() {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      absl::StatusOr<ReadyInfo> info = ReadReadyFile(ready_file_);
      if (info.ok()) return info;
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return absl::InternalError(absl::StrCat("loom-scheduler exited early, status ", status));
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return absl::DeadlineExceededError("no ready file within 30 s");
  }

  // SIGTERM, then waits (at most 20 s) and returns the exit code (-1 on timeout or signal).
  int Terminate() {
    kill(pid_, SIGTERM);
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return -1;
  }

 private:
  std::string ready_file_;
  pid_t pid_ = -1;
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
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open("/dev/null", O_WRONLY);
    dup2(fd, 2);
    std::string bin = BinaryPath();
    std::string root = "--checkpoint_root=" + TmpDir();
    char* argv[] = {bin.data(), root.data(), nullptr};
    execv(argv[0], argv);
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);  // --db is required
}

}  // namespace
}  // namespace loom
