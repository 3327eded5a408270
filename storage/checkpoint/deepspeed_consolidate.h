// Streaming consolidation of a DeepSpeed ZeRO checkpoint (as deepspeed engine.save_checkpoint
// writes it; docs/design/TECHNIQUES.md §5.1) into a Hugging Face safetensors export, with the
// values of DeepSpeed's own deepspeed/utils/zero_to_fp32.py (docs/design/TECHNIQUES.md §5.2) but
// bounded memory: zero_to_fp32 torch.loads every rank's whole optimizer state (and fails on
// checkpoints larger than RAM, DeepSpeed #4029); this reads only the pickled metadata
// (deepspeed_pickle.h) and then each output tensor's fp32 bytes straight from the zip records
// (deepspeed_archive.h) with pread, `piece_bytes` at a time, into the safetensors writer
// (storage/safetensors).
//
// Input, DIR = a save_dir with a `latest` file naming the tag, or the tag directory itself:
//   mp_rank_00_model_states.pt (stage 1-2) or zero_pp_rank_0_mp_rank_00_model_states.pt (stage
//     3): param_shapes = a list with one ordered dict name -> torch.Size per optimizer param
//     group in flattening order (a single dict is accepted too), shared_params {alias: source},
//     dp_world_size, and for frozen parameters (requires_grad=False) frozen_param_shapes +
//     frozen_param_fragments (stage 3: each rank's partition in its own
//     zero_pp_rank_<r>_mp_rank_00_model_states.pt; deepspeed_frozen.h). Frozen BF16/F16
//     fragments are written widened to F32.
//   [bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt, r = 0..N-1: optimizer_state_dict with
//     zero_stage, partition_count N (an int or one per group) and the fp32 master partition:
//     stage 1-2 single_partition_of_fp32_groups: per group g, rank r's 1-D slice of the group's
//       flat vector (params flattened in order, zero-padded at the end to a multiple of 2N);
//       full group = concat over ranks; param i = the next numel_i elements, viewed to its shape.
//     stage 3 fp32_flat_groups: per rank a list of sub-group flats, read as one vector; with a
//       running per-rank offset o over the params of all groups in order and p = ceil(n / N),
//       param = concat over ranks of rank_r[o, o + p), first n elements; o += p.
// Output (output_dir, created): model.safetensors, or with max_shard_size_bytes > 0 and more
// than one shard model-0000k-of-0000n.safetensors + model.safetensors.index.json (split as
// huggingface_hub does: PlanShards in consolidate.h); every tensor F32, __metadata__
// {"format": "pt"}. Names are param_shapes' names (HF module names such as
// model.layers.0.self_attn.q_proj.weight) with any leading "module." wrapper prefix removed.
// Tied weights are written once: an alias in shared_params is not written (HF convention: for
// lm_head.weight <-> model.embed_tokens.weight the tensor is written as model.embed_tokens.weight)
// and is listed in skipped_tensors. Each file is written crash-safely (AtomicFileWriter).
//
// Memory: the metadata tree of the rank-0 model states plus that of one other file at a time, a
// list of (file, byte offset, elements) pieces per tensor, one piece buffer (and, for bf16/fp16
// frozen parameters, its fp32 widening) and the writer's 1 MiB buffer: independent of model size.
//
// Errors (each message names the file concerned):
//   NOT_FOUND            DIR, the tag directory, the model-states file or every optim file absent.
//   FAILED_PRECONDITION  a missing rank file (names the expected path), more or fewer optim files
//                        than partition_count, or dp_world_size / zero_stage disagreeing.
//   DATA_LOSS            a truncated archive or a storage record shorter than its tensor.
//   INVALID_ARGUMENT     a pickle outside the subset torch.save writes (deepspeed_pickle.h), a
//                        missing or mistyped key, a non-fp32 or non-contiguous partition, param
//                        shapes whose numels do not match the partitions, duplicate output names.
//                        A frozen parameter whose fragment is missing, of the wrong size or dtype
//                        (deepspeed_frozen.h) is INVALID_ARGUMENT naming its model-states file.
//   UNIMPLEMENTED        persistent buffers (not consolidated yet), stage 0.
// Thread-compatible: distinct output directories may be written concurrently.
#ifndef LOOM_STORAGE_CHECKPOINT_DEEPSPEED_CONSOLIDATE_H_
#define LOOM_STORAGE_CHECKPOINT_DEEPSPEED_CONSOLIDATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::storage {

struct DeepSpeedConsolidateOptions {
  std::string tag;                    // "" = the contents of DIR/latest, else DIR itself
  int64_t piece_bytes = 1 << 20;      // bytes per pread of a partition (rounded to 4)
  int64_t max_shard_size_bytes = 0;   // 0 = one model.safetensors (see ParseShardSize)
};

struct DeepSpeedConsolidateResult {
  std::string checkpoint_dir;   // the tag directory read
  int zero_stage = 0;
  int world_size = 0;           // N, the number of rank files
  int64_t num_tensors = 0;
  int64_t tensor_bytes = 0;
  int64_t safetensors_bytes = 0;
  std::vector<std::string> files;     // safetensors files written (full paths)
  std::string index_path;             // model.safetensors.index.json when sharded, else ""
  std::vector<std::string> skipped_tensors;  // tied aliases not written
  double seconds = 0;
};

absl::StatusOr<DeepSpeedConsolidateResult> ConsolidateDeepSpeed(
    const std::string& dir, const std::string& output_dir,
    const DeepSpeedConsolidateOptions& options = {});

}  // namespace loom::storage

#endif  // LOOM_STORAGE_CHECKPOINT_DEEPSPEED_CONSOLIDATE_H_
