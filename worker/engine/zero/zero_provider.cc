// ZeroProvider: micro-step boundaries, parameter refresh, gradient clearing and norms, and the
// checkpoint partitions. Construction is in zero_create.cc, fetching in zero_fetch.cc, the
// gradient sink in zero_grads.cc.
#include "worker/engine/zero/zero_provider.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstring>

#include "worker/engine/zero/zero_common.h"

namespace loom::engine {

using zero_internal::Bytes;
using zero_internal::ThrowIfError;

at::ScalarType ZeroProvider::activation_dtype() const {
  return options_.param_dtype == at::kBFloat16 ? at::kBFloat16 : at::kFloat;
}

at::ScalarType ZeroProvider::grad_communication_dtype() const {
  if (options_.communication_dtype != at::ScalarType::Undefined) {
    return options_.communication_dtype;
  }
  return options_.param_dtype == at::kBFloat16 ? at::kBFloat16 : at::kFloat;
}

int64_t ZeroProvider::partition_bytes() const {
  int64_t b = 0;
  for (const ZeroParam& p : params_) b += p.master.numel() * 4;
  return b;
}

void ZeroProvider::BeginMicroStep(bool last) {
  last_micro_ = last;
  in_micro_step_ = true;
  grad_expected_.assign(params_.size(), 0);
  grad_seen_.assign(params_.size(), 0);
  trace_pos_ = 0;
  enqueued_.assign(params_.size(), 0);
  ready_raised_.assign(params_.size(), 0);
  prefetch_pos_ = 0;
  read_ahead_pos_ = 0;
  if (options_.stage < 3) return;
  if (trace_mode_ == TraceMode::kRecord && !recording_.empty()) {
    trace_ = std::move(recording_);
    recording_.clear();
    trace_mode_ = TraceMode::kReplay;
  } else if (trace_mode_ == TraceMode::kOff) {
    trace_mode_ = TraceMode::kRecord;
  }
  if (trace_mode_ == TraceMode::kReplay) IssuePrefetches();
}

void ZeroProvider::FinishMicroStep() {
  WaitReplicas();  // RefreshParams' gathers of parameters this micro-step did not use
  FlushGrads();
  if (options_.stage == 3) FreeGathered();
  in_micro_step_ = false;
  if (options_.partition_source != nullptr) options_.partition_source->DropReadAhead();
  pool_.Trim();  // buffers no micro-step used since the last one are freed
}

void ZeroProvider::RefreshParams() {
  at::NoGradGuard no_grad;
  // With the parameters viewing the masters nothing below reads a master, and the fence waits
  // at each parameter's next Acquire instead (set_master_fence).
  if (master_fence_ && !params_view_masters()) {
    for (ParamId i = 0; i < params_.size(); ++i) master_fence_(i);
  }
  const at::ScalarType dt = options_.param_dtype;
  switch (options_.stage) {
    case 0:
      if (dt != at::kFloat) {
        for (ZeroParam& p : params_) p.replica.view({-1}).copy_(p.master);
      }
      return;
    case 3:
      for (ZeroParam& p : params_) {
        if (!p.shard.is_same(p.master) && !p.shard_offloaded) p.shard.copy_(p.master);
      }
      for (auto it = live_.begin(); it != live_.end();) {  // persistent params are stale now
        auto next = std::next(it);
        Free(it);
        it = next;
      }
      return;
    default:
      break;
  }
  if (collectives_->world_size() == 1) {
    // One rank: the partition is the whole parameter, so copy it into the replica (no
    // collective and no staging buffers; perf showed the old bucketed gather's fresh buffers
    // as page faults at ~1/3 of a 1-rank offload step), or nothing when the replica is a view
    // of the master (ZeroOptions::params_view_masters).
    if (replica_views_master_) return;
    for (ZeroParam& p : params_) p.replica.view({-1}).copy_(p.master.narrow(0, 0, p.numel));
    return;
  }
  RefreshReplicas();  // stages 1/2 (zero_refresh.cc)
}

void ZeroProvider::ClearGrads() {
  touched_.assign(params_.size(), 0);
  grad_written_.assign(params_.size(), 0);
  if (grad_flat_.defined()) {
    // One rank (identity_reduction): every gradient written since now overwrites its partition
    // first, so only those still unwritten at the end of the last micro-step are zeroed then
    // (FlushGrads) instead of the whole buffer here.
    if (identity_reduction()) {
      grads_stale_ = true;
      if (gradient_buffers() == 2) {
        // The other buffer (the step before last's gradients, or new zeros) becomes the
        // gradient storage; the last step's stays readable until the next ClearGrads.
        if (!grad_flat_other_.defined()) {
          grad_flat_other_ = at::zeros_like(grad_flat_);
          memory_.Acquire(MemoryKind::kGrads, Bytes(grad_flat_other_));
        }
        std::swap(grad_flat_, grad_flat_other_);
        ViewGradsInFlat();
      }
    } else {
      grad_flat_.zero_();
    }
    return;
  }
  for (ZeroParam& p : params_) {
    memory_.Release(MemoryKind::kGrads, Bytes(p.grad));
    p.grad = at::Tensor();
  }
}

double ZeroProvider::LocalGradSquaredNorm() const {
  // The same ops as p.grad.to(kDouble).pow(2).sum() (the same bits), in one double buffer of
  // the largest gradient's size instead of two fresh temporaries per parameter (2 x 8 bytes of
  // fresh pages per gradient element every step; perf: page clearing). Not pooled: it is freed
  // at once, so it does not stay resident through the next backward.
  int64_t largest = 0;
  for (const ZeroParam& p : params_) {
    if (p.grad.defined()) largest = std::max(largest, p.grad.numel());
  }
  if (largest == 0) return 0;
  at::Tensor scratch = at::empty({largest}, at::kDouble);
  double sq = 0;
  for (const ZeroParam& p : params_) {
    if (!p.grad.defined()) continue;
    at::Tensor d = scratch.narrow(0, 0, p.grad.numel());
    d.copy_(p.grad.reshape({-1}));
    d.pow_(2);
    sq += d.sum().item<double>();
  }
  return sq;
}

bool ZeroProvider::any_nonfinite_grad() const {
  for (const ZeroParam& p : params_) {
    if (p.grad.defined() && !at::isfinite(p.grad).all().item<bool>()) return true;
  }
  return false;
}

at::Tensor ZeroProvider::GatherFull(ParamId i) {
  at::NoGradGuard no_grad;
  at::Tensor out = Acquire(i).to(at::kFloat).clone();
  Release(i);
  return out;
}

at::Tensor ZeroProvider::CheckpointPartition(ParamId i, int which) const {
  if (master_fence_) master_fence_(i);
  const ZeroParam& p = params_[i];
  const at::Tensor& t = which == 0 ? p.master : which == 1 ? p.exp_avg : p.exp_avg_sq;
  if (options_.stage != 0) return t;
  at::Tensor out = at::zeros({p.slice.partition_numel}, at::kFloat);
  if (p.slice.valid() > 0) {
    out.narrow(0, 0, p.slice.valid()).copy_(t.narrow(0, p.slice.begin, p.slice.valid()));
  }
  return out;
}

void ZeroProvider::LoadPartition(ParamId i, int which, const float* src) {
  at::NoGradGuard no_grad;
  WaitReplicas();  // a master partition may still be the send buffer of a gather
  if (master_fence_) master_fence_(i);
  ZeroParam& p = params_[i];
  const int64_t part = p.slice.partition_numel;
  const int64_t n_ranks = collectives_->world_size();
  at::Tensor& dst = which == 0 ? p.master : which == 1 ? p.exp_avg : p.exp_avg_sq;
  if (options_.stage != 0) {
    std::memcpy(dst.data_ptr<float>(), src, part * sizeof(float));
    return;
  }
  at::Tensor mine = at::empty({part}, at::kFloat);
  std::memcpy(mine.data_ptr<float>(), src, part * sizeof(float));
  at::Tensor all = at::empty({n_ranks * part}, at::kFloat);
  ThrowIfError(collectives_->AllGather(mine, all));
  dst.copy_(all.narrow(0, 0, p.numel));
}

}  // namespace loom::engine
