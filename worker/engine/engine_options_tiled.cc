#include "worker/engine/engine_options_tiled.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace loom::engine {
namespace {

absl::Status CheckTileSize(const char* field, int64_t size, bool on, const char* switch_name) {
  if (size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.", field, ": ", size, " must be >= 0 (0 = the default rule)"));
  }
  if (size > 0 && !on) {
    return absl::InvalidArgumentError(absl::StrCat("training.", field, ": set while training.",
                                                   switch_name, " is false"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseTiledCompute(const loom::v1::TrainingSpec& training, TiledComputeOptions* out) {
  out->mlp = training.tiled_mlp_compute();
  out->mlp_tile_size = training.tiled_mlp_tile_size();
  out->logits_loss = training.tiled_logits_loss();
  out->logits_loss_tile_size = training.tiled_logits_loss_tile_size();
  absl::Status st =
      CheckTileSize("tiled_mlp_tile_size", out->mlp_tile_size, out->mlp, "tiled_mlp_compute");
  if (!st.ok()) return st;
  return CheckTileSize("tiled_logits_loss_tile_size", out->logits_loss_tile_size,
                       out->logits_loss, "tiled_logits_loss");
}

}  // namespace loom::engine
