// Test support: real daemons started as child processes on loopback, found through the ready
// files they write (common/daemon.h), and stopped when the test ends.
#ifndef LOOM_TESTS_TESTING_SUBPROCESS_H_
#define LOOM_TESTS_TESTING_SUBPROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/daemon.h"

namespace loom::testing {

// Path of a binary or data file in the test's runfiles ("services/cli/loomctl").
std::string RunfilePath(const std::string& relative);

// A child process in its own process group, stdout+stderr to `log_path`. Not thread-safe.
class Subprocess {
 public:
  // INTERNAL if it cannot be started.
  static absl::StatusOr<Subprocess> Start(const std::vector<std::string>& argv,
                                          const std::string& log_path);
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  ~Subprocess();  // Stop()

  // SIGTERM the group, wait up to `grace`, then SIGKILL. Returns the exit status (waitpid form).
  int Stop(absl::Duration grace = absl::Seconds(10));
  // SIGKILL the group at once (a crash), reaping it.
  void Kill();
  // Blocks until the process exits (at most `timeout`, then SIGKILL); returns the waitpid status.
  int Wait(absl::Duration timeout = absl::Seconds(60));
  bool Running();
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }

 private:
  Subprocess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}
  pid_t pid_ = -1;
  std::string log_path_;
};

// Waits until `ready_file` exists and parses; fails early if `process` exits first.
// DEADLINE_EXCEEDED after `timeout`, with the log's tail in the message.
absl::StatusOr<ReadyInfo> WaitReady(Subprocess& process, const std::string& ready_file,
                                    absl::Duration timeout = absl::Seconds(30));

// Starts the daemon `binary` (a runfiles path such as "services/scheduler/loom-scheduler") with
// `args` plus --ready_file=<dir>/<name>.ready.json, logging to <dir>/<name>.log, and waits until
// it is ready. The daemon's ReadyInfo is stored in `*info`.
absl::StatusOr<std::unique_ptr<Subprocess>> StartDaemon(const std::string& dir,
                                                        const std::string& name,
                                                        const std::string& binary,
                                                        std::vector<std::string> args,
                                                        ReadyInfo* info);

// The exit code in a waitpid status, or -1 if the process was killed by a signal.
int ExitCode(int wait_status);

// The last `max_bytes` of a file (for failure messages).
std::string Tail(const std::string& path, size_t max_bytes = 4000);

// HTTP GET http://host:port/path on loopback; returns the body. UNAVAILABLE on connection errors.
absl::StatusOr<std::string> HttpGet(const std::string& url);

}  // namespace loom::testing

#endif  // LOOM_TESTS_TESTING_SUBPROCESS_H_
