#include "worker/engine/model/llama_model.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/functional/loss.h>

#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/engine/model/autograd_ops.h"
#include "worker/engine/model/bias_op.h"

namespace loom::engine {
namespace {

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

// Logits head + mean cross-entropy in fp32 (the ops the engine ran before the split).
class FullLogitsLoss : public LossHead {
 public:
  FullLogitsLoss(ParamAccess* access, ParamId head, int64_t vocab)
      : access_(access), head_(head), vocab_(vocab) {}
  LossOutput Forward(const at::Tensor& hidden, const at::Tensor& labels) override {
    access_->NoteUse(head_);
    at::Tensor logits = LinearOp(access_, head_, hidden).to(at::kFloat);
    LossOutput out;
    out.loss = torch::nn::functional::cross_entropy(logits.reshape({-1, vocab_}),
                                                    labels.reshape({-1}));
    out.token_count = labels.numel();
    return out;
  }

 private:
  ParamAccess* access_;
  ParamId head_;
  int64_t vocab_;
};

}  // namespace

std::pair<at::Tensor, at::Tensor> RopeTables(const spec::LlamaConfig& config, int64_t seq,
                                             const at::Tensor& positions) {
  const spec::RopeType type = config.rope_scaling.rope_type;
  int64_t rope_len = seq;  // transformers' seq_len = max(position_ids) + 1
  if (positions.defined() && positions.numel() > 0 &&
      (type == spec::RopeType::kDynamic || type == spec::RopeType::kLongrope)) {
    rope_len = positions.max().item<int64_t>() + 1;
  }
  const spec::RopeFrequencies f =
      spec::ComputeRopeFrequencies(config.rope_theta, config.rope_scaling, config.head_dim(),
                                   config.max_position_embeddings, rope_len);
  at::Tensor inv_freq;  // [d/2] fp32
  if (type == spec::RopeType::kDefault) {
    // Bit for bit what transformers' compute_default_rope_parameters computes (fp32 pow).
    const int64_t d = config.head_dim();
    inv_freq = 1.0 / at::pow(config.rope_theta,
                             at::arange(0, d, 2, at::kLong).to(at::kFloat) / static_cast<double>(d));
  } else {
    inv_freq = at::tensor(at::ArrayRef<double>(f.inv_freq), at::kDouble).to(at::kFloat);
  }
  at::Tensor t = positions.defined() ? positions.reshape({-1}).to(at::kFloat)
                                     : at::arange(seq, at::kLong).to(at::kFloat);
  at::Tensor freqs = at::outer(t, inv_freq.to(t.device()));  // [seq, d/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  if (f.attention_scaling == 1.0) return {emb.cos(), emb.sin()};
  return {emb.cos() * f.attention_scaling, emb.sin() * f.attention_scaling};
}

std::pair<at::Tensor, at::Tensor> RopeTables(int64_t seq, int64_t head_dim, double theta,
                                             const at::Tensor& positions) {
  spec::LlamaConfig config;
  config.explicit_head_dim = head_dim;
  config.rope_theta = theta;
  config.max_position_embeddings = seq;
  return RopeTables(config, seq, positions);
}

at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return x * cos + RotateHalf(x) * sin;
}

const at::Tensor& AttentionMask::Dense() const {
  if (!dense_.defined()) {
    const at::Tensor p = positions.reshape({-1});
    dense_ = p.unsqueeze(0) > p.unsqueeze(1);  // [i][j]: key j is after query i
    if (document_ids.defined()) {
      const at::Tensor doc = document_ids.reshape({-1});
      dense_ = dense_ | (doc.unsqueeze(0) != doc.unsqueeze(1));
    }
  }
  return dense_;
}

at::Tensor MaterializedCausalAttention::Forward(const at::Tensor& q, const at::Tensor& k_in,
                                                const at::Tensor& v_in, const AttentionMask& mask,
                                                at::ScalarType act) {
  const at::Tensor& masked = mask.Dense();
  const int64_t n_rep = q.size(1) / k_in.size(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  at::Tensor k = RepeatKv(k_in, n_rep);
  at::Tensor v = RepeatKv(v_in, n_rep);
  at::Tensor scores = at::matmul(q, k.transpose(2, 3)) * scale;  // [B,Hq,S,S]
  scores = scores.masked_fill(masked, -std::numeric_limits<float>::infinity());
  at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(act);
  return at::matmul(probs, v);  // [B,Hq,S,d]
}

LlamaModel::LlamaModel(const spec::LlamaConfig& config, ParamAccess* access)
    : config_(config), access_(access), core_(std::make_unique<MaterializedCausalAttention>()) {}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(const spec::LlamaConfig& config,
                                                               ParamAccess* access) {
  std::unique_ptr<LlamaModel> m(new LlamaModel(config, access));
  std::map<std::string, ParamId> by_name;
  const std::vector<spec::ParamSpec>& have = access->param_specs();
  for (ParamId i = 0; i < have.size(); ++i) by_name[have[i].name] = i;
  std::map<std::string, ParamId> bound;
  for (const spec::ParamSpec& want : spec::LlamaParamSpecs(config)) {
    auto it = by_name.find(want.name);
    if (it == by_name.end()) {
      return absl::NotFoundError(absl::StrCat("model parameter ", want.name,
                                              " is not in the parameter table"));
    }
    if (have[it->second].shape != want.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model parameter ", want.name, ": shape [", absl::StrJoin(have[it->second].shape, ","),
          "] in the parameter table, the config needs [", absl::StrJoin(want.shape, ","), "]"));
    }
    bound[want.name] = it->second;
  }
  m->embed_ = bound.at("model.embed_tokens.weight");
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    m->layers_.push_back({bound.at(p + "input_layernorm.weight"),
                          bound.at(p + "self_attn.q_proj.weight"),
                          bound.at(p + "self_attn.k_proj.weight"),
                          bound.at(p + "self_attn.v_proj.weight"),
                          bound.at(p + "self_attn.o_proj.weight"),
                          bound.at(p + "post_attention_layernorm.weight"),
                          bound.at(p + "mlp.gate_proj.weight"), bound.at(p + "mlp.up_proj.weight"),
                          bound.at(p + "mlp.down_proj.weight")});
    if (config.qk_norm()) {
      DecoderLayer& layer = m->layers_.back();
      layer.q_norm = bound.at(p + "self_attn.q_norm.weight");
      layer.k_norm = bound.at(p + "self_attn.k_norm.weight");
    }
    if (config.qkv_bias()) {
      DecoderLayer& layer = m->layers_.back();
      layer.q_bias = bound.at(p + "self_attn.q_proj.bias");
      layer.k_bias = bound.at(p + "self_attn.k_proj.bias");
      layer.v_bias = bound.at(p + "self_attn.v_proj.bias");
    }
  }
  m->final_norm_ = bound.at("model.norm.weight");
  m->head_ = config.tie_word_embeddings ? m->embed_ : bound.at("lm_head.weight");
  m->set_loss_head(nullptr);
  return m;
}

void LlamaModel::set_attention_core(std::unique_ptr<AttentionCore> core) {
  core_ = core ? std::move(core) : std::make_unique<MaterializedCausalAttention>();
}

void LlamaModel::set_loss_head(std::unique_ptr<LossHead> head) {
  loss_head_ = head ? std::move(head)
                    : std::make_unique<FullLogitsLoss>(access_, head_, config_.vocab_size);
}

void LlamaModel::NoteUse(ParamId i) {
  switch (phase_) {
    case CheckpointPhase::kNone:
      access_->NoteUse(i);
      return;
    case CheckpointPhase::kForward: {  // grad mode is off here, the use still counts
      at::AutoGradMode grad_on(true);
      access_->NoteUse(i);
      return;
    }
    case CheckpointPhase::kRecompute:  // counted in the checkpointed forward
      return;
  }
}

at::Tensor LlamaModel::Linear(const at::Tensor& x, ParamId i) {
  NoteUse(i);
  return LinearOp(access_, i, x);
}

at::Tensor LlamaModel::Linear(const at::Tensor& x, ParamId i, ParamId bias) {
  at::Tensor y = Linear(x, i);
  if (bias == kNoParam) return y;
  NoteUse(bias);
  return BiasAddOp(access_, bias, y);
}

at::Tensor LlamaModel::Norm(const at::Tensor& x, ParamId i) {
  NoteUse(i);
  return RmsNormOp(access_, i, x, config_.rms_norm_eps);
}

at::Tensor LlamaModel::Layer(const DecoderLayer& l, const at::Tensor& h_in, const at::Tensor& cos,
                             const at::Tensor& sin, const AttentionMask& mask) {
  if (checkpointing_.enabled && phase_ == CheckpointPhase::kNone &&
      at::GradMode::is_enabled()) {
    return CheckpointLayer(
        [this, &l, cos, sin, mask](const at::Tensor& x, CheckpointPhase phase) {
          const CheckpointPhase outer = phase_;
          phase_ = phase;
          struct Restore {
            CheckpointPhase* p;
            CheckpointPhase v;
            ~Restore() { *p = v; }
          } restore{&phase_, outer};
          return Layer(l, x, cos, sin, mask);
        },
        h_in, access_->anchor(), checkpointing_);
  }
  const int64_t b = h_in.size(0), s = h_in.size(1);
  const int64_t d = config_.head_dim(), hq = config_.num_attention_heads;
  const int64_t hkv = config_.num_key_value_heads;
  at::Tensor h = h_in;
  at::Tensor x = Norm(h, l.input_norm);
  at::Tensor q = Linear(x, l.q, l.q_bias).view({b, s, hq, d});  // [B,S,Hq,d]
  at::Tensor k = Linear(x, l.k, l.k_bias).view({b, s, hkv, d});
  if (l.q_norm != kNoParam) {  // Qwen3: RMSNorm over each head's d features
    q = Norm(q, l.q_norm);
    k = Norm(k, l.k_norm);
  }
  q = q.transpose(1, 2);  // [B,Hq,S,d]
  k = k.transpose(1, 2);  // [B,Hkv,S,d]
  at::Tensor v = Linear(x, l.v, l.v_bias).view({b, s, hkv, d}).transpose(1, 2);
  q = ApplyRope(q, cos, sin);
  k = ApplyRope(k, cos, sin);
  at::Tensor attn = core_->Forward(q, k, v, mask, access_->activation_dtype())
                        .transpose(1, 2)
                        .reshape({b, s, hq * d});
  h = h + Linear(attn, l.o);
  x = Norm(h, l.post_norm);
  at::Tensor mlp = mlp_core_ ? mlp_core_->Forward(x, l.gate, l.up, l.down)
                            : Linear(at::silu(Linear(x, l.gate)) * Linear(x, l.up), l.down);
  return h + mlp;
}

at::Tensor LlamaModel::Hidden(const at::Tensor& ids, const std::vector<int64_t>* layer_order,
                              const at::Tensor& positions, const at::Tensor& document_ids) {
  const int64_t s = ids.size(1);
  const at::ScalarType act = access_->activation_dtype();
  at::Tensor cos, sin;
  AttentionMask mask;
  mask.document_ids = document_ids;
  if (positions.defined()) {
    auto tables = RopeTables(config_, s, positions);
    cos = tables.first.to(act);
    sin = tables.second.to(act);
    mask.positions = positions.reshape({-1});
  } else {
    auto it = rope_cache_.find(s);
    if (it == rope_cache_.end()) {
      auto tables = RopeTables(config_, s);
      it = rope_cache_.emplace(s, std::make_pair(tables.first.to(act), tables.second.to(act)))
               .first;
    }
    cos = it->second.first;
    sin = it->second.second;
    mask.positions = at::arange(s, at::kLong);
  }
  access_->NoteUse(embed_);
  at::Tensor h = EmbeddingOp(access_, embed_, ids, config_.pad_token_id);  // [B,S,H]
  if (layer_order != nullptr) {
    for (int64_t l : *layer_order) h = Layer(layers_.at(static_cast<size_t>(l)), h, cos, sin, mask);
  } else {
    for (const DecoderLayer& l : layers_) h = Layer(l, h, cos, sin, mask);
  }
  return Norm(h, final_norm_);
}

at::Tensor LlamaModel::Forward(const at::Tensor& ids, const std::vector<int64_t>* layer_order,
                               const at::Tensor& positions, const at::Tensor& document_ids) {
  at::Tensor h = Hidden(ids, layer_order, positions, document_ids);
  return Linear(h, head_);  // [B,S,V]
}

LossOutput LlamaModel::Loss(const at::Tensor& ids, const at::Tensor& labels,
                            const std::vector<int64_t>* layer_order, const at::Tensor& positions,
                            const at::Tensor& document_ids) {
  return loss_head_->Forward(Hidden(ids, layer_order, positions, document_ids), labels);
}

}  // namespace loom::engine
