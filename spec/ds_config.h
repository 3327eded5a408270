// DeepSpeed JSON configuration (ds_config.json) as Loom's engine understands it: parsing with
// DeepSpeed's code defaults (docs/design/TECHNIQUES.md §0, §1.9; deepspeed/runtime/config.py,
// zero/config.py, lr_schedules.py), batch-size arithmetic, validation, and the learning-rate
// schedules. No LibTorch. All functions are pure and thread-safe.
//
// Policy for keys: unknown keys are rejected with their path. Recognised keys that the engine
// does not implement are accepted with a warning (DeepSpeedConfig::warnings, one line each naming
// the key) when ignoring them cannot change results (logging knobs, round_robin_gradients,
// stage3_model_persistence_threshold, ...) and rejected with INVALID_ARGUMENT "<path>: ... is not
// supported yet" when they would (ZeRO++, fp16 auto_cast, ...). The zenflow block is parsed
// and validated with DeepSpeed's constraints (ds_config_zenflow.cc). Offload sections
// (offload_optimizer / offload_param with device cpu or nvme) are parsed and accepted here; the
// engine decides at start whether it implements them. Of their keys, device, nvme_path,
// buffer_count, offload_param.buffer_size, offload_optimizer.pipeline_read / pipeline_write and
// offload_optimizer.ratio act; pin_memory, max_in_cpu, fast_init, cpuadam_cores_perc, pipeline,
// offload_param.pipeline_read / pipeline_write / ratio and offload_optimizer.buffer_size are
// type-checked and warned about. In "aio", block_size and queue_depth act; thread_count,
// intra_op_parallelism, single_submit, overlap_events and use_gds are warned about.
#ifndef LOOM_SPEC_DS_CONFIG_H_
#define LOOM_SPEC_DS_CONFIG_H_

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::spec {

struct OptimizerConfig {
  enum class Type { kAdam, kAdamW };
  Type type = Type::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  // Adam: 0; AdamW: 0.01 (torch.optim.AdamW's default).
  double weight_decay = 0.0;
  // Decoupled weight decay (AdamW, Loshchilov & Hutter) vs L2 added to the gradient (Adam).
  // DeepSpeed builds FusedAdam with adam_w_mode = (type == AdamW) or params.adam_w_mode, and
  // adam_w_mode defaults to true, so "Adam" also decays decoupled unless adam_w_mode is false.
  bool decoupled_weight_decay = true;
  bool bias_correction = true;
  std::string name() const { return type == Type::kAdam ? "adam" : "adamw"; }
};

struct SchedulerConfig {
  // kHf*: Hugging Face Trainer's lr_scheduler_type (spec/hf_trainer_config.h), never read from a
  // DeepSpeed config: "linear", "cosine", "constant", "constant_with_warmup".
  enum class Type {
    kNone, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR,
    kHfLinear, kHfCosine, kHfConstant, kHfConstantWithWarmup
  };
  Type type = Type::kNone;
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;  // WarmupLR: defaults to optimizer lr; WarmupDecayLR: 0.001
  int64_t warmup_num_steps = 1000;
  bool warmup_log = true;  // warmup_type "log" (default) or "linear"
  int64_t total_num_steps = 0;  // WarmupDecayLR / WarmupCosineLR (required there)
  double warmup_min_ratio = 0.0;  // WarmupCosineLR
  double cos_min_ratio = 0.0001;  // WarmupCosineLR
};

struct OffloadConfig {
  std::string device = "none";  // none | cpu | nvme
  std::string nvme_path;
  int64_t buffer_count = 0;  // 5 (param) / 4 (optimizer)
  int64_t buffer_size = 100000000;  // elements; used by offload_param only
  // Parsed for DeepSpeed's defaults but not acted on (a warning when present): see above.
  int64_t max_in_cpu = 1000000000;
  bool pin_memory = true;
  bool pipeline_read = false;   // used by offload_optimizer only
  bool pipeline_write = false;  // used by offload_optimizer only
  bool fast_init = false;
  double ratio = 1.0;  // offload_optimizer: the engine refuses < 1 (without super_offload)
  // SuperOffload (offload_optimizer only; parsed in ds_config_super_offload.cc,
  // docs/design/TECHNIQUES.md §4.2): speculative CPU Adam per sub-group during backward. With it,
  // `ratio` is the fraction of sub-groups whose step runs on the CPU (the last ones), the rest
  // in-memory Adam.
  bool super_offload = false;
  double cpuadam_cores_perc = 0.8;  // share (0, 1] of training.threads_per_rank for CPU Adam
  // Loom's key (not DeepSpeed's), SuperOffload only: "adaptive" (default) speculates a step only
  // when the previous step's gradient norm did not trigger gradient_clipping; "always"
  // speculates every step (each clipped step is then rolled back and replayed).
  bool speculate_always = false;
};

// zero_optimization.zenflow (docs/design/TECHNIQUES.md §2.6; DeepSpeed
// runtime/zenflow/zenflow_config.py), parsed and validated in ds_config_zenflow.cc. Intervals are
// in optimizer steps (epochs for select_strategy "epoch"); 0 in an *_interval field means "auto".
struct ZenFlowConfig {
  bool enabled = false;             // the block is present
  double topk_ratio = 0.1;          // [0, 1]: share of each 2-D weight's columns updated at once
  std::string select_strategy = "auto";  // auto | step | epoch
  int64_t select_interval = 0;      // 0 = "auto" (one epoch)
  // 0 = "auto" (Zen-auto rule, docs/design/TECHNIQUES-TESTS.md §2.1.5)
  int64_t update_interval = 0;
  bool overlap_step = false;        // asynchronous CPU step with double buffers
  bool offload = false;             // selective moments in host memory (no-op on a CPU node)
  double auto_ratio = 0.99;         // (0, 1]: Zen-auto threshold
  int64_t full_warm_up_rounds = 0;  // first steps are synchronous full-offload steps
  double pt_reserved_cores_perc = 0.5;  // [0, 1]: cores kept by the training thread pool
  int64_t steps_per_epoch = 0;      // 0 = from the data (DeepSpeed's newer key, ZF-U7)
};

// zero_optimization with DeepSpeed's code defaults (docs/design/TECHNIQUES.md §1.9). Sizes are in
// elements.
struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  int64_t reduce_bucket_size = 500000000;
  bool use_multi_rank_bucket_allreduce = true;
  bool allgather_partitions = true;
  int64_t allgather_bucket_size = 500000000;
  std::optional<bool> overlap_comm;  // null -> true iff stage 3
  bool load_from_fp32_weights = true;
  int64_t sub_group_size = 1000000000;
  bool sub_group_size_set = false;  // the key was given (SuperOffload's bucket model otherwise)
  int64_t stage3_prefetch_bucket_size = 50000000;
  int64_t stage3_param_persistence_threshold = 100000;
  int64_t stage3_model_persistence_threshold = INT64_MAX;
  int64_t stage3_max_live_parameters = 1000000000;
  int64_t stage3_max_reuse_distance = 1000000000;
  bool stage3_gather_16bit_weights_on_model_save = false;
  int64_t stage3_module_granularity_threshold = 0;
  bool stage3_use_all_reduce_for_fetch_params = false;
  bool stage3_allgather_sequential = false;
  bool round_robin_gradients = false;
  bool ignore_unused_parameters = true;
  OffloadConfig offload_param;
  OffloadConfig offload_optimizer;
  ZenFlowConfig zenflow;
  bool overlap_comm_effective() const { return overlap_comm.value_or(stage == 3); }
};

// fp16 dynamic loss scaling (DeepSpeed runtime/fp16/loss_scaler.py DynamicLossScaler;
// docs/design/TECHNIQUES.md §0). loss_scale 0 = dynamic starting at 2^initial_scale_power.
struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0.0;
  int64_t initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
};

// NVMe async I/O (DeepSpeed "aio" section, docs/design/TECHNIQUES.md §0): Loom's io_uring swapper
// submits transfers in block_size pieces with up to queue_depth in flight. The other keys
// (thread_count, single_submit, overlap_events, use_gds, intra_op_parallelism) tune libaio
// threading: they are type-checked and ignored with a warning each.
struct AioConfig {
  int64_t block_size = 1048576;  // bytes; a positive multiple of 4096
  int64_t queue_depth = 8;
};

// The monitor blocks that act (DeepSpeed deepspeed/monitor/config.py): `tensorboard` and
// `csv_monitor`, each {enabled, output_path, job_name}. Rank 0 writes what DeepSpeed's monitors
// write (worker/trainer/monitor_writers.h) into <checkpoint dir>/<output_path>/<job_name>/: the
// job's durable directory stands where DeepSpeed uses the launch directory, so output_path must
// be relative and stay inside it (INVALID_ARGUMENT otherwise). `wandb` and `comet` need their
// hosted services: accepted with a warning.
struct MonitorBlock {
  bool enabled = false;
  std::string output_path;                  // relative to the job's checkpoint directory
  std::string job_name = "DeepSpeedJobName";  // DeepSpeed's default
};
struct MonitorConfig {
  MonitorBlock tensorboard;
  MonitorBlock csv_monitor;
};

// activation_checkpointing (DeepSpeed runtime/activation_checkpointing/config.py;
// docs/design/TECHNIQUES.md §3.4). The section being present turns on per-decoder-layer
// checkpointing (Loom's model checkpoints every layer: there is no model code that would call
// checkpoint()). Acting keys: cpu_checkpointing (checkpointed layer inputs kept in host memory).
// partition_activations true is refused (not supported yet: it needs a model-parallel group);
// contiguous_memory_optimization, number_checkpoints, synchronize_checkpoint_boundary and profile
// are type-checked and warned about (they tune the allocator, timing and logging, not results).
// Parsed in ds_config_activation.cc.
struct ActivationCheckpointingConfig {
  bool enabled = false;  // the section is present (and not null)
  bool cpu_checkpointing = false;
  bool cpu_checkpointing_set = false;  // the key was given (false explicitly, or true)
};

struct DeepSpeedConfig {
  int64_t train_batch_size = 0;                // = micro * GAS * world (derived if absent)
  int64_t train_micro_batch_size_per_gpu = 0;  // samples per rank per micro-step
  int64_t gradient_accumulation_steps = 1;
  double gradient_clipping = 0.0;  // global-norm clip; 0 = off
  int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  ZeroConfig zero;
  Fp16Config fp16;
  bool bf16_enabled = false;
  AioConfig aio;
  MonitorConfig monitor;
  // Ulysses sequence parallelism (issue 13): sequence_parallel_size P (divides the world size;
  // batch sizes count world / P data-parallel ranks) and seq_parallel_communication_data_type
  // (fp32 default, or bf16 on the all-to-all wire).
  int64_t sequence_parallel_size = 1;
  bool seq_parallel_communication_bf16 = false;
  // communication_data_type (ds_config_communication.cc): the dtype ZeRO stages 1-3 reduce
  // gradients in, "fp32", "bf16" or "fp16"; "" when absent (the default: bf16 for bf16 jobs,
  // fp32 otherwise).
  std::string communication_data_type;
  ActivationCheckpointingConfig activation_checkpointing;
  // Values Loom filled in for a config written for Hugging Face's Trainer ("auto", a missing
  // optimizer or scheduler; spec/hf_trainer_config.h), one message each. Emitted like warnings.
  std::vector<std::string> resolved;
  // Keys accepted but not implemented (ignoring them cannot change results), one message each:
  // "deepspeed_config.<path>: ignored (<why>)". loom-trainer prints them as "warning" events.
  std::vector<std::string> warnings;
};

// Parses `json_text` (a JSON object) for a job of `world_size` data-parallel ranks.
// Batch sizes follow DeepSpeed's _set_batch_related_parameters: any two of train_batch_size,
// train_micro_batch_size_per_gpu and gradient_accumulation_steps determine the third; all three
// must satisfy train_batch_size == micro * GAS * world_size (with sequence_parallel_size P, the
// data-parallel size world_size / P, as DeepSpeed counts it: the P ranks of a sequence-parallel
// group train on the same samples).
// Errors: INVALID_ARGUMENT naming the key path, e.g.
// "deepspeed_config.zero_optimization.foo: unknown key" or
// "deepspeed_config.zero_optimization.zenflow.topk_ratio: 1.5 is not in [0, 1]"; with several
// problems, all of them in one status (common/problems.h: "3 problems:" and one line each, and
// as its payload): every unknown key and unsupported feature, and the first bad value of each
// section (a section's later checks may depend on its earlier values).
absl::StatusOr<DeepSpeedConfig> ParseDeepSpeedConfig(const std::string& json_text,
                                                     int world_size);
// The same on a parsed value (e.g. spec::StructToJson of a job spec's deepspeed_config).
absl::StatusOr<DeepSpeedConfig> ParseDeepSpeedConfigValue(const nlohmann::json& root,
                                                          int world_size);

// Rewrites DeepSpeed's alias spellings of zero_optimization keys (prefetch_bucket_size,
// param_persistence_threshold, max_live_parameters, gather_16bit_weights_on_model_save, ...,
// and the deprecated stage3_gather_fp16_weights_on_model_save) to their stage3_ names, as
// DeepSpeed's pydantic model accepts both. The parser does this itself; Hugging Face's "auto"
// resolution (hf_trainer_config.h) calls it first. INVALID_ARGUMENT naming the alias when both
// spellings carry different values.
absl::Status NormalizeDeepSpeedAliases(nlohmann::json* ds);

// Learning rate used by optimizer step `step` (0-based: the first step is 0). DeepSpeed builds
// the scheduler with last_batch_iteration = -1 (which sets the lr once) and calls
// scheduler.step() after every optimizer step, so step s runs with last_batch_iteration = s - 1:
//   WarmupLR:       s-1 < 0 -> warmup_min_lr; else min + (max - min) * gamma, gamma =
//                   log(it+1)/log(W) (log) or it/W (linear) while it < W, else 1; W = max(2, n).
//   WarmupDecayLR:  as WarmupLR in warm-up, then max(0, (T - it) / max(1, T - W)).
//   WarmupCosineLR: lr * ratio; ratio 0 before the start, warm-up ratio from warmup_min_ratio,
//                   then cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi*(it-W+1)/(T-W)))/2.
//   Hugging Face's (LambdaLR stepped after each optimizer step, so step s uses lambda(s); W =
//                   warmup_num_steps, T = total_num_steps): optimizer.lr * lambda, lambda =
//                   s / max(1, W) while s < W, then linear max(0, (T - s) / max(1, T - W)),
//                   cosine max(0, (1 + cos(pi * (s - W) / max(1, T - W))) / 2), constant 1.
//   none:           optimizer.lr.
double LearningRateAtStep(const DeepSpeedConfig& config, int64_t step);

}  // namespace loom::spec

#endif  // LOOM_SPEC_DS_CONFIG_H_
