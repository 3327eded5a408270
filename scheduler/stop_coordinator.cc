#include "scheduler/stop_coordinator.h"

#include "absl/strings/str_cat.h"
#include "scheduler/record_helpers.h"

namespace loom {

void StopCoordinator::Begin(const std::string& job_id, absl::Time now, absl::Duration grace) {
  StopRequest& stop = stops_[job_id];
  stop = StopRequest();
  stop.deadline = now + grace;
}

const StopCoordinator::StopRequest* StopCoordinator::Find(const std::string& job_id) const {
  auto it = stops_.find(job_id);
  return it == stops_.end() ? nullptr : &it->second;
}

std::vector<std::string> StopCoordinator::Jobs() const {
  std::vector<std::string> ids;
  ids.reserve(stops_.size());
  for (const auto& [id, stop] : stops_) ids.push_back(id);
  return ids;
}

std::optional<std::string> StopCoordinator::RecordRankEnd(const loom::v1::RankStatus& st,
                                                          const std::string& exit_message) {
  auto it = stops_.find(st.job_id());
  if (it == stops_.end()) return std::nullopt;
  StopRequest& stop = it->second;
  if (st.state() == loom::v1::RANK_STATE_SUCCEEDED) {
    stop.training_finished = true;  // the last step came before the stop
    if (st.rank() == 0) stop.final_checkpoint_step = st.progress().last_checkpoint_step();
  } else if (st.state() == loom::v1::RANK_STATE_STOPPED && st.graceful_stop()) {
    if (st.rank() == 0) stop.final_checkpoint_step = st.progress().last_checkpoint_step();
  } else if (RankEnded(st.state()) && !stop.escalated) {
    // Failed, or stopped without its checkpoint: the peers cannot complete theirs.
    return exit_message;
  }
  return std::nullopt;
}

bool StopCoordinator::Escalate(const std::string& job_id, const std::string& why) {
  auto it = stops_.find(job_id);
  if (it == stops_.end() || it->second.escalated) return false;
  it->second.escalated = true;
  it->second.escalation = why;
  return true;
}

std::vector<std::string> StopCoordinator::Late(absl::Time now) const {
  std::vector<std::string> late;
  for (const auto& [job_id, stop] : stops_) {
    if (!stop.escalated && now > stop.deadline) late.push_back(job_id);
  }
  return late;
}

std::string StopCoordinator::FinalMessage(const std::string& job_id,
                                          int64_t newest_checkpoint_step) const {
  auto it = stops_.find(job_id);
  if (it == stops_.end()) return "";
  const StopRequest& stop = it->second;
  const std::string newest_text =
      newest_checkpoint_step > 0 ? absl::StrCat("newest checkpoint at step ", newest_checkpoint_step)
                                 : "no checkpoint written";
  if (stop.escalated) {
    return absl::StrCat("cancelled by request; the graceful stop was abandoned (", stop.escalation,
                        ") and the ranks were killed without a final checkpoint (", newest_text,
                        ")");
  }
  if (stop.training_finished) {
    return absl::StrCat("cancelled by request, but training had finished first; final "
                        "checkpoint at step ", stop.final_checkpoint_step);
  }
  if (stop.final_checkpoint_step >= 0) {
    return absl::StrCat("cancelled by request; final checkpoint written at step ",
                        stop.final_checkpoint_step);
  }
  return absl::StrCat("cancelled by request; the ranks ended without confirming a final "
                      "checkpoint (", newest_text, ")");
}

}  // namespace loom
