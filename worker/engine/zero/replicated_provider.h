// The trivial ParamAccess: full fp32 parameters, plain local fp32 gradients, no collectives.
// The reference in tests (a model over it is plain single-process autograd semantics), e.g.
// LlamaModel over ZeroProvider (any stage) at world size 1 must give the same loss and
// gradients as over this provider. Initial values follow ParamInit exactly as ZeroProvider
// draws them. Not thread-safe.
#ifndef LOOM_WORKER_ENGINE_ZERO_REPLICATED_PROVIDER_H_
#define LOOM_WORKER_ENGINE_ZERO_REPLICATED_PROVIDER_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/model/param_access.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {

class ReplicatedProvider : public ParamAccess {
 public:
  // Errors: `init.from`'s read errors as they are.
  static absl::StatusOr<std::unique_ptr<ReplicatedProvider>> Create(
      std::vector<spec::ParamSpec> specs, const ParamInit& init);

  const std::vector<spec::ParamSpec>& param_specs() const override { return specs_; }
  const at::Tensor& Acquire(ParamId i) override { return params_[i]; }
  void Release(ParamId) override {}
  void NoteUse(ParamId) override {}
  at::Tensor GradDestination(ParamId, at::ScalarType) override { return at::Tensor(); }
  void CommitGrad(ParamId) override {}
  // grad(i) += full_grad (fp32).
  void AddGrad(ParamId i, const at::Tensor& full_grad) override;
  void BeginGradDeferral(const std::vector<ParamId>&) override {}
  void EndGradDeferral(const std::vector<ParamId>&) override {}
  at::ScalarType activation_dtype() const override { return at::kFloat; }
  const at::Tensor& anchor() const override { return anchor_; }

  // Parameter i, fp32 [shape] (writable: tests set values); its accumulated gradient, fp32
  // [shape] (undefined before the first contribution); number of AddGrad calls so far.
  at::Tensor& param(ParamId i) { return params_[i]; }
  const at::Tensor& grad(ParamId i) const { return grads_[i]; }
  int64_t add_grad_calls() const { return add_grad_calls_; }
  void ClearGrads();

 private:
  std::vector<spec::ParamSpec> specs_;
  std::vector<at::Tensor> params_, grads_;
  at::Tensor anchor_;
  int64_t add_grad_calls_ = 0;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_ZERO_REPLICATED_PROVIDER_H_
