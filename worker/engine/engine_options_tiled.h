// Forwarding header (this round only): moved to spec/engine_options_tiled.h
// (namespace loom::spec), so the
// scheduler can use it without //worker/engine. Engine code keeps its include path and its
// loom::engine names while other branches of this round still include it; new code includes
// "spec/engine_options_tiled.h" and depends on //spec:engine_options_tiled.
#ifndef LOOM_WORKER_ENGINE_ENGINE_OPTIONS_TILED_H_
#define LOOM_WORKER_ENGINE_ENGINE_OPTIONS_TILED_H_

#include "spec/engine_options_tiled.h"

namespace loom::engine {

using ::loom::spec::ParseTiledCompute;
using ::loom::spec::ModelExecutionKeys;
using ::loom::spec::ParseModelExecution;
using ::loom::spec::ValidateAlstKeys;

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_ENGINE_OPTIONS_TILED_H_
