// Process-level tests of the loom-worker binary's startup and exit paths.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace loom {
namespace {

// Regression: an unwritable --ready_file made loom-worker return from main while its
// signal-handling std::thread was still joinable, so std::terminate aborted the process (SIGABRT)
// instead of exiting with an error naming the file.
TEST(WorkerMainTest, UnwritableReadyFileExitsWithErrorInsteadOfAborting) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::string bad_ready = dir + "/no/such/dir/ready.json";
  absl::StatusOr<testing::Subprocess> worker = testing::Subprocess::Start(
      {testing::RunfilePath("services/worker/loom-worker"), "--scheduler=127.0.0.1:1",
       "--node_id=n1", "--trainer=/bin/true", "--work_dir=" + dir + "/work",
       "--ready_file=" + bad_ready},
      dir + "/worker.log");
  ASSERT_TRUE(worker.ok()) << worker.status();
  const int status = worker->Wait(absl::Seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status) << ": "
                                 << testing::Tail(worker->log_path());
  EXPECT_EQ(WEXITSTATUS(status), 1) << testing::Tail(worker->log_path());
  EXPECT_NE(testing::Tail(worker->log_path()).find("ready.json"), std::string::npos)
      << testing::Tail(worker->log_path());
}

// A loopback TCP listener that accepts each connection and closes it at once, recording when:
// every connection attempt of a gRPC client fails before HTTP/2 SETTINGS, so the client backs
// off between attempts exactly as it does while its server is down.
class ConnectionRecorder {
 public:
  ConnectionRecorder() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Loop(); });
  }
  ~ConnectionRecorder() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }
  // Waits until `n` connections were accepted (at most `timeout`); returns their times.
  std::vector<absl::Time> WaitFor(size_t n, absl::Duration timeout) {
    absl::MutexLock l(&mu_);
    auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return accepted_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return accepted_;
  }

 private:
  void Loop() {
    while (true) {
      {
        absl::MutexLock l(&mu_);
        if (stop_) return;
      }
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      ::close(c);
      absl::MutexLock l(&mu_);
      accepted_.push_back(absl::Now());
    }
  }

  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<absl::Time> accepted_ ABSL_GUARDED_BY(mu_);
};

// Regression (issue 18): loom-worker used gRPC's default reconnect backoff (1 s growing 1.6x per
// failed attempt up to 120 s), so after a scheduler outage of ten seconds it waited up to another
// ten before it even tried again, and the restarted scheduler declared it lost. With the default
// --reconnect_backoff_max=1s the attempts keep coming at most ~1.2 s apart (1 s + 20 % jitter).
TEST(WorkerMainTest, ReconnectAttemptsStayWithinTheBackoffCap) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  ConnectionRecorder scheduler_port;
  absl::StatusOr<testing::Subprocess> worker = testing::Subprocess::Start(
      {testing::RunfilePath("services/worker/loom-worker"),
       absl::StrCat("--scheduler=127.0.0.1:", scheduler_port.port()), "--node_id=n1",
       "--trainer=/bin/true", "--work_dir=" + dir + "/work-reconnect",
       "--heartbeat_interval=100ms", "--rpc_timeout=1s"},
      dir + "/worker-reconnect.log");
  ASSERT_TRUE(worker.ok()) << worker.status();
  // Eight attempts: with gRPC's default backoff the 5th-8th gaps alone would be 4 s-27 s.
  const std::vector<absl::Time> attempts = scheduler_port.WaitFor(8, absl::Seconds(30));
  worker->Stop(absl::Seconds(10));
  std::string gaps;
  for (size_t i = 1; i < attempts.size(); ++i) {
    absl::StrAppend(&gaps, " ", absl::FormatDuration(attempts[i] - attempts[i - 1]));
  }
  ASSERT_GE(attempts.size(), 8u) << "gaps:" << gaps << "\n" << testing::Tail(worker->log_path());
  for (size_t i = 1; i < attempts.size(); ++i) {
    EXPECT_LE(attempts[i] - attempts[i - 1], absl::Milliseconds(1500))
        << "gap before connection attempt " << i + 1;
  }
}

TEST(WorkerMainTest, ReconnectBackoffOutOfRangeIsRefusedNamingTheFlag) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  absl::StatusOr<testing::Subprocess> worker = testing::Subprocess::Start(
      {testing::RunfilePath("services/worker/loom-worker"), "--scheduler=127.0.0.1:1",
       "--node_id=n1", "--trainer=/bin/true", "--work_dir=" + dir + "/work-bad",
       "--reconnect_backoff_max=0s"},
      dir + "/worker-bad.log");
  ASSERT_TRUE(worker.ok()) << worker.status();
  const int status = worker->Wait(absl::Seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << testing::Tail(worker->log_path());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(testing::Tail(worker->log_path()).find("--reconnect_backoff_max"), std::string::npos)
      << testing::Tail(worker->log_path());
}

}  // namespace
}  // namespace loom
