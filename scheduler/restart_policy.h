// What the scheduler makes of a failed rank, and when the next attempt may start
// (docs/scheduling.md "Restarts"). Plain functions over protos: no state, no locks; thread-safe.
//
//   * Exit classification (ClassifyRankExit). loom-trainer's exit codes (worker/trainer/
//     exit_codes.h): 78 (configuration or spec error) is final: the job FAILS at once with reason
//     "ConfigError" and no restart, since every attempt would fail the same way. 65 (data error: a
//     checkpoint failed its CRC-32 check) is reason "DataError", class INFRA: it is charged to
//     the infra budget, never the user's, and the next attempt's resume point is verified and the
//     corrupt step skipped (storage/checkpoint/resume_point.h). 66 (dataset error: the job's
//     data set changed since its first start, or is too small for it; data/dataset_error.h) is
//     final like 78, reason "DatasetError", class USER: restarting would fail the same way, or
//     resume the job's trajectory on other data. Otherwise as before: OOM for an
//     out-of-memory error, or a SIGKILL (exit 137) that the worker saw the kernel's OOM killer
//     make (RankStatus.oom_kill, worker/oom_kill.h) or could not tell apart (no cgroup memory
//     accounting); a `kill -9` the worker could tell apart is not OOM. SETUP for a rank that
//     never ran and could not start (126/127) or rendezvous, USER otherwise.
//   * Failure attribution (CauseScore, IsLikelierCause). When one rank dies, its peers fail too
//     ("Connection closed by peer"), and their reports may reach the scheduler first. A rank
//     killed by a signal is the likeliest cause, then a rank failing with its own error, then one
//     whose error says a peer went away; between equals, the rank whose process ended first (the
//     worker's RankStatus.exit_time_us). A later report of a likelier cause re-attributes the
//     attempt's failure, naming both ranks.
//   * Backoff (ExponentialBackoff): restart k of a job (k = its user + infra restarts so far) waits
//     base x 2^(k-1), at most cap (SchedulerOptions::restart_backoff_*), stored in the job's
//     not_before_us like the gang-ready backoff.
#ifndef LOOM_SCHEDULER_RESTART_POLICY_H_
#define LOOM_SCHEDULER_RESTART_POLICY_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "proto/common.pb.h"
#include "proto/scheduler_state.pb.h"
#include "proto/worker_service.pb.h"

namespace loom {

// Retained phase changes per job (JobSchedulingState.history) and the longest message kept.
inline constexpr int kMaxJobHistory = 32;
inline constexpr size_t kMaxHistoryMessageBytes = 2048;

struct RankExitClass {
  loom::v1::FailureClass failure_class = loom::v1::FAILURE_CLASS_USER;
  // "RankFailed", "ConfigError", "DatasetError" or "DataError"
  std::string reason = "RankFailed";
  bool final = false;                 // no restart, whatever the budget says
};

// `had_run`: the rank had reported RUNNING before it failed.
RankExitClass ClassifyRankExit(const loom::v1::RankStatus& st, bool had_run);

// "rank R on node X exited with code C (killed by signal 9, SIGKILL): <error>".
std::string RankExitMessage(int32_t rank, const std::string& node_id,
                            const loom::v1::RankStatus& st);

// True when the rank's error says that a peer went away (connection closed or reset by peer,
// broken pipe): a consequence of another rank's failure rather than a cause.
bool SawPeerGoAway(const loom::v1::RankStatus& st);

// 0: killed by a signal; 1: failed with its own error; 2: saw a peer go away. Lower is likelier
// the cause.
int CauseScore(const loom::v1::RankStatus& st);

// True if `candidate` is a likelier cause of an attempt's failure than `blamed` (lower
// CauseScore, or the same score and an earlier exit_time_us, both known).
bool IsLikelierCause(const loom::v1::RankStatus& candidate, const loom::v1::RankStatus& blamed);

// base x 2^(k-1) for k >= 1, at most cap (base when k < 1). Zero base: zero.
absl::Duration ExponentialBackoff(int32_t k, absl::Duration base, absl::Duration cap);

// Appends a phase change to `state`'s history (message cut to kMaxHistoryMessageBytes), dropping
// the oldest beyond kMaxJobHistory.
void AppendHistory(loom::internal::JobSchedulingState* state, absl::Time time,
                   loom::v1::JobPhase phase, const std::string& reason, const std::string& message,
                   int32_t attempt);

}  // namespace loom

#endif  // LOOM_SCHEDULER_RESTART_POLICY_H_
