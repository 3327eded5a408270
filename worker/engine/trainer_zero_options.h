// The ZeRO provider's options of a job (zero_provider.h ZeroOptions) from its deepspeed_config
// and its process groups: stage, param dtype (bf16 / fp16 / fp32), bucket sizes, overlap and the
// stage-3 knobs as DeepSpeed names them, communication_data_type (communication_dtype), and the
// gradient divide factor the ProcessGroups carry for the ZeRO partition group (process_groups.h:
// the world size for a data-parallel job, D for a sequence-parallel one under the trainer's
// loss_r * n_r / N convention; docs/design/TECHNIQUES.md §3.2, DeepSpeed issue #5248). Offload and
// the optimizer hooks are set by the Trainer on top.
// Pure; thread-safe. No errors (ds is already validated by the config parser).
#ifndef LOOM_WORKER_ENGINE_TRAINER_ZERO_OPTIONS_H_
#define LOOM_WORKER_ENGINE_TRAINER_ZERO_OPTIONS_H_

#include "spec/ds_config.h"
#include "worker/engine/process_groups.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {

ZeroOptions ZeroOptionsFor(const spec::DeepSpeedConfig& ds, const ProcessGroups& groups);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_TRAINER_ZERO_OPTIONS_H_
