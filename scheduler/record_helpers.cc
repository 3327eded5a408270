#include "scheduler/record_helpers.h"

namespace loom {

bool RankEnded(loom::v1::RankState s) {
  return s == v1::RANK_STATE_SUCCEEDED || s == v1::RANK_STATE_FAILED ||
         s == v1::RANK_STATE_STOPPED;
}

bool Waiting(const JobRecord& job) {
  return job.phase == v1::JOB_PHASE_PENDING || job.phase == v1::JOB_PHASE_RECOVERING;
}

const std::string& QueueOf(const loom::v1::JobSpec& spec) {
  static const std::string* const kDefault = new std::string("default");
  return spec.queue().empty() ? *kDefault : spec.queue();
}

const std::string& PhaseMessage(const JobRecord& job) {
  const auto& history = job.state.history();
  if (!history.empty() && history.rbegin()->phase() == job.phase) {
    return history.rbegin()->message();
  }
  return job.message;
}

std::string Utc(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

}  // namespace loom
