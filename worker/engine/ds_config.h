// Forwarding header (this round only): moved to spec/ds_config.h (namespace loom::spec), so the
// scheduler can use it without //worker/engine. Engine code keeps its include path and its
// loom::engine names while other branches of this round still include it; new code includes
// "spec/ds_config.h" and depends on //spec:ds_config.
#ifndef LOOM_WORKER_ENGINE_DS_CONFIG_H_
#define LOOM_WORKER_ENGINE_DS_CONFIG_H_

#include "spec/ds_config.h"

namespace loom::engine {

using ::loom::spec::OptimizerConfig;
using ::loom::spec::SchedulerConfig;
using ::loom::spec::OffloadConfig;
using ::loom::spec::ZenFlowConfig;
using ::loom::spec::ZeroConfig;
using ::loom::spec::Fp16Config;
using ::loom::spec::AioConfig;
using ::loom::spec::ActivationCheckpointingConfig;
using ::loom::spec::DeepSpeedConfig;
using ::loom::spec::ParseDeepSpeedConfig;
using ::loom::spec::LearningRateAtStep;

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_DS_CONFIG_H_
