// SuperOffloadPipeline with its optimizer state on NVMe (super_offload_pipeline.h, options.nvme):
// a speculative step into held swap buffers instead of a snapshot (the files keep the pre-step
// state), and validation's outcome on them: commit writes the held buffers back, a clip or an
// overflow drops them, and whatever was not committed steps from the files as synchronous
// ZeRO-Infinity does.
#include <chrono>
#include <cstdint>
#include <vector>

#include "common/status_macros.h"
#include "worker/engine/optim/super_offload_pipeline.h"

namespace loom::engine::optim {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

void SuperOffloadPipeline::RunNvmeTask(const Task& t, CpuGroup& g, offload::CpuAdam& adam) {
  if (options_.nvme->holdable_groups() < 1) {
    g.no_buffer = true;  // stepped after validation, from the files
    return;
  }
  std::vector<const float*> grads(plan().num_params(), nullptr);
  const float mul = static_cast<float>(t.unscale);  // at::mul_'s fp32 scalar
  for (const Slice& s : t.slices) {
    grads[s.index] = s.grad;
    if (s.grad != nullptr && t.unscale != 1.0) {
      float* slot = g.grad.data() + s.offset;
      for (int64_t j = 0; j < s.numel; ++j) slot[j] = s.grad[j] * mul;
      grads[s.index] = slot;
    }
  }
  absl::StatusOr<offload::OffloadOptimizer::HeldGroup> h =
      options_.nvme->StepGroupHeld(t.k, t.step, t.lr, grads, adam);
  if (!h.ok()) {
    g.error = h.status();
    return;
  }
  g.held = *h;
  g.stepped = true;
}

absl::Status SuperOffloadPipeline::TaskError() const {
  for (const CpuGroup& g : cpu_) {
    if (!g.error.ok()) return g.error;
  }
  return absl::OkStatus();
}

absl::Status SuperOffloadPipeline::CommitNvme(const StepValidation& v) {
  const Clock::time_point work0 = Clock::now();
  absl::Status error = TaskError();
  if (!error.ok()) {
    RestoreAll();  // drop whatever is held; the files keep the pre-step state
    return error;
  }
  const int64_t n = plan().num_sub_groups();
  const size_t num_params = plan().num_params();
  std::vector<float*> masters(num_params, nullptr);
  for (size_t i = 0; i < num_params; ++i) masters[i] = source_(i).param.data_ptr<float>();
  int64_t rolled_back = 0, hits = 0;
  std::vector<bool> committed(n, false);
  if (v.clip_coef > 1.0) {
    rolled_back = RestoreAll();  // the speculative steps used the unclipped gradient
  } else {
    for (int64_t k = first_cpu_; k < n; ++k) {
      CpuGroup& g = cpu_[k - first_cpu_];
      if (!g.stepped) continue;
      g.stepped = false;
      committed[k] = true;
      ++hits;
      absl::Status st = options_.nvme->CommitHeldGroup(&g.held, masters);
      if (!st.ok()) {
        RestoreAll();
        return st;
      }
    }
  }
  // Everything not committed above steps now from the files, as synchronous ZeRO-Infinity does
  // (offload_pipeline.cc): the gradient multiplied in place, then OffloadOptimizer's step.
  std::vector<int64_t> rest;
  std::vector<const float*> grads(num_params, nullptr);
  for (int64_t k = 0; k < n; ++k) {
    if (committed[k]) continue;
    rest.push_back(k);
    const SubGroup& sg = plan().sub_group(k);
    for (size_t i = sg.first; i < sg.last; ++i) {
      OptimizerPartition p = source_(i);
      if (!p.grad.defined()) continue;
      if (v.grad_multiplier != 1.0) p.grad.mul_(v.grad_multiplier);
      grads[i] = p.grad.data_ptr<float>();
    }
  }
  RETURN_IF_ERROR(options_.nvme->StepGroups(rest, step_, lr_, masters, grads));
  RETURN_IF_ERROR(options_.nvme->Flush());
  RecordCommit(v, hits, rolled_back, work0);
  return absl::OkStatus();
}

absl::Status SuperOffloadPipeline::RollbackNvme() {
  const Clock::time_point work0 = Clock::now();
  const absl::Status error = TaskError();
  const int64_t restored = RestoreAll();  // drops the buffers; the files are untouched
  RETURN_IF_ERROR(error);
  RecordRollback(restored, work0);
  return absl::OkStatus();
}

}  // namespace loom::engine::optim
