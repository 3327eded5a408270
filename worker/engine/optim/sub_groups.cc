#include "worker/engine/optim/sub_groups.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace loom::engine::optim {

absl::StatusOr<SubGroupPlan> SubGroupPlan::Create(const std::vector<int64_t>& partition_numels,
                                                  int64_t sub_group_size) {
  if (sub_group_size <= 0) {
    return absl::InvalidArgumentError("zero_optimization.sub_group_size: must be positive");
  }
  SubGroupPlan plan;
  plan.numels_ = partition_numels;
  for (size_t i = 0; i < partition_numels.size(); ++i) {
    const int64_t n = partition_numels[i];
    if (n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sub-group plan: parameter ", i, " has a negative partition numel ", n));
    }
    plan.offsets_.push_back(plan.total_);
    // Whole parameters, greedily up to sub_group_size elements.
    if (plan.groups_.empty() || plan.groups_.back().numel + n > sub_group_size) {
      SubGroup g;
      g.first = g.last = i;
      g.offset = plan.total_;
      plan.groups_.push_back(g);
    }
    plan.groups_.back().last = i + 1;
    plan.groups_.back().numel += n;
    plan.group_of_.push_back(static_cast<int64_t>(plan.groups_.size()) - 1);
    plan.total_ += n;
  }
  plan.ResetReadiness();
  return plan;
}

SubGroupPlan::SubGroupPlan(const SubGroupPlan& other) { *this = other; }

SubGroupPlan& SubGroupPlan::operator=(const SubGroupPlan& other) {
  if (this == &other) return *this;
  std::scoped_lock lock(mu_, other.mu_);
  numels_ = other.numels_;
  offsets_ = other.offsets_;
  group_of_ = other.group_of_;
  groups_ = other.groups_;
  total_ = other.total_;
  param_ready_ = other.param_ready_;
  pending_params_ = other.pending_params_;
  groups_ready_ = other.groups_ready_;
  return *this;
}

void SubGroupPlan::ResetReadiness() {
  std::lock_guard<std::mutex> lock(mu_);
  param_ready_.assign(numels_.size(), false);
  pending_params_.clear();
  for (const SubGroup& g : groups_) {
    pending_params_.push_back(static_cast<int64_t>(g.last - g.first));
  }
  groups_ready_ = 0;
}

absl::StatusOr<int64_t> SubGroupPlan::MarkParamReady(size_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  if (i >= numels_.size()) {
    return absl::OutOfRangeError(
        absl::StrCat("sub-group plan: parameter ", i, " of ", numels_.size()));
  }
  if (param_ready_[i]) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sub-group plan: parameter ", i, " was marked ready twice in one step"));
  }
  param_ready_[i] = true;
  const int64_t k = group_of_[i];
  if (--pending_params_[k] != 0) return int64_t{-1};
  ++groups_ready_;
  return k;
}

bool SubGroupPlan::all_ready() const {
  std::lock_guard<std::mutex> lock(mu_);
  return groups_ready_ == static_cast<int64_t>(groups_.size());
}

}  // namespace loom::engine::optim
