// The job spec's ALST tiled-compute switches (training.tiled_*; docs/job-spec.md), as the engine
// reads them. ArcticTraining's name where it has one (tiled_mlp_compute). Torch-free, plain data.
#ifndef LOOM_SPEC_TILED_COMPUTE_OPTIONS_H_
#define LOOM_SPEC_TILED_COMPUTE_OPTIONS_H_

#include <cstdint>

namespace loom::spec {

struct TiledComputeOptions {
  bool mlp = false;          // training.tiled_mlp_compute: TiledMlp in every decoder layer
  int64_t mlp_tile_size = 0;   // training.tiled_mlp_tile_size: tokens per tile, 0 = hidden_size
  bool logits_loss = false;  // training.tiled_logits_loss: TiledLogitsLoss as the loss head
  int64_t logits_loss_tile_size = 0;  // training.tiled_logits_loss_tile_size: tokens per tile,
                                      // 0 = rows of 64 MiB fp32 logits
};

}  // namespace loom::spec

#endif  // LOOM_SPEC_TILED_COMPUTE_OPTIONS_H_
