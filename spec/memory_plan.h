// Per-rank memory of a training job predicted from its spec alone (issue 48): every byte the
// engine allocates for a rank, as named terms, each with its formula and where the formula comes
// from (the engine file that allocates it, or a measurement). Torch-free: `loomctl plan`
// (services/cli/plan_command.h) prints it, and admission and placement use it (spec/memory_fit.h,
// docs/scheduling.md "Capacity at submission"); the technique decision function of issue 48 is
// not built yet.
//
// Notation (all per rank; elements unless a term says bytes):
//   Ψ      trainable parameters (LlamaParamSpecs), n_i one tensor's elements, n_max the largest
//   N      world size (resources.num_ranks); P = Σ ceil(n_i/N), this rank's partition
//   d      parameter dtype bytes: 2 with bf16/fp16 enabled, else 4;
//          a = activation dtype bytes (= d)
//   B      train_micro_batch_size_per_gpu; S sequence length; SP = sequence_parallel_size;
//          T = B·S/SP the tokens a rank holds (Ulysses shards the sequence, and its attention
//          runs on all S with Hq/SP heads: the same element count)
//   H, I, L, V, Hq, Hkv, hd  hidden, intermediate, layers, vocab, query/KV heads, head_dim;
//          q = Hq·hd, kv = Hkv·hd
// Model states follow worker/engine/zero/zero_provider.cc (measured per rank by
// worker/trainer:zero_stages_test and memory_plan_trainer_test); activations follow what
// LibTorch's autograd keeps for the engine's ops (worker/engine/model/llama_model.cc,
// autograd_ops.cc, blockwise_attention.h, activation_checkpoint.cc, tiled_ops.h), not a paper's
// rule of thumb. The whole-process peak (VmHWM) adds the measured runtime constants below;
// worker/trainer:memory_plan_trainer_test holds the plan to 10% (model states) and 15% (VmHWM)
// of real loom-trainer ranks.
//
// Places: on a CPU rank (the only kind the engine runs today) device memory IS host memory: every
// term is listed under `host` and `device` is empty (cpu_rank true). On an accelerator rank,
// offload targets decide the place: offload_optimizer/offload_param "cpu" -> host, "nvme" -> the
// NVMe term list (with host swap buffers), activation_checkpointing.cpu_checkpointing -> host;
// with the optimizer offloaded, the fp32 gradient partition is in host memory too (ZeRO-Offload's
// layout, stages 2 and 3).
// The accelerator terms are the same formulas (the engine's GPU path is not built yet, issue 48
// "the GPU memory terms join when GPU ranks land"), plus a CUDA context estimate.
//
// Units: bytes. All functions are pure and thread-safe.
#ifndef LOOM_SPEC_MEMORY_PLAN_H_
#define LOOM_SPEC_MEMORY_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/common.pb.h"
#include "spec/ds_config.h"
#include "spec/engine_options_tiled.h"
#include "spec/model_config.h"
#include "spec/tiled_compute_options.h"

namespace loom::spec {

// The runtime's steady cost on a CPU rank: LibTorch, glog, the thread pools and the tokenised
// dataset with no model to speak of: the VmRSS plateau of loom-trainer training a 0.15M-parameter
// model (H 96, 1 layer, S 64, B 2; 1 rank) between its "started" and "done" events, sampled every
// 5 ms. Measured 2026-12-07 on the 2-core x86_64 development machine (LibTorch 2.11 CPU wheel):
// 389-391 MiB over 3 runs (ProcessStart rss_bytes 347 MiB).
inline constexpr int64_t kCpuRuntimeFixedBytes = int64_t{390} << 20;
// After its "done" event, loom-trainer's teardown raises VmRSS by 104-116 MiB over the
// post-training level (same sampling; 4 models from 0.15M to 7.3M parameters, S 64-1024, with
// and without activation checkpointing), after the step's activations are freed: it overlaps
// them, so the plan adds max(0, this - the step's transient terms). Its cause is not known.
inline constexpr int64_t kCpuTeardownBytes = int64_t{110} << 20;
// glibc's dynamic mmap threshold (worker/trainer/main.cc --malloc_mmap_threshold_bytes) leaves
// freed step transients in the heap, by an amount that varies between runs of the same job:
// VmHWM 787-912 MiB over 7 runs of one configuration (7.3M parameters, S 1024, 2026-12-07). The
// plan adds the step's transient terms / 4, the middle of that spread, fitted on
// worker/trainer:memory_plan_trainer_test's grid (so that test does not validate it
// independently).
inline constexpr int64_t kCpuHeapRetentionDivisor = 4;
// An accelerator rank's CUDA context, cuBLAS/NCCL workspaces: not measured (no GPU rank yet);
// 1 GiB is PyTorch's usual 0.5-1 GiB context plus NCCL's default buffers (NCCL_BUFFSIZE 4 MiB
// per channel and peer).
inline constexpr int64_t kAcceleratorContextBytes = int64_t{1} << 30;

// Everything the model needs from a job spec.
struct MemoryPlanInput {
  LlamaConfig model;
  DeepSpeedConfig ds;
  int world_size = 1;            // resources.num_ranks
  int64_t sequence_length = 0;   // training.sequence_length
  TiledComputeOptions tiled;     // training.tiled_*
  ModelExecutionKeys exec;       // attention core, activation checkpointing (+ cpu offload)
  bool cpu_rank = true;          // resources.accelerator CPU (or unspecified)
};

// One named term: bytes and the formula with its values, e.g.
// {"gradients", 476416, "4P = 4 x 119104 (fp32 partition, zero_grads.cc EnsureGrad)"}.
struct MemoryTerm {
  std::string name;
  int64_t bytes = 0;
  std::string formula;
  // Counted by the trainer's MemoryTracker (param/grad/optimizer_state/buffer/cached/
  // activation_offload bytes; its peak_bytes). Untracked terms other than the runtime's are the
  // step's transients (activations, logits), freed between steps.
  bool tracked = false;
};

struct RankMemoryPlan {
  bool cpu_rank = true;
  std::vector<MemoryTerm> device;  // empty on a CPU rank (device == host)
  std::vector<MemoryTerm> host;
  std::vector<MemoryTerm> nvme;
  static int64_t Sum(const std::vector<MemoryTerm>& terms);
  int64_t device_bytes() const { return Sum(device); }
  int64_t host_bytes() const { return Sum(host); }
  int64_t nvme_bytes() const { return Sum(nvme); }
  // Σ of the tracked terms over device and host: what the trainer's peak_bytes should be.
  int64_t tracked_bytes() const;
  // The term called `name` in any list (nullptr when absent).
  const MemoryTerm* Find(const std::string& name) const;
};

// The plan for one rank of `in`. Errors: INVALID_ARGUMENT naming the field when world_size < 1,
// sequence_length < 1, sequence_parallel_size does not divide world_size, or the model has no
// layers/heads (a spec validation accepts never yields these).
absl::StatusOr<RankMemoryPlan> PlanRankMemory(const MemoryPlanInput& in);

// The input of a validated job spec (ParseLlamaConfigValue, ParseJobDeepSpeedConfig,
// ParseTiledCompute, ParseModelExecution: the trainer's parsers). Errors: theirs.
absl::StatusOr<MemoryPlanInput> MemoryPlanInputFromJobSpec(const loom::v1::JobSpec& spec);

// "1.23 GiB", "456.0 MiB", "789 B": for tables and messages.
std::string FormatBytes(int64_t bytes);

}  // namespace loom::spec

#endif  // LOOM_SPEC_MEMORY_PLAN_H_
