#include "worker/engine/model/tiled_ops.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace loom::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kIgnoreIndex = -100;

ParamAccess* AccessOf(AutogradContext* ctx) {
  return reinterpret_cast<ParamAccess*>(ctx->saved_data["access"].toInt());
}

// [start, length) of tile t of `tiles` torch.chunk-like tiles over `len` (length 0: empty).
std::pair<int64_t, int64_t> TileRange(int64_t len, int64_t tiles, int64_t t) {
  const int64_t step = (len + tiles - 1) / tiles;
  const int64_t start = std::min(len, t * step);
  return {start, std::min(len, start + step) - start};
}

// One full [out, in] weight-gradient contribution dW = a^T b (a [tokens, out], b [tokens, in]),
// as LinearOp hands it over: straight into the provider's buffer when it offers one.
void ContributeGrad(ParamAccess* m, ParamId i, const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor at_ = a.t();
  at::Tensor dst = m->GradDestination(i, a.scalar_type());
  if (dst.defined()) {
    at::mm_out(dst, at_, b);
    m->CommitGrad(i);
  } else {
    m->AddGrad(i, at_.mm(b));
  }
}

// SwiGLU over sequence tiles; saves x only (TiledMlp in the header).
struct TiledMlpFn : public torch::autograd::Function<TiledMlpFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& anchor,
                            ParamAccess* m, int64_t gate, int64_t up, int64_t down,
                            int64_t tiles) {
    ctx->saved_data["access"] = reinterpret_cast<int64_t>(m);
    ctx->saved_data["ids"] = std::vector<int64_t>{gate, up, down};
    ctx->saved_data["tiles"] = tiles;
    ctx->save_for_backward({x});
    const at::ScalarType dt = x.scalar_type();
    const at::Tensor wg = m->Acquire(gate).to(dt), wu = m->Acquire(up).to(dt),
                     wd = m->Acquire(down).to(dt);
    const int64_t s = x.size(1);
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = wd.size(0);
    at::Tensor y = at::empty(shape, x.options());
    for (int64_t t = 0; t < tiles; ++t) {
      const auto [start, len] = TileRange(s, tiles, t);
      if (len == 0) continue;  // an empty tile: nothing to compute
      const at::Tensor xt = x.narrow(1, start, len);
      at::Tensor h = at::silu(at::matmul(xt, wg.t())) * at::matmul(xt, wu.t());
      y.narrow(1, start, len).copy_(at::matmul(h, wd.t()));
    }
    m->Release(gate);
    m->Release(up);
    m->Release(down);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    ParamAccess* m = AccessOf(ctx);
    const std::vector<int64_t> ids = ctx->saved_data["ids"].toIntVector();
    const ParamId gate = ids[0], up = ids[1], down = ids[2];
    const int64_t tiles = ctx->saved_data["tiles"].toInt();
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor& dy = grads[0];
    const at::ScalarType dt = x.scalar_type();
    const int64_t s = x.size(1), hidden = x.size(-1);
    // Every tile's weight gradient accumulates in the provider; one reduction per weight when
    // the deferral closes (DeepSpeed: ds_grad_is_ready only on the last shard).
    GradDeferral deferral(m, {gate, up, down});
    const at::Tensor wg = m->Acquire(gate).to(dt), wu = m->Acquire(up).to(dt),
                     wd = m->Acquire(down).to(dt);
    const int64_t inter = wg.size(0);
    at::Tensor dx = at::empty_like(x);
    for (int64_t t = 0; t < tiles; ++t) {
      const auto [start, len] = TileRange(s, tiles, t);
      if (len == 0) continue;
      const at::Tensor xt = x.narrow(1, start, len);
      const at::Tensor dyt = dy.narrow(1, start, len).to(dt);
      // Recompute: g = x Wg^T, u = x Wu^T, a = silu(g), h = a * u (y = h Wd^T).
      const at::Tensor g = at::matmul(xt, wg.t());
      const at::Tensor u = at::matmul(xt, wu.t());
      const at::Tensor a = at::silu(g);
      const at::Tensor h = a * u;
      // dh = dy Wd; dWd = dy^T h; da = dh u; du = dh a; dg = silu'(g) da;
      // dx = dg Wg + du Wu; dWg = dg^T x; dWu = du^T x.
      const at::Tensor dh = at::matmul(dyt, wd);
      ContributeGrad(m, down, dyt.reshape({-1, hidden}), h.reshape({-1, inter}));
      const at::Tensor dg = at::silu_backward(dh * u, g);
      const at::Tensor du = dh * a;
      const at::Tensor x2 = xt.reshape({-1, hidden});
      ContributeGrad(m, gate, dg.reshape({-1, inter}), x2);
      ContributeGrad(m, up, du.reshape({-1, inter}), x2);
      dx.narrow(1, start, len).copy_(at::matmul(du, wu) + at::matmul(dg, wg));
    }
    m->Release(gate);
    m->Release(up);
    m->Release(down);
    deferral.Close();
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

// Logits + cross-entropy over row tiles with each tile's backward inside forward.
struct TiledLossFn : public torch::autograd::Function<TiledLossFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& labels, const at::Tensor& anchor, ParamAccess* m,
                            int64_t head, int64_t tiles, int64_t n_valid, bool need_grad) {
    ctx->saved_data["access"] = reinterpret_cast<int64_t>(m);
    ctx->saved_data["head"] = head;
    const at::ScalarType dt = hidden.scalar_type();
    const int64_t h = hidden.size(-1), n = hidden.numel() / h;
    const at::Tensor x = hidden.reshape({n, h});
    const at::Tensor y = labels.reshape({n});
    const at::Tensor w = m->Acquire(head).to(dt);  // [V,H], once for all tiles
    const double inv_count = 1.0 / static_cast<double>(std::max<int64_t>(n_valid, 1));
    at::Tensor dx, dw;
    if (need_grad) {
      dx = at::empty({n, h}, hidden.options());
      dw = at::zeros(w.sizes(), w.options().dtype(at::kFloat));
    }
    at::Tensor loss_sum;
    for (int64_t t = 0; t < tiles; ++t) {
      const auto [start, len] = TileRange(n, tiles, t);
      if (len == 0) continue;
      const at::Tensor xt = x.narrow(0, start, len);
      const at::Tensor yt = y.narrow(0, start, len);
      at::Tensor logp = at::log_softmax(at::matmul(xt, w.t()).to(at::kFloat), -1);  // [len,V]
      at::Tensor lt = at::nll_loss(logp, yt, {}, at::Reduction::Sum, kIgnoreIndex);
      loss_sum = loss_sum.defined() ? loss_sum + lt : lt;
      if (!need_grad) continue;
      // d(loss_t)/dlogits = softmax - onehot(label) on valid rows, 0 on ignored ones; the
      // division by the count of valid tokens over ALL tiles happens here.
      const at::Tensor valid = yt.ne(kIgnoreIndex).to(at::kFloat).unsqueeze(1);  // [len,1]
      at::Tensor dlogits = logp.exp_();
      dlogits.scatter_add_(1, yt.clamp_min(0).unsqueeze(1), -valid);
      dlogits.mul_(valid * inv_count);
      const at::Tensor d = dlogits.to(dt);
      dx.narrow(0, start, len).copy_(at::matmul(d, w));
      if (dt == at::kFloat) {
        dw.addmm_(d.t(), xt);
      } else {
        dw.add_(d.t().mm(xt));  // in the activation dtype, as LinearOp, accumulated in fp32
      }
    }
    m->Release(head);
    if (need_grad) ctx->save_for_backward({dx.view(hidden.sizes()), dw});
    if (!loss_sum.defined()) loss_sum = at::zeros({}, at::kFloat);
    // A division, as nll_loss's mean does (one tile: the default head's bits).
    return loss_sum / static_cast<double>(std::max<int64_t>(n_valid, 1));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    ParamAccess* m = AccessOf(ctx);
    const ParamId head = static_cast<ParamId>(ctx->saved_data["head"].toInt());
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& dx = saved[0];
    const at::Tensor& dw = saved[1];
    const at::Tensor g = grads[0].to(at::kFloat);  // the upstream scale (1/GAS, loss scale, k)
    at::Tensor dst = m->GradDestination(head, at::kFloat);
    if (dst.defined()) {
      at::mul_out(dst, dw, g);
      m->CommitGrad(head);
    } else {
      m->AddGrad(head, dw * g);
    }
    return {(dx * g).to(dx.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

int64_t LocalTileCount(int64_t length, int64_t tile_size) {
  // length / tile, rounded up, without the overflow of (length + tile - 1) for a tile size near
  // INT64_MAX (the spec allows any positive tile size).
  return std::max<int64_t>(1, length / tile_size + (length % tile_size != 0 ? 1 : 0));
}

int64_t AgreeTileCount(Collectives* group, int64_t local) {
  if (group == nullptr || group->world_size() == 1) return local;
  at::Tensor t = at::full({1}, local, at::kLong);
  absl::Status st = group->AllReduce(t, ReduceOp::kMax);
  if (!st.ok()) throw CollectiveError(st);
  return t.item<int64_t>();
}

at::Tensor TiledMlp::Forward(const at::Tensor& x, ParamId gate, ParamId up, ParamId down) {
  const int64_t tile = tile_size_ > 0 ? tile_size_ : x.size(-1);
  const int64_t tiles = AgreeTileCount(group_, LocalTileCount(x.size(1), tile));
  last_tiles_ = tiles;
  // One contribution per non-empty tile in backward.
  for (int64_t t = 0; t < tiles; ++t) {
    if (TileRange(x.size(1), tiles, t).second == 0) continue;
    access_->NoteUse(gate);
    access_->NoteUse(up);
    access_->NoteUse(down);
  }
  return TiledMlpFn::apply(x, access_->anchor(), access_, static_cast<int64_t>(gate),
                           static_cast<int64_t>(up), static_cast<int64_t>(down), tiles);
}

TiledLogitsLoss::TiledLogitsLoss(ParamAccess* access, Collectives* group, ParamId head,
                                 int64_t tile_size)
    : access_(access), group_(group), head_(head), tile_size_(tile_size) {
  if (tile_size_ <= 0) {
    const int64_t vocab = access_->spec(head_).shape[0];
    tile_size_ = std::max<int64_t>(1, kDefaultLossTileBytes / (4 * vocab));
  }
}

LossOutput TiledLogitsLoss::Forward(const at::Tensor& hidden, const at::Tensor& labels) {
  const int64_t rows = labels.numel();
  const int64_t tiles = AgreeTileCount(group_, LocalTileCount(rows, tile_size_));
  last_tiles_ = tiles;
  LossOutput out;
  out.token_count = labels.ne(kIgnoreIndex).sum().item<int64_t>();
  const bool need_grad = at::GradMode::is_enabled();
  access_->NoteUse(head_);  // one contribution, in backward
  out.loss = TiledLossFn::apply(hidden, labels, access_->anchor(), access_,
                                static_cast<int64_t>(head_), tiles, out.token_count, need_grad);
  return out;
}

absl::Status InstallTiledCompute(const spec::TiledComputeOptions& options, Collectives* group,
                                 LlamaModel* model) {
  if (options.mlp_tile_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training.tiled_mlp_tile_size: ", options.mlp_tile_size, " must be >= 0"));
  }
  if (options.logits_loss_tile_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat("training.tiled_logits_loss_tile_size: ",
                                                   options.logits_loss_tile_size,
                                                   " must be >= 0"));
  }
  if (options.mlp) {
    model->set_mlp_core(
        std::make_unique<TiledMlp>(model->access(), group, options.mlp_tile_size));
  }
  if (options.logits_loss) {
    model->set_loss_head(std::make_unique<TiledLogitsLoss>(
        model->access(), group, model->head_id(), options.logits_loss_tile_size));
  }
  return absl::OkStatus();
}

}  // namespace loom::engine
