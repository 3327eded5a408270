// Checkpoint I/O of one rank's training state: its shard of a step checkpoint (fp32 master,
// exp_avg, exp_avg_sq sections in the per-parameter partition layout of every ZeRO stage,
// storage/checkpoint/shard_format.h), resume from one, and the final-logits file.
//
// Shards are streamed piece by piece — one parameter partition, or one offload sub-group when
// the offload optimizer owns the state — so saving needs one piece of memory rather than a
// copy of the rank's 12 bytes per element of state. The loss-scaler state (identical on every
// rank) is written by rank 0 before its manifest, which is part of what commits the checkpoint.
//
// Thread-safety: none; called from the training thread. All ranks call WriteShards / Load /
// WriteFinalLogits together (stage 0 all-gathers each piece; the final logits all-gather the
// model). Errors: the shard format's (naming the file); Load returns FAILED_PRECONDITION naming
// resume_from and the directory for a world size, parameter list, section list or loss-scaler
// file that does not match this run.
#ifndef LOOM_WORKER_ENGINE_CHECKPOINT_IO_H_
#define LOOM_WORKER_ENGINE_CHECKPOINT_IO_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "data/corpus.h"
#include "storage/checkpoint/shard_format.h"
#include "worker/engine/engine_options.h"
#include "worker/engine/trajectory.h"

namespace loom::storage {
struct ShardManifest;
}  // namespace loom::storage

namespace loom::engine {

class Collectives;
class LossScaler;
class LlamaModel;
class ZeroProvider;
namespace offload {
class OffloadOptimizer;
}  // namespace offload

// What a checkpoint records besides the partitions.
struct CheckpointMeta {
  int64_t optimizer_step = 0;             // committed optimizer steps (skipped ones excluded)
  std::map<std::string, double> metrics;  // e.g. train_loss, eval_loss of this step (retention)
  std::vector<storage::SideFile> side_files;  // this rank's technique state files (manifest)
};

// The trajectory dump's shape for this rank of a run resumed at `start_step` (0: fresh).
TrajectoryShape TrajectoryShapeFor(const EngineOptions& options, int rank, int world_size,
                                   int64_t start_step);

class CheckpointIo {
 public:
  // `offload`: the offload optimizer that owns master and moments, or null when the model's
  // partition tensors hold them. Every reference must outlive this object.
  // `model`: the parameter state (partitions); `llama`: the model written against it (final
  // logits).
  CheckpointIo(const EngineOptions& options, Collectives& collectives, ZeroProvider& model,
               LlamaModel& llama, offload::OffloadOptimizer* offload, LossScaler& scaler);

  // This rank's shard of a checkpoint of `step` under base_dir/<StepDirName(step)>.
  absl::Status WriteShards(const std::string& base_dir, int64_t step, const CheckpointMeta& meta);
  // Loads step_dir (verified, size and CRC-32, before anything is loaded) into the model or the
  // offload optimizer and the loss scaler; refreshes the model's working parameters.
  // *step: the checkpoint's step; *optimizer_step: its committed optimizer steps.
  absl::Status Load(const std::string& step_dir, int64_t* step, int64_t* optimizer_step);
  // Rank 0 writes <checkpoint_dir>/final_logits.json: the first 32 tokens of `heldout` (fewer
  // if the context or corpus is shorter) and the model's fp32 logits [tokens, vocab] for them.
  // Every rank must call it (the forward all-gathers). No-op without a checkpoint_dir.
  absl::Status WriteFinalLogits(const data::TokenStream& heldout);
  // --trajectory_dir: the weights as an HF export <trajectory dir>/<name>: every rank writes its
  // shard under shards_dir, passes a barrier, then rank 0 consolidates.
  absl::Status ExportTrajectoryWeights(TrajectoryRecorder& trajectory,
                                       const std::string& shards_dir, int64_t step,
                                       const std::string& name, const CheckpointMeta& meta);

 private:
  // Where the sections are cut for streaming: after every parameter partition, or after every
  // offload sub-group.
  std::vector<int64_t> PieceEnds(const storage::ShardManifest& m) const;
  // The model's fp32 master partitions (null when the parameters live on NVMe).
  std::vector<float*> MasterPointers() const;

  const EngineOptions& o_;
  Collectives& coll_;
  ZeroProvider& model_;
  LlamaModel& llama_;
  offload::OffloadOptimizer* const offload_;
  LossScaler& scaler_;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_CHECKPOINT_IO_H_
