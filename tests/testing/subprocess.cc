#include "tests/testing/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <httplib.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/file_util.h"

extern char** environ;

namespace loom::testing {

std::string RunfilePath(const std::string& relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(srcdir != nullptr ? srcdir : ".", "/loom/", relative);
}

absl::StatusOr<Subprocess> Subprocess::Start(const std::vector<std::string>& argv,
                                             const std::string& log_path) {
  int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return absl::InternalError(absl::StrCat("open ", log_path, ": ", std::strerror(errno)));
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (std::string& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, log_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, log_fd, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, args[0].c_str(), &actions, &attr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(log_fd);
  if (rc != 0) return absl::InternalError(absl::StrCat("spawn ", args[0], ": ", std::strerror(rc)));
  return Subprocess(pid, log_path);
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(other.pid_), log_path_(std::move(other.log_path_)) {
  other.pid_ = -1;
}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    Stop();
    pid_ = other.pid_;
    log_path_ = std::move(other.log_path_);
    other.pid_ = -1;
  }
  return *this;
}

Subprocess::~Subprocess() { Stop(); }

bool Subprocess::Running() {
  if (pid_ < 0) return false;
  int status;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

int Subprocess::Stop(absl::Duration grace) {
  if (pid_ < 0) return 0;
  ::kill(-pid_, SIGTERM);
  absl::Time deadline = absl::Now() + grace;
  int status = 0;
  while (true) {
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) break;
    if (absl::Now() > deadline) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ::kill(-pid_, SIGKILL);  // children left in the group (e.g. trainer ranks)
  pid_ = -1;
  return status;
}

int Subprocess::Wait(absl::Duration timeout) {
  if (pid_ < 0) return 0;
  absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) != pid_) {
    if (absl::Now() > deadline) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  pid_ = -1;
  return status;
}

absl::StatusOr<std::unique_ptr<Subprocess>> StartDaemon(const std::string& dir,
                                                        const std::string& name,
                                                        const std::string& binary,
                                                        std::vector<std::string> args,
                                                        ReadyInfo* info) {
  const std::string ready = absl::StrCat(dir, "/", name, ".ready.json");
  ::unlink(ready.c_str());  // a stale file from an earlier daemon must not count as ready
  args.insert(args.begin(), RunfilePath(binary));
  args.push_back(absl::StrCat("--ready_file=", ready));
  auto started = Subprocess::Start(args, absl::StrCat(dir, "/", name, ".log"));
  if (!started.ok()) return started.status();
  auto process = std::make_unique<Subprocess>(std::move(*started));
  absl::StatusOr<ReadyInfo> ready_info = WaitReady(*process, ready);
  if (!ready_info.ok()) {
    return absl::Status(ready_info.status().code(),
                        absl::StrCat(name, ": ", ready_info.status().message()));
  }
  *info = *ready_info;
  return process;
}

int ExitCode(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
}

void Subprocess::Kill() {
  if (pid_ < 0) return;
  ::kill(-pid_, SIGKILL);
  int status;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

std::string Tail(const std::string& path, size_t max_bytes) {
  auto text = ReadFile(path);
  if (!text.ok()) return absl::StrCat("(no log: ", text.status().message(), ")");
  if (text->size() <= max_bytes) return *text;
  return text->substr(text->size() - max_bytes);
}

absl::StatusOr<ReadyInfo> WaitReady(Subprocess& process, const std::string& ready_file,
                                    absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    auto info = ReadReadyFile(ready_file);
    if (info.ok()) return info;
    if (!process.Running()) {
      return absl::FailedPreconditionError(
          absl::StrCat("process exited before it was ready; log:\n", Tail(process.log_path())));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("not ready after ", absl::FormatDuration(timeout), "; log:\n",
                   Tail(process.log_path())));
}

absl::StatusOr<std::string> HttpGet(const std::string& url) {
  // url = http://host:port/path
  constexpr absl::string_view kScheme = "http://";
  if (!absl::StartsWith(url, kScheme)) return absl::InvalidArgumentError(absl::StrCat("not http: ", url));
  std::string rest = url.substr(kScheme.size());
  size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  std::string path = slash == std::string::npos ? "/" : rest.substr(slash);
  size_t colon = hostport.rfind(':');
  int port = 80;
  if (colon == std::string::npos || !absl::SimpleAtoi(hostport.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(absl::StrCat("no port in ", url));
  }
  httplib::Client client(hostport.substr(0, colon), port);
  client.set_connection_timeout(5);
  client.set_read_timeout(10);
  auto res = client.Get(path.c_str());
  if (!res) return absl::UnavailableError(absl::StrCat("GET ", url, " failed"));
  if (res->status != 200) {
    return absl::UnavailableError(absl::StrCat("GET ", url, ": HTTP ", res->status));
  }
  return res->body;
}

}  // namespace loom::testing
