// Supervision of one loom-trainer process (one rank of one attempt of a job).
//
// The trainer speaks a line protocol on stdout: one loom.TrainerEvent
// (proto/trainer_events.proto) per line in protobuf's JSON mapping, read with protobuf's parser
// (worker/trainer/trainer_events.h; fields this worker does not know are ignored, a line that is
// not an event is logged and skipped). Its stderr goes through a pipe to a per-rank log file.
// RankProcess parses the events into a loom.v1.RankStatus that the worker daemon reports in its
// heartbeats (with the exit code, the killing signal and the exit time once the process ended),
// and keeps every stdout and stderr line in a bounded ring (LogRing, sequence-numbered) from
// which the daemon sends new lines to the scheduler (StreamLogs).
//
// Stopping: Stop() is immediate (SIGTERM to the process group, SIGKILL after stop_grace; the
// rank ends STOPPED). StopGracefully() sends SIGUSR1 to the trainer: the ranks agree on a step,
// write a final checkpoint and exit 0 after a "stopped" event carrying checkpoint_step; the rank
// then ends STOPPED with graceful_stop set. So does a rank that a peer's SIGUSR1 stopped before
// this worker's own stop request arrived (the gang agrees on the stop). A rank asked to stop
// gracefully that exits otherwise ends FAILED (unless Stop() was called too).
#ifndef LOOM_WORKER_RANK_PROCESS_H_
#define LOOM_WORKER_RANK_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/worker_service.pb.h"
#include "worker/log_ring.h"

namespace loom::worker {

struct RankProcessOptions {
  // Path of the loom-trainer executable.
  std::string trainer_path;
  // Directory for this rank's files (spec.json, rank_<r>.log). Created if missing.
  std::string run_dir;
  // Time between SIGTERM and SIGKILL when stopping.
  absl::Duration stop_grace = absl::Seconds(5);
  // Extra environment entries ("KEY=VALUE") for the trainer; each replaces an inherited entry of
  // the same name.
  std::vector<std::string> extra_env;
  // The node's advertised address: the trainer's Gloo transport binds it (--bind_address).
  // Empty: the trainer picks the local address on the route to master_addr.
  std::string bind_address;
};

// Per-step numbers of a rank that the heartbeat does not carry; the worker exports them as
// Prometheus gauges (worker/worker_metrics.h). Zero until the rank reports "started".
struct RankStats {
  // The trainer's pid: the cumulative counts below are per process (worker_metrics.h turns them
  // into counter increments per process, so two processes of one rank number never mix).
  int64_t process_id = 0;
  double step_seconds = 0;         // wall time of the last optimizer step ("step_time_s")
  // Global training tokens of the steps since the process started: the sum over step events of
  // tokens_per_s * step_time_s (the step's global tokens), for loom_trainer_tokens_total.
  double tokens = 0;
  double partition_bytes = 0;      // this rank's ZeRO-3 parameter partition ("partition_bytes")
  double peak_gathered_bytes = 0;  // peak all-gathered parameter bytes in the last step
  // Unix time of the last "step" / "checkpoint" event. Before the first one: of the "started"
  // event for steps, and for checkpoints the commit time of the checkpoint the attempt resumed
  // from (the started event's time for a fresh attempt), so that a job that crashes and resumes
  // in a loop shows its checkpoint ageing.
  double last_step_unix_seconds = 0;
  double last_checkpoint_unix_seconds = 0;
  // Of the last step: seconds blocked in collectives ("comm_s") and that plus seconds spent
  // building input batches ("comm_s" + "data_s"); both 0 if the trainer does not report them.
  double communication_seconds = 0;
  double stall_seconds = 0;
  // Optimizer steps rolled back (SuperOffload's speculative step) since the process started;
  // the sum of the step events' optimizer_rollbacks (0 today).
  double optimizer_rollbacks = 0;
  // ZenFlow's numbers of the last step (TrainerEvent.Step zenflow_*); `zenflow` is false for
  // jobs without a zenflow block (then the worker exports no ZenFlow series).
  bool zenflow = false;
  double zenflow_stall_seconds = 0;
  double zenflow_selected_mass_fraction = 0;
  double zenflow_update_interval_steps = 0;
  double zenflow_bytes_moved = 0;
  // SuperOffload's numbers (TrainerEvent.Step speculated_sub_groups ... optimizer_work_s);
  // `superoffload` is set by a "started" event naming a superoffload_casting (SuperOffload jobs
  // only; then the worker exports the loom_trainer_superoffload_* series). The counts are
  // cumulative since the trainer process started; the fraction and seconds are the last step's.
  bool superoffload = false;
  double superoffload_speculated = 0;     // sub-group steps started during backward
  double superoffload_hits = 0;           // of them, committed as they were
  double superoffload_rollbacks_overflow = 0;
  double superoffload_rollbacks_clip = 0;
  double superoffload_replays = 0;        // replayed with the clip coefficient
  double superoffload_speculation_paused = 0;  // not speculated: the step before clipped
  double superoffload_speculation_no_buffer = 0;  // not speculated: no NVMe swap buffers free
  double superoffload_overlap_fraction = 0;
  double superoffload_optimizer_work_seconds = 0;
  // Memory of the last step, bytes (TrainerEvent.Step's memory fields: per-kind peaks, whose
  // kinds are disjoint, and the peak of their sum). Parameters, gradients and optimizer state
  // live through the step, so their peaks are their sizes and add up to the model-state
  // footprint; buffers, cached buffers and offloaded activations come and go within it.
  // memory_reported: a step event carried them (false before the first step).
  bool memory_reported = false;
  double param_bytes = 0;
  double grad_bytes = 0;
  double optimizer_state_bytes = 0;
  double buffer_peak_bytes = 0;
  double cached_peak_bytes = 0;
  double activation_offload_peak_bytes = 0;
  double memory_peak_bytes = 0;  // peak of the sum over kinds (what must fit)
};

// One running (or finished) trainer process. Thread-safe.
class RankProcess {
 public:
  // Writes the spec, spawns the trainer in its own process group and starts reading its events.
  // INVALID_ARGUMENT if the assignment is malformed, INTERNAL if the process cannot start.
  static absl::StatusOr<std::unique_ptr<RankProcess>> Start(const loom::v1::RankAssignment& a,
                                                            const RankProcessOptions& options);
  ~RankProcess();  // Stops the process (if running) and joins the reader thread.

  RankProcess(const RankProcess&) = delete;
  RankProcess& operator=(const RankProcess&) = delete;

  // The latest status (state, progress, rendezvous port, exit code, error).
  loom::v1::RankStatus Status() const;
  RankStats Stats() const;
  bool Finished() const;
  // SIGTERM to the process group, SIGKILL after stop_grace. Idempotent; does not block.
  void Stop();
  // SIGUSR1 to the trainer (checkpoint, then stop). Idempotent; no-op after Stop().
  void StopGracefully();
  // Output lines newer than sequence `after` (LogRing::After).
  std::vector<loom::v1::RankLogLine> LogLinesAfter(int64_t after, size_t max_lines,
                                                   size_t max_bytes) const {
    return logs_.After(after, max_lines, max_bytes);
  }
  const std::string& log_path() const { return log_path_; }
  pid_t pid() const { return pid_; }

 private:
  RankProcess() = default;
  void ReadEvents(int fd);
  // Copies the trainer's stderr to the log file and the ring until EOF.
  void ReadStderr(int fd, int log_fd);
  void HandleEvent(const std::string& line);

  pid_t pid_ = -1;
  std::string log_path_;
  // Commit time (Unix seconds) of the checkpoint this attempt resumes from; 0 without one.
  double resumed_checkpoint_unix_seconds_ = 0;
  // The memory cgroup's OOM kill count before the spawn (worker/oom_kill.h); nullopt: unknown.
  std::optional<int64_t> oom_kills_at_start_;
  absl::Duration stop_grace_;
  std::thread reader_;
  std::thread stderr_reader_;  // joined by reader_ before the exit status is read
  std::thread killer_;
  LogRing logs_;

  mutable absl::Mutex mu_;
  loom::v1::RankStatus status_ ABSL_GUARDED_BY(mu_);
  RankStats stats_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool saw_done_ ABSL_GUARDED_BY(mu_) = false;
  bool graceful_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool saw_graceful_stop_ ABSL_GUARDED_BY(mu_) = false;  // "stopped" with checkpoint_step
};

}  // namespace loom::worker

#endif  // LOOM_WORKER_RANK_PROCESS_H_
