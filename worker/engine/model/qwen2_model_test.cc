// Qwen2 (Llama + q/k/v projection biases, model_type "qwen2") through LlamaModel on ZeRO
// stages 0-3 on a 2-rank Gloo thread gang: the loss and every gradient (biases included) equal a
// plain LibTorch autograd Qwen2ForCausalLM forward written here, over the same initial weights,
// looked up by Hugging Face name (tied: with a pad_token_id, torch's embedding padding_idx as the
// reference). Also: a Qwen2 model over a Llama parameter table is refused.
#include <ATen/ATen.h>
#include <torch/nn/functional/embedding.h>
#include <torch/nn/functional/loss.h>

#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/engine/collectives.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/testing/thread_gang.h"
#include "worker/engine/testing/tiny_llama.h"
#include "worker/engine/zero/replicated_provider.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {
namespace {

constexpr double kAtol = 1e-6, kRtol = 1e-4;  // fp32 reduction-order tolerance
constexpr uint64_t kSeed = 31;

spec::LlamaConfig TinyQwen2(bool tied) {
  spec::LlamaConfig c = testing::TinyLlamaConfig(tied);
  c.model_type = spec::ModelType::kQwen2;
  c.rope_theta = 1000000.0;  // Qwen2's default
  return c;
}

// Hugging Face Qwen2ForCausalLM in plain LibTorch ops (eager attention, GQA by
// repeat_interleave, half-split RoPE, RMSNorm), weights by name. ids [B,S] -> mean CE loss.
at::Tensor ReferenceLoss(const spec::LlamaConfig& c, std::map<std::string, at::Tensor>& w,
                         const at::Tensor& ids, const at::Tensor& labels) {
  const int64_t b = ids.size(0), s = ids.size(1), hq = c.num_attention_heads;
  const int64_t hkv = c.num_key_value_heads, d = c.hidden_size / hq;
  auto rms = [&](const at::Tensor& x, const at::Tensor& g) {
    return g * (x * at::rsqrt(x.pow(2).mean(-1, true) + c.rms_norm_eps));
  };
  at::Tensor inv = 1.0 / at::pow(c.rope_theta, at::arange(0, d, 2, at::kFloat) / d);
  at::Tensor f = at::outer(at::arange(s, at::kFloat), inv);
  at::Tensor emb = at::cat({f, f}, -1);
  auto rope = [&](const at::Tensor& x) {
    at::Tensor x1 = x.narrow(-1, 0, d / 2), x2 = x.narrow(-1, d / 2, d / 2);
    return x * emb.cos() + at::cat({-x2, x1}, -1) * emb.sin();
  };
  torch::nn::functional::EmbeddingFuncOptions embedding_options;
  if (c.pad_token_id >= 0) embedding_options.padding_idx(c.pad_token_id);
  at::Tensor h = torch::nn::functional::embedding(ids, w.at("model.embed_tokens.weight"),
                                                  embedding_options);
  at::Tensor mask = at::ones({s, s}, at::kBool).tril().logical_not();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    at::Tensor x = rms(h, w.at(p + "input_layernorm.weight"));
    at::Tensor q = at::linear(x, w.at(p + "self_attn.q_proj.weight"),
                              w.at(p + "self_attn.q_proj.bias"));
    at::Tensor k = at::linear(x, w.at(p + "self_attn.k_proj.weight"),
                              w.at(p + "self_attn.k_proj.bias"));
    at::Tensor v = at::linear(x, w.at(p + "self_attn.v_proj.weight"),
                              w.at(p + "self_attn.v_proj.bias"));
    q = rope(q.view({b, s, hq, d}).transpose(1, 2));
    k = rope(k.view({b, s, hkv, d}).transpose(1, 2)).repeat_interleave(hq / hkv, 1);
    v = v.view({b, s, hkv, d}).transpose(1, 2).repeat_interleave(hq / hkv, 1);
    at::Tensor att = (at::matmul(q, k.transpose(2, 3)) / std::sqrt(static_cast<double>(d)))
                         .masked_fill(mask, -INFINITY)
                         .softmax(-1);
    at::Tensor o = at::matmul(att, v).transpose(1, 2).reshape({b, s, hq * d});
    h = h + at::linear(o, w.at(p + "self_attn.o_proj.weight"));  // no o_proj bias in Qwen2
    x = rms(h, w.at(p + "post_attention_layernorm.weight"));
    h = h + at::linear(at::silu(at::linear(x, w.at(p + "mlp.gate_proj.weight"))) *
                           at::linear(x, w.at(p + "mlp.up_proj.weight")),
                       w.at(p + "mlp.down_proj.weight"));
  }
  h = rms(h, w.at("model.norm.weight"));
  at::Tensor logits = at::linear(
      h, w.at(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"));
  return torch::nn::functional::cross_entropy(logits.reshape({-1, c.vocab_size}),
                                              labels.reshape({-1}));
}

at::Tensor PartitionOf(const at::Tensor& full, const ZeroParam& p) {
  at::Tensor out = at::zeros({p.slice.partition_numel}, at::kFloat);
  if (p.slice.valid() > 0) {
    out.narrow(0, 0, p.slice.valid())
        .copy_(full.reshape({-1}).narrow(0, p.slice.begin, p.slice.valid()));
  }
  return out;
}

void ExpectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double worst = ((got - want).abs() - kRtol * want.abs()).max().item<double>();
  EXPECT_LE(worst, kAtol) << what << " max |diff| " << (got - want).abs().max().item<double>();
}

TEST(Qwen2ParamSpecsTest, BiasesFollowTheirWeights) {
  const spec::LlamaConfig c = TinyQwen2(/*tied=*/true);
  const std::vector<spec::ParamSpec> specs = spec::LlamaParamSpecs(c);
  ASSERT_EQ(specs.size(), 1u + 2u * 12u + 1u);
  EXPECT_EQ(specs[2].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(specs[3].name, "model.layers.0.self_attn.q_proj.bias");
  EXPECT_EQ(specs[3].shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(specs[3].kind, spec::ParamSpec::Kind::kBias);
  EXPECT_EQ(specs[5].name, "model.layers.0.self_attn.k_proj.bias");
  EXPECT_EQ(specs[5].shape, (std::vector<int64_t>{8}));
  EXPECT_EQ(specs[7].name, "model.layers.0.self_attn.v_proj.bias");
  EXPECT_EQ(specs[8].name, "model.layers.0.self_attn.o_proj.weight");
  spec::LlamaConfig llama = c;
  llama.model_type = spec::ModelType::kLlama;
  EXPECT_EQ(spec::LlamaParamCount(c), spec::LlamaParamCount(llama) + 2 * (16 + 8 + 8));
}

TEST(Qwen2ModelTest, LlamaParameterTableIsRefusedNamingTheBias) {
  spec::LlamaConfig llama = TinyQwen2(false);
  llama.model_type = spec::ModelType::kLlama;
  auto rep = *ReplicatedProvider::Create(spec::LlamaParamSpecs(llama), {kSeed, 0.2});
  absl::StatusOr<std::unique_ptr<LlamaModel>> m = LlamaModel::Create(TinyQwen2(false), rep.get());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("model.layers.0.self_attn.q_proj.bias"), std::string::npos)
      << m.status();
}

// (tied head, ZeRO stage): two ranks, each with half of the batch; each rank's reduced mean
// gradient partition equals the reference gradient of the whole batch.
class Qwen2ZeroTest : public ::testing::TestWithParam<std::tuple<bool, int>> {};

TEST_P(Qwen2ZeroTest, TwoRankLossAndGradientsMatchPlainAutograd) {
  const auto [tied, stage] = GetParam();
  spec::LlamaConfig c = TinyQwen2(tied);
  at::manual_seed(5);
  at::Tensor ids = at::randint(0, c.vocab_size, {4, 10}, at::kLong);
  at::Tensor labels = at::randint(0, c.vocab_size, {4, 10}, at::kLong);
  if (tied) {
    // pad_token_id, on both ranks' halves: as nn.Embedding(padding_idx), its row gets no gradient
    // from the embedding path, only from the tied head (so an unmasked row would differ).
    c.pad_token_id = ids[0][0].item<int64_t>();
    ids[3][0] = c.pad_token_id;
  }

  // Reference weights: the same ParamInit through the replicated provider, then plain autograd.
  const std::vector<spec::ParamSpec> specs = spec::LlamaParamSpecs(c);
  auto rep = *ReplicatedProvider::Create(specs, {kSeed, c.initializer_range});
  std::map<std::string, at::Tensor> w;
  for (ParamId i = 0; i < specs.size(); ++i) {
    w[specs[i].name] = rep->param(i).detach().clone().set_requires_grad(true);
  }
  // The init must give the biases non-zero values, or a dropped bias would go unnoticed.
  ASSERT_GT(w.at("model.layers.1.self_attn.k_proj.bias").abs().max().item<double>(), 0.05);
  at::Tensor ref_loss = ReferenceLoss(c, w, ids, labels);
  ref_loss.backward();

  std::vector<double> losses(2);
  absl::Status s = testing::FirstFailure(testing::RunGang(2, [&](int rank, Collectives& coll) {
    ZeroOptions o;
    o.stage = stage;
    o.reduce_bucket_size = 300;  // several buckets
    o.param_persistence_threshold = 0;
    auto zero = ZeroProvider::Create(specs, &coll, {kSeed, c.initializer_range}, o);
    if (!zero.ok()) return zero.status();
    auto model = LlamaModel::Create(c, zero->get());
    if (!model.ok()) return model.status();
    (*zero)->BeginMicroStep(true);
    LossOutput out = (*model)->Loss(ids.narrow(0, 2 * rank, 2), labels.narrow(0, 2 * rank, 2));
    out.loss.backward();
    (*zero)->FinishMicroStep();
    losses[rank] = out.loss.item<double>();
    for (ParamId i = 0; i < specs.size(); ++i) {
      const ZeroParam& p = (*zero)->params()[i];
      EXPECT_TRUE(p.grad.defined()) << p.spec.name;
      if (!p.grad.defined()) continue;
      const at::Tensor& full = w.at(p.spec.name).grad();
      ExpectClose(p.grad, stage == 0 ? full.reshape({-1}) : PartitionOf(full, p),
                  absl::StrCat("stage ", stage, " rank ", rank, " ", p.spec.name));
    }
    return absl::OkStatus();
  }));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_NEAR((losses[0] + losses[1]) / 2, ref_loss.item<double>(), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(TiedUntiedAndStages, Qwen2ZeroTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(0, 1, 2, 3)));

}  // namespace
}  // namespace loom::engine
