// The Trainer's side of ZenFlow (zero_optimization.zenflow; optim/zenflow_pipeline.h): builds the
// pipeline over a ZeRO provider's partitions, splits the rank's threads between the training
// loop and the CPU optimizer (pt_reserved_cores_perc), and saves / loads the pipeline's state
// next to a checkpoint's shards so that a resumed run continues bit for bit.
//
// State file: <step dir>/zenflow_rank<r>.bin, written atomically (temporary file + rename) before
// the rank's shard, so a committed checkpoint always has it; the rank's manifest lists it as a
// side file (size, CRC-32: storage/checkpoint/shard_format.h), so checkpoint verification covers
// it and loading refuses a file of another rank or step. Format (little-endian): magic
// "LOOMZF02", the CRC-32 (zlib) of everything after it, u64 tensor count, then per tensor: u64
// name length, name bytes, u8 dtype (0 fp32, 1 int64, 2 fp64), u64 numel, the values. Files of
// format "LOOMZF01" (the same without the leading CRC, which ended the file instead) are read.
//
// Thread-safety: the training thread. Errors: INVALID_ARGUMENT naming the zenflow key for a
// configuration the engine cannot run; file errors naming the file (NOT_FOUND for a missing
// state file when resuming a ZenFlow run, DATA_LOSS for a corrupt one or one that does not
// match the rank's manifest).
#ifndef LOOM_WORKER_ENGINE_ZENFLOW_SETUP_H_
#define LOOM_WORKER_ENGINE_ZENFLOW_SETUP_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "storage/checkpoint/shard_format.h"
#include "worker/engine/collectives.h"
#include "worker/engine/engine_options.h"
#include "worker/engine/optim/zenflow_pipeline.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {

// DeepSpeed's _split_affinity (ZF-U2) on a thread count: the training loop keeps
// ceil(perc * threads), the CPU optimizer gets the rest; if that leaves either side with none,
// both use every thread. Returns {training, optimizer}.
std::pair<int, int> SplitZenFlowThreads(int threads, double pt_reserved_cores_perc);

// The pipeline over model's partitions (master, grad, exp_avg, exp_avg_sq of every parameter;
// 2-D parameters by their [out, in] shape). steps_per_epoch: the data's epoch length in steps
// (0 = unknown), used by select_strategy "epoch" / "auto" unless the config gives its own.
absl::StatusOr<std::unique_ptr<optim::ZenFlowPipeline>> MakeTrainerZenFlow(
    const EngineOptions& options, Collectives& collectives, ZeroProvider& model,
    int64_t steps_per_epoch);

std::string ZenFlowStateFile(const std::string& step_dir, int rank);
// Returns the file as the rank's manifest lists it (storage::SideFile: name, bytes, CRC-32), so
// that verifying the checkpoint covers it.
absl::StatusOr<storage::SideFile> SaveZenFlowState(optim::ZenFlowPipeline& pipeline,
                                                   const std::string& step_dir, int rank);
// `step`: the checkpoint's step, which bounds every step count in the file (a larger one is
// refused: INVALID_ARGUMENT). DATA_LOSS for a file that fails its CRC-32, its manifest entry or
// its framing; NOT_FOUND when it is missing.
absl::Status LoadZenFlowState(optim::ZenFlowPipeline& pipeline, const std::string& step_dir,
                              int rank, int64_t step);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_ZENFLOW_SETUP_H_
