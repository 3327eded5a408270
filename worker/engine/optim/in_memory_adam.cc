#include "worker/engine/optim/in_memory_adam.h"

#include <string>
#include <utility>
#include <vector>

namespace loom::engine::optim {
namespace {

class InMemoryAdamPipeline : public OptimizerPipeline {
 public:
  InMemoryAdamPipeline(const spec::OptimizerConfig& config, SubGroupPlan plan,
                       PartitionSource source)
      : OptimizerPipeline(std::move(plan)), config_(config), source_(std::move(source)) {}

  std::string name() const override { return "in-memory Adam"; }

 protected:
  absl::Status Commit(const StepValidation& v) override {
    OptimizerStepArgs args;
    args.step = step_;
    args.lr = lr_;
    args.grad_multiplier = v.grad_multiplier;
    std::vector<OptimizerPartition> group;
    for (const SubGroup& g : plan().sub_groups()) {
      group.clear();
      for (size_t i = g.first; i < g.last; ++i) group.push_back(source_(i));
      ApplyOptimizerStep(config_, args, group);
    }
    return absl::OkStatus();
  }

 private:
  const spec::OptimizerConfig config_;
  const PartitionSource source_;
};

}  // namespace

std::unique_ptr<OptimizerPipeline> MakeInMemoryAdamPipeline(const spec::OptimizerConfig& config,
                                                            SubGroupPlan plan,
                                                            PartitionSource source) {
  return std::make_unique<InMemoryAdamPipeline>(config, std::move(plan), std::move(source));
}

}  // namespace loom::engine::optim
