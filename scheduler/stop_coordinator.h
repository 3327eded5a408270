// File: scheduler/stop_coordinator.h
//
// The scheduler's stop coordinator (docs/scheduling.md "The scheduler's pieces";
// docs/design/DESIGN.md "Job model", Determined's cancel/kill): the graceful stops in progress
// (CancelJob of a RUNNING job, which is STOPPING until every rank ended) with their deadlines, what
// each stopping rank reported at its end, escalation to a kill, and the message a finished stop
// ends the job with. Kills (KillJob), preemption and drain end or requeue the job at once and only
// ever override a graceful stop here (Forget / Escalate).
//
//   * Begin(job, now, grace): a graceful stop with deadline now + grace (seconds-level units:
//     absl::Duration; SchedulerOptions::cancel_grace).
//   * RecordRankEnd: a stopping rank's final report. SUCCEEDED -> training had finished first;
//     STOPPED with graceful_stop -> rank 0's last_checkpoint_step is the final checkpoint; any
//     other end (FAILED, or stopped without its checkpoint) means the peers cannot complete
//     theirs: the caller must escalate (the returned reason).
//   * Late(now): stops past their deadline and not yet escalated (the caller escalates them).
//   * FinalMessage: the CANCELLED job's message once no rank of it is left.
//
// In memory only: the facade's Load re-creates a stop (with a fresh grace) for a STOPPING job.
// Thread-safety: NOT thread-safe and holds no lock: owned by the Scheduler facade and only
// called with its mutex (Scheduler::mu_) held. No clock of its own: `now` is an argument, so the
// deadlines are tested with plain times (stop_coordinator_test.cc). Errors: none; unknown job
// ids are no-ops (nullopt / false).
#ifndef LOOM_SCHEDULER_STOP_COORDINATOR_H_
#define LOOM_SCHEDULER_STOP_COORDINATOR_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/common.pb.h"
#include "proto/worker_service.pb.h"

namespace loom {

class StopCoordinator {
 public:
  // A graceful stop in progress (job STOPPING).
  struct StopRequest {
    absl::Time deadline;               // escalate to kill after this
    bool escalated = false;            // graceful stop abandoned: ranks are being killed
    std::string escalation;            // why it escalated
    int64_t final_checkpoint_step = -1;  // rank 0's, once it stopped gracefully
    bool training_finished = false;    // a rank succeeded before the stop took effect
  };

  // Starts (or restarts, resetting what was recorded) a graceful stop of `job_id`.
  void Begin(const std::string& job_id, absl::Time now, absl::Duration grace);
  // Sets the deadline to now + grace, keeping what was recorded (a new stop if there is none):
  // the facade's Load asks a STOPPING job's ranks again after a restart.
  void Rearm(const std::string& job_id, absl::Time now, absl::Duration grace) {
    stops_[job_id].deadline = now + grace;
  }
  bool Active(const std::string& job_id) const { return stops_.count(job_id) > 0; }
  const StopRequest* Find(const std::string& job_id) const;
  // The job ended or was requeued: its stop is over.
  void Forget(const std::string& job_id) { stops_.erase(job_id); }
  void Clear() { stops_.clear(); }
  // Job ids with a stop in progress, in id order.
  std::vector<std::string> Jobs() const;

  // A rank of a stopping job ended with `st` (state SUCCEEDED, STOPPED or FAILED). Returns the
  // reason to escalate (`exit_message` describes the rank's exit) when the graceful stop can no
  // longer complete; nullopt otherwise (also for an unknown job or one already escalated).
  std::optional<std::string> RecordRankEnd(const loom::v1::RankStatus& st,
                                           const std::string& exit_message);
  // Marks the stop escalated with `why`; false if there is none or it was escalated already.
  bool Escalate(const std::string& job_id, const std::string& why);
  // Stops whose deadline passed before `now` (strictly) and that were not escalated.
  std::vector<std::string> Late(absl::Time now) const;
  // The message of the job's CANCELLED end once its ranks are gone; `newest_checkpoint_step` is
  // the job's newest committed checkpoint (0: none). Empty if there is no stop.
  std::string FinalMessage(const std::string& job_id, int64_t newest_checkpoint_step) const;

 private:
  std::map<std::string, StopRequest> stops_;
};

}  // namespace loom

#endif  // LOOM_SCHEDULER_STOP_COORDINATOR_H_
