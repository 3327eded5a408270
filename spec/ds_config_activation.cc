// The activation_checkpointing section of the DeepSpeed config (ds_config.h states which keys
// act).
#include <string>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "spec/ds_config_internal.h"

namespace loom::spec::ds_config_internal {

absl::Status ParseActivationCheckpointing(const json& root, DeepSpeedConfig* c) {
  ASSIGN_OR_RETURN(const json* ac, OptObject(root, "activation_checkpointing", kRoot));
  if (ac == nullptr) return absl::OkStatus();
  const std::string path = Join(kRoot, "activation_checkpointing");
  RETURN_IF_ERROR(CheckKeys(*ac, path,
                            {"partition_activations", "cpu_checkpointing",
                             "contiguous_memory_optimization", "number_checkpoints",
                             "synchronize_checkpoint_boundary", "profile"}));
  c->activation_checkpointing.enabled = true;
  RETURN_IF_ERROR(
      ReadBool(*ac, "cpu_checkpointing", path, &c->activation_checkpointing.cpu_checkpointing));
  c->activation_checkpointing.cpu_checkpointing_set =
      ac->contains("cpu_checkpointing") && !(*ac)["cpu_checkpointing"].is_null();
  bool partition = false;
  RETURN_IF_ERROR(ReadBool(*ac, "partition_activations", path, &partition));
  if (partition) {
    return Unsupported(Join(path, "partition_activations"),
                       "partitioning checkpointed activations across a model-parallel group");
  }
  bool flag = false;
  RETURN_IF_ERROR(ReadBool(*ac, "contiguous_memory_optimization", path, &flag));
  RETURN_IF_ERROR(ReadBool(*ac, "synchronize_checkpoint_boundary", path, &flag));
  RETURN_IF_ERROR(ReadBool(*ac, "profile", path, &flag));
  RETURN_IF_ERROR(json_fields::OptInt(*ac, "number_checkpoints", path).status());  // null: absent
  WarnIgnored(*ac, path,
              {"contiguous_memory_optimization", "number_checkpoints",
               "synchronize_checkpoint_boundary", "profile"},
              "Loom checkpoints every decoder layer; these tune buffers, timing and logging, not "
              "results",
              &c->warnings);
  return absl::OkStatus();
}

}  // namespace loom::spec::ds_config_internal
