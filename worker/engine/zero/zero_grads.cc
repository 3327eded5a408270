// ZeroProvider, the gradient sink: local accumulation (stages 0/1), direct reduction buffers
// (stages 2/3), gradient deferral, bucketed reductions with overlap, and the partition
// gradient ready events (zero_provider.h).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "worker/engine/zero/zero_common.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {

using zero_internal::Bytes;
using zero_internal::ThrowIfError;

double ZeroProvider::divide_factor() const {
  return options_.gradient_divide_factor > 0 ? options_.gradient_divide_factor
                                             : static_cast<double>(collectives_->world_size());
}

void ZeroProvider::NoteUse(ParamId i) {
  // Uses in a training forward = gradient contributions in its backward.
  if (in_micro_step_ && at::GradMode::is_enabled()) ++grad_expected_[i];
}

void ZeroProvider::EnsureGrad(ZeroParam& p) {
  if (p.grad.defined()) return;
  if (options_.contiguous_gradients) {
    if (!grad_flat_.defined()) {
      int64_t total = 0;
      for (const ZeroParam& q : params_) total += q.master.numel();
      grad_flat_ = at::zeros({total}, at::kFloat);
      memory_.Acquire(MemoryKind::kGrads, Bytes(grad_flat_));
    }
    ViewGradsInFlat();
    return;
  }
  p.grad = at::zeros_like(p.master);
  memory_.Acquire(MemoryKind::kGrads, Bytes(p.grad));
}

void ZeroProvider::ViewGradsInFlat() {
  int64_t off = 0;
  for (ZeroParam& q : params_) {
    q.grad = grad_flat_.narrow(0, off, q.master.numel());
    off += q.master.numel();
  }
}

at::Tensor ZeroProvider::NewGradBuffer(size_t i) {
  const ZeroParam& p = params_[i];
  const int64_t padded = collectives_->world_size() * p.slice.partition_numel;
  at::Tensor buf = pool_.Get(padded, at::kFloat);
  if (padded > p.numel) buf.narrow(0, p.numel, padded - p.numel).zero_();
  return buf;
}

at::Tensor ZeroProvider::NewLocalGrad(size_t i) {
  // From the pool (no fresh pages to fault in every step: perf showed page clearing at ~5% of
  // a ZeRO-1 step); counted as kGrads while it is the accumulator.
  at::Tensor buf = NewGradBuffer(i);
  memory_.Release(MemoryKind::kBuffers, Bytes(buf));
  memory_.Acquire(MemoryKind::kGrads, Bytes(buf));
  return buf;
}

void ZeroProvider::PutLocalGrad(ZeroParam& p) {
  memory_.Release(MemoryKind::kGrads, Bytes(p.local_grad));
  memory_.Acquire(MemoryKind::kBuffers, Bytes(p.local_grad));
  pool_.Put(std::move(p.local_grad));
  p.local_grad = at::Tensor();
}

at::Tensor ZeroProvider::GradDestination(ParamId i, at::ScalarType compute_dtype) {
  if (compute_dtype != at::kFloat) return at::Tensor();
  if (options_.stage == 1) {
    // Stage 1: the step's first contribution is written straight into the [N*p] local
    // accumulator (no zero fill, no temporary gradient, no add); later ones take AddGrad.
    ZeroParam& p = params_[i];
    if (p.local_grad.defined()) return at::Tensor();
    p.local_grad = NewLocalGrad(i);
    return p.local_grad.narrow(0, 0, p.numel).view(p.spec.shape);
  }
  if (options_.stage < 2) return at::Tensor();
  if (identity_reduction() && deferral_depth_[i] == 0 && !grad_written_[i]) {
    // One rank: the reduction is the identity, so the first contribution since ClearGrads is
    // written straight into the gradient partition ([p] = [n]: no padding at one rank).
    ZeroParam& p = params_[i];
    EnsureGrad(p);
    grad_out_[i] = p.grad;
    grad_out_direct_[i] = 1;
    return p.grad.view(p.spec.shape);
  }
  grad_out_[i] = NewGradBuffer(i);
  grad_out_direct_[i] = 0;
  return grad_out_[i].narrow(0, 0, params_[i].numel).view(params_[i].spec.shape);
}

void ZeroProvider::CommitGrad(ParamId i) {
  touched_[i] = 1;
  ++grad_seen_[i];
  if (options_.stage == 1) {  // written into local_grad by GradDestination
    if (last_micro_ && deferral_depth_[i] == 0 && grad_seen_[i] >= grad_expected_[i]) {
      Enqueue(i, params_[i].local_grad);
    }
    return;
  }
  at::Tensor buf = std::move(grad_out_[i]);
  if (grad_out_direct_[i]) {  // one rank: buf is the gradient partition itself
    grad_out_direct_[i] = 0;
    const double factor = divide_factor();
    if (factor != 1.0) buf.div_(factor);  // the same op the reduction buffer gets
    grad_written_[i] = 1;
    MaybeGradReady(i);
    return;
  }
  if (deferral_depth_[i] > 0) {  // summed here, reduced once at EndGradDeferral
    if (!deferred_[i].defined()) {
      deferred_[i] = std::move(buf);
    } else {
      deferred_[i].add_(buf);
      pool_.Put(std::move(buf));
    }
    return;
  }
  const double factor = divide_factor();
  if (factor != 1.0) buf.div_(factor);  // the mean, as DeepSpeed pre-divides
  Enqueue(i, buf);
}

void ZeroProvider::AddGrad(ParamId i, const at::Tensor& full_grad) {
  ZeroParam& p = params_[i];
  if (options_.stage >= 2) {  // through the same buffer the direct path writes into
    GradDestination(i, at::kFloat).copy_(full_grad.reshape(p.spec.shape));
    CommitGrad(i);
    return;
  }
  at::Tensor g = full_grad.to(at::kFloat).contiguous().view({-1});
  // The step's first contribution is copied, not added to zeros: +0.0 + -0.0 is +0.0, and a
  // -0.0 element keeps its sign as PyTorch's AccumulateGrad keeps the first gradient as it is
  // (signed_zero_grad_test); every other value is the same either way.
  const bool first = !touched_[i];
  touched_[i] = 1;
  ++grad_seen_[i];
  // A parameter used several times (tied embedding/head, tiles) is reduced once, after its
  // last use (and after its deferral closed).
  const bool complete =
      last_micro_ && deferral_depth_[i] == 0 && grad_seen_[i] >= grad_expected_[i];
  switch (options_.stage) {
    case 0:
      EnsureGrad(p);
      if (first) {
        p.grad.copy_(g);
      } else {
        p.grad.add_(g);
      }
      if (complete) Enqueue(i, p.grad);
      return;
    case 1:
      if (!p.local_grad.defined()) {  // zero-padded to N*p: reduce-scattered as it is
        p.local_grad = NewLocalGrad(i);
        p.local_grad.narrow(0, 0, p.numel).copy_(g);
      } else {
        p.local_grad.narrow(0, 0, p.numel).add_(g);
      }
      if (complete) Enqueue(i, p.local_grad);
      return;
    default:
      return;
  }
}

void ZeroProvider::BeginGradDeferral(const std::vector<ParamId>& ids) {
  for (ParamId i : ids) ++deferral_depth_.at(i);
}

void ZeroProvider::EndGradDeferral(const std::vector<ParamId>& ids) {
  for (ParamId i : ids) {
    if (deferral_depth_.at(i) <= 0) {
      throw std::logic_error(absl::StrCat("EndGradDeferral of ", specs_[i].name,
                                          " without a matching BeginGradDeferral"));
    }
    if (--deferral_depth_[i] > 0) continue;
    if (options_.stage >= 2) {
      if (!deferred_[i].defined()) continue;
      at::Tensor buf = std::move(deferred_[i]);
      const double factor = divide_factor();
      if (factor != 1.0) buf.div_(factor);
      Enqueue(i, buf);
    } else if (last_micro_ && touched_[i] && !enqueued_[i] &&
               grad_seen_[i] >= grad_expected_[i]) {
      Enqueue(i, options_.stage == 0 ? params_[i].grad : params_[i].local_grad);
    }
  }
}

void ZeroProvider::Enqueue(size_t i, const at::Tensor& flat) {
  enqueued_[i] = 1;
  ++reductions_in_flight_[i];
  bucket_.emplace_back(i, flat);
  bucket_elems_ += params_[i].numel;
  if (bucket_elems_ >= options_.reduce_bucket_size) Flush();
}

void ZeroProvider::Flush() {
  if (bucket_.empty()) return;
  const double factor = divide_factor();
  Reduction r;
  int64_t total = 0;
  for (const auto& [i, t] : bucket_) {
    r.ids.push_back(i);
    r.offsets.push_back(total);  // stage 0: where its gradient sits in the concatenation
    total += params_[i].numel;
  }
  if (identity_reduction()) {
    FlushIdentity();
    return;
  }
  if (options_.stage == 0) {
    std::vector<at::Tensor> parts;
    for (const auto& [i, t] : bucket_) parts.push_back(t);
    r.send = at::cat(parts);
    if (factor != 1.0) r.send.div_(factor);
    r.bytes = Bytes(r.send);
    memory_.Acquire(MemoryKind::kBuffers, r.bytes);
    r.pending = collectives_->StartAllReduce(r.send, ReduceOp::kSum);
  } else {
    // One coalesced reduce-scatter of the bucket's [N*p] buffers (stages 2/3: pre-divided in
    // CommitGrad; stage 1: the padded local accumulators, divided here). A 16-bit
    // communication dtype reduces a copy rounded once to it (the fp32 buffer of stages 2/3
    // goes back to the pool at once) into a 16-bit [p] temporary.
    const at::ScalarType wire = grad_communication_dtype();
    r.wire16 = wire != at::kFloat;
    for (auto& [i, t] : bucket_) {
      ZeroParam& p = params_[i];
      if (options_.stage == 1 && factor != 1.0) t.div_(factor);
      if (r.wire16) {
        at::Tensor w = pool_.Get(t.numel(), wire);
        w.copy_(t);
        if (options_.stage >= 2) pool_.Put(std::move(t));
        r.fulls.push_back(std::move(w));
      } else {
        r.fulls.push_back(t);
      }
      // The first reduction since ClearGrads lands in the gradient partition itself (copied
      // from the 16-bit temporary); later ones (gradient accumulation, a parameter used twice)
      // are added when they complete.
      EnsureGrad(p);
      const bool direct = !grad_written_[i];
      grad_written_[i] = 1;
      if (r.wire16) {
        r.parts.push_back(pool_.Get(p.slice.partition_numel, wire));
      } else {
        r.parts.push_back(direct ? p.grad : pool_.Get(p.slice.partition_numel, at::kFloat));
      }
      r.direct.push_back(direct);
    }
    r.pending = collectives_->StartReduceScatterSumCoalesced(r.fulls, r.parts);
  }
  bucket_.clear();
  bucket_elems_ = 0;
  in_flight_.push_back(std::move(r));
  const size_t max_in_flight = options_.overlap_comm ? 2 : 0;
  while (in_flight_.size() > max_in_flight) CompleteOldest();
}

void ZeroProvider::FlushIdentity() {
  // One rank, fp32 wire: the reduce-scatter would copy each [p] = [n] buffer into its
  // partition (Collectives' one-rank reduction is a copy), so the buffer is copied (first
  // reduction since ClearGrads) or added (later ones) into the gradient itself: the same
  // values, bit for bit, without the collective's copy and the temporary partition.
  const double factor = divide_factor();
  std::vector<std::pair<size_t, at::Tensor>> bucket = std::move(bucket_);
  bucket_.clear();
  bucket_elems_ = 0;
  for (auto& [i, t] : bucket) {
    ZeroParam& p = params_[i];
    if (options_.stage == 1 && factor != 1.0) t.div_(factor);  // stages 2/3: in CommitGrad
    EnsureGrad(p);
    if (grad_written_[i]) {
      p.grad.add_(t);
    } else {
      p.grad.copy_(t);
      grad_written_[i] = 1;
    }
    if (options_.stage == 1) {  // t is the local accumulator
      t = at::Tensor();
      PutLocalGrad(p);
    } else {
      pool_.Put(std::move(t));
    }
    --reductions_in_flight_[i];
  }
  for (const auto& entry : bucket) MaybeGradReady(entry.first);
}

void ZeroProvider::CompleteOldest() {
  Reduction r = std::move(in_flight_.front());
  in_flight_.pop_front();
  absl::Status s = r.pending->Wait();
  r.pending.reset();  // holds no reference to the buffers once done: they can go to the pool
  if (s.ok()) {
    for (size_t b = 0; b < r.ids.size(); ++b) {
      ZeroParam& p = params_[r.ids[b]];
      if (options_.stage == 0) {
        p.grad.copy_(r.send.narrow(0, r.offsets[b], p.numel));
      } else if (r.wire16 && r.direct[b]) {
        p.grad.copy_(r.parts[b]);
      } else if (!r.direct[b]) {
        p.grad.add_(r.parts[b]);
      }
    }
  }
  memory_.Release(MemoryKind::kBuffers, r.bytes);
  for (size_t b = 0; b < r.fulls.size(); ++b) {
    if (!r.direct[b] || r.wire16) pool_.Put(std::move(r.parts[b]));
    if (options_.stage == 1) {  // the full local accumulator is no longer needed
      ZeroParam& p = params_[r.ids[b]];
      if (r.wire16) pool_.Put(std::move(r.fulls[b]));
      r.fulls[b] = at::Tensor();
      PutLocalGrad(p);
    } else {
      pool_.Put(std::move(r.fulls[b]));
    }
  }
  for (size_t id : r.ids) --reductions_in_flight_[id];
  ThrowIfError(s);
  for (size_t id : r.ids) MaybeGradReady(id);
}

void ZeroProvider::MaybeGradReady(size_t i) {
  if (options_.grad_ready_listener == nullptr || !last_micro_ || ready_raised_[i]) return;
  if (reductions_in_flight_[i] > 0 || deferral_depth_[i] > 0 || deferred_[i].defined()) return;
  if (grad_seen_[i] < grad_expected_[i]) return;  // more contributions to come
  ready_raised_[i] = 1;
  options_.grad_ready_listener->OnPartitionGradReady(i);
}

void ZeroProvider::FlushGrads() {
  // A deferral still open at the end of backward is closed here (its sum reduced), in id order.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (deferral_depth_[i] > 0) {
      deferral_depth_[i] = 1;
      EndGradDeferral({i});
    }
  }
  if (last_micro_ && options_.stage <= 1) {
    // Stages 0/1 reduce local accumulations once, in the last micro-step's backward; a parameter
    // that got gradients in earlier micro-steps only (a dynamic model) is reduced here, in index
    // order (the same on every rank).
    for (size_t i = 0; i < params_.size(); ++i) {
      if (touched_[i] && !enqueued_[i]) {
        Enqueue(i, options_.stage == 0 ? params_[i].grad : params_[i].local_grad);
      }
    }
  }
  Flush();
  while (!in_flight_.empty()) CompleteOldest();
  if (last_micro_ && grads_stale_) {  // ClearGrads left them: zero what no reduction wrote
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!grad_written_[i] && params_[i].grad.defined()) params_[i].grad.zero_();
    }
    grads_stale_ = false;
  }
  if (options_.grad_ready_listener != nullptr && last_micro_) {
    // Parameters whose last reduction was in an earlier micro-step (or that were used fewer
    // times than noted) are final now.
    for (size_t i = 0; i < params_.size(); ++i) {
      if (touched_[i] && !ready_raised_[i]) {
        ready_raised_[i] = 1;
        options_.grad_ready_listener->OnPartitionGradReady(i);
      }
    }
  }
}

}  // namespace loom::engine
