// BlockwiseCausalAttention (FlashAttention-2 forward/backward) against two independent
// references: plain LibTorch autograd ops written here (repeat_interleave K/V, dense scores,
// dense mask, softmax) and the model's MaterializedCausalAttention.
// fp32 tolerance: |a - b| <= 2e-6 + 1e-5 |b| for outputs and dq/dk/dv (a different summation
// order of the same fp32 math; values are O(1)). bf16 inputs: |a - b| <= 2e-2 + 2e-2 |b| against
// the fp32 reference of the same (bf16-rounded) inputs.
#include "worker/engine/model/blockwise_attention.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/engine/model/llama_model.h"

namespace loom::engine {
namespace {

void ExpectClose(const at::Tensor& got, const at::Tensor& want, double atol, double rtol,
                 const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const at::Tensor g = got.to(at::kFloat), w = want.to(at::kFloat);
  ASSERT_TRUE(at::isfinite(g).all().item<bool>()) << what << " has non-finite values";
  const double worst = ((g - w).abs() - rtol * w.abs()).max().item<double>();
  EXPECT_LE(worst, atol) << what << " max |diff| " << (g - w).abs().max().item<double>();
}

// The reference: softmax(q k^T / sqrt(d) masked) v in fp32 with K/V heads repeated.
at::Tensor Reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& pos, const at::Tensor& doc) {
  const int64_t rep = q.size(1) / k.size(1);
  const at::Tensor k2 = k.to(at::kFloat).repeat_interleave(rep, 1);
  const at::Tensor v2 = v.to(at::kFloat).repeat_interleave(rep, 1);
  at::Tensor scores = at::matmul(q.to(at::kFloat), k2.transpose(-1, -2)) /
                      std::sqrt(static_cast<double>(q.size(-1)));
  at::Tensor visible = pos.view({1, -1}) <= pos.view({-1, 1});  // [query][key]
  if (doc.defined()) visible = visible & (doc.view({1, -1}) == doc.view({-1, 1}));
  scores = scores.masked_fill(visible.logical_not(), -std::numeric_limits<float>::infinity());
  return at::matmul(at::softmax(scores, -1), v2);
}

struct Case {
  int64_t b, hq, hkv, s, d, block;
};

std::string Name(const Case& c) {
  return absl::StrCat("B=", c.b, " Hq=", c.hq, " Hkv=", c.hkv, " S=", c.s, " d=", c.d,
                      " block=", c.block);
}

struct Grads {
  at::Tensor out, dq, dk, dv;
};

// Runs `attn` on leaves made from q, k, v and backpropagates sum(out * w).
template <typename Fn>
Grads RunAttn(Fn attn, const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0,
          const at::Tensor& w) {
  at::Tensor q = q0.clone().requires_grad_(true);
  at::Tensor k = k0.clone().requires_grad_(true);
  at::Tensor v = v0.clone().requires_grad_(true);
  at::Tensor out = attn(q, k, v);
  (out.to(at::kFloat) * w).sum().backward();
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

void CheckCase(const Case& c, const at::Tensor& pos, const at::Tensor& doc) {
  at::manual_seed(c.s * 31 + c.hq);
  const at::Tensor q = at::randn({c.b, c.hq, c.s, c.d});
  const at::Tensor k = at::randn({c.b, c.hkv, c.s, c.d});
  const at::Tensor v = at::randn({c.b, c.hkv, c.s, c.d});
  const at::Tensor w = at::randn({c.b, c.hq, c.s, c.d});
  const std::string what = Name(c) + (doc.defined() ? " packed" : "");
  Grads ref = RunAttn([&](auto& a, auto& b, auto& x) { return Reference(a, b, x, pos, doc); }, q, k,
                  v, w);
  AttentionMask mask;
  mask.positions = pos;
  mask.document_ids = doc;
  MaterializedCausalAttention materialized;
  Grads mat = RunAttn([&](auto& a, auto& b, auto& x) {
    return materialized.Forward(a, b, x, mask, at::kFloat);
  }, q, k, v, w);
  // The tiled function itself (every case, also one block larger than S), then the core.
  Grads blk = RunAttn([&](auto& a, auto& b, auto& x) {
    return BlockwiseAttention(a, b, x, pos, doc, c.block, at::kFloat);
  }, q, k, v, w);
  BlockwiseCausalAttention blockwise(c.block);
  Grads core = RunAttn([&](auto& a, auto& b, auto& x) {
    return blockwise.Forward(a, b, x, mask, at::kFloat);
  }, q, k, v, w);
  ExpectClose(core.out, blk.out, 2e-6, 1e-5, what + " core out vs the tiled function");
  ExpectClose(core.dq, blk.dq, 2e-6, 1e-5, what + " core dq vs the tiled function");
  if (c.s <= c.block) {  // one tile: the core runs the materialised computation, bit for bit
    EXPECT_TRUE(at::equal(core.out, mat.out)) << what;
    EXPECT_TRUE(at::equal(core.dq, mat.dq) && at::equal(core.dk, mat.dk) &&
                at::equal(core.dv, mat.dv))
        << what;
  }
  for (const auto& [name, want] : {std::make_pair("reference", ref), std::make_pair("materialized", mat)}) {
    ExpectClose(blk.out, want.out, 2e-6, 1e-5, what + " out vs " + name);
    ExpectClose(blk.dq, want.dq, 2e-6, 1e-5, what + " dq vs " + name);
    ExpectClose(blk.dk, want.dk, 2e-6, 1e-5, what + " dk vs " + name);
    ExpectClose(blk.dv, want.dv, 2e-6, 1e-5, what + " dv vs " + name);
  }
}

TEST(BlockwiseAttentionTest, EqualsMaterializedForwardAndBackwardMhaGqaMqa) {
  const std::vector<Case> cases = {
      {1, 4, 4, 32, 8, 8},    // MHA, S a multiple of the block
      {2, 4, 4, 37, 8, 16},   // MHA, S = 2*16 + 5
      {1, 6, 2, 37, 16, 8},   // GQA 3:1, uneven last block
      {2, 6, 2, 50, 8, 16},   // GQA, B = 2
      {2, 4, 1, 19, 8, 4},    // MQA
      {1, 4, 2, 21, 8, 64},   // one block larger than S
      {1, 2, 1, 9, 4, 1},     // 1x1 tiles
  };
  for (const Case& c : cases) {
    CheckCase(c, at::arange(c.s, at::kLong), at::Tensor());
  }
}

// A sequence shard: global positions 1000..1000+S-1 (what sequence parallelism passes) give the
// same attention as 0..S-1, and match the references with those positions.
TEST(BlockwiseAttentionTest, OffsetPositionsOfASequenceShard) {
  const Case c{2, 6, 2, 45, 8, 16};
  CheckCase(c, at::arange(1000, 1000 + c.s, at::kLong), at::Tensor());
  at::manual_seed(5);
  const at::Tensor q = at::randn({c.b, c.hq, c.s, c.d});
  const at::Tensor k = at::randn({c.b, c.hkv, c.s, c.d});
  const at::Tensor v = at::randn({c.b, c.hkv, c.s, c.d});
  const at::Tensor a = BlockwiseAttention(q, k, v, at::arange(c.s, at::kLong), at::Tensor(), 16,
                                          at::kFloat);
  const at::Tensor b = BlockwiseAttention(q, k, v, at::arange(1000, 1000 + c.s, at::kLong),
                                          at::Tensor(), 16, at::kFloat);
  EXPECT_TRUE(at::equal(a, b));
}

// Unsorted positions (a later key placed before an earlier query) are masked by value.
TEST(BlockwiseAttentionTest, PositionsNeedNotBeSorted) {
  const Case c{1, 4, 2, 24, 8, 8};
  at::manual_seed(6);
  CheckCase(c, at::randperm(c.s, at::kLong), at::Tensor());
}

// Packed sample: documents of 20 and 17 tokens, positions restarting at 0 in each.
TEST(BlockwiseAttentionTest, PackedTwoDocumentsDoNotAttendAcrossTheBoundary) {
  const Case c{2, 6, 2, 37, 8, 16};
  const at::Tensor pos = at::cat({at::arange(20, at::kLong), at::arange(17, at::kLong)});
  const at::Tensor doc =
      at::cat({at::zeros({20}, at::kLong), at::ones({17}, at::kLong)});
  CheckCase(c, pos, doc);

  // No leakage: changing document 0's q/k/v leaves document 1's outputs bit for bit, and the
  // loss on document 1's outputs gives document 0's k/v exactly zero gradient.
  at::manual_seed(7);
  at::Tensor q = at::randn({c.b, c.hq, c.s, c.d}), k = at::randn({c.b, c.hkv, c.s, c.d});
  at::Tensor v = at::randn({c.b, c.hkv, c.s, c.d});
  const at::Tensor out1 = BlockwiseAttention(q, k, v, pos, doc, 16, at::kFloat);
  at::Tensor q2 = q.clone(), k2 = k.clone(), v2 = v.clone();
  q2.narrow(2, 0, 20).normal_();
  k2.narrow(2, 0, 20).normal_();
  v2.narrow(2, 0, 20).normal_();
  const at::Tensor out2 = BlockwiseAttention(q2, k2, v2, pos, doc, 16, at::kFloat);
  EXPECT_TRUE(at::equal(out1.narrow(2, 20, 17), out2.narrow(2, 20, 17)));
  EXPECT_FALSE(at::equal(out1.narrow(2, 0, 20), out2.narrow(2, 0, 20)));
  k.requires_grad_(true);
  v.requires_grad_(true);
  BlockwiseAttention(q, k, v, pos, doc, 16, at::kFloat).narrow(2, 20, 17).sum().backward();
  EXPECT_EQ(k.grad().narrow(2, 0, 20).abs().max().item<float>(), 0.0f);
  EXPECT_EQ(v.grad().narrow(2, 0, 20).abs().max().item<float>(), 0.0f);
  EXPECT_GT(v.grad().narrow(2, 20, 17).abs().max().item<float>(), 0.0f);
}

// bf16 activations: fp32 accumulation, output in bf16, gradients in bf16.
TEST(BlockwiseAttentionTest, Bf16InputsAccumulateInFp32) {
  const Case c{2, 6, 2, 40, 16, 16};
  at::manual_seed(8);
  const at::Tensor q = at::randn({c.b, c.hq, c.s, c.d}).to(at::kBFloat16);
  const at::Tensor k = at::randn({c.b, c.hkv, c.s, c.d}).to(at::kBFloat16);
  const at::Tensor v = at::randn({c.b, c.hkv, c.s, c.d}).to(at::kBFloat16);
  const at::Tensor w = at::randn({c.b, c.hq, c.s, c.d});
  const at::Tensor pos = at::arange(c.s, at::kLong);
  Grads ref = RunAttn([&](auto& a, auto& b, auto& x) { return Reference(a, b, x, pos, at::Tensor()); },
                  q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), w);
  Grads blk = RunAttn([&](auto& a, auto& b, auto& x) {
    return BlockwiseAttention(a, b, x, pos, at::Tensor(), c.block, at::kBFloat16);
  }, q, k, v, w);
  EXPECT_EQ(blk.out.scalar_type(), at::kBFloat16);
  EXPECT_EQ(blk.dq.scalar_type(), at::kBFloat16);
  ExpectClose(blk.out, ref.out, 2e-2, 2e-2, "bf16 out");
  ExpectClose(blk.dq, ref.dq, 2e-2, 2e-2, "bf16 dq");
  ExpectClose(blk.dk, ref.dk, 2e-2, 2e-2, "bf16 dk");
  ExpectClose(blk.dv, ref.dv, 2e-2, 2e-2, "bf16 dv");
}

TEST(BlockwiseAttentionTest, BadArgumentsAreRefusedWithAClearError) {
  const at::Tensor q = at::randn({1, 3, 8, 4}), k = at::randn({1, 2, 8, 4});
  const at::Tensor pos = at::arange(8, at::kLong);
  EXPECT_THROW(BlockwiseAttention(q, k, k, pos, at::Tensor(), 4, at::kFloat), c10::Error);
  const at::Tensor q4 = at::randn({1, 4, 8, 4});
  EXPECT_THROW(BlockwiseAttention(q4, k, k, pos, at::Tensor(), 0, at::kFloat), c10::Error);
  EXPECT_THROW(BlockwiseAttention(q4, k, k, at::arange(7, at::kLong), at::Tensor(), 4,
                                  at::kFloat),
               c10::Error);
}

}  // namespace
}  // namespace loom::engine
