#include "worker/engine/sequence_parallel.h"

#include <torch/csrc/autograd/engine.h>
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <utility>

#include "worker/engine/model/param_access.h"

namespace loom::engine {
namespace {

// Enables the Ulysses core for the scope of one runner call.
class Enabled {
 public:
  explicit Enabled(UlyssesAttention* core) : core_(core) { core_->set_enabled(true); }
  ~Enabled() { core_->set_enabled(false); }

 private:
  UlyssesAttention* core_;
};

// Identity on the micro-step's backprop scalar whose backward switches the Ulysses core on for
// the rest of that backward pass and off again when the pass ends (an engine final callback).
// Activation checkpointing recomputes each decoder layer during backward, after Loss() has
// returned and its Enabled scope has ended: without this the recompute ran the inner core on
// the rank's own shard alone (local attention over S/P tokens, all heads), so the forward loss
// was right and every gradient wrong (alst_stack_test).
struct UlyssesOnInBackward : public torch::autograd::Function<UlyssesOnInBackward> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t core) {
    ctx->saved_data["core"] = core;
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* core = reinterpret_cast<UlyssesAttention*>(ctx->saved_data["core"].toInt());
    core->set_enabled(true);
    torch::autograd::Engine::get_default_engine().queue_callback(
        [core] { core->set_enabled(false); });
    return {grads[0], torch::autograd::Variable()};
  }
};

}  // namespace

at::Tensor ShiftLabels(const at::Tensor& labels) {
  const int64_t s = labels.size(1);
  at::Tensor out = at::full_like(labels, kIgnoreLabel);
  if (s > 1) out.narrow(1, 0, s - 1).copy_(labels.narrow(1, 1, s - 1));
  return out;
}

SequenceShard ShardSample(const at::Tensor& ids, const at::Tensor& targets, int64_t rank,
                          int64_t sp_size, const at::Tensor& positions) {
  TORCH_CHECK(ids.dim() == 2 && targets.sizes() == ids.sizes(),
              "sequence parallel: ids and targets must both be [B, S]");
  const int64_t s = ids.size(1);
  TORCH_CHECK(s % sp_size == 0, "training.sequence_length: ", s,
              " is not divisible by deepspeed_config.sequence_parallel_size ", sp_size);
  const int64_t sl = s / sp_size;
  SequenceShard shard;
  shard.ids = ids.narrow(1, rank * sl, sl).contiguous();
  shard.labels = targets.narrow(1, rank * sl, sl).contiguous();
  if (positions.defined()) {
    TORCH_CHECK(positions.dim() == 1 && positions.size(0) == s,
                "sequence parallel: positions must be [S]");
    shard.positions = positions.narrow(0, rank * sl, sl).contiguous();
  } else {
    shard.positions = at::arange(rank * sl, (rank + 1) * sl, at::kLong);
  }
  shard.valid = shard.labels.ne(kIgnoreLabel).sum().item<int64_t>();
  shard.global_valid = targets.ne(kIgnoreLabel).sum().item<int64_t>();
  return shard;
}

absl::StatusOr<std::unique_ptr<SequenceParallelRunner>> SequenceParallelRunner::Create(
    LlamaModel* model, Collectives* group, bool bf16_wire, std::unique_ptr<AttentionCore> inner) {
  const spec::LlamaConfig& c = model->config();
  UlyssesOptions o;
  o.num_heads = c.num_attention_heads;
  o.num_kv_heads = c.num_key_value_heads;
  o.communication_dtype = bf16_wire ? at::kBFloat16 : at::kFloat;
  absl::StatusOr<std::unique_ptr<UlyssesAttention>> core =
      UlyssesAttention::Create(group, o, std::move(inner));
  if (!core.ok()) return core.status();
  UlyssesAttention* raw = core->get();
  raw->set_enabled(false);
  model->set_attention_core(std::move(*core));
  return std::unique_ptr<SequenceParallelRunner>(new SequenceParallelRunner(model, group, raw));
}

double SequenceParallelRunner::SumOverGroup(double local) {
  at::Tensor t = at::full({1}, local, at::kDouble);
  absl::Status s = group_->AllReduce(t, ReduceOp::kSum);
  if (!s.ok()) throw CollectiveError(s);
  return t.item<double>();
}

SequenceParallelRunner::MicroStep SequenceParallelRunner::Loss(
    const at::Tensor& ids, const at::Tensor& targets, const std::vector<int64_t>* layer_order,
    const at::Tensor& positions) {
  SequenceShard shard =
      ShardSample(ids, targets, group_->rank(), group_->world_size(), positions);
  Enabled on(core_);
  core_->SetLocalPositions(shard.positions);
  at::Tensor labels = shard.labels;
  if (shard.valid == 0) {
    // An all-ignored shard: a finite loss on one token, multiplied by an exact zero below, so
    // the backward (and its all-to-alls) runs with zero gradients instead of NaN.
    labels = labels.clone();
    labels.view({-1})[0] = 0;
  }
  LossOutput out = model_->Loss(shard.ids, labels, layer_order, shard.positions);
  const double weight = shard.valid == 0 ? 0.0
                                         : static_cast<double>(shard.valid) /
                                               static_cast<double>(shard.global_valid);
  MicroStep step;
  step.backprop =
      UlyssesOnInBackward::apply(out.loss * weight, reinterpret_cast<int64_t>(core_));
  step.loss = SumOverGroup(out.loss.item<double>() * weight);
  return step;
}

HeldOutLoss HeldOutLossOf(LlamaModel* model, const at::Tensor& ids, const at::Tensor& targets,
                          const at::Tensor& positions, const at::Tensor& document_ids) {
  at::NoGradGuard no_grad;
  // Through the loss head, not Forward + cross_entropy: with the tiled head the full logits
  // never exist in evaluation either.
  LossOutput out = model->Loss(ids, targets, nullptr, positions, document_ids);
  HeldOutLoss h;
  // Both heads average over the non-ignored targets (FullLogitsLoss's token_count is B*S).
  h.tokens = targets.ne(kIgnoreLabel).sum().item<int64_t>();
  if (h.tokens > 0) h.sum = out.loss.item<double>() * static_cast<double>(h.tokens);
  return h;
}

double SequenceParallelRunner::EvalLoss(const at::Tensor& ids, const at::Tensor& targets,
                                        const at::Tensor& positions) {
  at::NoGradGuard no_grad;
  SequenceShard shard =
      ShardSample(ids, targets, group_->rank(), group_->world_size(), positions);
  Enabled on(core_);
  core_->SetLocalPositions(shard.positions);
  const HeldOutLoss h = HeldOutLossOf(model_, shard.ids, shard.labels, shard.positions);
  return SumOverGroup(h.sum) / static_cast<double>(std::max<int64_t>(shard.global_valid, 1));
}

}  // namespace loom::engine
