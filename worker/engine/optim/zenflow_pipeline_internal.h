// Helpers shared by ZenFlowPipeline's translation units (zenflow_pipeline*.cc); not part of
// its API.
#ifndef LOOM_WORKER_ENGINE_OPTIM_ZENFLOW_PIPELINE_INTERNAL_H_
#define LOOM_WORKER_ENGINE_OPTIM_ZENFLOW_PIPELINE_INTERNAL_H_

#include <chrono>

#include "worker/engine/optim/optimizer_pipeline.h"

namespace loom::engine::optim::zenflow_internal {

// Wall seconds since t0.
inline double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The partition's fp32 gradient, or nullptr when it is undefined (zero).
inline const float* GradPtr(const OptimizerPartition& p) {
  return p.grad.defined() ? p.grad.data_ptr<float>() : nullptr;
}

}  // namespace loom::engine::optim::zenflow_internal

#endif  // LOOM_WORKER_ENGINE_OPTIM_ZENFLOW_PIPELINE_INTERNAL_H_
