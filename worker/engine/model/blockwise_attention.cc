#include "worker/engine/model/blockwise_attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>
#include <vector>

namespace loom::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Geometry {
  int64_t b, hkv, rep, s, d;
};

Geometry GeometryOf(const at::Tensor& q, const at::Tensor& k) {
  return {q.size(0), k.size(1), q.size(1) / k.size(1), q.size(2), q.size(3)};
}

// Visibility of the tile (queries [i0, i0+n), keys [j0, j0+m); doc [0] = one document): none,
// all, or a [n,m] bool mask (true = visible).
struct Tile {
  bool any = false;
  bool all = false;
  at::Tensor visible;
};

Tile TileOf(const at::Tensor& pos, const at::Tensor& doc, int64_t i0, int64_t n, int64_t j0,
            int64_t m) {
  at::Tensor vis = pos.narrow(0, j0, m).unsqueeze(0) <= pos.narrow(0, i0, n).unsqueeze(1);
  if (doc.numel() > 0) {
    vis = vis & (doc.narrow(0, j0, m).unsqueeze(0) == doc.narrow(0, i0, n).unsqueeze(1));
  }
  Tile t;
  t.any = vis.any().item<bool>();
  t.all = t.any && vis.all().item<bool>();
  if (t.any && !t.all) t.visible = vis;
  return t;
}

// Rows [i0, i0+n) of a grouped [B,Hkv,rep,S,x] tensor as [B,Hkv,rep*n,x] fp32.
at::Tensor Rows(const at::Tensor& grouped, int64_t i0, int64_t n) {
  const Geometry g{grouped.size(0), grouped.size(1), grouped.size(2), 0, grouped.size(4)};
  return grouped.narrow(3, i0, n).reshape({g.b, g.hkv, g.rep * n, g.d}).to(at::kFloat);
}

// Sets the invisible entries of scores [B,Hkv,rep*n,m] to -inf.
at::Tensor Mask(const at::Tensor& scores, const Tile& t, const Geometry& g, int64_t n,
                int64_t m) {
  if (!t.visible.defined()) return scores;
  return scores.view({g.b, g.hkv, g.rep, n, m})
      .masked_fill(t.visible.logical_not(), kNegInf)
      .view({g.b, g.hkv, g.rep * n, m});
}

struct BlockwiseFn : public torch::autograd::Function<BlockwiseFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& pos, const at::Tensor& doc,
                            int64_t block, int64_t act_int) {
    const auto act = static_cast<at::ScalarType>(act_int);
    const Geometry g = GeometryOf(q, k);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(g.d)));
    const at::Tensor qg = q.view({g.b, g.hkv, g.rep, g.s, g.d});
    at::Tensor out = at::empty({g.b, g.hkv, g.rep, g.s, g.d}, q.options().dtype(act));
    at::Tensor lse = at::empty({g.b, g.hkv, g.rep, g.s}, q.options().dtype(at::kFloat));
    for (int64_t i0 = 0; i0 < g.s; i0 += block) {
      const int64_t n = std::min(block, g.s - i0);
      const at::Tensor qb = Rows(qg, i0, n) * scale;  // [B,Hkv,rep*n,d] (never a view of q)
      at::Tensor row_max = at::full({g.b, g.hkv, g.rep * n, 1}, kNegInf, qb.options());
      at::Tensor row_sum = at::zeros({g.b, g.hkv, g.rep * n, 1}, qb.options());
      at::Tensor acc = at::zeros({g.b, g.hkv, g.rep * n, g.d}, qb.options());
      for (int64_t j0 = 0; j0 < g.s; j0 += block) {
        const int64_t m = std::min(block, g.s - j0);
        const Tile t = TileOf(pos, doc, i0, n, j0, m);
        if (!t.any) continue;
        const at::Tensor kb = k.narrow(2, j0, m).to(at::kFloat);  // [B,Hkv,m,d]
        const at::Tensor vb = v.narrow(2, j0, m).to(at::kFloat);
        at::Tensor s = Mask(at::matmul(qb, kb.transpose(2, 3)), t, g, n, m);
        at::Tensor new_max = at::maximum(row_max, std::get<0>(s.max(-1, /*keepdim=*/true)));
        // Rows with nothing visible yet keep max -inf: shift by 0 so exp gives 0, not NaN.
        at::Tensor shift = at::where(at::isinf(new_max), at::zeros_like(new_max), new_max);
        at::Tensor p = at::exp(s - shift);
        at::Tensor alpha = at::exp(row_max - shift);
        row_sum = row_sum * alpha + p.sum(-1, /*keepdim=*/true);
        acc = acc * alpha + at::matmul(p, vb);
        row_max = new_max;
      }
      // Every query sees at least itself; a row with nothing visible yields 0 (lse +inf).
      const at::Tensor safe_sum = at::where(row_sum > 0, row_sum, at::ones_like(row_sum));
      out.narrow(3, i0, n).copy_((acc / safe_sum).view({g.b, g.hkv, g.rep, n, g.d}));
      at::Tensor block_lse = at::where(row_sum > 0, row_max + at::log(safe_sum),
                                       at::full_like(row_sum, std::numeric_limits<float>::infinity()));
      lse.narrow(3, i0, n).copy_(block_lse.view({g.b, g.hkv, g.rep, n}));
    }
    at::Tensor result = out.view({g.b, g.hkv * g.rep, g.s, g.d});
    ctx->save_for_backward({q, k, v, result, lse});
    ctx->saved_data["pos"] = pos;
    ctx->saved_data["doc"] = doc;
    ctx->saved_data["block"] = block;
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3];
    const at::Tensor& lse = saved[4];  // [B,Hkv,rep,S]
    const at::Tensor pos = ctx->saved_data["pos"].toTensor();
    const at::Tensor doc = ctx->saved_data["doc"].toTensor();
    const int64_t block = ctx->saved_data["block"].toInt();
    const Geometry g = GeometryOf(q, k);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(g.d)));
    const at::Tensor qg = q.view({g.b, g.hkv, g.rep, g.s, g.d});
    const at::Tensor dog = grads[0].contiguous().view({g.b, g.hkv, g.rep, g.s, g.d});
    // D_i = rowsum(dO_i * O_i) (Alg. 2 line 4), fp32 [B,Hkv,rep,S].
    const at::Tensor delta =
        (grads[0].to(at::kFloat) * out.to(at::kFloat)).sum(-1).view({g.b, g.hkv, g.rep, g.s});
    at::Tensor dq = at::zeros({g.b, g.hkv, g.rep, g.s, g.d}, q.options().dtype(at::kFloat));
    at::Tensor dk = at::empty({g.b, g.hkv, g.s, g.d}, q.options().dtype(at::kFloat));
    at::Tensor dv = at::empty({g.b, g.hkv, g.s, g.d}, q.options().dtype(at::kFloat));
    for (int64_t j0 = 0; j0 < g.s; j0 += block) {
      const int64_t m = std::min(block, g.s - j0);
      const at::Tensor kb = k.narrow(2, j0, m).to(at::kFloat);
      const at::Tensor vb = v.narrow(2, j0, m).to(at::kFloat);
      at::Tensor dkb = at::zeros({g.b, g.hkv, m, g.d}, kb.options());
      at::Tensor dvb = at::zeros({g.b, g.hkv, m, g.d}, kb.options());
      for (int64_t i0 = 0; i0 < g.s; i0 += block) {
        const int64_t n = std::min(block, g.s - i0);
        const Tile t = TileOf(pos, doc, i0, n, j0, m);
        if (!t.any) continue;
        const at::Tensor qb = Rows(qg, i0, n) * scale;
        const at::Tensor dob = Rows(dog, i0, n);
        const at::Tensor lseb = lse.narrow(3, i0, n).reshape({g.b, g.hkv, g.rep * n, 1});
        const at::Tensor db = delta.narrow(3, i0, n).reshape({g.b, g.hkv, g.rep * n, 1});
        at::Tensor s = Mask(at::matmul(qb, kb.transpose(2, 3)), t, g, n, m);
        at::Tensor p = at::exp(s - lseb);                        // [B,Hkv,rep*n,m]
        dvb.add_(at::matmul(p.transpose(2, 3), dob));            // dV_j += P^T dO_i
        at::Tensor dp = at::matmul(dob, vb.transpose(2, 3));     // dP = dO_i V_j^T
        at::Tensor ds = p * (dp - db);                           // dS = P o (dP - D_i)
        dq.narrow(3, i0, n).add_(at::matmul(ds, kb).mul_(scale).view({g.b, g.hkv, g.rep, n, g.d}));
        dkb.add_(at::matmul(ds.transpose(2, 3), qb));            // qb carries the scale
      }
      dk.narrow(2, j0, m).copy_(dkb);
      dv.narrow(2, j0, m).copy_(dvb);
    }
    return {dq.view({g.b, g.hkv * g.rep, g.s, g.d}).to(q.scalar_type()), dk.to(k.scalar_type()),
            dv.to(v.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor BlockwiseAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& positions, const at::Tensor& document_ids,
                              int64_t block_size, at::ScalarType act) {
  TORCH_CHECK(block_size >= 1, "attention block size ", block_size, " must be >= 1");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be [B,H,S,d]");
  TORCH_CHECK(k.sizes() == v.sizes(), "k ", k.sizes(), " and v ", v.sizes(), " differ");
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(2) == k.size(2) && q.size(3) == k.size(3),
              "q ", q.sizes(), " does not match k ", k.sizes());
  TORCH_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, "query heads ", q.size(1),
              " are not a multiple of KV heads ", k.size(1));
  const int64_t s = q.size(2);
  TORCH_CHECK(positions.defined() && positions.numel() == s, "positions must be [", s, "]");
  const at::Tensor pos = positions.reshape({-1}).to(at::kLong);
  at::Tensor doc = at::empty({0}, at::kLong);  // [0]: one document (apply needs defined inputs)
  if (document_ids.defined()) {
    TORCH_CHECK(document_ids.numel() == s, "document_ids must be [", s, "]");
    doc = document_ids.reshape({-1}).to(at::kLong);
  }
  return BlockwiseFn::apply(q.contiguous(), k.contiguous(), v.contiguous(), pos, doc, block_size,
                            static_cast<int64_t>(act));
}

at::Tensor BlockwiseCausalAttention::Forward(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const AttentionMask& mask,
                                             at::ScalarType act) {
  // One tile covers the whole sequence: the tile IS the materialised [S, S] computation, and the
  // dense kernels run it faster than the tiled function's online-softmax bookkeeping and
  // backward recompute (attention_bench at the fortunes example's S = 128, block 128: 1.19x
  // slower tiled, docs/engine.md). Memory stays bounded by one [B, Hq, block, block] tile.
  if (q.size(2) <= block_size_ && k.size(2) <= block_size_) {
    return MaterializedCausalAttention().Forward(q, k, v, mask, act);
  }
  return BlockwiseAttention(q, k, v, mask.positions, mask.document_ids, block_size_, act);
}

}  // namespace loom::engine
