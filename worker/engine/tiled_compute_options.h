// Forwarding header (this round only): moved to spec/tiled_compute_options.h
// (namespace loom::spec), so the
// scheduler can use it without //worker/engine. Engine code keeps its include path and its
// loom::engine names while other branches of this round still include it; new code includes
// "spec/tiled_compute_options.h" and depends on //spec:tiled_compute_options.
#ifndef LOOM_WORKER_ENGINE_TILED_COMPUTE_OPTIONS_H_
#define LOOM_WORKER_ENGINE_TILED_COMPUTE_OPTIONS_H_

#include "spec/tiled_compute_options.h"

namespace loom::engine {

using ::loom::spec::TiledComputeOptions;

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_TILED_COMPUTE_OPTIONS_H_
