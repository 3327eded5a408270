#include "worker/engine/optim/optimizer_pipeline.h"

#include "absl/strings/str_cat.h"

namespace loom::engine::optim {

absl::Status OptimizerPipeline::BeginStep(int64_t step, double lr) {
  std::lock_guard<std::mutex> lock(mu_);
  if (open_) {
    return absl::FailedPreconditionError(absl::StrCat(
        name(), ": BeginStep(", step, ") while step ", step_, " is still open"));
  }
  if (step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(name(), ": BeginStep: step ", step, " is not 1-based"));
  }
  open_ = true;
  step_ = step;
  lr_ = lr;
  ready_.assign(plan_.num_sub_groups(), false);
  absl::Status s = OnBegin();
  if (!s.ok()) open_ = false;
  return s;
}

absl::Status OptimizerPipeline::OnSubGroupReady(int64_t k) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!open_) {
    return absl::FailedPreconditionError(
        absl::StrCat(name(), ": sub-group ", k, " ready outside a step (no BeginStep)"));
  }
  if (k < 0 || k >= plan_.num_sub_groups()) {
    return absl::OutOfRangeError(absl::StrCat(name(), ": sub-group ", k, " of ",
                                              plan_.num_sub_groups()));
  }
  if (ready_[k]) {
    return absl::FailedPreconditionError(
        absl::StrCat(name(), ": sub-group ", k, " raised twice in step ", step_));
  }
  ready_[k] = true;
  return OnReady(k);
}

absl::Status OptimizerPipeline::FinishStep(const StepValidation& validation) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!open_) {
    return absl::FailedPreconditionError(absl::StrCat(name(), ": FinishStep without BeginStep"));
  }
  open_ = false;
  if (validation.overflow) return Rollback();
  for (int64_t k = 0; k < plan_.num_sub_groups(); ++k) {
    if (!ready_[k]) {
      // Nothing speculative may survive a step that is not applied.
      absl::Status rolled_back = Rollback();
      return absl::FailedPreconditionError(absl::StrCat(
          name(), ": step ", step_, " finished while sub-group ", k,
          " (parameters ", plan_.sub_group(k).first, "..", plan_.sub_group(k).last - 1,
          ") is not ready", rolled_back.ok() ? "" : "; rollback: ", rolled_back.message()));
    }
  }
  return Commit(validation);
}

absl::Status OptimizerPipeline::ReleaseGradients() {
  std::lock_guard<std::mutex> lock(mu_);
  return OnReleaseGradients();
}

bool OptimizerPipeline::step_open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_;
}

}  // namespace loom::engine::optim
