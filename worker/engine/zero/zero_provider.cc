// ZeroProvider: construction, micro-step boundaries, parameter refresh and the checkpoint
// partitions. Fetching is in zero_fetch.cc, the gradient sink in zero_grads.cc.
#include "worker/engine/zero/zero_provider.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "data/corpus.h"
#include "worker/engine/zero/zero_common.h"

namespace loom::engine {

using zero_internal::Bytes;
using zero_internal::ThrowIfError;
using zero_internal::Wire;

absl::StatusOr<std::unique_ptr<ZeroProvider>> ZeroProvider::Create(
    std::vector<spec::ParamSpec> specs, Collectives* collectives, const ParamInit& init,
    const ZeroOptions& options) {
  if (options.stage < 0 || options.stage > 3) {
    return absl::InvalidArgumentError(absl::StrCat("zero stage ", options.stage));
  }
  if (options.gradient_divide_factor < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient_divide_factor ", options.gradient_divide_factor, " is negative"));
  }
  const at::ScalarType comm = options.communication_dtype;
  if (comm != at::ScalarType::Undefined && comm != at::kFloat && comm != at::kBFloat16 &&
      comm != at::kHalf) {
    return absl::InvalidArgumentError(absl::StrCat(
        "communication_dtype ", c10::toString(comm), ": must be fp32, bf16 or fp16"));
  }
  if (options.stage == 0 && comm != at::ScalarType::Undefined && comm != at::kFloat) {
    return absl::InvalidArgumentError(absl::StrCat(
        "communication_dtype ", c10::toString(comm),
        " with stage 0: its gradient all-reduce is fp32 (16-bit needs stage 1-3)"));
  }
  std::unique_ptr<ZeroProvider> m(new ZeroProvider(std::move(specs), collectives, options));
  const int64_t n_ranks = collectives->world_size();
  const int64_t rank = collectives->rank();
  const int stage = options.stage;
  const at::ScalarType dt = options.param_dtype;
  const bool fp32 = dt == at::kFloat;
  const bool view = options.params_view_masters && fp32 && n_ranks == 1;
  m->replica_views_master_ = view && (stage == 1 || stage == 2);
  m->gather_views_shard_ = view && stage == 3 && !(options.partition_source != nullptr &&
                                                    options.partition_source->serves_partitions());
  try {
    at::NoGradGuard no_grad;
    m->anchor_ = at::empty({0}, at::kFloat).set_requires_grad(true);
    const std::vector<spec::ParamSpec>& all = m->specs_;
    m->params_.reserve(all.size());
    for (size_t i = 0; i < all.size(); ++i) {
      ZeroParam p;
      p.spec = all[i];
      p.numel = all[i].numel();
      p.slice = ComputePartition(p.numel, n_ranks, rank);
      const int64_t part_n = p.slice.partition_numel;
      // Stage 3 reads only this rank's slice; the others need the full tensor.
      const int64_t begin = stage == 3 ? p.slice.begin : 0;
      const int64_t count = stage == 3 ? p.slice.valid() : p.numel;
      at::Tensor src = at::zeros({stage == 3 ? part_n : p.numel}, at::kFloat);
      if (init.from != nullptr) {  // fine-tuning: read from the export
        absl::Status s = init.from->ReadRange(p.spec.name, p.spec.shape, begin, count,
                                              src.data_ptr<float>());
        if (!s.ok()) return s;
      } else {
        at::Tensor full;
        if (p.spec.kind == spec::ParamSpec::Kind::kNorm) {
          full = at::ones({p.numel}, at::kFloat);
        } else {
          at::Generator gen =
              at::detail::createCPUGenerator(data::Mix64(init.seed ^ data::Mix64(i + 1)));
          full = at::empty({p.numel}, at::kFloat);
          if (init.initializer_range > 0) {
            full.normal_(0.0, init.initializer_range, gen);
          } else {
            full.zero_();
          }
        }
        if (count > 0) src.narrow(0, 0, count).copy_(full.narrow(0, begin, count));
      }
      bool master_is_param = false;
      if (stage == 0) {
        p.master = src;
        p.replica = fp32 ? src.view(p.spec.shape) : src.to(dt).view(p.spec.shape);
        master_is_param = fp32;
        m->memory_.Acquire(MemoryKind::kParams, Bytes(p.replica));
      } else if (stage < 3) {
        p.master = at::zeros({part_n}, at::kFloat);
        if (p.slice.valid() > 0) {
          p.master.narrow(0, 0, p.slice.valid()).copy_(src.narrow(0, p.slice.begin,
                                                                   p.slice.valid()));
        }
        if (m->replica_views_master_) {  // one rank: the master is the whole parameter
          p.replica = p.master.view(p.spec.shape);
          master_is_param = true;
        } else {
          p.replica = src.to(dt).clone().view(p.spec.shape);
        }
        m->memory_.Acquire(MemoryKind::kParams, Bytes(p.replica));
      } else {
        p.master = src;
        p.shard = fp32 ? src : src.to(dt);
        p.persistent = p.numel <= options.param_persistence_threshold;
        master_is_param = fp32;
        m->memory_.Acquire(MemoryKind::kParams, Bytes(p.shard));
      }
      if (options.allocate_optimizer_state) {
        p.exp_avg = at::zeros_like(p.master);
        p.exp_avg_sq = at::zeros_like(p.master);
      }
      src.reset();
      if (options.partition_source != nullptr) {
        absl::Status hs = options.partition_source->OnParamBuilt(i, p);
        if (!hs.ok()) return hs;
        if (p.shard_offloaded) {  // offloaded: nothing resident
          m->memory_.Release(MemoryKind::kParams, Bytes(p.shard));
        }
      }
      m->memory_.Acquire(MemoryKind::kOptimizerStates,
                         Bytes(p.exp_avg) + Bytes(p.exp_avg_sq) +
                             (master_is_param || p.shard_offloaded ? 0 : Bytes(p.master)));
      m->params_.push_back(std::move(p));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("model init: ", e.what()));
  }
  const size_t n = m->params_.size();
  m->grad_expected_.assign(n, 0);
  m->grad_seen_.assign(n, 0);
  m->touched_.assign(n, 0);
  m->enqueued_.assign(n, 0);
  m->grad_written_.assign(n, 0);
  m->grad_out_.resize(n);
  m->grad_out_direct_.assign(n, 0);
  m->deferral_depth_.assign(n, 0);
  m->deferred_.resize(n);
  m->reductions_in_flight_.assign(n, 0);
  m->ready_raised_.assign(n, 0);
  m->memory_.ResetPeaks();
  return m;
}

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
