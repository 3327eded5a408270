#include "worker/engine/zero_llama.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "worker/engine/corpus.h"

namespace loom::engine {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void GatherTracker::Acquire(int64_t bytes) {
  int64_t now = current_.fetch_add(bytes) + bytes;
  int64_t prev = peak_.load();
  while (now > prev && !peak_.compare_exchange_weak(prev, now)) {
  }
}

void GatherTracker::Release(int64_t bytes) { current_.fetch_sub(bytes); }

namespace {

using Runtime = ZeroLlama::Runtime;

void ThrowIfError(const absl::Status& s) {
  if (!s.ok()) throw CollectiveError(s);
}

// A full parameter all-gathered from the partitions; freed (and un-accounted) on destruction.
class Gathered {
 public:
  Gathered(const ZeroParam& p, Runtime* rt) : rt_(rt) {
    const int64_t n_ranks = rt->collectives->world_size();
    at::Tensor flat = at::empty({n_ranks * p.slice.partition_numel}, at::kFloat);
    bytes_ = flat.nbytes();
    rt_->tracker->Acquire(bytes_);
    ThrowIfError(
        rt->collectives->AllGather(rt->fetch ? rt->fetch(p) : p.partition.detach(), flat));
    full_ = flat.narrow(0, 0, p.numel).view(p.spec.shape);
  }
  ~Gathered() {
    full_.reset();
    rt_->tracker->Release(bytes_);
  }
  Gathered(const Gathered&) = delete;
  Gathered& operator=(const Gathered&) = delete;
  const at::Tensor& full() const { return full_; }

 private:
  Runtime* rt_;
  at::Tensor full_;
  int64_t bytes_ = 0;
};

// Reduce-scatters the gradient of a full parameter: zero-pads it to N*p, pre-divides by N
// (DeepSpeed divides the bucket by the DP size before its reduce-scatter) and returns this
// rank's summed slice [p].
at::Tensor ReduceScatterGrad(const ZeroParam& p, Runtime* rt, const at::Tensor& full_grad) {
  const int64_t n_ranks = rt->collectives->world_size();
  const int64_t part = p.slice.partition_numel;
  at::Tensor flat = at::zeros({n_ranks * part}, at::kFloat);
  const int64_t bytes = flat.nbytes();
  rt->tracker->Acquire(bytes);
  flat.narrow(0, 0, p.numel).copy_(full_grad.reshape({-1}));
  if (n_ranks > 1) flat.div_(static_cast<double>(n_ranks));
  at::Tensor out = at::empty({part}, at::kFloat);
  absl::Status s = rt->collectives->ReduceScatterSum(flat, out);
  flat.reset();
  rt->tracker->Release(bytes);
  ThrowIfError(s);
  return out;
}

ZeroParam* ParamOf(AutogradContext* ctx) {
  return reinterpret_cast<ZeroParam*>(ctx->saved_data["param"].toInt());
}
Runtime* RuntimeOf(AutogradContext* ctx) {
  return reinterpret_cast<Runtime*>(ctx->saved_data["runtime"].toInt());
}
void SaveHandles(AutogradContext* ctx, ZeroParam* p, Runtime* rt) {
  ctx->saved_data["param"] = reinterpret_cast<int64_t>(p);
  ctx->saved_data["runtime"] = reinterpret_cast<int64_t>(rt);
}

// y = x W^T with W [out, in] gathered; x [..., in] -> y [..., out].
// Backward (no recompute): dx = dy W, dW = dy^T x summed over all leading dims.
struct ZeroLinearFn : public torch::autograd::Function<ZeroLinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& partition, ZeroParam* p, Runtime* rt) {
    SaveHandles(ctx, p, rt);
    ctx->save_for_backward({x});
    Gathered w(*p, rt);
    return at::matmul(x, w.full().t());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    ZeroParam* p = ParamOf(ctx);
    Runtime* rt = RuntimeOf(ctx);
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor& gy = grads[0];
    const int64_t out_f = p->spec.shape[0], in_f = p->spec.shape[1];
    at::Tensor dx;
    {
      Gathered w(*p, rt);
      dx = at::matmul(gy, w.full());
    }
    at::Tensor dw = gy.reshape({-1, out_f}).t().mm(x.reshape({-1, in_f}));
    at::Tensor dpart = ReduceScatterGrad(*p, rt, dw);
    return {dx, dpart, at::Tensor(), at::Tensor()};
  }
};

// Token embedding: ids [...] int64 -> rows of W [V, H] gathered -> [..., H].
// Backward: dW = index_add of dy rows at the ids.
struct ZeroEmbeddingFn : public torch::autograd::Function<ZeroEmbeddingFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& ids,
                            const at::Tensor& partition, ZeroParam* p, Runtime* rt) {
    SaveHandles(ctx, p, rt);
    ctx->save_for_backward({ids});
    Gathered w(*p, rt);
    std::vector<int64_t> shape = ids.sizes().vec();
    shape.push_back(p->spec.shape[1]);
    return w.full().index_select(0, ids.reshape({-1})).view(shape);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    ZeroParam* p = ParamOf(ctx);
    Runtime* rt = RuntimeOf(ctx);
    const at::Tensor ids = ctx->get_saved_variables()[0];
    const int64_t hidden = p->spec.shape[1];
    at::Tensor dw = at::zeros(p->spec.shape, at::kFloat);
    dw.index_add_(0, ids.reshape({-1}), grads[0].reshape({-1, hidden}));
    at::Tensor dpart = ReduceScatterGrad(*p, rt, dw);
    return {at::Tensor(), dpart, at::Tensor(), at::Tensor()};
  }
};

// RMSNorm (Zhang & Sennrich 2019; HF LlamaRMSNorm), fp32:
//   y = w * (x * rsqrt(mean(x^2, -1) + eps)).
// Backward, closed form with r = rsqrt(mean(x^2) + eps), xhat = x r, gx = dy w:
//   dx = r (gx - xhat mean(gx xhat, -1)),  dw = Σ dy xhat over leading dims.
struct ZeroRmsNormFn : public torch::autograd::Function<ZeroRmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& partition, ZeroParam* p, Runtime* rt, double eps) {
    SaveHandles(ctx, p, rt);
    ctx->saved_data["eps"] = eps;
    ctx->save_for_backward({x});
    Gathered w(*p, rt);
    at::Tensor r = at::rsqrt(x.pow(2).mean({-1}, /*keepdim=*/true) + eps);
    return w.full() * (x * r);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    ZeroParam* p = ParamOf(ctx);
    Runtime* rt = RuntimeOf(ctx);
    const double eps = ctx->saved_data["eps"].toDouble();
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor& gy = grads[0];
    const int64_t hidden = p->spec.shape[0];
    at::Tensor r = at::rsqrt(x.pow(2).mean({-1}, true) + eps);
    at::Tensor xhat = x * r;
    at::Tensor dx;
    {
      Gathered w(*p, rt);
      at::Tensor gx = gy * w.full();
      dx = r * (gx - xhat * (gx * xhat).mean({-1}, true));
    }
    at::Tensor dw = (gy * xhat).reshape({-1, hidden}).sum(0);
    at::Tensor dpart = ReduceScatterGrad(*p, rt, dw);
    return {dx, dpart, at::Tensor(), at::Tensor(), at::Tensor()};
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

}  // namespace

absl::StatusOr<std::unique_ptr<ZeroLlama>> ZeroLlama::Create(const LlamaConfig& config,
                                                             Collectives* collectives,
                                                             uint64_t seed,
                                                             const HfWeights* init,
                                                             const ZeroInitHooks* hooks) {
  std::unique_ptr<ZeroLlama> m(new ZeroLlama(config, collectives));
  m->runtime_ = Runtime{collectives, &m->tracker_, nullptr};
  const bool moments = hooks == nullptr || hooks->allocate_optimizer_state;
  auto finish = [&](ZeroParam& p) -> absl::Status {
    if (moments) {
      p.exp_avg = at::zeros_like(p.partition);
      p.exp_avg_sq = at::zeros_like(p.partition);
    }
    if (hooks != nullptr && hooks->on_param) return hooks->on_param(p);
    return absl::OkStatus();
  };
  const int64_t n_ranks = collectives->world_size();
  const int64_t rank = collectives->rank();
  try {
    at::NoGradGuard no_grad;
    std::vector<ParamSpec> specs = LlamaParamSpecs(config);
    m->params_.reserve(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      ZeroParam p;
      p.index = static_cast<int64_t>(i);
      p.spec = specs[i];
      p.numel = specs[i].numel();
      p.slice = ComputePartition(p.numel, n_ranks, rank);
      if (init != nullptr) {  // fine-tuning: this rank reads only its own slice of the export
        at::Tensor part = at::zeros({p.slice.partition_numel}, at::kFloat);
        absl::Status s = init->ReadRange(p.spec.name, p.spec.shape, p.slice.begin,
                                         p.slice.valid(), part.data_ptr<float>());
        if (!s.ok()) return s;
        p.partition = part.set_requires_grad(true);
        absl::Status hs = finish(p);
        if (!hs.ok()) return hs;
        m->params_.push_back(std::move(p));
        continue;
      }
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
      at::Tensor part = at::zeros({p.slice.partition_numel}, at::kFloat);
      if (p.slice.valid() > 0) {
        part.narrow(0, 0, p.slice.valid()).copy_(full.narrow(0, p.slice.begin, p.slice.valid()));
      }
      p.partition = part.set_requires_grad(true);
      full.reset();
      absl::Status hs = finish(p);
      if (!hs.ok()) return hs;
      m->params_.push_back(std::move(p));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("model init: ", e.what()));
  }
  return m;
}

int64_t ZeroLlama::partition_bytes() const {
  int64_t b = 0;
  for (const ZeroParam& p : params_) b += p.slice.partition_numel * 4;
  return b;
}

at::Tensor ZeroLlama::GatherFull(size_t i) {
  at::NoGradGuard no_grad;
  Gathered g(params_[i], &runtime_);
  return g.full().clone();
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

at::Tensor ZeroLlama::Forward(const at::Tensor& ids) {
  const LlamaConfig& c = config_;
  const int64_t b = ids.size(0), s = ids.size(1);
  const int64_t d = c.head_dim(), hq = c.num_attention_heads, hkv = c.num_key_value_heads;
  Runtime* rt = &runtime_;
  auto linear = [&](const at::Tensor& x, size_t i) {
    return ZeroLinearFn::apply(x, params_[i].partition, &params_[i], rt);
  };
  auto norm = [&](const at::Tensor& x, size_t i) {
    return ZeroRmsNormFn::apply(x, params_[i].partition, &params_[i], rt, c.rms_norm_eps);
  };
  auto it = rope_cache_.find(s);
  if (it == rope_cache_.end()) {
    it = rope_cache_.emplace(s, RopeTables(s, d, c.rope_theta)).first;
  }
  const at::Tensor& cos = it->second.first;
  const at::Tensor& sin = it->second.second;
  const at::Tensor causal = at::ones({s, s}, at::kBool).triu(1);  // true above the diagonal
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));

  at::Tensor h = ZeroEmbeddingFn::apply(ids, params_[0].partition, &params_[0], rt);  // [B,S,H]
  size_t idx = 1;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const size_t in_ln = idx, q_i = idx + 1, k_i = idx + 2, v_i = idx + 3, o_i = idx + 4;
    const size_t post_ln = idx + 5, gate_i = idx + 6, up_i = idx + 7, down_i = idx + 8;
    idx += 9;
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
    at::Tensor probs = at::softmax(scores, -1, at::kFloat);
    at::Tensor attn = at::matmul(probs, v).transpose(1, 2).reshape({b, s, hq * d});
    h = h + linear(attn, o_i);
    x = norm(h, post_ln);
    at::Tensor mlp = linear(at::silu(linear(x, gate_i)) * linear(x, up_i), down_i);
    h = h + mlp;
  }
  h = norm(h, idx);
  const size_t head = c.tie_word_embeddings ? 0 : idx + 1;
  return linear(h, head);  // [B,S,V]
}

}  // namespace loom::engine
