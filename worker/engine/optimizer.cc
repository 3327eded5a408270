#include "worker/engine/optimizer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "worker/engine/offload/cpu_adam.h"

namespace loom::engine {
namespace {

// Elements per slice of the element-wise update: a slice of the 4 partitions (1 MiB) stays in
// the CPU's L2 cache across the update's passes instead of streaming whole partitions through
// memory. A multiple of every vector width (2 x 16 floats for AVX-512), so every slice but the
// last runs entirely in the vectorised loop of either path.
constexpr int64_t kChunk = 65536;

// The op-by-op update (torch.optim.Adam / AdamW single-tensor, PyTorch 1.13) of one partition,
// over kChunk-element slices with reused scratch: the path for a partition that is not an fp32
// CPU tensor (an accelerator's; there ATen's kernels run on the device).
void StepOpByOp(const spec::OptimizerConfig& oc, const OptimizerStepArgs& args,
                OptimizerPartition& p, at::Tensor& denom_buf, at::Tensor& l2_buf) {
  const double lr = args.lr;
  const double bc1 = oc.bias_correction ? 1.0 - std::pow(oc.beta1, args.step) : 1.0;
  const double bc2 = oc.bias_correction ? 1.0 - std::pow(oc.beta2, args.step) : 1.0;
  const double step_size = lr / bc1;
  const double bc2_sqrt = std::sqrt(bc2);
  const bool l2 = oc.weight_decay != 0 && !oc.decoupled_weight_decay;
  const at::Tensor param_all = p.param.view({-1});
  at::Tensor grad_all = p.grad.defined() ? p.grad.view({-1}) : at::zeros_like(param_all);
  const at::Tensor m_all = p.exp_avg.view({-1}), v_all = p.exp_avg_sq.view({-1});
  const int64_t n = param_all.numel();
  if (!denom_buf.defined() || denom_buf.numel() < std::min(n, kChunk) ||
      denom_buf.device() != param_all.device()) {
    denom_buf = at::empty({std::min(n, kChunk)}, param_all.options());
    if (l2) l2_buf = at::empty_like(denom_buf);
  }
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t len = std::min(kChunk, n - off);
    at::Tensor param = param_all.narrow(0, off, len);
    at::Tensor grad = grad_all.narrow(0, off, len);
    at::Tensor m = m_all.narrow(0, off, len), v = v_all.narrow(0, off, len);
    if (p.grad.defined() && args.grad_multiplier != 1.0) grad.mul_(args.grad_multiplier);
    if (oc.weight_decay != 0) {
      if (oc.decoupled_weight_decay) {
        param.mul_(1.0 - lr * oc.weight_decay);
      } else {
        at::Tensor g2 = l2_buf.narrow(0, 0, len);
        at::add_out(g2, grad, param, oc.weight_decay);
        grad = g2;
      }
    }
    m.mul_(oc.beta1).add_(grad, 1.0 - oc.beta1);
    v.mul_(oc.beta2).addcmul_(grad, grad, 1.0 - oc.beta2);
    at::Tensor denom = denom_buf.narrow(0, 0, len);
    at::sqrt_out(denom, v);
    denom.div_(bc2_sqrt).add_(oc.eps);
    param.addcdiv_(m, denom, -step_size);
  }
}

bool IsCpuFp32(const at::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous();
}

// The fused path: one pass of offload::CpuAdam's kernel per kChunk slice (the gradient's unscale
// multiply first, on the same cache-resident slice), split over the rank's intra-op threads.
// Each task makes its own one-thread CpuAdam (no threads are created: a one-thread pool runs
// inline), so the split follows at::set_num_threads and the result does not depend on it.
void StepFusedCpu(const spec::OptimizerConfig& oc, const OptimizerStepArgs& args,
                  OptimizerPartition& p) {
  offload::CpuAdamOptions ao;
  ao.beta1 = oc.beta1;
  ao.beta2 = oc.beta2;
  ao.eps = oc.eps;
  ao.weight_decay = oc.weight_decay;
  ao.decoupled_weight_decay = oc.decoupled_weight_decay;
  ao.bias_correction = oc.bias_correction;
  ao.threads = 1;
  const int64_t n = p.param.numel();
  float* param = p.param.data_ptr<float>();
  float* grad = p.grad.defined() ? p.grad.data_ptr<float>() : nullptr;
  float* m = p.exp_avg.data_ptr<float>();
  float* v = p.exp_avg_sq.data_ptr<float>();
  const at::Tensor grad_flat = p.grad.defined() ? p.grad.view({-1}) : at::Tensor();
  const bool scale = grad != nullptr && args.grad_multiplier != 1.0;
  at::parallel_for(0, n, kChunk, [&](int64_t begin, int64_t end) {
    offload::CpuAdam adam(ao);
    for (int64_t off = begin; off < end; off += kChunk) {
      const int64_t len = std::min(kChunk, end - off);
      // ATen's multiply (the scalar rounded to fp32, as CpuAdam rounds its coefficients).
      if (scale) grad_flat.narrow(0, off, len).mul_(args.grad_multiplier);
      adam.StepRange(args.step, args.lr, param, grad, m, v, off, off + len);
    }
  });
}

}  // namespace

void ApplyOptimizerStep(const spec::OptimizerConfig& oc, const OptimizerStepArgs& args,
                        std::vector<OptimizerPartition>& sub_group) {
  at::Tensor denom_buf, l2_buf;  // [kChunk] scratch of the op-by-op path, reused
  for (OptimizerPartition& p : sub_group) {
    TORCH_CHECK(p.param.numel() == p.exp_avg.numel() && p.param.numel() == p.exp_avg_sq.numel() &&
                    (!p.grad.defined() || p.grad.numel() == p.param.numel()),
                "ApplyOptimizerStep: partition tensors differ in numel");
    const bool fused = IsCpuFp32(p.param) && IsCpuFp32(p.exp_avg) && IsCpuFp32(p.exp_avg_sq) &&
                       (!p.grad.defined() || IsCpuFp32(p.grad));
    if (fused) {
      StepFusedCpu(oc, args, p);
    } else {
      StepOpByOp(oc, args, p, denom_buf, l2_buf);
    }
  }
}

}  // namespace loom::engine
