#include "worker/rank_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "worker/oom_kill.h"
#include "worker/trainer/trainer_events.h"

extern char** environ;

namespace loom::worker {
namespace {

// Last non-empty line of a file (the trainer's last stderr line), at most 1 KiB read back.
std::string LastLine(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  std::streamoff start = std::max<std::streamoff>(0, size - 1024);
  in.seekg(start);
  std::string tail((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> lines = absl::StrSplit(tail, '\n', absl::SkipWhitespace());
  return lines.empty() ? "" : lines.back();
}

// When the checkpoint in step directory `step_dir` was committed: the newest modification time
// of the files directly in it (its manifests are written after its shards, and the last one
// commits it; storage/checkpoint/consolidate.h). 0 if the directory cannot be read.
double CommitTimeUnixSeconds(const std::string& step_dir) {
  std::error_code ec;
  double newest = 0;
  for (std::filesystem::directory_iterator it(step_dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    struct stat st;
    // stat(2) rather than last_write_time: C++17's file clock has no conversion to Unix time.
    if (::stat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    newest = std::max(newest, st.st_mtim.tv_sec + st.st_mtim.tv_nsec * 1e-9);
  }
  return newest;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RankProcess>> RankProcess::Start(
    const loom::v1::RankAssignment& a, const RankProcessOptions& options) {
  if (a.job_id().empty() || a.world_size() < 1 || a.rank() < 0 || a.rank() >= a.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("bad assignment: job '", a.job_id(), "' rank ",
                                                   a.rank(), " of ", a.world_size()));
  }
  RETURN_IF_ERROR(MakeDirs(options.run_dir));
  std::string spec_json;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  auto st = google::protobuf::util::MessageToJsonString(a.spec(), &spec_json, print);
  if (!st.ok()) return absl::InternalError(absl::StrCat("cannot encode spec: ", st.ToString()));
  std::string spec_path = absl::StrCat(options.run_dir, "/spec.json");
  RETURN_IF_ERROR(WriteFileAtomically(spec_path, spec_json));

  std::unique_ptr<RankProcess> p(new RankProcess());
  p->stop_grace_ = options.stop_grace;
  p->log_path_ = absl::StrCat(options.run_dir, "/rank_", a.rank(), ".log");
  {
    absl::MutexLock l(&p->mu_);
    p->status_.set_job_id(a.job_id());
    p->status_.set_attempt(a.attempt());
    p->status_.set_rank(a.rank());
    p->status_.set_state(loom::v1::RANK_STATE_STARTING);
  }

  std::vector<std::string> args = {
      options.trainer_path,
      absl::StrCat("--spec=", spec_path),
      absl::StrCat("--rank=", a.rank()),
      absl::StrCat("--world_size=", a.world_size()),
      absl::StrCat("--master_addr=", a.master_addr()),
      absl::StrCat("--master_port=", a.master_port()),
      absl::StrCat("--checkpoint_dir=", a.checkpoint_dir()),
      absl::StrCat("--job_id=", a.job_id()),
  };
  if (!a.resume_from().empty()) {
    args.push_back(absl::StrCat("--resume_from=", a.resume_from()));
    p->resumed_checkpoint_unix_seconds_ = CommitTimeUnixSeconds(a.resume_from());
  }
  if (!options.bind_address.empty()) {
    args.push_back(absl::StrCat("--bind_address=", options.bind_address));
  }
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_store;
  // extra_env replaces inherited entries of the same name (glibc's getenv returns the first
  // match, so an inherited CUDA_VISIBLE_DEVICES would otherwise win over the rank's own).
  std::set<std::string> overridden;
  for (const std::string& e : options.extra_env) overridden.insert(e.substr(0, e.find('=')));
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    if (overridden.count(entry.substr(0, entry.find('='))) == 0) env_store.push_back(entry);
  }
  for (const std::string& e : options.extra_env) env_store.push_back(e);
  std::vector<char*> envp;
  for (std::string& s : env_store) envp.push_back(s.data());
  envp.push_back(nullptr);

  int out_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  // A trainer blocks when its event pipe is full, and its peers then stall in their collectives.
  // 1 MiB (Linux's default pipe-max-size; 64 KiB otherwise) holds thousands of step events, so a
  // worker that is briefly unresponsive (paused, swapping) does not stall the gang.
  (void)::fcntl(out_pipe[1], F_SETPIPE_SZ, 1 << 20);
  int log_fd = ::open(p->log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return absl::InternalError(absl::StrCat("cannot open ", p->log_path_, ": ", std::strerror(errno)));
  }
  // stderr through a pipe too: the reader copies it to the log file and the line ring.
  int err_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    ::close(log_fd);
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(e)));
  }
  (void)::fcntl(err_pipe[1], F_SETPIPE_SZ, 1 << 20);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Own process group (Stop() signals the whole group), and a clean signal state: the daemon
  // blocks SIGTERM/SIGINT in all its threads for its sigwait thread, and a spawned child would
  // otherwise inherit that mask and never see the SIGTERM that asks it to stop.
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t empty_mask, default_signals;
  sigemptyset(&empty_mask);
  posix_spawnattr_setsigmask(&attr, &empty_mask);
  sigemptyset(&default_signals);
  sigaddset(&default_signals, SIGTERM);
  sigaddset(&default_signals, SIGINT);
  sigaddset(&default_signals, SIGPIPE);
  posix_spawnattr_setsigdefault(&attr, &default_signals);
  pid_t pid = -1;
  // Before the spawn: a kill of this rank must count after this reading.
  p->oom_kills_at_start_ = ReadOomKillCount();
  int rc = ::posix_spawn(&pid, options.trainer_path.c_str(), &actions, &attr, argv.data(),
                         envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (rc != 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    ::close(log_fd);
    return absl::InternalError(
        absl::StrCat("cannot start ", options.trainer_path, ": ", std::strerror(rc)));
  }
  p->pid_ = pid;
  {
    absl::MutexLock l(&p->mu_);
    p->stats_.process_id = pid;
  }
  LOG(INFO) << "started rank " << a.rank() << "/" << a.world_size() << " of " << a.job_id()
            << " attempt " << a.attempt() << " pid " << pid << " log " << p->log_path_;
  int read_fd = out_pipe[0], err_fd = err_pipe[0];
  RankProcess* raw = p.get();
  p->stderr_reader_ = std::thread([raw, err_fd, log_fd] { raw->ReadStderr(err_fd, log_fd); });
  p->reader_ = std::thread([raw, read_fd] { raw->ReadEvents(read_fd); });
  return p;
}

RankProcess::~RankProcess() {
  if (!Finished()) Stop();
  if (reader_.joinable()) reader_.join();
  if (stderr_reader_.joinable()) stderr_reader_.join();
  if (killer_.joinable()) killer_.join();
}

loom::v1::RankStatus RankProcess::Status() const {
  absl::MutexLock l(&mu_);
  loom::v1::RankStatus status = status_;
  // Every rank's worker reports its rank's latest step and when it came (rank_progress.h).
  if (status.progress().step() > 0 && stats_.last_step_unix_seconds > 0) {
    status.set_last_step_time_us(static_cast<int64_t>(stats_.last_step_unix_seconds * 1e6));
  }
  return status;
}

RankStats RankProcess::Stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

bool RankProcess::Finished() const {
  absl::MutexLock l(&mu_);
  return finished_;
}

void RankProcess::Stop() {
  {
    absl::MutexLock l(&mu_);
    if (finished_ || stop_requested_) return;
    stop_requested_ = true;
  }
  ::kill(-pid_, SIGTERM);
  killer_ = std::thread([this] {
    absl::MutexLock l(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&done), stop_grace_)) {
      LOG(WARNING) << "rank process " << pid_ << " ignored SIGTERM; sending SIGKILL";
      ::kill(-pid_, SIGKILL);
    }
  });
}

void RankProcess::StopGracefully() {
  {
    absl::MutexLock l(&mu_);
    if (finished_ || stop_requested_ || graceful_requested_) return;
    graceful_requested_ = true;
  }
  LOG(INFO) << "asking rank process " << pid_ << " to checkpoint and stop (SIGUSR1)";
  ::kill(pid_, SIGUSR1);
}

void RankProcess::ReadStderr(int fd, int log_fd) {
  std::string buf;
  char chunk[4096];
  while (true) {
    ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t off = 0; off < n;) {
      ssize_t w = ::write(log_fd, chunk + off, static_cast<size_t>(n - off));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;  // a full disk must not stop the rank; the ring still has the lines
      off += w;
    }
    buf.append(chunk, static_cast<size_t>(n));
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      logs_.Add("stderr", absl::string_view(buf).substr(0, nl));
      buf.erase(0, nl + 1);
    }
    if (buf.size() > kMaxRankLogLineBytes) {  // an endless line: emit what we have
      logs_.Add("stderr", buf);
      buf.clear();
    }
  }
  if (!buf.empty()) logs_.Add("stderr", buf);
  ::close(fd);
  ::close(log_fd);
}

void RankProcess::HandleEvent(const std::string& line) {
  // Unknown fields are ignored here (a newer trainer's extra field must not lose the event); the
  // trainer's own tests parse strictly.
  absl::StatusOr<loom::TrainerEvent> parsed =
      loom::trainer::ParseTrainerEventLine(line, /*ignore_unknown_fields=*/true);
  if (!parsed.ok()) {
    LOG(WARNING) << "trainer pid " << pid_ << " printed a non-event line (" << parsed.status()
                 << "): " << line;
    return;
  }
  const loom::TrainerEvent& ev = *parsed;
  const double now_unix_s = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  absl::MutexLock l(&mu_);
  loom::v1::Progress* prog = status_.mutable_progress();
  switch (ev.kind_case()) {
    case loom::TrainerEvent::kRendezvous:
      status_.set_rendezvous_port(ev.rendezvous().port());
      break;
    case loom::TrainerEvent::kStarted:
      status_.set_state(loom::v1::RANK_STATE_RUNNING);
      // Step and checkpoint ages count from the rank's start until the first of each arrives.
      stats_.partition_bytes = static_cast<double>(ev.started().partition_bytes());
      stats_.last_step_unix_seconds = now_unix_s;
      // A resumed attempt's newest checkpoint is the one it resumed from, as old as its commit
      // (issue 53: the age restarted at each attempt, so LoomCheckpointTooOld never fired for a
      // job that crashes and resumes in a loop).
      stats_.last_checkpoint_unix_seconds =
          ev.started().start_step() > 0 && resumed_checkpoint_unix_seconds_ > 0
              ? resumed_checkpoint_unix_seconds_
              : now_unix_s;
      stats_.superoffload = !ev.started().superoffload_casting().empty();
      // A resumed attempt starts with the checkpoint it resumed from as its newest one (issue
      // 53: it read 0 until the attempt wrote its own, overstating the steps at risk).
      if (ev.started().start_step() > prog->last_checkpoint_step()) {
        prog->set_last_checkpoint_step(ev.started().start_step());
      }
      break;
    case loom::TrainerEvent::kStep: {
      const loom::TrainerEvent::Step& st = ev.step();
      status_.set_state(loom::v1::RANK_STATE_RUNNING);
      prog->set_step(st.step());
      prog->set_loss(st.loss());
      prog->set_tokens_per_second(st.tokens_per_s());
      stats_.step_seconds = st.step_time_s();
      stats_.tokens += std::round(st.tokens_per_s() * st.step_time_s());
      stats_.partition_bytes = static_cast<double>(st.partition_bytes());
      stats_.peak_gathered_bytes = static_cast<double>(st.peak_gathered_bytes());
      stats_.communication_seconds = st.comm_s();
      stats_.stall_seconds = st.comm_s() + st.data_s();
      stats_.optimizer_rollbacks += static_cast<double>(st.optimizer_rollbacks());
      if (st.has_zenflow_stall_s()) {
        stats_.zenflow = true;
        stats_.zenflow_stall_seconds = st.zenflow_stall_s();
        stats_.zenflow_selected_mass_fraction = st.zenflow_selected_mass_fraction();
        stats_.zenflow_update_interval_steps = static_cast<double>(st.zenflow_update_interval());
        stats_.zenflow_bytes_moved = static_cast<double>(st.zenflow_bytes_moved());
      }
      if (stats_.superoffload) {
        stats_.superoffload_speculated = static_cast<double>(st.speculated_sub_groups());
        stats_.superoffload_hits = static_cast<double>(st.speculation_hits());
        stats_.superoffload_rollbacks_overflow = static_cast<double>(st.rollbacks_overflow());
        stats_.superoffload_rollbacks_clip = static_cast<double>(st.rollbacks_clip());
        stats_.superoffload_replays = static_cast<double>(st.replays());
        stats_.superoffload_speculation_paused = static_cast<double>(st.speculation_paused());
        stats_.superoffload_speculation_no_buffer =
            static_cast<double>(st.speculation_no_buffer());
        stats_.superoffload_overlap_fraction = st.optimizer_overlap_fraction();
        stats_.superoffload_optimizer_work_seconds = st.optimizer_work_s();
      }
      stats_.memory_reported = true;
      stats_.param_bytes = static_cast<double>(st.param_bytes());
      stats_.grad_bytes = static_cast<double>(st.grad_bytes());
      stats_.optimizer_state_bytes = static_cast<double>(st.optimizer_state_bytes());
      stats_.buffer_peak_bytes = static_cast<double>(st.buffer_bytes());
      stats_.cached_peak_bytes = static_cast<double>(st.cached_bytes());
      stats_.activation_offload_peak_bytes = static_cast<double>(st.activation_offload_bytes());
      stats_.memory_peak_bytes = static_cast<double>(st.peak_bytes());
      stats_.last_step_unix_seconds = now_unix_s;
      break;
    }
    case loom::TrainerEvent::kEval:
      if (!prog->has_eval_loss()) prog->set_initial_eval_loss(ev.eval().loss());
      prog->set_eval_loss(ev.eval().loss());
      prog->set_eval_step(ev.eval().step());
      prog->set_has_eval_loss(true);
      break;
    case loom::TrainerEvent::kCheckpoint:
      prog->set_last_checkpoint_step(ev.checkpoint().step());
      stats_.last_checkpoint_unix_seconds = now_unix_s;
      break;
    case loom::TrainerEvent::kDone:
      saw_done_ = true;
      prog->set_initial_eval_loss(ev.done().initial_eval_loss());
      prog->set_eval_loss(ev.done().final_eval_loss());
      prog->set_eval_step(ev.done().step());
      prog->set_has_eval_loss(true);
      break;
    case loom::TrainerEvent::kStopped:
      if (ev.stopped().has_checkpoint_step()) {
        saw_graceful_stop_ = true;
        prog->set_last_checkpoint_step(ev.stopped().checkpoint_step());
      }
      break;
    case loom::TrainerEvent::kError:
      status_.set_error(ev.error().message().empty() ? "unknown error" : ev.error().message());
      break;
    default:  // process_start, warning: nothing to report
      break;
  }
}

void RankProcess::ReadEvents(int fd) {
  std::string buf;
  char chunk[4096];
  while (true) {
    ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buf.append(chunk, static_cast<size_t>(n));
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      if (!line.empty()) {
        logs_.Add("stdout", line);
        HandleEvent(line);
      }
    }
  }
  ::close(fd);
  int wstatus = 0;
  while (::waitpid(pid_, &wstatus, 0) < 0 && errno == EINTR) {
  }
  int exit_code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus)
                                     : (WIFSIGNALED(wstatus) ? 128 + WTERMSIG(wstatus) : -1);
  // The trainer's stderr reaches EOF once it exited: the log file is complete.
  if (stderr_reader_.joinable()) stderr_reader_.join();
  std::string last_line = LastLine(log_path_);
  const int64_t exit_time_us = absl::ToUnixMicros(absl::Now());
  absl::MutexLock l(&mu_);
  status_.set_exit_code(exit_code);
  // For failure attribution (scheduler/restart_policy.h): which rank died first, and how.
  status_.set_exit_time_us(exit_time_us);
  if (WIFSIGNALED(wstatus)) status_.set_term_signal(WTERMSIG(wstatus));
  if (WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL && oom_kills_at_start_.has_value()) {
    // The OOM killer and `kill -9` look alike in the exit status; the cgroup's count does not.
    const std::optional<int64_t> now = ReadOomKillCount();
    if (now.has_value()) {
      status_.set_oom_kill(*now > *oom_kills_at_start_ ? loom::v1::OOM_KILL_YES
                                                       : loom::v1::OOM_KILL_NO);
    }
  }
  if (exit_code == 0 && saw_done_) {
    status_.set_state(loom::v1::RANK_STATE_SUCCEEDED);
  } else if (exit_code == 0 && saw_graceful_stop_) {
    // Not only when this worker asked: the ranks agree on the stop (a SIGUSR1 on any one rank
    // stops the gang), so a rank whose peer was signalled first ends the same way, and can do so
    // before this worker's own stop entry arrives in a heartbeat reply.
    status_.set_state(loom::v1::RANK_STATE_STOPPED);
    status_.set_graceful_stop(true);
  } else if (stop_requested_) {
    status_.set_state(loom::v1::RANK_STATE_STOPPED);
  } else {
    status_.set_state(loom::v1::RANK_STATE_FAILED);
    if (status_.error().empty()) {
      status_.set_error(last_line.empty() ? absl::StrCat("trainer exited with code ", exit_code)
                                          : last_line);
    }
  }
  finished_ = true;
  LOG(INFO) << "rank " << status_.rank() << " of " << status_.job_id() << " exited with code "
            << exit_code << " (" << loom::v1::RankState_Name(status_.state()) << ")";
}

}  // namespace loom::worker
