// LlamaModel over ZeroProvider on one process (local collectives): RoPE against the rotation
// formula, the causal mask, the custom autograd ops against plain LibTorch autograd on the
// gathered weights (forward and every parameter gradient) for stages 0-3, tied/untied heads,
// gather accounting, prefetch traces, dynamic models and the buffer pool.
// (Ported from worker/engine/zero_llama_test.cc when zero_llama was split, issue 12.)
#include "worker/engine/zero/zero_provider.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/functional/embedding.h>
#include <torch/nn/functional/loss.h>

#include <cmath>
#include <map>
#include <tuple>

#include "gtest/gtest.h"
#include "worker/engine/model/llama_model.h"

namespace loom::engine {
namespace {

// A LlamaModel and the ZeroProvider it runs on, with the provider's calls forwarded.
struct Model {
  std::unique_ptr<ZeroProvider> zero;
  std::unique_ptr<LlamaModel> llama;
  at::Tensor Forward(const at::Tensor& ids, const std::vector<int64_t>* order = nullptr) {
    return llama->Forward(ids, order);
  }
  std::vector<ZeroParam>& params() { return zero->params(); }
  MemoryTracker& memory() { return zero->memory(); }
  void BeginMicroStep(bool last) { zero->BeginMicroStep(last); }
  void FinishMicroStep() { zero->FinishMicroStep(); }
  void ClearGrads() { zero->ClearGrads(); }
  at::Tensor GatherFull(size_t i) { return zero->GatherFull(i); }
  int64_t prefetch_hits() const { return zero->prefetch_hits(); }
  int64_t trace_invalidations() const { return zero->trace_invalidations(); }
  int64_t partition_bytes() const { return zero->partition_bytes(); }
};

absl::StatusOr<std::unique_ptr<Model>> MakeModel(const spec::LlamaConfig& c, Collectives* coll,
                                                 uint64_t seed, const HfWeights* init = nullptr,
                                                 const ZeroOptions& o = {}) {
  auto m = std::make_unique<Model>();
  absl::StatusOr<std::unique_ptr<ZeroProvider>> z =
      ZeroProvider::Create(spec::LlamaParamSpecs(c), coll, {seed, c.initializer_range, init}, o);
  if (!z.ok()) return z.status();
  m->zero = *std::move(z);
  absl::StatusOr<std::unique_ptr<LlamaModel>> l = LlamaModel::Create(c, m->zero.get());
  if (!l.ok()) return l.status();
  m->llama = *std::move(l);
  return m;
}

spec::LlamaConfig TinyConfig(bool tied) {
  spec::LlamaConfig c;
  c.vocab_size = 256;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = tied;
  c.initializer_range = 0.2;  // larger than 0.02 so the attention is far from uniform
  return c;
}

TEST(RopeTest, MatchesPairwiseRotationFormula) {
  const int64_t s = 7, d = 8;
  const double theta = 500.0;
  auto [cos, sin] = RopeTables(s, d, theta);
  at::Tensor x = at::randn({1, 2, s, d}, at::kFloat);
  at::Tensor y = ApplyRope(x, cos, sin);
  auto xa = x.accessor<float, 4>();
  auto ya = y.accessor<float, 4>();
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t m = 0; m < s; ++m) {
      for (int64_t i = 0; i < d / 2; ++i) {
        const double freq = std::pow(theta, -2.0 * i / d);
        const double c = std::cos(m * freq), sn = std::sin(m * freq);
        const double a = xa[0][h][m][i], b = xa[0][h][m][i + d / 2];
        EXPECT_NEAR(ya[0][h][m][i], a * c - b * sn, 1e-5);
        EXPECT_NEAR(ya[0][h][m][i + d / 2], b * c + a * sn, 1e-5);
      }
    }
  }
}

// Independent reference: plain LibTorch autograd over full weights (HF LlamaForCausalLM).
at::Tensor ReferenceForward(const spec::LlamaConfig& c, const std::vector<at::Tensor>& w,
                            const at::Tensor& ids) {
  const int64_t b = ids.size(0), s = ids.size(1), d = c.head_dim();
  const int64_t hq = c.num_attention_heads, hkv = c.num_key_value_heads;
  auto rms = [&](const at::Tensor& x, const at::Tensor& g) {
    return g * (x * at::rsqrt(x.pow(2).mean(-1, true) + c.rms_norm_eps));
  };
  auto rope = [&](const at::Tensor& x) {
    at::Tensor inv = 1.0 / at::pow(c.rope_theta, at::arange(0, d, 2, at::kFloat) / d);
    at::Tensor f = at::outer(at::arange(s, at::kFloat), inv);
    at::Tensor emb = at::cat({f, f}, -1);
    at::Tensor x1 = x.narrow(-1, 0, d / 2), x2 = x.narrow(-1, d / 2, d / 2);
    return x * emb.cos() + at::cat({-x2, x1}, -1) * emb.sin();
  };
  at::Tensor h = torch::nn::functional::embedding(ids, w[0]);
  size_t i = 1;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l, i += 9) {
    at::Tensor x = rms(h, w[i]);
    at::Tensor q = at::linear(x, w[i + 1]).view({b, s, hq, d}).transpose(1, 2);
    at::Tensor k = at::linear(x, w[i + 2]).view({b, s, hkv, d}).transpose(1, 2);
    at::Tensor v = at::linear(x, w[i + 3]).view({b, s, hkv, d}).transpose(1, 2);
    q = rope(q);
    k = rope(k).repeat_interleave(hq / hkv, 1);
    v = v.repeat_interleave(hq / hkv, 1);
    at::Tensor mask = at::ones({s, s}, at::kBool).tril().logical_not();
    at::Tensor att = (at::matmul(q, k.transpose(2, 3)) / std::sqrt(static_cast<double>(d)))
                         .masked_fill(mask, -INFINITY)
                         .softmax(-1);
    h = h + at::linear(at::matmul(att, v).transpose(1, 2).reshape({b, s, hq * d}), w[i + 4]);
    x = rms(h, w[i + 5]);
    h = h + at::linear(at::silu(at::linear(x, w[i + 6])) * at::linear(x, w[i + 7]), w[i + 8]);
  }
  h = rms(h, w[i]);
  return at::linear(h, c.tie_word_embeddings ? w[0] : w[i + 1]);
}

// (tied head, ZeRO stage) on one rank: every stage computes the same forward and gradients.
class ZeroProviderLlamaTest : public ::testing::TestWithParam<std::tuple<bool, int>> {};

TEST_P(ZeroProviderLlamaTest, ForwardAndGradientsMatchPlainAutograd) {
  const auto [tied, stage] = GetParam();
  const spec::LlamaConfig c = TinyConfig(tied);
  std::unique_ptr<Collectives> coll = CreateLocalCollectives();
  ZeroOptions opts;
  opts.stage = stage;
  opts.param_persistence_threshold = 0;
  opts.reduce_bucket_size = 3000;  // several buckets
  absl::StatusOr<std::unique_ptr<Model>> m = MakeModel(c, coll.get(), 11, nullptr, opts);
  ASSERT_TRUE(m.ok()) << m.status();
  Model& model = **m;
  ASSERT_EQ(model.params().size(), spec::LlamaParamSpecs(c).size());
  EXPECT_EQ(model.params().back().spec.name, tied ? "model.norm.weight" : "lm_head.weight");

  std::vector<at::Tensor> ref_w;
  for (size_t i = 0; i < model.params().size(); ++i) {
    ref_w.push_back(model.GatherFull(i).set_requires_grad(true));
  }
  EXPECT_EQ(model.memory().current(MemoryKind::kBuffers), 0);

  at::Tensor ids = at::randint(0, 256, {3, 12}, at::kLong);
  at::Tensor targets = at::randint(0, 256, {3, 12}, at::kLong);
  model.BeginMicroStep(/*last=*/true);
  at::Tensor logits = model.Forward(ids);
  ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{3, 12, 256}));
  if (stage == 3) {
    EXPECT_EQ(model.memory().current(MemoryKind::kBuffers), 0)
        << "gathered weights must be freed after forward (no trace recorded yet)";
    EXPECT_GT(model.memory().peak(MemoryKind::kBuffers), 0);
  }
  at::Tensor ref_logits = ReferenceForward(c, ref_w, ids);
  EXPECT_TRUE(at::allclose(logits, ref_logits, 1e-5, 2e-5))
      << (logits - ref_logits).abs().max().item<float>();

  auto ce = [&](const at::Tensor& l) {
    return torch::nn::functional::cross_entropy(l.reshape({-1, 256}), targets.reshape({-1}));
  };
  ce(logits).backward();
  model.FinishMicroStep();
  ce(ref_logits).backward();
  EXPECT_EQ(model.memory().current(MemoryKind::kBuffers), 0)
      << "gathered weights and buckets must be freed after backward";
  for (size_t i = 0; i < ref_w.size(); ++i) {
    const ZeroParam& p = model.params()[i];
    ASSERT_TRUE(p.grad.defined()) << p.spec.name;
    at::Tensor g = p.grad.narrow(0, 0, p.numel).view(p.spec.shape);
    at::Tensor rg = ref_w[i].grad();
    const double scale = rg.abs().max().item<double>();
    EXPECT_TRUE(at::allclose(g, rg, 1e-4, 1e-6 + 1e-5 * scale))
        << p.spec.name << " max diff " << (g - rg).abs().max().item<float>() << " scale "
        << scale;
  }
}

INSTANTIATE_TEST_SUITE_P(TiedUntiedAndStages, ZeroProviderLlamaTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(0, 1, 2, 3)));

// bf16: forward close to the fp32 model (bf16 noise), gradients land in fp32 partitions.
TEST(ZeroLlamaBf16Test, Bf16ForwardIsCloseToFp32) {
  const spec::LlamaConfig c = TinyConfig(false);
  std::unique_ptr<Collectives> coll = CreateLocalCollectives();
  ZeroOptions opts;
  std::unique_ptr<Model> f32 = *MakeModel(c, coll.get(), 4, nullptr, opts);
  opts.param_dtype = at::kBFloat16;
  std::unique_ptr<Model> b16 = *MakeModel(c, coll.get(), 4, nullptr, opts);
  EXPECT_EQ(b16->params()[2].shard.scalar_type(), at::kBFloat16);
  EXPECT_EQ(b16->params()[2].master.scalar_type(), at::kFloat);
  at::manual_seed(0);
  at::Tensor ids = at::randint(0, 256, {2, 8}, at::kLong);
  at::Tensor a = f32->Forward(ids);
  b16->BeginMicroStep(true);
  at::Tensor b = b16->Forward(ids);
  EXPECT_EQ(b.scalar_type(), at::kBFloat16);
  // bf16 keeps 8 mantissa bits: a few percent of the logits' range after 2 layers.
  const float range = a.abs().max().item<float>();
  EXPECT_LT((a - b.to(at::kFloat)).abs().max().item<float>(), 0.05 * range);
  b.to(at::kFloat).sum().backward();
  b16->FinishMicroStep();
  EXPECT_EQ(b16->params()[2].grad.scalar_type(), at::kFloat);
  EXPECT_GT(b16->params()[2].grad.abs().sum().item<float>(), 0);
}

// Stage-3 prefetch trace on one process: the first micro-step records, later ones prefetch
// (hits), a changed layer order invalidates the trace, and gradients are bit-identical to a
// model without prefetching. Live gathered params stay within max_live_parameters (+ the one
// parameter fetched on demand beyond it), reduction buffers aside.
TEST(ZeroLlamaPrefetchTest, TraceReplayInvalidationAndLiveBound) {
  const spec::LlamaConfig c = TinyConfig(false);  // hidden 32: largest param 256*32 = 8192
  std::unique_ptr<Collectives> coll = CreateLocalCollectives();
  ZeroOptions on;
  on.stage = 3;
  on.overlap_comm = false;
  on.reduce_bucket_size = 1;  // one parameter per reduction: buffers 2 * 4 * n
  on.param_persistence_threshold = 0;
  on.prefetch_bucket_size = 3000;
  on.max_live_parameters = 4000;
  on.max_reuse_distance = 0;
  ZeroOptions off = on;
  off.prefetch_bucket_size = 0;
  std::unique_ptr<Model> a = *MakeModel(c, coll.get(), 8, nullptr, on);
  std::unique_ptr<Model> b = *MakeModel(c, coll.get(), 8, nullptr, off);
  at::Tensor ids = at::randint(0, 256, {2, 10}, at::kLong);
  const std::vector<int64_t> skip = {1};
  const int64_t largest = 256 * 32;
  int64_t hits_after_invalidation = 0;
  for (int micro = 0; micro < 5; ++micro) {
    const std::vector<int64_t>* order = micro == 2 ? &skip : nullptr;
    for (Model* m : {a.get(), b.get()}) {
      m->memory().ResetPeaks();
      m->BeginMicroStep(true);
      m->Forward(ids, order).sum().backward();
      m->FinishMicroStep();
      EXPECT_EQ(m->memory().current(MemoryKind::kBuffers), 0);
    }
    for (size_t i = 0; i < a->params().size(); ++i) {
      const at::Tensor& ga = a->params()[i].grad;
      const at::Tensor& gb = b->params()[i].grad;
      ASSERT_EQ(ga.defined(), gb.defined()) << i;
      if (ga.defined()) {
        EXPECT_TRUE(at::equal(ga, gb)) << "micro " << micro << " param " << i;
      }
    }
    EXPECT_LE(a->memory().peak(MemoryKind::kBuffers),
              4 * (on.max_live_parameters + largest) + 2 * 4 * largest)
        << "micro " << micro;
    a->ClearGrads();
    b->ClearGrads();
    if (micro == 0) {
      EXPECT_EQ(a->prefetch_hits(), 0);
    }
    if (micro == 1) {
      EXPECT_GT(a->prefetch_hits(), 0);
      EXPECT_EQ(a->trace_invalidations(), 0);
    }
    if (micro == 2) {
      EXPECT_EQ(a->trace_invalidations(), 1);  // skipped layer 0
    }
    if (micro == 3) hits_after_invalidation = a->prefetch_hits();  // micro 3 records anew
  }
  EXPECT_EQ(b->prefetch_hits(), 0);
  // micro 4 replays the trace recorded at micro 3.
  EXPECT_EQ(a->trace_invalidations(), 1);
  EXPECT_GT(a->prefetch_hits(), hits_after_invalidation);

  // Without limits (DeepSpeed defaults) the reuse distance keeps far more gathered.
  ZeroOptions defaults;
  defaults.param_persistence_threshold = 0;
  defaults.overlap_comm = false;
  defaults.reduce_bucket_size = 1;
  std::unique_ptr<Model> d = *MakeModel(c, coll.get(), 8, nullptr, defaults);
  for (int micro = 0; micro < 2; ++micro) {
    d->memory().ResetPeaks();
    d->BeginMicroStep(true);
    d->Forward(ids).sum().backward();
    d->FinishMicroStep();
  }
  EXPECT_GT(d->memory().peak(MemoryKind::kBuffers),
            4 * (on.max_live_parameters + largest) + 2 * 4 * largest);
}

// A dynamic model under gradient accumulation: layer 1 runs in micro-step 0 but not in the
// last micro-step. Stages 0/1 (which reduce once, in the last micro-step) must still reduce
// layer 1's accumulated gradients; every stage equals stage 2 (which reduces every micro-step).
TEST(ZeroLlamaDynamicTest, ParamsUnusedInTheLastMicroStepAreStillReduced) {
  const spec::LlamaConfig c = TinyConfig(false);
  std::unique_ptr<Collectives> coll = CreateLocalCollectives();
  at::manual_seed(1);
  at::Tensor ids0 = at::randint(0, 256, {2, 8}, at::kLong);
  at::Tensor ids1 = at::randint(0, 256, {2, 8}, at::kLong);
  const std::vector<int64_t> only_first = {0};
  std::vector<std::vector<at::Tensor>> grads;
  for (int stage : {2, 0, 1, 3}) {
    ZeroOptions opts;
    opts.stage = stage;
    opts.reduce_bucket_size = 2000;
    std::unique_ptr<Model> m = *MakeModel(c, coll.get(), 9, nullptr, opts);
    m->BeginMicroStep(false);
    m->Forward(ids0).sum().backward();
    m->FinishMicroStep();
    m->BeginMicroStep(true);
    m->Forward(ids1, &only_first).sum().backward();
    m->FinishMicroStep();
    std::vector<at::Tensor> g;
    for (const ZeroParam& p : m->params()) {
      g.push_back(p.grad.defined() ? p.grad.clone() : at::Tensor());
    }
    grads.push_back(g);
  }
  const size_t layer1_q = 11;  // model.layers.1.self_attn.q_proj.weight
  for (size_t s = 1; s < grads.size(); ++s) {
    for (size_t i = 0; i < grads[0].size(); ++i) {
      ASSERT_TRUE(grads[s][i].defined()) << "stage order index " << s << " param " << i;
      EXPECT_TRUE(at::allclose(grads[s][i], grads[0][i], 1e-5, 1e-7))
          << "stage order index " << s << " param " << i;
    }
    EXPECT_GT(grads[s][layer1_q].abs().sum().item<float>(), 0);
  }
}

TEST(ZeroLlamaCausalTest, LaterTokensDoNotChangeEarlierLogits) {
  const spec::LlamaConfig c = TinyConfig(false);
  std::unique_ptr<Collectives> coll = CreateLocalCollectives();
  std::unique_ptr<Model> model = *MakeModel(c, coll.get(), 3);
  at::NoGradGuard no_grad;
  at::Tensor ids = at::randint(0, 256, {1, 16}, at::kLong);
  at::Tensor changed = ids.clone();
  changed[0][10] = (ids[0][10].item<int64_t>() + 1) % 256;
  at::Tensor a = model->Forward(ids), b = model->Forward(changed);
  EXPECT_TRUE(at::allclose(a.narrow(1, 0, 10), b.narrow(1, 0, 10), 0, 1e-6));
  for (int64_t pos = 10; pos < 16; ++pos) {
    EXPECT_GT((a[0][pos] - b[0][pos]).abs().max().item<float>(), 1e-4) << pos;
  }
}

TEST(ZeroLlamaInitTest, DeterministicAndNormWeightsAreOnes) {
  const spec::LlamaConfig c = TinyConfig(true);
  std::unique_ptr<Collectives> coll = CreateLocalCollectives();
  std::unique_ptr<Model> a = *MakeModel(c, coll.get(), 5);
  std::unique_ptr<Model> b = *MakeModel(c, coll.get(), 5);
  std::unique_ptr<Model> other = *MakeModel(c, coll.get(), 6);
  EXPECT_TRUE(at::equal(a->params()[2].master, b->params()[2].master));
  EXPECT_FALSE(at::equal(a->params()[2].master, other->params()[2].master));
  EXPECT_TRUE(at::equal(a->params()[1].master, at::ones({c.hidden_size})));
  const double std = a->params()[0].master.std().item<double>();
  EXPECT_NEAR(std, c.initializer_range, 0.01);
  EXPECT_EQ(a->partition_bytes(), spec::LlamaParamCount(c) * 4);  // N = 1: no padding
}

// The step's large temporaries come from the model's buffer pool: once the step's pattern is
// set, every later micro-step reuses them (no new allocation, the cached bytes stay the same), nothing is
// left in use between micro-steps, and gradients with the pool are those of a fresh model.
// Stage 2 runs with a bf16 wire: with fp32 on one rank its gradients need no buffer at all
// (OneRankIdentityReductionTest).
TEST(ZeroLlamaBufferPoolTest, SteadyStateReusesBuffersAndGradientsAreUnchanged) {
  const spec::LlamaConfig c = TinyConfig(false);
  std::unique_ptr<Collectives> coll = CreateLocalCollectives();
  for (int stage : {2, 3}) {
    ZeroOptions o;
    o.stage = stage;
    o.param_persistence_threshold = 0;
    o.reduce_bucket_size = 3000;
    if (stage == 2) o.communication_dtype = at::kBFloat16;
    std::unique_ptr<Model> m = *MakeModel(c, coll.get(), 5, nullptr, o);
    at::Tensor ids = at::randint(0, 256, {2, 9}, at::kLong);
    std::vector<int64_t> cached;
    std::vector<at::Tensor> first_grads;
    for (int micro = 0; micro < 4; ++micro) {
      m->ClearGrads();
      m->BeginMicroStep(true);
      m->Forward(ids).sum().backward();
      m->FinishMicroStep();
      EXPECT_EQ(m->memory().current(MemoryKind::kBuffers), 0) << "stage " << stage;
      cached.push_back(m->memory().current(MemoryKind::kCached));
      for (size_t i = 0; i < m->params().size(); ++i) {
        if (micro == 0) {
          first_grads.push_back(m->params()[i].grad.clone());
        } else {  // same weights, same batch: pooled buffers must not change the result
          EXPECT_TRUE(at::equal(m->params()[i].grad, first_grads[i])) << stage << " " << i;
        }
      }
    }
    EXPECT_GT(cached[0], 0) << "stage " << stage;
    // Stage 3 records its prefetch trace in micro-step 0 and prefetches from micro-step 1 on
    // (more gathers in flight at once): steady from there.
    for (int micro = 2; micro < 4; ++micro) {
      EXPECT_EQ(cached[micro], cached[1]) << "stage " << stage << " micro " << micro;
    }
    if (stage == 2) {
      EXPECT_EQ(cached[1], cached[0]);
    }
  }
}

// Counts the grad-ready events and keeps a copy of each gradient partition at its event.
class ReadyRecorder : public GradReadyListener {
 public:
  explicit ReadyRecorder(ZeroProvider** zero) : zero_(zero) {}
  void OnPartitionGradReady(ParamId i) override {
    ++events[i];
    at_event[i] = (*zero_)->params()[i].grad.clone();
  }
  std::map<ParamId, int> events;
  std::map<ParamId, at::Tensor> at_event;

 private:
  ZeroProvider** zero_;
};

// One rank, fp32 wire: stages 1-3 run no gradient collective (the reduction is the identity;
// stages 2/3 write the first contribution straight into the gradient partition), and the
// gradients equal stage 0's bit for bit (stage 0 accumulates the full gradient locally and its
// one-rank all-reduce changes nothing): a tied model (the embedding gets two contributions),
// two micro-steps, a divide factor of 2 (stage 0 divides its all-reduce buffer, stages 2/3
// each contribution, stage 1 its accumulator: the same one fp32 division per value here
// because 2 is a power of two), and each grad-ready event once, with the final gradient.
TEST(OneRankIdentityReductionTest, NoGradientCollectiveAndStageZeroGradientsBitForBit) {
  const spec::LlamaConfig c = TinyConfig(/*tied=*/true);
  at::manual_seed(3);
  const at::Tensor ids0 = at::randint(0, 256, {2, 9}, at::kLong);
  const at::Tensor ids1 = at::randint(0, 256, {2, 9}, at::kLong);
  auto run = [&](int stage, std::vector<at::Tensor>* grads, int64_t* collectives,
                 ReadyRecorder* rec, ZeroProvider** raw) {
    std::unique_ptr<Collectives> coll = CreateLocalCollectives();
    ZeroOptions o;
    o.stage = stage;
    o.param_persistence_threshold = 1 << 30;  // stage 3: gathered once, before the count
    o.reduce_bucket_size = 3000;
    o.gradient_divide_factor = 2;
    o.grad_ready_listener = rec;
    std::unique_ptr<Model> m = *MakeModel(c, coll.get(), 7, nullptr, o);
    if (raw != nullptr) *raw = m->zero.get();
    m->BeginMicroStep(false);
    m->Forward(ids0).sum().backward();
    m->FinishMicroStep();
    const int64_t before = coll->collective_count();
    m->BeginMicroStep(true);
    at::Tensor logits = m->Forward(ids1);
    const int64_t after_forward = coll->collective_count();
    (logits * logits).mean().backward();
    m->FinishMicroStep();
    *collectives = coll->collective_count() - after_forward;
    EXPECT_EQ(after_forward, before) << "stage " << stage << ": persistent params gathered";
    for (const ZeroParam& p : m->params()) grads->push_back(p.grad.clone());
  };
  std::vector<at::Tensor> ref;
  int64_t ref_collectives = 0;
  run(0, &ref, &ref_collectives, nullptr, nullptr);
  for (int stage : {1, 2, 3}) {
    ZeroProvider* raw = nullptr;
    ReadyRecorder rec(&raw);
    std::vector<at::Tensor> got;
    int64_t collectives = -1;
    run(stage, &got, &collectives, &rec, &raw);
    EXPECT_EQ(collectives, 0) << "stage " << stage << ": a gradient collective ran on one rank";
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_TRUE(at::equal(got[i], ref[i])) << "stage " << stage << " param " << i << " max diff "
                                             << (got[i] - ref[i]).abs().max().item<float>();
      EXPECT_EQ(rec.events[i], 1) << "stage " << stage << " param " << i;
      ASSERT_EQ(rec.at_event.count(i), 1u);
      EXPECT_TRUE(at::equal(rec.at_event[i], got[i]))
          << "stage " << stage << " param " << i << " changed after its event";
    }
  }
}

// Two parameters, a [2, 3] weight and a [4] norm, for the one-rank gradient tests below.
const std::vector<spec::ParamSpec>& TwoParams() {
  static const auto* specs = new std::vector<spec::ParamSpec>{
      {"a", {2, 3}, spec::ParamSpec::Kind::kLinear}, {"b", {4}, spec::ParamSpec::Kind::kNorm}};
  return *specs;
}

// One micro-step whose backward hands parameter i the constant gradient v, per (i, v).
void MicroStep(ZeroProvider& z, bool last, const std::vector<std::pair<size_t, float>>& grads) {
  z.BeginMicroStep(last);
  for (const auto& [i, v] : grads) z.NoteUse(i);  // the forward's uses
  for (const auto& [i, v] : grads) {
    z.AddGrad(i, at::full(TwoParams()[i].shape, v, at::kFloat));
  }
  z.FinishMicroStep();
}

// One rank: ClearGrads leaves the zeroing to the end of the last micro-step (each gradient's
// first write overwrites its partition): a parameter with no gradient in a step reads zeros
// afterwards, not the previous step's values, and one written only in an earlier micro-step
// keeps that contribution. Values are exact (multiples of 1/2).
TEST(OneRankIdentityReductionTest, UnwrittenGradientsAreZeroAfterTheLastMicroStep) {
  const std::vector<spec::ParamSpec>& specs = TwoParams();
  for (int stage : {1, 2, 3}) {
    std::unique_ptr<Collectives> coll = CreateLocalCollectives();
    ZeroOptions o;
    o.stage = stage;
    std::unique_ptr<ZeroProvider> z = *ZeroProvider::Create(specs, coll.get(), {1, 0.02}, o);
    auto micro = [&](bool last, const std::vector<std::pair<size_t, float>>& grads) {
      MicroStep(*z, last, grads);
    };
    auto expect = [&](size_t i, float v, const std::string& what) {
      const at::Tensor& g = z->params()[i].grad;
      ASSERT_TRUE(g.defined()) << what;
      EXPECT_TRUE(at::equal(g, at::full({specs[i].numel()}, v, at::kFloat)))
          << "stage " << stage << " " << what << ": " << g;
    };
    micro(true, {{0, 1.5f}, {1, 2.5f}});
    expect(0, 1.5f, "step 1 a");
    expect(1, 2.5f, "step 1 b");
    z->ClearGrads();
    micro(true, {{0, -0.5f}});
    expect(0, -0.5f, "step 2 a");
    expect(1, 0.0f, "step 2 b (no gradient)");
    z->ClearGrads();
    micro(false, {{1, 1.0f}});
    micro(true, {{0, 2.0f}, {0, 0.5f}});
    expect(0, 2.5f, "step 3 a (two contributions)");
    expect(1, 1.0f, "step 3 b (first micro-step only)");
  }
}

// double_buffer_grads (one rank, fp32 wire): each ClearGrads switches between two gradient
// buffers, so the tensors holding step s's gradients keep those values through step s + 1's
// backward (ZenFlow's host thread reads them then) and are reused at step s + 2; the current
// gradients follow the same zeroing rule as with one buffer. Values are exact.
TEST(OneRankIdentityReductionTest, DoubleBufferedGradientsKeepTheLastStepThroughTheNext) {
  const std::vector<spec::ParamSpec>& specs = TwoParams();
  for (int stage : {1, 2, 3}) {
    std::unique_ptr<Collectives> coll = CreateLocalCollectives();
    ZeroOptions o;
    o.stage = stage;
    o.double_buffer_grads = true;
    std::unique_ptr<ZeroProvider> z = *ZeroProvider::Create(specs, coll.get(), {1, 0.02}, o);
    EXPECT_EQ(z->gradient_buffers(), 2) << "stage " << stage;
    auto micro = [&](const std::vector<std::pair<size_t, float>>& grads) {
      MicroStep(*z, true, grads);
    };
    auto full = [&](size_t i, float v) { return at::full({specs[i].numel()}, v, at::kFloat); };
    micro({{0, 1.5f}, {1, 2.5f}});
    const at::Tensor a1 = z->params()[0].grad, b1 = z->params()[1].grad;  // views, not copies
    z->ClearGrads();
    micro({{0, -0.5f}});
    EXPECT_TRUE(at::equal(z->params()[0].grad, full(0, -0.5f))) << "stage " << stage;
    EXPECT_TRUE(at::equal(z->params()[1].grad, full(1, 0.0f))) << "stage " << stage;
    EXPECT_TRUE(at::equal(a1, full(0, 1.5f))) << "stage " << stage << ": step 1's a overwritten";
    EXPECT_TRUE(at::equal(b1, full(1, 2.5f))) << "stage " << stage << ": step 1's b overwritten";
    z->ClearGrads();
    micro({{1, 1.0f}});  // step 3 is back in step 1's buffer
    EXPECT_EQ(z->params()[1].grad.data_ptr(), b1.data_ptr()) << "stage " << stage;
    EXPECT_TRUE(at::equal(b1, full(1, 1.0f))) << "stage " << stage;
    EXPECT_TRUE(at::equal(a1, full(0, 0.0f))) << "stage " << stage << ": a had no gradient";
  }
  // Not where the reduction is a real one: a 16-bit wire (or more than one rank).
  std::unique_ptr<Collectives> coll = CreateLocalCollectives();
  ZeroOptions o;
  o.stage = 2;
  o.double_buffer_grads = true;
  o.communication_dtype = at::kBFloat16;
  EXPECT_EQ((*ZeroProvider::Create(specs, coll.get(), {1, 0.02}, o))->gradient_buffers(), 1);
  o.communication_dtype = at::kFloat;
  o.double_buffer_grads = false;
  EXPECT_EQ((*ZeroProvider::Create(specs, coll.get(), {1, 0.02}, o))->gradient_buffers(), 1);
}

}  // namespace
}  // namespace loom::engine
