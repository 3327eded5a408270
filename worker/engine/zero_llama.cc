#include "worker/engine/zero_llama.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/engine/corpus.h"

namespace loom::engine {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void MemoryTracker::Acquire(MemoryKind kind, int64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  const int k = static_cast<int>(kind);
  cur_[k] += bytes;
  peak_[k] = std::max(peak_[k], cur_[k]);
  total_ += bytes;
  peak_total_ = std::max(peak_total_, total_);
}

void MemoryTracker::Release(MemoryKind kind, int64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  cur_[static_cast<int>(kind)] -= bytes;
  total_ -= bytes;
}

int64_t MemoryTracker::current(MemoryKind kind) const {
  std::lock_guard<std::mutex> l(mu_);
  return cur_[static_cast<int>(kind)];
}

int64_t MemoryTracker::peak(MemoryKind kind) const {
  std::lock_guard<std::mutex> l(mu_);
  return peak_[static_cast<int>(kind)];
}

int64_t MemoryTracker::current_total() const {
  std::lock_guard<std::mutex> l(mu_);
  return total_;
}

int64_t MemoryTracker::peak_total() const {
  std::lock_guard<std::mutex> l(mu_);
  return peak_total_;
}

void MemoryTracker::ResetPeaks() {
  std::lock_guard<std::mutex> l(mu_);
  for (int k = 0; k < kNumMemoryKinds; ++k) peak_[k] = cur_[k];
  peak_total_ = total_;
}

namespace {

void ThrowIfError(const absl::Status& s) {
  if (!s.ok()) throw CollectiveError(s);
}

// bf16 tensors travel through Gloo as fp16 bit patterns (same element size; gathers only copy).
at::Tensor Wire(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? t.view(at::kHalf) : t;
}

ZeroLlama* ModelOf(AutogradContext* ctx) {
  return reinterpret_cast<ZeroLlama*>(ctx->saved_data["model"].toInt());
}
size_t IndexOf(AutogradContext* ctx) {
  return static_cast<size_t>(ctx->saved_data["index"].toInt());
}
void SaveHandles(AutogradContext* ctx, ZeroLlama* m, size_t i) {
  ctx->saved_data["model"] = reinterpret_cast<int64_t>(m);
  ctx->saved_data["index"] = static_cast<int64_t>(i);
}

// y = x W^T with W [out, in]; x [..., in] -> y [..., out].
// Backward (no recompute): dx = dy W, dW = dy^T x summed over all leading dims.
struct ZeroLinearFn : public torch::autograd::Function<ZeroLinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& anchor,
                            ZeroLlama* m, int64_t i) {
    SaveHandles(ctx, m, i);
    ctx->save_for_backward({x});
    at::Tensor y = at::matmul(x, m->AcquireFull(i).to(x.scalar_type()).t());
    m->ReleaseFull(i);
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    ZeroLlama* m = ModelOf(ctx);
    const size_t i = IndexOf(ctx);
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor& gy = grads[0];
    const ZeroParam& p = m->params()[i];
    const int64_t out_f = p.spec.shape[0], in_f = p.spec.shape[1];
    at::Tensor dx = at::matmul(gy, m->AcquireFull(i).to(gy.scalar_type()));
    m->ReleaseFull(i);
    const at::Tensor gy_t = gy.reshape({-1, out_f}).t();  // [out, tokens]
    const at::Tensor x2 = x.reshape({-1, in_f});           // [tokens, in]
    at::Tensor dst = m->GradDestination(i, gy.scalar_type());
    if (dst.defined()) {
      at::mm_out(dst, gy_t, x2);  // dW straight into the reduction buffer
      m->CommitGrad(i);
    } else {
      m->AddGrad(i, gy_t.mm(x2));
    }
    return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Token embedding: ids [...] int64 -> rows of W [V, H] -> [..., H] in `dtype`.
// Backward: dW = index_add of dy rows at the ids.
struct ZeroEmbeddingFn : public torch::autograd::Function<ZeroEmbeddingFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& ids,
                            const at::Tensor& anchor, ZeroLlama* m, int64_t i) {
    SaveHandles(ctx, m, i);
    ctx->save_for_backward({ids});
    const ZeroParam& p = m->params()[i];
    std::vector<int64_t> shape = ids.sizes().vec();
    shape.push_back(p.spec.shape[1]);
    at::Tensor out = m->AcquireFull(i)
                         .index_select(0, ids.reshape({-1}))
                         .to(m->activation_dtype())
                         .view(shape);
    m->ReleaseFull(i);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    ZeroLlama* m = ModelOf(ctx);
    const size_t i = IndexOf(ctx);
    const at::Tensor ids = ctx->get_saved_variables()[0];
    const ZeroParam& p = m->params()[i];
    const int64_t hidden = p.spec.shape[1];
    at::Tensor dst = m->GradDestination(i, at::kFloat);
    at::Tensor dw = dst.defined() ? dst.zero_() : at::zeros(p.spec.shape, at::kFloat);
    dw.index_add_(0, ids.reshape({-1}), grads[0].reshape({-1, hidden}).to(at::kFloat));
    if (dst.defined()) {
      m->CommitGrad(i);
    } else {
      m->AddGrad(i, dw);
    }
    return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// RMSNorm (Zhang & Sennrich 2019; HF LlamaRMSNorm), statistics in fp32:
//   y = w * (x * rsqrt(mean(x^2, -1) + eps)).
// Backward, closed form with r = rsqrt(mean(x^2) + eps), xhat = x r, gx = dy w:
//   dx = r (gx - xhat mean(gx xhat, -1)),  dw = Σ dy xhat over leading dims.
struct ZeroRmsNormFn : public torch::autograd::Function<ZeroRmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& anchor,
                            ZeroLlama* m, int64_t i, double eps) {
    SaveHandles(ctx, m, i);
    ctx->saved_data["eps"] = eps;
    ctx->save_for_backward({x});
    const at::Tensor xf = x.to(at::kFloat);
    at::Tensor r = at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true) + eps);
    at::Tensor y = m->AcquireFull(i).to(x.scalar_type()) * (xf * r).to(x.scalar_type());
    m->ReleaseFull(i);
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    ZeroLlama* m = ModelOf(ctx);
    const size_t i = IndexOf(ctx);
    const double eps = ctx->saved_data["eps"].toDouble();
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor xf = x.to(at::kFloat);
    const at::Tensor gy = grads[0].to(at::kFloat);
    const int64_t hidden = m->params()[i].spec.shape[0];
    at::Tensor r = at::rsqrt(xf.pow(2).mean({-1}, true) + eps);
    at::Tensor xhat = xf * r;
    at::Tensor gx = gy * m->AcquireFull(i).to(at::kFloat);
    m->ReleaseFull(i);
    at::Tensor dx = (r * (gx - xhat * (gx * xhat).mean({-1}, true))).to(x.scalar_type());
    at::Tensor dw = (gy * xhat).reshape({-1, hidden}).sum(0);
    m->AddGrad(i, dw);
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// [B, Hkv, S, d] -> [B, Hkv*n_rep, S, d], each kv head repeated n_rep times consecutively.
at::Tensor RepeatKv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t b = x.size(0), h = x.size(1), s = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, h, n_rep, s, d}).reshape({b, h * n_rep, s, d});
}

int64_t Bytes(const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }

}  // namespace

absl::StatusOr<std::unique_ptr<ZeroLlama>> ZeroLlama::Create(const LlamaConfig& config,
                                                             Collectives* collectives,
                                                             uint64_t seed,
                                                             const HfWeights* init,
                                                             const ZeroOptions& options) {
  if (options.stage < 0 || options.stage > 3) {
    return absl::InvalidArgumentError(absl::StrCat("zero stage ", options.stage));
  }
  std::unique_ptr<ZeroLlama> m(new ZeroLlama(config, collectives, options));
  const int64_t n_ranks = collectives->world_size();
  const int64_t rank = collectives->rank();
  const int stage = options.stage;
  const at::ScalarType dt = options.param_dtype;
  const bool fp32 = dt == at::kFloat;
  try {
    at::NoGradGuard no_grad;
    m->anchor_ = at::empty({0}, at::kFloat).set_requires_grad(true);
    std::vector<ParamSpec> specs = LlamaParamSpecs(config);
    m->params_.reserve(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      ZeroParam p;
      p.spec = specs[i];
      p.numel = specs[i].numel();
      p.slice = ComputePartition(p.numel, n_ranks, rank);
      const int64_t part_n = p.slice.partition_numel;
      // Stage 3 reads only this rank's slice; the others need the full tensor.
      const int64_t begin = stage == 3 ? p.slice.begin : 0;
      const int64_t count = stage == 3 ? p.slice.valid() : p.numel;
      at::Tensor src = at::zeros({stage == 3 ? part_n : p.numel}, at::kFloat);
      if (init != nullptr) {  // fine-tuning: read from the export
        absl::Status s = init->ReadRange(p.spec.name, p.spec.shape, begin, count,
                                         src.data_ptr<float>());
        if (!s.ok()) return s;
      } else {
        at::Tensor full;
        if (p.spec.kind == ParamSpec::Kind::kNorm) {
          full = at::ones({p.numel}, at::kFloat);
        } else {
          at::Generator gen = at::detail::createCPUGenerator(Mix64(seed ^ Mix64(i + 1)));
          full = at::empty({p.numel}, at::kFloat);
          if (config.initializer_range > 0) {
            full.normal_(0.0, config.initializer_range, gen);
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
        p.replica = src.to(dt).clone().view(p.spec.shape);
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
      if (options.on_param) {
        absl::Status hs = options.on_param(i, p);
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
  m->memory_.ResetPeaks();
  return m;
}

at::ScalarType ZeroLlama::activation_dtype() const {
  return options_.param_dtype == at::kBFloat16 ? at::kBFloat16 : at::kFloat;
}

int64_t ZeroLlama::partition_bytes() const {
  int64_t b = 0;
  for (const ZeroParam& p : params_) b += p.master.numel() * 4;
  return b;
}

// ---- Stage-3 fetching -------------------------------------------------------------------

std::map<size_t, ZeroLlama::Live>::iterator ZeroLlama::StartGather(size_t i) {
  const ZeroParam& p = params_[i];
  const int64_t n_ranks = collectives_->world_size();
  Live l;
  l.kind = p.persistent ? MemoryKind::kParams : MemoryKind::kBuffers;
  if (p.persistent) {  // kept for the whole step: counted as a parameter, not pooled
    l.buffer = at::empty({n_ranks * p.slice.partition_numel}, p.shard.options());
    memory_.Acquire(l.kind, Bytes(l.buffer));
  } else {  // the pool counts it (kBuffers in use, kCached idle)
    l.buffer = pool_.Get(n_ranks * p.slice.partition_numel, p.shard.scalar_type());
  }
  at::Tensor out = Wire(l.buffer);
  if (options_.fetch_partition) {  // offload_param: read the partition from its file
    l.input = options_.fetch_partition(i);
    if (l.input.scalar_type() != p.shard.scalar_type()) l.input = l.input.to(p.shard.scalar_type());
    memory_.Acquire(MemoryKind::kBuffers, Bytes(l.input));  // released in Free
  } else {
    l.input = p.shard;
  }
  l.pending = collectives_->StartAllGather(Wire(l.input), out);
  l.full = l.buffer.narrow(0, 0, p.numel).view(p.spec.shape);
  if (!p.persistent) live_elems_ += p.numel;
  return live_.emplace(i, std::move(l)).first;
}

void ZeroLlama::Free(std::map<size_t, Live>::iterator it) {
  Live& l = it->second;
  absl::Status s = absl::OkStatus();
  if (l.pending) s = l.pending->Wait();
  if (l.prefetched_unused) prefetch_elems_ -= params_[it->first].numel;
  const bool pooled = !params_[it->first].persistent;
  if (pooled) {
    live_elems_ -= params_[it->first].numel;
  } else {
    memory_.Release(l.kind, Bytes(l.buffer));
  }
  if (options_.fetch_partition) memory_.Release(MemoryKind::kBuffers, Bytes(l.input));
  at::Tensor buffer = std::move(l.buffer);
  live_.erase(it);  // drops the views (full) and the fetched input
  if (pooled) pool_.Put(std::move(buffer));
  ThrowIfError(s);
}

bool ZeroLlama::ReusedSoon(size_t i) const {
  int64_t distance = 0;
  for (size_t k = trace_pos_; k < trace_.size(); ++k) {
    if (trace_[k] == i) return true;
    distance += params_[trace_[k]].numel;
    if (distance > options_.max_reuse_distance) return false;
  }
  return false;
}

void ZeroLlama::IssuePrefetches() {
  if (options_.prefetch_bucket_size <= 0) return;
  size_t k = std::max(prefetch_pos_, trace_pos_);
  // File reads (offload_param nvme) of the partitions about to be gathered and of those after
  // them, as far as the read buffers go: they run in parallel with each other and with compute.
  auto read_ahead = [&](size_t from) {
    if (!options_.read_ahead) return;
    for (size_t r = std::max(from, read_ahead_pos_); r < trace_.size(); ++r) {
      if (live_.count(trace_[r]) == 0 && !options_.read_ahead(trace_[r])) break;
      read_ahead_pos_ = r + 1;
    }
  };
  read_ahead(k);
  for (; k < trace_.size(); ++k) {
    const size_t j = trace_[k];
    auto live = live_.find(j);
    if (live != live_.end()) {
      // Persistent, prefetched or kept for reuse: it stays gathered until that use.
      if (params_[j].persistent || live->second.uses == 0) continue;
      // In use right now, and may be released before this later use: resume the scan here
      // after the release (then it is gathered again, or kept for reuse).
      break;
    }
    const ZeroParam& q = params_[j];
    if (prefetch_elems_ + q.numel > options_.prefetch_bucket_size) break;
    if (!q.persistent && live_elems_ + q.numel > options_.max_live_parameters) break;
    auto it = StartGather(j);
    it->second.prefetched_unused = true;
    prefetch_elems_ += q.numel;
  }
  prefetch_pos_ = k;
  read_ahead(k);  // refill the read buffers the gathers just took
}

void ZeroLlama::InvalidateTrace() {
  ++trace_invalidations_;
  // Every rank started the same prefetches (same trace, same order), so waiting for them all
  // keeps the collective sequences matched; the unused ones are dropped.
  for (auto it = live_.begin(); it != live_.end();) {
    auto next = std::next(it);
    if (it->second.prefetched_unused) Free(it);
    it = next;
  }
  trace_mode_ = TraceMode::kOff;
  trace_.clear();
  recording_.clear();
}

const at::Tensor& ZeroLlama::AcquireFull(size_t i) {
  ZeroParam& p = params_[i];
  if (options_.stage < 3) return p.replica;
  const bool traced = in_micro_step_;
  if (traced && trace_mode_ == TraceMode::kRecord) {
    recording_.push_back(i);
  } else if (traced && trace_mode_ == TraceMode::kReplay) {
    if (trace_pos_ < trace_.size() && trace_[trace_pos_] == i) {
      ++trace_pos_;
    } else {
      InvalidateTrace();
    }
  }
  auto it = live_.find(i);
  if (it == live_.end()) {
    it = StartGather(i);
    ++on_demand_fetches_;
  }
  Live& l = it->second;
  if (l.pending) {
    absl::Status s = l.pending->Wait();
    l.pending.reset();
    ThrowIfError(s);
  }
  if (l.prefetched_unused) {
    l.prefetched_unused = false;
    prefetch_elems_ -= p.numel;
    ++prefetch_hits_;
  }
  ++l.uses;
  if (traced && trace_mode_ == TraceMode::kReplay) IssuePrefetches();
  return l.full;
}

void ZeroLlama::ReleaseFull(size_t i) {
  if (options_.stage < 3) return;
  auto it = live_.find(i);
  if (it == live_.end()) return;
  if (--it->second.uses > 0) return;
  if (params_[i].persistent) return;
  if (in_micro_step_ && trace_mode_ == TraceMode::kReplay && ReusedSoon(i)) return;
  Free(it);
}

// ---- Gradient reduction -----------------------------------------------------------------

void ZeroLlama::EnsureGrad(ZeroParam& p) {
  if (p.grad.defined()) return;
  if (options_.contiguous_gradients) {
    if (!grad_flat_.defined()) {
      int64_t total = 0;
      for (const ZeroParam& q : params_) total += q.master.numel();
      grad_flat_ = at::zeros({total}, at::kFloat);
      memory_.Acquire(MemoryKind::kGrads, Bytes(grad_flat_));
    }
    int64_t off = 0;
    for (ZeroParam& q : params_) {
      q.grad = grad_flat_.narrow(0, off, q.master.numel());
      off += q.master.numel();
    }
    return;
  }
  p.grad = at::zeros_like(p.master);
  memory_.Acquire(MemoryKind::kGrads, Bytes(p.grad));
}

at::Tensor ZeroLlama::NewGradBuffer(size_t i) {
  const ZeroParam& p = params_[i];
  const int64_t padded = collectives_->world_size() * p.slice.partition_numel;
  at::Tensor buf = pool_.Get(padded, at::kFloat);
  if (padded > p.numel) buf.narrow(0, p.numel, padded - p.numel).zero_();
  return buf;
}

at::Tensor ZeroLlama::GradDestination(size_t i, at::ScalarType compute_dtype) {
  if (options_.stage < 2 || compute_dtype != at::kFloat) return at::Tensor();
  if (grad_out_.size() != params_.size()) grad_out_.resize(params_.size());
  grad_out_[i] = NewGradBuffer(i);
  return grad_out_[i].narrow(0, 0, params_[i].numel).view(params_[i].spec.shape);
}

void ZeroLlama::CommitGrad(size_t i) {
  at::Tensor buf = std::move(grad_out_[i]);
  const int64_t n_ranks = collectives_->world_size();
  if (n_ranks > 1) buf.div_(static_cast<double>(n_ranks));  // the mean, as DeepSpeed pre-divides
  if (touched_.size() != params_.size()) touched_.assign(params_.size(), 0);
  touched_[i] = 1;
  Enqueue(i, buf);
}

void ZeroLlama::AddGrad(size_t i, const at::Tensor& full_grad) {
  ZeroParam& p = params_[i];
  if (options_.stage >= 2) {  // through the same buffer the direct path writes into
    GradDestination(i, at::kFloat).copy_(full_grad.reshape(p.spec.shape));
    CommitGrad(i);
    return;
  }
  at::Tensor g = full_grad.to(at::kFloat).contiguous().view({-1});
  if (grad_seen_.size() != params_.size()) {
    grad_expected_.assign(params_.size(), 0);
    grad_seen_.assign(params_.size(), 0);
  }
  if (touched_.size() != params_.size()) touched_.assign(params_.size(), 0);
  touched_[i] = 1;
  switch (options_.stage) {
    case 0:
      EnsureGrad(p);
      p.grad.add_(g);
      // A parameter used twice (tied embedding/head) is reduced once, after its last use.
      if (last_micro_ && ++grad_seen_[i] >= grad_expected_[i]) Enqueue(i, p.grad);
      return;
    case 1:
      if (!p.local_grad.defined()) {  // zero-padded to N*p: reduce-scattered as it is
        p.local_grad =
            at::zeros({collectives_->world_size() * p.slice.partition_numel}, at::kFloat);
        memory_.Acquire(MemoryKind::kGrads, Bytes(p.local_grad));
      }
      p.local_grad.narrow(0, 0, p.numel).add_(g);
      if (last_micro_ && ++grad_seen_[i] >= grad_expected_[i]) Enqueue(i, p.local_grad);
      return;
    default:
      return;
  }
}

void ZeroLlama::Enqueue(size_t i, const at::Tensor& flat) {
  if (enqueued_.size() != params_.size()) enqueued_.assign(params_.size(), 0);
  enqueued_[i] = 1;
  bucket_.emplace_back(i, flat);
  bucket_elems_ += params_[i].numel;
  if (bucket_elems_ >= options_.reduce_bucket_size) Flush();
}

void ZeroLlama::Flush() {
  if (bucket_.empty()) return;
  const int64_t n_ranks = collectives_->world_size();
  Reduction r;
  int64_t total = 0;
  for (const auto& [i, t] : bucket_) {
    r.ids.push_back(i);
    r.offsets.push_back(total);  // stage 0: where its gradient sits in the concatenation
    total += params_[i].numel;
  }
  if (options_.stage == 0) {
    std::vector<at::Tensor> parts;
    for (const auto& [i, t] : bucket_) parts.push_back(t);
    r.send = at::cat(parts);
    if (n_ranks > 1) r.send.div_(static_cast<double>(n_ranks));
    r.bytes = Bytes(r.send);
    memory_.Acquire(MemoryKind::kBuffers, r.bytes);
    r.pending = collectives_->StartAllReduce(r.send, ReduceOp::kSum);
  } else {
    // One coalesced reduce-scatter of the bucket's [N*p] buffers (stages 2/3: pre-divided in
    // CommitGrad; stage 1: the padded local accumulators, divided here).
    if (grad_written_.size() != params_.size()) grad_written_.assign(params_.size(), 0);
    for (const auto& [i, t] : bucket_) {
      ZeroParam& p = params_[i];
      if (options_.stage == 1 && n_ranks > 1) t.div_(static_cast<double>(n_ranks));
      r.fulls.push_back(t);
      // The first reduction since ClearGrads lands in the gradient partition itself; later
      // ones (gradient accumulation, a parameter used twice) are added when they complete.
      EnsureGrad(p);
      const bool direct = !grad_written_[i];
      grad_written_[i] = 1;
      r.parts.push_back(direct ? p.grad : pool_.Get(p.slice.partition_numel, at::kFloat));
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

void ZeroLlama::CompleteOldest() {
  Reduction r = std::move(in_flight_.front());
  in_flight_.pop_front();
  absl::Status s = r.pending->Wait();
  r.pending.reset();  // holds no reference to the buffers once done: they can go to the pool
  if (s.ok()) {
    for (size_t b = 0; b < r.ids.size(); ++b) {
      ZeroParam& p = params_[r.ids[b]];
      if (options_.stage == 0) {
        p.grad.copy_(r.send.narrow(0, r.offsets[b], p.numel));
      } else if (!r.direct[b]) {
        p.grad.add_(r.parts[b]);
      }
    }
  }
  memory_.Release(MemoryKind::kBuffers, r.bytes);
  for (size_t b = 0; b < r.fulls.size(); ++b) {
    if (!r.direct[b]) pool_.Put(std::move(r.parts[b]));
    if (options_.stage == 1) {  // the full local accumulator is no longer needed
      ZeroParam& p = params_[r.ids[b]];
      r.fulls[b] = at::Tensor();
      memory_.Release(MemoryKind::kGrads, Bytes(p.local_grad));
      p.local_grad = at::Tensor();
    } else {
      pool_.Put(std::move(r.fulls[b]));
    }
  }
  ThrowIfError(s);
}

void ZeroLlama::BeginMicroStep(bool last) {
  last_micro_ = last;
  in_micro_step_ = true;
  grad_expected_.assign(params_.size(), 0);
  grad_seen_.assign(params_.size(), 0);
  trace_pos_ = 0;
  enqueued_.assign(params_.size(), 0);
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

void ZeroLlama::FinishMicroStep() {
  if (last_micro_ && options_.stage <= 1 && touched_.size() == params_.size()) {
    // Stages 0/1 reduce local accumulations once, in the last micro-step's backward; a parameter
    // that got gradients in earlier micro-steps only (a dynamic model) is reduced here, in index
    // order (the same on every rank).
    if (enqueued_.size() != params_.size()) enqueued_.assign(params_.size(), 0);
    for (size_t i = 0; i < params_.size(); ++i) {
      if (touched_[i] && !enqueued_[i]) {
        Enqueue(i, options_.stage == 0 ? params_[i].grad : params_[i].local_grad);
      }
    }
  }
  Flush();
  while (!in_flight_.empty()) CompleteOldest();
  if (options_.stage == 3) {
    if (trace_mode_ == TraceMode::kReplay && trace_pos_ != trace_.size()) InvalidateTrace();
    for (auto it = live_.begin(); it != live_.end();) {
      auto next = std::next(it);
      if (!params_[it->first].persistent) {
        Free(it);
      } else if (it->second.pending) {  // the optimizer must not touch a shard still being sent
        absl::Status s = it->second.pending->Wait();
        it->second.pending.reset();
        ThrowIfError(s);
      }
      it = next;
    }
  }
  in_micro_step_ = false;
  if (options_.drop_read_ahead) options_.drop_read_ahead();
  pool_.Trim();  // buffers no micro-step used since the last one are freed
}

void ZeroLlama::RefreshParams() {
  at::NoGradGuard no_grad;
  const at::ScalarType dt = options_.param_dtype;
  const int64_t n_ranks = collectives_->world_size();
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
  // Stages 1/2: all-gather the updated partitions into the replicas, allgather_bucket_size
  // elements (of gathered output) per collective.
  size_t first = 0;
  while (first < params_.size()) {
    size_t last = first;
    int64_t total = 0;
    while (last < params_.size()) {
      total += params_[last].slice.partition_numel;
      ++last;
      if (total * n_ranks >= options_.allgather_bucket_size) break;
    }
    at::Tensor send = at::empty({total}, params_[first].replica.options());
    std::vector<int64_t> offsets;
    int64_t off = 0;
    for (size_t i = first; i < last; ++i) {
      offsets.push_back(off);
      send.narrow(0, off, params_[i].slice.partition_numel).copy_(params_[i].master);
      off += params_[i].slice.partition_numel;
    }
    at::Tensor recv = at::empty({n_ranks * total}, send.options());
    const int64_t bytes = Bytes(send) + Bytes(recv);
    memory_.Acquire(MemoryKind::kBuffers, bytes);
    at::Tensor wire_recv = Wire(recv);
    absl::Status s = collectives_->AllGather(Wire(send), wire_recv);
    if (s.ok()) {
      for (size_t i = first; i < last; ++i) {
        ZeroParam& p = params_[i];
        at::Tensor flat = p.replica.view({-1});
        for (int64_t q = 0; q < n_ranks; ++q) {
          const PartitionSlice sl = ComputePartition(p.numel, n_ranks, q);
          if (sl.valid() > 0) {
            flat.narrow(0, sl.begin, sl.valid())
                .copy_(recv.narrow(0, q * total + offsets[i - first], sl.valid()));
          }
        }
      }
    }
    memory_.Release(MemoryKind::kBuffers, bytes);
    ThrowIfError(s);
    first = last;
  }
}

void ZeroLlama::ClearGrads() {
  touched_.assign(params_.size(), 0);
  grad_written_.assign(params_.size(), 0);
  if (grad_flat_.defined()) {
    grad_flat_.zero_();
    return;
  }
  for (ZeroParam& p : params_) {
    memory_.Release(MemoryKind::kGrads, Bytes(p.grad));
    p.grad = at::Tensor();
  }
}

double ZeroLlama::LocalGradSquaredNorm() const {
  double sq = 0;
  for (const ZeroParam& p : params_) {
    if (p.grad.defined()) sq += p.grad.to(at::kDouble).pow(2).sum().item<double>();
  }
  return sq;
}

bool ZeroLlama::any_nonfinite_grad() const {
  for (const ZeroParam& p : params_) {
    if (p.grad.defined() && !at::isfinite(p.grad).all().item<bool>()) return true;
  }
  return false;
}

at::Tensor ZeroLlama::GatherFull(size_t i) {
  at::NoGradGuard no_grad;
  at::Tensor out = AcquireFull(i).to(at::kFloat).clone();
  ReleaseFull(i);
  return out;
}

at::Tensor ZeroLlama::CheckpointPartition(size_t i, int which) const {
  const ZeroParam& p = params_[i];
  const at::Tensor& t = which == 0 ? p.master : which == 1 ? p.exp_avg : p.exp_avg_sq;
  if (options_.stage != 0) return t;
  at::Tensor out = at::zeros({p.slice.partition_numel}, at::kFloat);
  if (p.slice.valid() > 0) {
    out.narrow(0, 0, p.slice.valid()).copy_(t.narrow(0, p.slice.begin, p.slice.valid()));
  }
  return out;
}

void ZeroLlama::LoadPartition(size_t i, int which, const float* src) {
  at::NoGradGuard no_grad;
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

std::pair<at::Tensor, at::Tensor> ZeroLlama::RopeTables(int64_t seq, int64_t head_dim,
                                                        double theta) {
  at::Tensor exponents = at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) /
                         static_cast<double>(head_dim);
  at::Tensor inv_freq = 1.0 / at::pow(theta, exponents);  // fp32, as HF computes it
  at::Tensor t = at::arange(seq, at::kLong).to(at::kFloat);
  at::Tensor freqs = at::outer(t, inv_freq);  // [seq, d/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};
}

at::Tensor ZeroLlama::ApplyRope(const at::Tensor& x, const at::Tensor& cos,
                                const at::Tensor& sin) {
  return x * cos + RotateHalf(x) * sin;
}

at::Tensor ZeroLlama::Forward(const at::Tensor& ids, const std::vector<int64_t>* layer_order) {
  const LlamaConfig& c = config_;
  const int64_t b = ids.size(0), s = ids.size(1);
  const int64_t d = c.head_dim(), hq = c.num_attention_heads, hkv = c.num_key_value_heads;
  const at::ScalarType act = activation_dtype();
  // Uses per parameter in this training forward = gradient contributions in its backward.
  const bool counting = in_micro_step_ && at::GradMode::is_enabled();
  if (counting && grad_expected_.size() != params_.size()) {
    grad_expected_.assign(params_.size(), 0);
    grad_seen_.assign(params_.size(), 0);
  }
  auto count = [&](size_t i) {
    if (counting) ++grad_expected_[i];
  };
  auto linear = [&](const at::Tensor& x, size_t i) {
    count(i);
    return ZeroLinearFn::apply(x, anchor_, this, static_cast<int64_t>(i));
  };
  auto norm = [&](const at::Tensor& x, size_t i) {
    count(i);
    return ZeroRmsNormFn::apply(x, anchor_, this, static_cast<int64_t>(i), c.rms_norm_eps);
  };
  auto it = rope_cache_.find(s);
  if (it == rope_cache_.end()) {
    auto tables = RopeTables(s, d, c.rope_theta);
    it = rope_cache_.emplace(s, std::make_pair(tables.first.to(act), tables.second.to(act)))
             .first;
  }
  const at::Tensor& cos = it->second.first;
  const at::Tensor& sin = it->second.second;
  const at::Tensor causal = at::ones({s, s}, at::kBool).triu(1);  // true above the diagonal
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));

  count(0);
  at::Tensor h = ZeroEmbeddingFn::apply(ids, anchor_, this, 0);  // [B,S,H]
  std::vector<int64_t> order;
  if (layer_order != nullptr) {
    order = *layer_order;
  } else {
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) order.push_back(l);
  }
  for (int64_t layer : order) {
    const size_t idx = 1 + 9 * static_cast<size_t>(layer);
    const size_t in_ln = idx, q_i = idx + 1, k_i = idx + 2, v_i = idx + 3, o_i = idx + 4;
    const size_t post_ln = idx + 5, gate_i = idx + 6, up_i = idx + 7, down_i = idx + 8;
    at::Tensor x = norm(h, in_ln);
    at::Tensor q = linear(x, q_i).view({b, s, hq, d}).transpose(1, 2);   // [B,Hq,S,d]
    at::Tensor k = linear(x, k_i).view({b, s, hkv, d}).transpose(1, 2);  // [B,Hkv,S,d]
    at::Tensor v = linear(x, v_i).view({b, s, hkv, d}).transpose(1, 2);
    q = ApplyRope(q, cos, sin);
    k = ApplyRope(k, cos, sin);
    k = RepeatKv(k, hq / hkv);
    v = RepeatKv(v, hq / hkv);
    at::Tensor scores = at::matmul(q, k.transpose(2, 3)) * scale;  // [B,Hq,S,S]
    scores = scores.masked_fill(causal, -std::numeric_limits<float>::infinity());
    at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(act);
    at::Tensor attn = at::matmul(probs, v).transpose(1, 2).reshape({b, s, hq * d});
    h = h + linear(attn, o_i);
    x = norm(h, post_ln);
    at::Tensor mlp = linear(at::silu(linear(x, gate_i)) * linear(x, up_i), down_i);
    h = h + mlp;
  }
  const size_t final_norm = 1 + 9 * static_cast<size_t>(c.num_hidden_layers);
  h = norm(h, final_norm);
  const size_t head = c.tie_word_embeddings ? 0 : final_norm + 1;
  return linear(h, head);  // [B,S,V]
}

}  // namespace loom::engine
