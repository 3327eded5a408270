// Everything one training rank needs to know about its job, filled from the loom.v1.JobSpec
// message (proto/common.proto) that the scheduler validated (scheduler/job_spec_validation.h):
// one schema, read by protobuf's own parser on both sides. The two embedded documents keep their
// own formats and parsers: model.config (a Hugging Face config.json, model_config.h) and
// deepspeed_config (DeepSpeed's ds_config.json, ds_config.h). Torch-free; this header only
// forward-declares the message, so the engine's LibTorch translation units do not include
// generated protobuf headers.
#ifndef LOOM_WORKER_ENGINE_ENGINE_OPTIONS_H_
#define LOOM_WORKER_ENGINE_ENGINE_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "spec/ds_config.h"
#include "spec/model_config.h"
#include "spec/tiled_compute_options.h"
#include "data/corpus.h"

namespace loom::v1 {
class JobSpec;
}  // namespace loom::v1

namespace loom::engine {

struct EngineOptions {
  spec::LlamaConfig model;
  std::string model_config_json;  // the spec's model.config object, as given
  std::string init_from;          // model.init_from: a Hugging Face export directory, or empty
  spec::DeepSpeedConfig ds;
  // dataset.*: path, format, text_field, token_dtype, holdout_fraction, tokenizer (kind,
  // tokenizer_model, vocab_size, model_type) and model.config's vocab/bos/eos ids. The run-time
  // fields (record_dir, rank, world_size) are filled in by the engine.
  data::CorpusOptions data;
  std::string tokenizer = "byte";  // dataset.tokenizer (= data.tokenizer.kind)
  // dataset.pack_documents: every window a packed sample (per-document positions and
  // attention, no target across a document boundary; data/corpus.h PackedPositions).
  bool pack_documents = false;
  int64_t steps = 0;               // total optimizer steps (a resumed run continues up to it)
  int64_t sequence_length = 0;     // tokens per sample (targets are shifted by one)
  uint64_t seed = 0;
  int64_t eval_every_steps = 0;    // 0: only before and after training
  int64_t eval_batches = 8;        // held-out micro-batches per evaluation
  int threads_per_rank = 1;        // intra-op threads
  int64_t checkpoint_interval_steps = 0;  // 0: only at the end
  spec::TiledComputeOptions tiled;       // training.tiled_* (ALST tiled MLP / logits+loss)
  // Attention core and activation checkpointing (issue 13; engine_options_model.cc):
  // model.attn_implementation, model.attn_block_size, and checkpointing from deepspeed_config
  // activation_checkpointing (enabled when the section is present; cpu_checkpointing) or
  // training.activation_checkpoint_cpu_offload.
  std::string attn_implementation = "flash_attention_2";  // default | eager
  int64_t attn_block_size = 128;
  bool activation_checkpointing = false;
  bool activation_checkpoint_cpu_offload = false;
  // resources.accelerator, lower case: "cpu" (also for an unset kind), "h100", "h200" or
  // "gh200"; the trainer resolves the rank's device from it (worker/engine/device.h).
  std::string accelerator = "cpu";
  // Run-time (from flags, not the spec).
  int rank = 0;
  int world_size = 1;
  std::string checkpoint_dir;      // where step_<S>/rank_<r>.shard go; empty: no checkpoints
  std::string resume_from;         // a step directory to resume from; empty: fresh start
  std::string job_id;
  absl::Duration collective_timeout = absl::Seconds(300);
  // Non-empty: dump initial/final HF exports, every training window and per-step loss here
  // (worker/engine/trajectory.h; loom-trainer --trajectory_dir), for an external reference.
  std::string trajectory_dir;
  // Test hooks (loom-trainer --test_* flags; never set by the worker).
  // 1-based optimizer steps at which rank 0 writes +inf into its first gradient after backward.
  std::vector<int64_t> test_inject_inf_grad_steps;
  // At 1-based step test_layer_order_step every micro-step runs the decoder layers in
  // test_layer_order (e.g. {1, 0} or {0}) instead of 0..L-1 (a dynamic module order).
  int64_t test_layer_order_step = 0;
  std::vector<int64_t> test_layer_order;
  // > 0: this rank's training micro-batches use this many tokens per sample instead of
  // sequence_length (uneven data across ranks).
  int64_t test_rank_sequence_length = 0;
  // ZenFlow with overlap_step accumulates on the training thread, fused into the selective pass
  // (ZenFlowOptions::host_accumulation false): the reference of the host-thread accumulation.
  bool test_zenflow_fused_accumulation = false;
};

// Fills the spec fields of EngineOptions from `spec` (model.config, model.init_from, dataset,
// deepspeed_config, training, checkpoint; other fields are the scheduler's) for `world_size`
// ranks, with the trainer's defaults for zero values (holdout_fraction 0.05, eval_batches 8,
// threads_per_rank 1). Errors: INVALID_ARGUMENT naming the field ("training.sequence_length:
// ..."), and the "model.config.*" / "deepspeed_config.*" errors of the config parsers.
absl::StatusOr<EngineOptions> EngineOptionsFromJobSpec(const loom::v1::JobSpec& spec,
                                                       int world_size);

// The trainer's --spec file: a JobSpec in protobuf's JSON mapping (what the worker writes:
// worker/rank_process.cc; proto or lowerCamel field names, int64 as numbers or strings), read with
// protobuf's JSON parser, then EngineOptionsFromJobSpec. A field JobSpec does not have, or a value
// of the wrong type, is INVALID_ARGUMENT "spec: ..." with protobuf's message naming the field.
absl::StatusOr<EngineOptions> ParseJobSpecJson(const std::string& json_text, int world_size);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_ENGINE_OPTIONS_H_
