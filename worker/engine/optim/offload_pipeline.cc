#include "worker/engine/optim/offload_pipeline.h"

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

namespace loom::engine::optim {
namespace {

class OffloadPipeline : public OptimizerPipeline {
 public:
  OffloadPipeline(offload::OffloadOptimizer* optimizer, PartitionSource source)
      : OptimizerPipeline(optimizer->plan()), opt_(optimizer), source_(std::move(source)) {}

  std::string name() const override {
    return opt_->optimizer_nvme() ? "offload nvme" : "offload cpu";
  }

 protected:
  absl::Status Commit(const StepValidation& v) override {
    const size_t n = plan().num_params();
    std::vector<const float*> grads(n, nullptr);
    std::vector<float*> masters(n, nullptr);
    for (size_t i = 0; i < n; ++i) {
      OptimizerPartition p = source_(i);
      if (p.grad.defined()) {
        if (v.grad_multiplier != 1.0) p.grad.mul_(v.grad_multiplier);
        grads[i] = p.grad.data_ptr<float>();
      }
      if (!opt_->params_nvme()) masters[i] = p.param.data_ptr<float>();
    }
    return opt_->Step(step_, lr_, masters, grads);
  }

 private:
  offload::OffloadOptimizer* const opt_;
  const PartitionSource source_;
};

}  // namespace

std::unique_ptr<OptimizerPipeline> MakeOffloadPipeline(offload::OffloadOptimizer* optimizer,
                                                       PartitionSource source) {
  return std::make_unique<OffloadPipeline>(optimizer, std::move(source));
}

}  // namespace loom::engine::optim
