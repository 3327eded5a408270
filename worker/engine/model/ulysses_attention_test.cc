// Ulysses sequence parallelism (ulysses_attention.h) on real Gloo ranks (threads, RunGang):
//   * the seq->heads all-to-all puts head block r on rank r (values that encode their origin,
//     checked against a formula), the round trip is bit-exact, and d Σ(a2a(x)²)/dx = 2x exactly
//     (docs/design/TECHNIQUES-TESTS.md AL-5..AL-7), for P = 2, 4, batch 1, 2, several head counts
//     and dims;
//   * Ulysses attention over the materialised core equals an unsharded causal attention written
//     here with plain LibTorch ops (forward and q/k/v gradients, fp32, |a-b| <= 1e-6 + 1e-5|b|):
//     MHA P = 2, 4; GQA with Hkv % P == 0; Hkv < P (replicated KV heads); a packed sample of two
//     documents (80 + 48 tokens, positions restarting at 0) with no attention across them;
//   * bf16 on the wire stays within bf16 rounding of the fp32 result;
//   * bad head counts are INVALID_ARGUMENT naming the field.
#include "worker/engine/model/ulysses_attention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <ATen/ATen.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "worker/engine/collectives.h"
#include "worker/engine/model/blockwise_attention.h"
#include "worker/engine/testing/thread_gang.h"

namespace loom::engine {
namespace {

using testing::FirstFailure;
using testing::RunGang;

// A value that names its origin: (rank, batch, head, token, dim) -> an integer exact in fp32.
float Code(int64_t rank, int64_t b, int64_t h, int64_t s, int64_t dd) {
  return static_cast<float>((((rank * 2 + b) * 8 + h) * 8 + s) * 32 + dd);
}

at::Tensor Coded(int64_t rank, int64_t batch, int64_t heads, int64_t sl, int64_t dim) {
  at::Tensor x = at::empty({batch, heads, sl, dim}, at::kFloat);
  auto a = x.accessor<float, 4>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t s = 0; s < sl; ++s)
        for (int64_t dd = 0; dd < dim; ++dd) a[b][h][s][dd] = Code(rank, b, h, s, dd);
  return x;
}

TEST(UlyssesAllToAllTest, HeadBlockRLandsOnRankRAndTheRoundTripIsExact) {
  for (int p : {2, 4}) {
    std::vector<absl::Status> st = RunGang(p, [p](int rank, Collectives& group) {
      const int64_t sl = 3;
      for (int64_t batch : {1, 2}) {
        for (int64_t heads : {4, 8}) {
          for (int64_t dim : {16, 32}) {
            const at::Tensor x = Coded(rank, batch, heads, sl, dim);
            const at::Tensor y = UlyssesSeqToHeads(x, &group, at::kFloat);
            const int64_t hl = heads / p;
            EXPECT_EQ(y.sizes(), (std::vector<int64_t>{batch, hl, p * sl, dim}));
            auto a = y.accessor<float, 4>();
            int64_t wrong = 0;
            for (int64_t b = 0; b < batch; ++b)
              for (int64_t h = 0; h < hl; ++h)
                for (int64_t j = 0; j < p; ++j)  // sequence chunk j came from rank j
                  for (int64_t s = 0; s < sl; ++s)
                    for (int64_t dd = 0; dd < dim; ++dd) {
                      wrong += a[b][h][j * sl + s][dd] != Code(j, b, rank * hl + h, s, dd);
                    }
            EXPECT_EQ(wrong, 0) << "P " << p << " rank " << rank << " batch " << batch
                                << " heads " << heads << " dim " << dim;
            EXPECT_TRUE(at::equal(UlyssesHeadsToSeq(y, &group, at::kFloat), x));
            // The adjoint: d Σ y² / dx = 2x exactly (the backward all-to-all moves it home).
            at::Tensor xg = x.clone().requires_grad_(true);
            at::Tensor yg = UlyssesSeqToHeads(xg, &group, at::kFloat);
            (yg * yg).sum().backward();
            EXPECT_TRUE(at::equal(xg.grad(), 2 * x));
          }
        }
      }
      return absl::OkStatus();
    });
    ASSERT_TRUE(FirstFailure(st).ok()) << "P " << p << ": " << FirstFailure(st);
  }
}

// The reference: causal attention over the full sequence, written out (no Loom code). Query
// head h uses KV head h / (H / Hkv). allowed[i][j]: token j visible to token i.
at::Tensor ReferenceAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& allowed) {
  const int64_t rep = q.size(1) / k.size(1);
  at::Tensor kf = k.repeat_interleave(rep, 1), vf = v.repeat_interleave(rep, 1);
  at::Tensor scores = at::matmul(q, kf.transpose(-1, -2)) / std::sqrt(double(q.size(-1)));
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  return at::matmul(at::softmax(scores, -1), vf);
}

// Block-diagonal causal mask of documents with the given lengths.
at::Tensor DocumentsCausal(const std::vector<int64_t>& lengths) {
  int64_t s = 0;
  for (int64_t l : lengths) s += l;
  at::Tensor allowed = at::zeros({s, s}, at::kBool);
  int64_t start = 0;
  for (int64_t l : lengths) {
    allowed.narrow(0, start, l).narrow(1, start, l).copy_(at::ones({l, l}, at::kBool).tril());
    start += l;
  }
  return allowed;
}

struct Case {
  int p;
  int64_t batch, heads, kv_heads, dim;
  std::vector<int64_t> documents;  // lengths; their sum is S
};

bool Close(const at::Tensor& a, const at::Tensor& b) {
  return at::le(at::abs(a - b), 1e-6 + 1e-5 * at::abs(b)).all().item<bool>();
}

// inner_block > 0: Ulysses wraps BlockwiseCausalAttention(inner_block) instead of the default
// materialised core (the trainer's `model.attn_implementation: flash_attention_2` with SP).
void ExpectEqualsUnsharded(const Case& c, at::ScalarType wire = at::kFloat,
                           int64_t inner_block = 0) {
  int64_t s = 0;
  std::vector<at::Tensor> pos;
  for (int64_t l : c.documents) {
    s += l;
    pos.push_back(at::arange(l, at::kLong));
  }
  const at::Tensor positions = at::cat(pos);
  torch::manual_seed(7);  // one generator, used here on the main thread only
  const at::Tensor q = at::randn({c.batch, c.heads, s, c.dim});
  const at::Tensor k = at::randn({c.batch, c.kv_heads, s, c.dim});
  const at::Tensor v = at::randn({c.batch, c.kv_heads, s, c.dim});
  const at::Tensor w = at::randn({c.batch, c.heads, s, c.dim});  // d loss / d out
  at::Tensor rq = q.clone().requires_grad_(true), rk = k.clone().requires_grad_(true),
             rv = v.clone().requires_grad_(true);
  const at::Tensor allowed = DocumentsCausal(c.documents);
  at::Tensor ref = ReferenceAttention(rq, rk, rv, allowed);
  (ref * w).sum().backward();
  const int64_t sl = s / c.p;
  std::vector<absl::Status> st = RunGang(c.p, [&](int rank, Collectives& group) {
    auto chunk = [&](const at::Tensor& t) { return t.narrow(2, rank * sl, sl); };
    absl::StatusOr<std::unique_ptr<UlyssesAttention>> core =
        UlyssesAttention::Create(
            &group, {c.heads, c.kv_heads, wire},
            inner_block > 0 ? std::make_unique<BlockwiseCausalAttention>(inner_block) : nullptr);
    if (!core.ok()) return core.status();
    (*core)->SetLocalPositions(positions.narrow(0, rank * sl, sl));
    EXPECT_TRUE(at::equal((*core)->global_positions(), positions));
    at::Tensor lq = chunk(q).clone().requires_grad_(true);
    at::Tensor lk = chunk(k).clone().requires_grad_(true);
    at::Tensor lv = chunk(v).clone().requires_grad_(true);
    at::Tensor out = (*core)->Forward(lq, lk, lv, AttentionMask(), at::kFloat);
    (out * chunk(w)).sum().backward();
    if (wire == at::kFloat) {
      EXPECT_TRUE(Close(out, chunk(ref))) << "rank " << rank << " max diff "
                                          << (out - chunk(ref)).abs().max().item<float>();
      EXPECT_TRUE(Close(lq.grad(), chunk(rq.grad()))) << "rank " << rank;
      EXPECT_TRUE(Close(lk.grad(), chunk(rk.grad()))) << "rank " << rank;
      EXPECT_TRUE(Close(lv.grad(), chunk(rv.grad()))) << "rank " << rank;
    } else {  // bf16 wire: inputs and output rounded to 8 mantissa bits
      EXPECT_LT((out - chunk(ref)).abs().max().item<float>(), 3e-2) << "rank " << rank;
      EXPECT_FALSE(at::equal(out, chunk(ref)));
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(FirstFailure(st).ok()) << FirstFailure(st);
}

TEST(UlyssesAttentionTest, MhaEqualsUnshardedForTwoAndFourRanks) {
  ExpectEqualsUnsharded({2, 1, 8, 8, 16, {32}});
  ExpectEqualsUnsharded({2, 2, 4, 4, 32, {16}});
  ExpectEqualsUnsharded({4, 2, 8, 8, 16, {32}});
}

TEST(UlyssesAttentionTest, GqaWithKvHeadsDivisibleByP) {
  ExpectEqualsUnsharded({2, 1, 8, 4, 16, {32}});
  ExpectEqualsUnsharded({4, 2, 8, 4, 16, {16}});
}

TEST(UlyssesAttentionTest, FewerKvHeadsThanRanksReplicatesThem) {
  ExpectEqualsUnsharded({4, 1, 8, 2, 16, {32}});  // f = 2: ranks 0,1 KV head 0; 2,3 KV head 1
  ExpectEqualsUnsharded({4, 2, 4, 1, 16, {16}});  // MQA: every rank a replica of the one head
}

TEST(UlyssesAttentionTest, PackedDocumentsDoNotAttendAcrossTheBoundary) {
  // 80 + 48 tokens, P = 2: rank 0 holds tokens 0..63 (document 1), rank 1 tokens 64..127, whose
  // first 16 belong to document 1 and the rest to document 2.
  ExpectEqualsUnsharded({2, 1, 4, 2, 16, {80, 48}});
  // Changing document 1 leaves document 2's outputs (rank 1, local tokens >= 16) bit-equal.
  const int64_t s = 128, sl = 64;
  const at::Tensor positions = at::cat({at::arange(80, at::kLong), at::arange(48, at::kLong)});
  torch::manual_seed(11);
  const at::Tensor q = at::randn({1, 4, s, 16}), k = at::randn({1, 2, s, 16}),
                   v = at::randn({1, 2, s, 16});
  at::Tensor k2 = k.clone(), v2 = v.clone();
  k2.narrow(2, 0, 80).mul_(3).add_(1);
  v2.narrow(2, 0, 80).mul_(-2);
  std::vector<absl::Status> st = RunGang(2, [&](int rank, Collectives& group) {
    absl::StatusOr<std::unique_ptr<UlyssesAttention>> core =
        UlyssesAttention::Create(&group, {4, 2, at::kFloat}, nullptr);
    if (!core.ok()) return core.status();
    (*core)->SetLocalPositions(positions.narrow(0, rank * sl, sl));
    auto chunk = [&](const at::Tensor& t) { return t.narrow(2, rank * sl, sl).contiguous(); };
    at::Tensor a = (*core)->Forward(chunk(q), chunk(k), chunk(v), AttentionMask(), at::kFloat);
    at::Tensor b = (*core)->Forward(chunk(q), chunk(k2), chunk(v2), AttentionMask(), at::kFloat);
    if (rank == 1) {
      EXPECT_TRUE(at::equal(a.narrow(2, 16, 48), b.narrow(2, 16, 48)));
      EXPECT_FALSE(at::equal(a.narrow(2, 0, 16), b.narrow(2, 0, 16)));
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(FirstFailure(st).ok()) << FirstFailure(st);
}

// The blockwise (FlashAttention-2) core inside Ulysses: same outputs and input gradients as the
// unsharded reference, with a block (24) that divides neither S nor the chunk, GQA, replicated KV
// heads and packed documents (the document ids Ulysses derives from the gathered positions).
TEST(UlyssesAttentionTest, BlockwiseInnerCoreEqualsUnsharded) {
  ExpectEqualsUnsharded({2, 1, 8, 8, 16, {32}}, at::kFloat, 24);
  ExpectEqualsUnsharded({2, 2, 8, 4, 16, {32}}, at::kFloat, 24);
  ExpectEqualsUnsharded({4, 1, 8, 2, 16, {32}}, at::kFloat, 24);
  ExpectEqualsUnsharded({2, 1, 4, 2, 16, {80, 48}}, at::kFloat, 24);
}

TEST(UlyssesAttentionTest, Bf16OnTheWireIsCloseButNotExact) {
  ExpectEqualsUnsharded({2, 1, 4, 4, 16, {32}}, at::kBFloat16);
}

TEST(UlyssesAttentionTest, PackedCausalMaskStartsADocumentWherePositionsDoNotIncrease) {
  const at::Tensor m = PackedCausalMask(at::tensor({0, 1, 2, 0, 1}, at::kLong));
  EXPECT_TRUE(at::equal(m.logical_not(), DocumentsCausal({3, 2})));
  EXPECT_TRUE(at::equal(PackedCausalMask(at::arange(6, at::kLong)),
                        at::ones({6, 6}, at::kBool).triu(1)));
}

TEST(UlyssesAttentionTest, BadHeadCountsNameTheField) {
  absl::Status s = CheckUlyssesHeads(6, 6, 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("num_attention_heads: 6"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("sequence_parallel_size 4"), absl::string_view::npos) << s;
  s = CheckUlyssesHeads(12, 3, 2);  // 3 % 2 != 0 and 2 % 3 != 0
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("num_key_value_heads: 3"), absl::string_view::npos) << s;
  EXPECT_TRUE(CheckUlyssesHeads(8, 2, 4).ok());
  EXPECT_TRUE(CheckUlyssesHeads(8, 4, 2).ok());
  EXPECT_EQ(CheckUlyssesHeads(8, 8, 0).code(), absl::StatusCode::kInvalidArgument);
  std::unique_ptr<Collectives> local = CreateLocalCollectives();
  EXPECT_EQ(UlyssesAttention::Create(local.get(), {8, 8, at::kHalf}, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::engine
