#include "worker/engine/model/ulysses_attention.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "spec/sequence_parallel_config.h"
#include "worker/engine/model/param_access.h"

namespace loom::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void CheckCollective(const absl::Status& s) {
  if (!s.ok()) throw CollectiveError(s);
}

// x [b, H, Sl, d] -> [b, H/P, P*Sl, d]: chunk j of the send buffer is head block j (all local
// tokens), the receive buffer's chunk j is sequence chunk j of this rank's head block.
at::Tensor SeqToHeadsRaw(const at::Tensor& x, Collectives* group, at::ScalarType wire) {
  const int64_t p = group->world_size();
  const int64_t b = x.size(0), h = x.size(1), sl = x.size(2), d = x.size(3);
  TORCH_CHECK(h % p == 0, "Ulysses all-to-all: ", h, " heads are not divisible by ", p,
              " sequence-parallel ranks");
  at::Tensor send =
      x.to(wire).reshape({b, p, h / p, sl, d}).permute({1, 0, 2, 3, 4}).contiguous().view({-1});
  at::Tensor recv = at::empty_like(send);
  CheckCollective(group->AllToAll(send, recv));
  return recv.view({p, b, h / p, sl, d})
      .permute({1, 2, 0, 3, 4})
      .reshape({b, h / p, p * sl, d})
      .to(x.scalar_type());
}

// y [b, Hl, S, d] -> [b, P*Hl, S/P, d]: the inverse of SeqToHeadsRaw.
at::Tensor HeadsToSeqRaw(const at::Tensor& y, Collectives* group, at::ScalarType wire) {
  const int64_t p = group->world_size();
  const int64_t b = y.size(0), hl = y.size(1), s = y.size(2), d = y.size(3);
  TORCH_CHECK(s % p == 0, "Ulysses all-to-all: sequence length ", s, " is not divisible by ", p,
              " sequence-parallel ranks");
  const int64_t sl = s / p;
  at::Tensor send =
      y.to(wire).reshape({b, hl, p, sl, d}).permute({2, 0, 1, 3, 4}).contiguous().view({-1});
  at::Tensor recv = at::empty_like(send);
  CheckCollective(group->AllToAll(send, recv));
  return recv.view({p, b, hl, sl, d})
      .permute({1, 0, 2, 3, 4})
      .reshape({b, p * hl, sl, d})
      .to(y.scalar_type());
}

Collectives* GroupOf(AutogradContext* ctx) {
  return reinterpret_cast<Collectives*>(ctx->saved_data["group"].toInt());
}
at::ScalarType WireOf(AutogradContext* ctx) {
  return static_cast<at::ScalarType>(ctx->saved_data["wire"].toInt());
}

struct SeqToHeadsFn : public torch::autograd::Function<SeqToHeadsFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group,
                            int64_t wire) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["wire"] = wire;
    return SeqToHeadsRaw(x, reinterpret_cast<Collectives*>(group),
                         static_cast<at::ScalarType>(wire));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {HeadsToSeqRaw(grads[0], GroupOf(ctx), WireOf(ctx)), at::Tensor(), at::Tensor()};
  }
};

struct HeadsToSeqFn : public torch::autograd::Function<HeadsToSeqFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y, int64_t group,
                            int64_t wire) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["wire"] = wire;
    return HeadsToSeqRaw(y, reinterpret_cast<Collectives*>(group),
                         static_cast<at::ScalarType>(wire));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {SeqToHeadsRaw(grads[0], GroupOf(ctx), WireOf(ctx)), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

absl::Status CheckUlyssesHeads(int64_t num_heads, int64_t num_kv_heads, int64_t sp_size) {
  return spec::CheckSequenceParallelHeads(num_heads, num_kv_heads, sp_size);
}

AttentionMask PackedAttentionMask(const at::Tensor& positions) {
  at::NoGradGuard no_grad;
  const at::Tensor pos = positions.reshape({-1}).to(at::kLong);
  const int64_t s = pos.size(0);
  at::Tensor starts = at::ones({s}, at::kLong);
  if (s > 1) {
    starts.narrow(0, 1, s - 1).copy_(pos.narrow(0, 1, s - 1).le(pos.narrow(0, 0, s - 1)));
  }
  AttentionMask m;
  m.positions = pos;
  m.document_ids = starts.cumsum(0);
  return m;
}

at::Tensor PackedCausalMask(const at::Tensor& positions) {
  return PackedAttentionMask(positions).Dense();
}

at::Tensor UlyssesSeqToHeads(const at::Tensor& x, Collectives* group, at::ScalarType wire) {
  return SeqToHeadsFn::apply(x, reinterpret_cast<int64_t>(group), static_cast<int64_t>(wire));
}

at::Tensor UlyssesHeadsToSeq(const at::Tensor& y, Collectives* group, at::ScalarType wire) {
  return HeadsToSeqFn::apply(y, reinterpret_cast<int64_t>(group), static_cast<int64_t>(wire));
}

UlyssesAttention::UlyssesAttention(Collectives* group, const UlyssesOptions& options,
                                   std::unique_ptr<AttentionCore> inner)
    : group_(group), options_(options), inner_(std::move(inner)) {}

absl::StatusOr<std::unique_ptr<UlyssesAttention>> UlyssesAttention::Create(
    Collectives* group, const UlyssesOptions& options, std::unique_ptr<AttentionCore> inner) {
  if (group == nullptr) return absl::InvalidArgumentError("Ulysses: no sequence-parallel group");
  if (absl::Status s = CheckUlyssesHeads(options.num_heads, options.num_kv_heads,
                                         group->world_size());
      !s.ok()) {
    return s;
  }
  if (options.communication_dtype != at::kFloat &&
      options.communication_dtype != at::kBFloat16) {
    return absl::InvalidArgumentError(
        "deepspeed_config.seq_parallel_communication_data_type: must be fp32 or bf16");
  }
  if (inner == nullptr) inner = std::make_unique<MaterializedCausalAttention>();
  return std::unique_ptr<UlyssesAttention>(
      new UlyssesAttention(group, options, std::move(inner)));
}

void UlyssesAttention::SetLocalPositions(const at::Tensor& positions) {
  at::NoGradGuard no_grad;
  const int64_t p = group_->world_size(), r = group_->rank();
  const at::Tensor local = positions.reshape({-1}).to(at::kLong);
  const int64_t sl = local.size(0);
  at::Tensor all = at::zeros({p * sl}, at::kLong);
  all.narrow(0, r * sl, sl).copy_(local);
  CheckCollective(group_->AllReduce(all, ReduceOp::kSum));  // zeros elsewhere: a concatenation
  global_positions_ = all;
  mask_ = PackedAttentionMask(all);
}

at::Tensor UlyssesAttention::Forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const AttentionMask& mask, at::ScalarType act) {
  if (!enabled_) return inner_->Forward(q, k, v, mask, act);
  const int64_t p = group_->world_size();
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "Ulysses: q/k/v must be 4-d");
  TORCH_CHECK(q.size(1) == options_.num_heads && k.size(1) == options_.num_kv_heads &&
                  v.size(1) == options_.num_kv_heads,
              "Ulysses: q/k/v have ", q.size(1), "/", k.size(1), "/", v.size(1),
              " heads, the options say ", options_.num_heads, "/", options_.num_kv_heads);
  const int64_t s = q.size(2) * p;
  if (!mask_.positions.defined() || mask_.positions.size(0) != s) {
    TORCH_CHECK(!global_positions_.defined(), "Ulysses: SetLocalPositions gave ",
                global_positions_.numel(), " global positions, the forward has ", s, " tokens");
    mask_ = AttentionMask();
    mask_.positions = at::arange(s, at::kLong);  // positions 0..S-1, one document
  }
  at::Tensor kr = k, vr = v;
  if (options_.num_kv_heads % p != 0) {  // P % Hkv == 0: one replica per rank
    const int64_t f = p / options_.num_kv_heads;
    kr = k.repeat_interleave(f, 1);
    vr = v.repeat_interleave(f, 1);
  }
  const at::ScalarType wire = options_.communication_dtype;
  at::Tensor qh = UlyssesSeqToHeads(q, group_, wire);
  at::Tensor kh = UlyssesSeqToHeads(kr, group_, wire);
  at::Tensor vh = UlyssesSeqToHeads(vr, group_, wire);
  at::Tensor out = inner_->Forward(qh, kh, vh, mask_, act);  // [b, H/P, S, d]
  return UlyssesHeadsToSeq(out, group_, wire);
}

}  // namespace loom::engine
