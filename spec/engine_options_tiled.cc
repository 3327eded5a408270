#include "spec/engine_options_tiled.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace loom::spec {
namespace {

absl::Status CheckTileSize(const char* field, int64_t size, bool on, const char* switch_name) {
  if (size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.", field, ": ", size, " must be >= 0 (0 = the default rule)"));
  }
  if (size > 0 && !on) {
    return absl::InvalidArgumentError(absl::StrCat("training.", field, ": set while training.",
                                                   switch_name, " is false"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseTiledCompute(const loom::v1::TrainingSpec& training, TiledComputeOptions* out) {
  out->mlp = training.tiled_mlp_compute();
  out->mlp_tile_size = training.tiled_mlp_tile_size();
  out->logits_loss = training.tiled_logits_loss();
  out->logits_loss_tile_size = training.tiled_logits_loss_tile_size();
  absl::Status st =
      CheckTileSize("tiled_mlp_tile_size", out->mlp_tile_size, out->mlp, "tiled_mlp_compute");
  if (!st.ok()) return st;
  return CheckTileSize("tiled_logits_loss_tile_size", out->logits_loss_tile_size,
                       out->logits_loss, "tiled_logits_loss");
}

absl::Status ParseModelExecution(const loom::v1::JobSpec& spec,
                                 const ActivationCheckpointingConfig& ac, ModelExecutionKeys* out) {
  const loom::v1::ModelSpec& model = spec.model();
  if (!model.attn_implementation().empty()) out->attn_implementation = model.attn_implementation();
  if (out->attn_implementation != "eager" && out->attn_implementation != "flash_attention_2") {
    return absl::InvalidArgumentError(
        absl::StrCat("model.attn_implementation: \"", out->attn_implementation,
                     "\" is not eager or flash_attention_2"));
  }
  if (model.attn_block_size() != 0) out->attn_block_size = model.attn_block_size();
  if (out->attn_block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.attn_block_size: ", out->attn_block_size, " must be >= 1"));
  }
  const bool arctic_offload = spec.training().activation_checkpoint_cpu_offload();
  if (arctic_offload && ac.cpu_checkpointing_set && !ac.cpu_checkpointing) {
    // Regression (break-it pass, 2026-12-05): the two spellings contradicted each other and
    // offload silently won.
    return absl::InvalidArgumentError(
        "training.activation_checkpoint_cpu_offload: true contradicts "
        "deepspeed_config.activation_checkpointing.cpu_checkpointing: false (set one of them)");
  }
  out->activation_checkpointing = ac.enabled || arctic_offload;
  out->activation_checkpoint_cpu_offload = ac.cpu_checkpointing || arctic_offload;
  return absl::OkStatus();
}

absl::Status CheckPackDocuments(const loom::v1::DatasetSpec& dataset, int64_t micro_batch,
                                const LlamaConfig& model) {
  if (!dataset.pack_documents()) return absl::OkStatus();
  if (micro_batch != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.pack_documents: needs deepspeed_config.train_micro_batch_size_per_gpu 1, got ",
        micro_batch, " (one packed sample per micro-batch; raise gradient_accumulation_steps "
        "instead)"));
  }
  if (dataset.format() == "tokens" && !model.eos_token_id_set) {
    return absl::InvalidArgumentError(
        "dataset.pack_documents: a token-file data set marks document ends by "
        "model.config.eos_token_id, which is not set");
  }
  if (dataset.format() == "tokens" &&
      (model.eos_token_id < 0 || model.eos_token_id >= model.vocab_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.pack_documents: a token-file data set marks document ends by "
        "model.config.eos_token_id, and ", model.eos_token_id, " is not a token id of "
        "vocab_size ", model.vocab_size));
  }
  return absl::OkStatus();
}

absl::Status ValidateAlstKeys(const loom::v1::JobSpec& spec, const DeepSpeedConfig& ds) {
  TiledComputeOptions tiled;
  absl::Status st = ParseTiledCompute(spec.training(), &tiled);
  if (!st.ok()) return st;
  ModelExecutionKeys keys;
  return ParseModelExecution(spec, ds.activation_checkpointing, &keys);
}

}  // namespace loom::spec
