// File: scheduler/rank_progress.h
//
// Gang liveness from every rank's progress (docs/scheduling.md "Node liveness"). Each worker
// reports the latest step of every rank it runs (RankStatus.progress.step, and
// RankStatus.last_step_time_us by the worker's clock); the ranks of one job cannot step without
// each other (every ZeRO step all-gathers and reduce-scatters across the whole gang), so a new
// step from ANY rank proves that every rank of the gang, on every node, is alive. The scheduler
// uses this to keep a node whose heartbeats stopped (a frozen or partitioned worker daemon) from
// being declared lost while its job's other ranks still report new steps.
//
// Time is the scheduler's clock at the heartbeat that carried the new step (workers' clocks are
// not compared with it). Steps are per (job, attempt): a new attempt starts from no baseline.
// Not thread-safe: the scheduler guards it with its own mutex.
#ifndef LOOM_SCHEDULER_RANK_PROGRESS_H_
#define LOOM_SCHEDULER_RANK_PROGRESS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/time/time.h"

namespace loom {

class RankProgress {
 public:
  // Records that rank `rank` of `job_id`'s attempt `attempt` reported `step` at `now`. Returns
  // true when that step is newer than the rank's previous report in the same attempt (the first
  // report of a rank in an attempt is only a baseline: a re-adopted rank's step after a scheduler
  // restart proves nothing by itself). An older attempt's report is ignored (false).
  bool Observe(const std::string& job_id, int32_t attempt, int32_t rank, int64_t step,
               absl::Time now);
  // When any rank of the job's current attempt last reported a new step; nullopt if none did.
  std::optional<absl::Time> LastAdvance(const std::string& job_id) const;
  // The latest step `rank` reported in the job's current attempt; -1 if none.
  int64_t LatestStep(const std::string& job_id, int32_t rank) const;
  // Forgets the job (it ended, or its attempt ended).
  void Forget(const std::string& job_id) { jobs_.erase(job_id); }
  void Clear() { jobs_.clear(); }

 private:
  struct Gang {
    int32_t attempt = 0;
    std::map<int32_t, int64_t> step_by_rank;
    std::optional<absl::Time> last_advance;
  };
  std::map<std::string, Gang> jobs_;
};

}  // namespace loom

#endif  // LOOM_SCHEDULER_RANK_PROGRESS_H_
