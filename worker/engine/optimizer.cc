#include "worker/engine/optimizer.h"

#include <ATen/ATen.h>

#include <cmath>

namespace loom::engine {

void ApplyOptimizerStep(const spec::OptimizerConfig& oc, const OptimizerStepArgs& args,
                        std::vector<OptimizerPartition>& sub_group) {
  const double lr = args.lr;
  const double bc1 = oc.bias_correction ? 1.0 - std::pow(oc.beta1, args.step) : 1.0;
  const double bc2 = oc.bias_correction ? 1.0 - std::pow(oc.beta2, args.step) : 1.0;
  const double step_size = lr / bc1;
  const double bc2_sqrt = std::sqrt(bc2);
  for (OptimizerPartition& p : sub_group) {
    at::Tensor param = p.param;
    at::Tensor grad = p.grad;
    if (!grad.defined()) {
      grad = at::zeros_like(param);
    } else if (args.grad_multiplier != 1.0) {
      grad.mul_(args.grad_multiplier);
    }
    if (oc.weight_decay != 0) {
      if (oc.decoupled_weight_decay) {
        param.mul_(1.0 - lr * oc.weight_decay);
      } else {
        grad = grad.add(param, oc.weight_decay);
      }
    }
    p.exp_avg.mul_(oc.beta1).add_(grad, 1.0 - oc.beta1);
    p.exp_avg_sq.mul_(oc.beta2).addcmul_(grad, grad, 1.0 - oc.beta2);
    at::Tensor denom = (p.exp_avg_sq.sqrt() / bc2_sqrt).add_(oc.eps);
    param.addcdiv_(p.exp_avg, denom, -step_size);
  }
}

}  // namespace loom::engine
