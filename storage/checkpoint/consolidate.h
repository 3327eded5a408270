// Checkpoint commit detection and consolidation of ZeRO-3 rank shards (shard_format.h) into a
// Hugging Face model directory: model.safetensors, or model-0000k-of-0000n.safetensors shards +
// model.safetensors.index.json (F32 or BF16, HF tensor names, __metadata__ {"format": "pt"}) +
// config.json. Also checkpoint verification and deletion. No LibTorch, no gRPC.
//
// Reconstruction follows DeepSpeed's zero_to_fp32.py for stage 3 (docs/design/TECHNIQUES.md §5.2
// step 4): for a parameter of numel n and shape S with p = ceil(n / N),
//   full = concat over ranks r = 0..N-1 of rank_r.fp32_params[offset : offset + p],
//   truncated to the first n elements, viewed as S,
// where `offset` is the parameter's partition_offset (the same on every rank). The bytes are
// streamed from the shards to the output through short-lived read-only maps of io_buffer_bytes
// (mapped_chunks.h: the CRC-32 and the write read the page cache's pages, no pread copy), so
// memory stays at one mapped chunk regardless of model size. For F32 the copy runs inside the
// kernel (copy_file_range) while a second thread checksums the next chunk (overlapped_copy.h).
//
// Memory: one mapped chunk (F32: one per thread, and the checker thread's stack; BF16: plus half
// of one), the writer's 1 MiB buffer, and under 100 bytes per (tensor, rank) of copy and
// checksum bookkeeping. Shards must not be truncated while a consolidation
// reads them (committed shards are never rewritten).
// Thread-compatible: distinct checkpoint/output directories may be processed concurrently; two
// consolidations into the same output directory from one process must be serialised by the
// caller (temporary file names carry the process id).
#ifndef LOOM_STORAGE_CHECKPOINT_CONSOLIDATE_H_
#define LOOM_STORAGE_CHECKPOINT_CONSOLIDATE_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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
  // The training metrics recorded with the checkpoint (lowest-ranked readable manifest).
  std::map<std::string, double> metrics;
  // True when all world_size manifests are present, readable and consistent (same format, step,
  // world size, params, sections), and every shard file has the size its manifest records.
  // (CRC-32s are checked by Consolidate, not here: listing does not read shard contents.)
  bool committed = false;
  // OK when committed; otherwise why not: FAILED_PRECONDITION for missing ranks or manifests that
  // disagree, DATA_LOSS for an unreadable manifest or a missing or wrongly sized shard. The
  // message names the step directory and the ranks/files concerned.
  absl::Status commit_status;
  // Marked corrupt (corrupt_mark.h: a verification after the commit found a bad shard): then
  // committed is false, corrupt_reason says what failed and commit_status is DATA_LOSS.
  bool corrupt = false;
  std::string corrupt_reason;
};

// Every step directory of `checkpoint_dir` (names "step_" + digits that StepDirName reproduces;
// temporaries such as "*.tmp.<pid>" are ignored), sorted by step ascending.
// NOT_FOUND if `checkpoint_dir` does not exist; INTERNAL on other I/O errors.
absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& checkpoint_dir);

// The committed checkpoint with the highest step. NOT_FOUND if `checkpoint_dir` or any checkpoint
// is absent; FAILED_PRECONDITION (naming the newest partial one) if none is committed.
absl::StatusOr<CheckpointInfo> NewestCommittedCheckpoint(const std::string& checkpoint_dir);

struct ConsolidateOptions {
  // Check every shard's CRC-32 (streamed); on a mismatch nothing is published.
  bool verify_checksums = true;
  // false (default): each byte the copy reads is checksummed as it passes, the rest of each shard
  // (optimizer sections, padding, skipped tensors) is read afterwards, and the pieces are
  // combined in file order (zlib crc32_combine) before anything is published; the parameters are
  // read once. true: a full checksum pass before writing anything (reads them twice).
  bool checksum_before_writing = false;
  // F32 output, checksums on the copy's bytes (checksum_before_writing false): true (default) =
  // a checker thread computes the CRC-32 of chunk k + 1 while chunk k is copied
  // (overlapped_copy.h), so the checksum is off the copy's critical path; false = one thread,
  // each chunk checksummed just before it is copied. Same output bytes, same checks.
  bool overlap_checksums = true;
  // Start asynchronous writeback of the output every this many bytes (sync_file_range), so the
  // disk writes while the copy goes on and the final fsync has little left; 0 = only the fsync.
  int64_t writeback_bytes = 32 << 20;
  // Bytes mapped at a time for checksums and tensor copies (rounded up to a multiple of 4
  // bytes).
  int64_t io_buffer_bytes = 4 << 20;
  // Output dtype: "F32" (bit-exact copy of the fp32 master weights) or "BF16" (round to nearest
  // even, Fp32ToBf16).
  std::string dtype = "F32";
  // 0 = one model.safetensors. Otherwise split as huggingface_hub's
  // split_torch_state_dict_into_shards does with this max_shard_size (bytes of tensor data per
  // file; a tensor larger than it gets a file of its own); more than one shard gives
  // model-0000k-of-0000n.safetensors + model.safetensors.index.json. See ParseShardSize.
  int64_t max_shard_size_bytes = 0;
};

// "5GB" -> 5'000'000'000. Accepts a non-negative decimal number (fractions allowed: "1.5GB") with
// an optional unit B, KB, MB, GB, TB (decimal, powers of 1000, case-insensitive, as
// huggingface_hub.parse_size_to_int), or KiB, MiB, GiB, TiB (powers of 1024); a plain integer is
// bytes. "" = 0 (no sharding). INVALID_ARGUMENT otherwise, or for a positive value under 1 byte.
absl::StatusOr<int64_t> ParseShardSize(absl::string_view text);

// "F32"/"fp32"/"float32" -> "F32", "BF16"/"bf16"/"bfloat16" -> "BF16", "" -> "F32".
// INVALID_ARGUMENT naming the value otherwise.
absl::StatusOr<std::string> NormalizeOutputDtype(absl::string_view text);

// fp32 -> bfloat16 bits with round-to-nearest-even, as PyTorch's c10::round_to_nearest_even:
// NaN -> 0x7FC0; otherwise (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 (so values past the
// largest bf16 round to infinity). Thread-safe.
uint16_t Fp32ToBf16(float value);

// One output file of a sharded export: tensor names (in state-dict order) and tensor bytes.
struct ShardPlanFile {
  std::string file_name;  // "model.safetensors" or "model-00001-of-00003.safetensors"
  std::vector<std::string> tensors;
  int64_t tensor_bytes = 0;
};

// huggingface_hub.split_torch_state_dict_into_shards (serialization/_base.py) over
// (name, bytes) in state-dict order: a tensor larger than `max_shard_size_bytes` is a shard of its
// own (appended at once); otherwise a new shard starts when the current one would exceed the
// limit. One shard -> "model.safetensors"; else "model-%05d-of-%05d.safetensors" in list order.
// max_shard_size_bytes <= 0 means one file.
std::vector<ShardPlanFile> PlanShards(const std::vector<std::pair<std::string, int64_t>>& tensors,
                                      int64_t max_shard_size_bytes);

struct ConsolidateResult {
  int64_t step = 0;
  std::string output_dir;
  // <output_dir>/model.safetensors for one file; the index path for a sharded export.
  std::string safetensors_path;
  std::string config_path;       // <output_dir>/config.json
  // Every safetensors file written, in shard order (full paths).
  std::vector<std::string> files;
  // <output_dir>/model.safetensors.index.json when sharded, else "".
  std::string index_path;
  std::string dtype;             // "F32" or "BF16"
  int64_t num_tensors = 0;
  int64_t safetensors_bytes = 0;  // total size of the safetensors files
  int64_t tensor_bytes = 0;       // bytes of tensor data in it
  // Parameters present in the shards but not written (lm_head.weight under tied embeddings).
  std::vector<std::string> skipped_tensors;
  double seconds = 0;
};

// Where Consolidate writes when `output_dir` is empty: <checkpoint_dir>/step_XXXXXXXX/hf for the
// fp32 export ("F32", the master weights bit for bit) and .../hf-bf16 for "BF16", so that the
// two exports of one step never overwrite each other. `dtype` as NormalizeOutputDtype returns it.
std::string DefaultConsolidationDir(const std::string& checkpoint_dir, int64_t step,
                                    const std::string& dtype = "F32");

// Consolidates checkpoint `step` of `checkpoint_dir` (0 = the newest committed one) into
// `output_dir` (created if needed; "" = DefaultConsolidationDir). Streams tensor by tensor: memory
// is one I/O buffer (plus half of it for BF16) and the writer's buffer, independent of model size.
// Crash safety: every file (config.json: the manifest's model_config, indent 2; the safetensors
// files; the index) is first written and fsynced inside a staging directory
// <output_dir>/.consolidate.tmp.<pid>; only when all are complete are the previous outputs
// removed and the new files renamed into place, the completion marker last
// (model.safetensors.index.json when sharded, else model.safetensors). So a run killed while
// writing leaves nothing at the final names, and a marker at its final name means the output is
// complete. A rerun overwrites a previous output and removes staging directories and temporaries
// left by dead processes.
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

// Verifies one step directory: the commit rules of ListCheckpoints plus every shard's CRC-32
// (streamed). OK with the CheckpointInfo when valid; otherwise the first problem: NOT_FOUND if the
// directory does not exist, FAILED_PRECONDITION (missing ranks, disagreeing manifests),
// DATA_LOSS naming the file and rank (unreadable manifest, wrong size, CRC-32 mismatch).
// `step_dir` must be named step_<8 digits>.
absl::StatusOr<CheckpointInfo> VerifyCheckpointDir(const std::string& step_dir,
                                                   int64_t io_buffer_bytes = 4 << 20);

struct DeleteResult {
  bool deleted = false;  // false if the step did not exist (deletion is idempotent)
};

// A step whose directory was moved aside for deletion (<checkpoint_dir>/.deleting.step_<S>.<id>)
// and is still on disk: a deletion in progress, one cut short by a crash, or one whose files
// could not be removed. Its bytes still use disk; listings must show it until they are gone.
struct PendingDeletion {
  int64_t step = 0;
  std::string path;    // the moved-aside directory (or the step directory, if it could not move)
  int64_t bytes = 0;   // bytes of the regular files still in it
  // Why the last removal of it failed, naming the file and the OS error (PERMISSION_DENIED for
  // EACCES/EPERM); OK when none was tried (ListPendingDeletions).
  absl::Status status;
};

// The pending deletions of `checkpoint_dir`, by step ascending; removes nothing. NOT_FOUND (or
// another error of opendir) if the directory cannot be listed.
absl::StatusOr<std::vector<PendingDeletion>> ListPendingDeletions(const std::string& checkpoint_dir);

// Tries once more to remove every pending deletion of `checkpoint_dir`, whichever process moved
// it aside (a moved-aside step is never needed again, and two processes removing the same tree
// is harmless). Returns those still there, each with its removal error. Errors as
// ListPendingDeletions.
absl::StatusOr<std::vector<PendingDeletion>> RetryPendingDeletions(
    const std::string& checkpoint_dir);

// OK if `failed` is empty; else the first failure's code, with a message that names every failed
// step with its path and error (at most 8, then a count) and says that their bytes stay on disk
// until a later deletion or retention removes them. `what` leads the message (e.g. the
// directory).
absl::Status DeletionFailures(absl::string_view what, const std::vector<PendingDeletion>& failed);

// Deletes checkpoint `step` of `checkpoint_dir` (the whole step directory, with any consolidated
// output inside it): renames it to .deleting.step_<S>.<pid> (atomic: it leaves the committed
// listing at once), fsyncs the directory, then removes the tree. FAILED_PRECONDITION, deleting
// nothing, if `step` is the newest committed checkpoint or is in `protected_steps` (e.g. one an
// attempt is resuming from).
// Idempotent: OK with deleted = false when the step is absent and nothing of it is pending; a
// pending deletion of `step` (an earlier call that failed, or a crash) is retried: OK with
// deleted = true once its files are gone. A removal that fails returns its error naming the
// file and the OS error (PERMISSION_DENIED for EACCES/EPERM); the step then stays a pending
// deletion (ListPendingDeletions) until a later call removes it. Also retries the pending
// deletions of other steps (their failures do not fail this call).
absl::StatusOr<DeleteResult> DeleteCheckpoint(const std::string& checkpoint_dir, int64_t step,
                                              const std::vector<int64_t>& protected_steps = {});

// Retention: keep the newest `keep_last` committed checkpoints, and also the `keep_best`
// committed ones with the lowest `best_metric` (a metric the trainer recorded in the manifests,
// e.g. "eval_loss"; checkpoints without it do not compete).
struct RetentionPolicy {
  int32_t keep_last = 1;  // >= 1
  int32_t keep_best = 0;  // >= 0
  std::string best_metric = "eval_loss";
};

struct RetentionResult {
  std::vector<int64_t> deleted_steps;  // ascending: removed by this call (pending ones included)
  std::vector<int64_t> kept_steps;     // ascending, committed and partial
  // Doomed steps (by this call or an earlier one) whose files could not be removed, by step;
  // they stay on disk as pending deletions. DeletionFailures() turns them into a status.
  std::vector<PendingDeletion> failed;
};

// Applies `policy` to `checkpoint_dir`: deletes committed checkpoints older than the newest
// `keep_last` committed ones, and partial checkpoints older than the newest committed one (a partial
// one newer than it may still be being written and is kept). Never deletes the newest committed
// checkpoint or a step in `protected_steps`. With no committed checkpoint, deletes nothing.
// Retries pending deletions first. A step that cannot be moved aside or removed does not stop
// the others: it is reported in `failed` (OK status), and a later call retries it.
// Cost: one scan of the step directories and two directory syncs per call however many steps
// it deletes (the doomed steps are all moved aside, synced once, removed, synced again).
// INVALID_ARGUMENT if keep_last < 1 or keep_best < 0; errors of ListCheckpoints and of the
// directory syncs.
absl::StatusOr<RetentionResult> ApplyRetention(const std::string& checkpoint_dir,
                                               const RetentionPolicy& policy,
                                               const std::vector<int64_t>& protected_steps = {});

// Test only: the remove(3) that deletions use (nullptr = ::remove). Lets a test make files
// undeletable where it runs as root on a file system without immutable files. Not thread-safe
// with respect to deletions in progress; set it before and reset it after.
void TEST_SetRemoveFunction(int (*remove)(const char* path));

}  // namespace loom::storage

#endif  // LOOM_STORAGE_CHECKPOINT_CONSOLIDATE_H_
