// Forwarding header (this round only): moved to spec/model_config.h (namespace loom::spec), so the
// scheduler can use it without //worker/engine. Engine code keeps its include path and its
// loom::engine names while other branches of this round still include it; new code includes
// "spec/model_config.h" and depends on //spec:model_config.
#ifndef LOOM_WORKER_ENGINE_MODEL_CONFIG_H_
#define LOOM_WORKER_ENGINE_MODEL_CONFIG_H_

#include "spec/model_config.h"

namespace loom::engine {

using ::loom::spec::kMaxLlamaParams;
using ::loom::spec::ModelType;
using ::loom::spec::LlamaConfig;
using ::loom::spec::ParseLlamaConfig;
using ::loom::spec::LlamaConfigToHfJson;
using ::loom::spec::ParamSpec;
using ::loom::spec::LlamaParamSpecs;
using ::loom::spec::LlamaParamCount;

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_MODEL_CONFIG_H_
