// Checkpoint commit detection and consolidation of ZeRO-3 rank shards (shard_format.h) into a
// Hugging Face model directory: model.safetensors (F32, HF tensor names, __metadata__
// {"format": "pt"}) + config.json. No LibTorch, no gRPC.
//
// Reconstruction follows DeepSpeed's zero_to_fp32.py for stage 3 (TECHNIQUES.md §5.2 step 4):
// for a parameter of numel n and shape S with p = ceil(n / N),
//   full = concat over ranks r = 0..N-1 of rank_r.fp32_params[offset : offset + p],
//   truncated to the first n elements, viewed as S,
// where `offset` is the parameter's partition_offset (the same on every rank). The bytes are
// streamed straight from the shards (pread) to the output, so memory stays at one I/O buffer per
// call regardless of model size.
//
// Thread-compatible: distinct checkpoint/output directories may be processed concurrently; two
// consolidations into the same output directory from one process must be serialised by the
// caller (temporary file names carry the process id).
#ifndef LOOM_STORAGE_CHECKPOINT_CONSOLIDATE_H_
#define LOOM_STORAGE_CHECKPOINT_CONSOLIDATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::storage {

// One step_XXXXXXXX directory of a job's checkpoint directory.
struct CheckpointInfo {
  int64_t step = 0;
  std::string path;                   // <checkpoint_dir>/step_XXXXXXXX
  int32_t world_size = 0;             // from the lowest-ranked readable manifest; 0 if none
  std::vector<int32_t> ranks_reported;  // ranks whose manifest is present, ascending
  std::vector<int32_t> missing_ranks;   // ranks in [0, world_size) without a manifest
  // Bytes of the rank shard and manifest files present (not of temporaries or outputs).
  int64_t total_bytes = 0;
  // True when all world_size manifests are present, readable and consistent (same format, step,
  // world size, params, sections), and every shard file has the size its manifest records.
  // (CRC-32s are checked by Consolidate, not here: listing does not read shard contents.)
  bool committed = false;
  // OK when committed; otherwise why not: FAILED_PRECONDITION for missing ranks or manifests that
  // disagree, DATA_LOSS for an unreadable manifest or a missing or wrongly sized shard. The
  // message names the step directory and the ranks/files concerned.
  absl::Status commit_status;
};

// Every step directory of `checkpoint_dir` (names "step_" + digits that StepDirName reproduces;
// temporaries such as "*.tmp.<pid>" are ignored), sorted by step ascending.
// NOT_FOUND if `checkpoint_dir` does not exist; INTERNAL on other I/O errors.
absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& checkpoint_dir);

// The committed checkpoint with the highest step. NOT_FOUND if `checkpoint_dir` or any checkpoint
// is absent; FAILED_PRECONDITION (naming the newest partial one) if none is committed.
absl::StatusOr<CheckpointInfo> NewestCommittedCheckpoint(const std::string& checkpoint_dir);

struct ConsolidateOptions {
  // Check every shard's CRC-32 (streamed) before writing anything.
  bool verify_checksums = true;
  // Size of the single read buffer used for checksums and tensor copies.
  int64_t io_buffer_bytes = 4 << 20;
};

struct ConsolidateResult {
  int64_t step = 0;
  std::string output_dir;
  std::string safetensors_path;  // <output_dir>/model.safetensors
  std::string config_path;       // <output_dir>/config.json
  int64_t num_tensors = 0;
  int64_t safetensors_bytes = 0;  // size of model.safetensors
  int64_t tensor_bytes = 0;       // bytes of tensor data in it
  // Parameters present in the shards but not written (lm_head.weight under tied embeddings).
  std::vector<std::string> skipped_tensors;
  double seconds = 0;
};

// <checkpoint_dir>/step_XXXXXXXX/hf: where Consolidate writes when `output_dir` is empty.
std::string DefaultConsolidationDir(const std::string& checkpoint_dir, int64_t step);

// Consolidates checkpoint `step` of `checkpoint_dir` (0 = the newest committed one) into
// `output_dir` (created if needed; "" = DefaultConsolidationDir). Writes config.json (the
// manifest's model_config, pretty-printed, indent 2) then model.safetensors, each atomically
// (temporary name, fsync, rename): a killed run leaves nothing at the final names it had not
// finished, so a model.safetensors at its final name means the output is complete. A rerun
// overwrites a previous output and removes temporaries left by dead processes.
// If model_config.tie_word_embeddings is true, "lm_head.weight" is not written (HF convention: the
// embedding holds the tied tensor); every tensor is written under exactly one name.
// Errors:
//   NOT_FOUND            the directory or the requested step does not exist, or no checkpoint at all.
//   FAILED_PRECONDITION  the checkpoint is not committed: names the missing ranks, or the
//                        disagreeing manifests; or no committed checkpoint exists (step 0).
//   DATA_LOSS            a shard's size or CRC-32 differs from its manifest (names file and rank),
//                        an unreadable manifest, or a shard shorter than its layout.
//   INVALID_ARGUMENT     the manifest describes an unwritable model (duplicate names, no
//                        fp32_params section, model_config not a JSON object).
//   others               I/O errors of the output (e.g. RESOURCE_EXHAUSTED when the disk is full).
absl::StatusOr<ConsolidateResult> Consolidate(const std::string& checkpoint_dir, int64_t step,
                                              const std::string& output_dir,
                                              const ConsolidateOptions& options = {});

}  // namespace loom::storage

#endif  // LOOM_STORAGE_CHECKPOINT_CONSOLIDATE_H_
