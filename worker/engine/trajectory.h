// Trajectory dump of one training run, for a reference that shares no code with the engine
// (tests/python/reference_trajectory.py replays it in plain PyTorch). Enabled by
// `loom-trainer --trajectory_dir=DIR` (EngineOptions::trajectory_dir); off by default.
//
// Layout of DIR (docs/job-spec.md, "Trajectory dump"):
//   initial_hf/{model.safetensors,config.json}  the weights before the first step (F32), written
//                                              by the consolidation exporter users run
//                                              (storage/checkpoint/consolidate.h) from a
//                                              checkpoint of the start step in initial_shards/
//   final_hf/{model.safetensors,config.json}    the weights after the last step, same path
//                                              (shards in final_shards/)
//   tokens_rank_<r>.bin                        every training window rank r ran, in order
//                                              (step, micro-step, row): int64 little-endian,
//                                              shape [steps - start_step, GAS, micro, window]
//                                              with window = sequence_length + 1 (inputs are
//                                              columns [0, window-1), targets [1, window))
//   tokens_rank_<r>.json                       {"rank","dtype":"int64-le","shape":[...],
//                                              "start_step"} describing that file
//   positions_rank_<r>.bin                     dataset.pack_documents only: the position id
//                                              of every token of tokens_rank_<r>.bin (same
//                                              shape and dtype; 0 where a document starts,
//                                              data/corpus.h PackedPositions)
//   trajectory.json                            rank 0: {"format":"loom-trajectory-v1",
//                                              "world_size","start_step","steps",
//                                              "gradient_accumulation_steps",
//                                              "micro_batch_size","sequence_length",
//                                              "pack_documents",
//                                              "steps_run":[{"step","loss","lr",
//                                              "grad_norm","skipped"}...]}
//                                              loss is the rank-mean of the micro-step mean
//                                              cross-entropy; grad_norm the global norm before
//                                              clipping (unscaled); lr the step's learning rate
// trajectory.json and final_hf/ are written only when the run reaches its last step.
//
// Thread-compatible (one recorder per rank, used by the training thread only).
#ifndef LOOM_WORKER_ENGINE_TRAJECTORY_H_
#define LOOM_WORKER_ENGINE_TRAJECTORY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/file_util.h"

namespace loom::engine {

struct TrajectoryShape {
  int rank = 0;
  int world_size = 1;
  int64_t start_step = 0;        // optimizer steps done before this run (resume step)
  int64_t steps = 0;             // the step the run trains up to
  int64_t gradient_accumulation_steps = 1;
  int64_t micro_batch_size = 1;  // rows per micro-batch on this rank
  int64_t window = 0;            // tokens per row (this rank's sequence length + 1)
  int64_t sequence_length = 0;   // the job's training.sequence_length
  bool pack_documents = false;   // dataset.pack_documents: positions_rank_<r>.bin is written
};

class TrajectoryRecorder {
 public:
  // Creates `dir` (and parents) and starts tokens_rank_<rank>.bin (published by Finish).
  // INVALID_ARGUMENT naming --trajectory_dir when `dir` is empty; FAILED_PRECONDITION naming
  // the directory when it already holds a dump (initial_shards/ or final_shards/ exist: a
  // trajectory is written into a fresh directory); I/O errors (naming the file) otherwise.
  // Call on every rank before any rank writes shards (the engine passes a barrier after it).
  static absl::StatusOr<std::unique_ptr<TrajectoryRecorder>> Open(const std::string& dir,
                                                                  const TrajectoryShape& shape);
  // Appends one micro-batch: `rows` x `window` int64 token ids, row-major, and with
  // pack_documents their position ids (same shape; required then, ignored otherwise).
  // INVALID_ARGUMENT on a shape other than [micro_batch_size, window] or missing positions;
  // INTERNAL on write errors (naming the file).
  absl::Status AppendBatch(const int64_t* tokens, int64_t rows, int64_t window,
                           const int64_t* positions = nullptr);

  // Remembers one finished optimizer step (1-based `step`) for trajectory.json.
  void RecordStep(int64_t step, double loss, double lr, double grad_norm, bool skipped);

  // Where the engine writes the checkpoint shards of the start / final weights (every rank).
  std::string InitialShardsDir() const { return dir_ + "/initial_shards"; }
  std::string FinalShardsDir() const { return dir_ + "/final_shards"; }

  // Rank 0 only, after every rank's shards of `shards_dir` are written (barrier): consolidates
  // its checkpoint of `step` into DIR/<name> (model.safetensors F32 + config.json), the same
  // call `loomctl consolidate` makes. Errors of storage::Consolidate.
  absl::Status ExportHf(const std::string& shards_dir, int64_t step,
                        const std::string& name) const;

  // Publishes the token file (fsync, rename), writes tokens_rank_<r>.json and, on rank 0, trajectory.json.
  // FAILED_PRECONDITION when fewer batches than [steps - start_step] x GAS were appended.
  absl::Status Finish();

 private:
  TrajectoryRecorder(std::string dir, const TrajectoryShape& shape) : dir_(std::move(dir)),
                                                                      shape_(shape) {}
  struct Step {
    int64_t step;
    double loss, lr, grad_norm;
    bool skipped;
  };
  std::string dir_;
  TrajectoryShape shape_;
  std::optional<AtomicFileWriter> tokens_;
  std::optional<AtomicFileWriter> positions_;  // pack_documents only
  int64_t batches_ = 0;
  std::vector<Step> steps_;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_TRAJECTORY_H_
