// Forwarding header (this round only): moved to spec/sequence_parallel_config.h
// (namespace loom::spec), so the
// scheduler can use it without //worker/engine. Engine code keeps its include path and its
// loom::engine names while other branches of this round still include it; new code includes
// "spec/sequence_parallel_config.h" and depends on //spec:sequence_parallel_config.
#ifndef LOOM_WORKER_ENGINE_SEQUENCE_PARALLEL_CONFIG_H_
#define LOOM_WORKER_ENGINE_SEQUENCE_PARALLEL_CONFIG_H_

#include "spec/sequence_parallel_config.h"

namespace loom::engine {

using ::loom::spec::CheckSequenceParallelHeads;
using ::loom::spec::ValidateSequenceParallel;

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_SEQUENCE_PARALLEL_CONFIG_H_
