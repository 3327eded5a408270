#include "scheduler/admission_pass_gate.h"

#include <string>
#include <utility>

namespace loom {

bool AdmissionPassGate::NoteUnreachable(const std::string& node_id) {
  if (!unreachable_.insert(node_id).second) return false;
  ++node_changes_;  // it takes no new ranks
  return true;
}

bool AdmissionPassGate::NoteReachable(const std::string& node_id) {
  if (unreachable_.erase(node_id) == 0) return false;
  ++node_changes_;  // it may take new ranks again
  return true;
}

void AdmissionPassGate::ResetNodes() {
  unreachable_.clear();
  ++node_changes_;
}

std::string AdmissionPassGate::ResumeSummary(const absl::Status& answer) {
  return answer.ok() || absl::IsNotFound(answer) ? std::string() : std::string(answer.message());
}

AdmissionPassStats::Kind AdmissionPassGate::Choose(uint64_t rank_generation,
                                                   std::map<std::string, std::string> resume,
                                                   absl::Time now) {
  Inputs in;
  in.jobs = job_changes_;
  in.nodes = node_changes_;
  in.ranks = rank_generation;
  in.resume = std::move(resume);
  const bool changed = !last_inputs_.has_value() || !(in == *last_inputs_) || now >= next_wake_;
  const bool full_due = queue_depth_ == 0 || now - last_full_pass_ >= full_interval_;
  next_inputs_ = std::move(in);
  if (!changed && !(last_pass_cut_off_ && full_due)) return AdmissionPassStats::Kind::kSkipped;
  return full_due ? AdmissionPassStats::Kind::kFull : AdmissionPassStats::Kind::kPartial;
}

void AdmissionPassGate::NotePass(AdmissionPassStats::Kind kind, int considered, int waiting,
                                 const std::vector<absl::Time>& not_before, absl::Time now) {
  last_inputs_ = next_inputs_;
  last_pass_ = AdmissionPassStats{kind, considered, waiting};
  last_pass_cut_off_ = considered < waiting;
  if (kind == AdmissionPassStats::Kind::kFull) last_full_pass_ = now;
  // The earliest backoff expiry still ahead: the pass must run again then.
  next_wake_ = absl::InfiniteFuture();
  for (const absl::Time t : not_before) {
    if (t > now && t < next_wake_) next_wake_ = t;
  }
}

}  // namespace loom
