#include "scheduler/rank_progress.h"

namespace loom {

bool RankProgress::Observe(const std::string& job_id, int32_t attempt, int32_t rank, int64_t step,
                           absl::Time now) {
  Gang& gang = jobs_[job_id];
  if (attempt < gang.attempt) return false;  // a late report of an earlier attempt
  if (attempt > gang.attempt) gang = Gang{attempt, {}, std::nullopt};
  auto [it, first] = gang.step_by_rank.emplace(rank, step);
  if (first || step <= it->second) return false;
  it->second = step;
  gang.last_advance = now;
  return true;
}

std::optional<absl::Time> RankProgress::LastAdvance(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? std::nullopt : it->second.last_advance;
}

int64_t RankProgress::LatestStep(const std::string& job_id, int32_t rank) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return -1;
  auto r = it->second.step_by_rank.find(rank);
  return r == it->second.step_by_rank.end() ? -1 : r->second;
}

}  // namespace loom
