#include "worker/engine/optim/step_validation.h"

#include <ATen/ATen.h>

#include <cmath>

#include "common/status_macros.h"

namespace loom::engine::optim {

absl::StatusOr<StepValidation> ValidateStep(Collectives& coll, const ValidationInputs& in,
                                            const std::function<bool()>& local_nonfinite,
                                            const std::function<double()>& local_squared_norm) {
  StepValidation v;
  if (in.check_overflow) {
    // Overflow anywhere skips the step on every rank (flag all-reduced with MAX).
    at::Tensor flag = at::full({1}, local_nonfinite() ? 1.0 : 0.0, at::kDouble);
    RETURN_IF_ERROR(coll.AllReduce(flag, ReduceOp::kMax));
    if (flag.item<double>() > 0) {
      v.overflow = true;
      return v;
    }
  }
  // Global norm of the (scaled) gradients = sqrt(all-reduce SUM of Σ local partition ||g||^2);
  // padding grads are zero; stage 0 holds the full gradients on every rank.
  at::Tensor sq = at::full({1}, local_squared_norm(), at::kDouble);
  if (in.grads_partitioned) RETURN_IF_ERROR(coll.AllReduce(sq, ReduceOp::kSum));
  const double norm = std::sqrt(sq.item<double>());
  const double scale = in.loss_scale;
  v.grad_norm = norm / scale;
  double combined = scale;
  if (in.gradient_clipping > 0) {
    const double clip = (norm / scale + 1e-6) / in.gradient_clipping;
    if (clip > 1.0) {
      combined = clip * scale;
      v.clip_coef = clip;
    }
  }
  v.grad_multiplier = combined == 1.0 ? 1.0 : 1.0 / combined;
  return v;
}

}  // namespace loom::engine::optim
