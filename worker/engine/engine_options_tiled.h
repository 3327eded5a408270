// The training.tiled_* fields of the job spec (ALST tiled compute, issue 13; docs/job-spec.md),
// for engine_options.cc and the scheduler's submission checks. Pure and thread-safe.
#ifndef LOOM_WORKER_ENGINE_ENGINE_OPTIONS_TILED_H_
#define LOOM_WORKER_ENGINE_ENGINE_OPTIONS_TILED_H_

#include "absl/status/status.h"
#include "proto/common.pb.h"
#include "worker/engine/tiled_compute_options.h"

namespace loom::engine {

// Fills `out` from training.tiled_mlp_compute / tiled_mlp_tile_size / tiled_logits_loss /
// tiled_logits_loss_tile_size. INVALID_ARGUMENT naming the field for a negative tile size, or
// for a tile size given while its switch is off (a typo would otherwise be silently ignored).
absl::Status ParseTiledCompute(const loom::v1::TrainingSpec& training, TiledComputeOptions* out);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_ENGINE_OPTIONS_TILED_H_
