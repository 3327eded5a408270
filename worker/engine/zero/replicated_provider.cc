#include "worker/engine/zero/replicated_provider.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "absl/strings/str_cat.h"
#include "data/corpus.h"

namespace loom::engine {

absl::StatusOr<std::unique_ptr<ReplicatedProvider>> ReplicatedProvider::Create(
    std::vector<spec::ParamSpec> specs, const ParamInit& init) {
  auto m = std::make_unique<ReplicatedProvider>();
  m->specs_ = std::move(specs);
  try {
    at::NoGradGuard no_grad;
    m->anchor_ = at::empty({0}, at::kFloat).set_requires_grad(true);
    for (size_t i = 0; i < m->specs_.size(); ++i) {
      const spec::ParamSpec& spec = m->specs_[i];
      at::Tensor full = at::empty({spec.numel()}, at::kFloat);
      if (init.from != nullptr) {
        absl::Status s =
            init.from->ReadRange(spec.name, spec.shape, 0, spec.numel(), full.data_ptr<float>());
        if (!s.ok()) return s;
      } else if (spec.kind == spec::ParamSpec::Kind::kNorm) {
        full.fill_(1.0);
      } else if (init.initializer_range > 0) {
        at::Generator gen =
            at::detail::createCPUGenerator(data::Mix64(init.seed ^ data::Mix64(i + 1)));
        full.normal_(0.0, init.initializer_range, gen);
      } else {
        full.zero_();
      }
      m->params_.push_back(full.view(spec.shape));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("replicated init: ", e.what()));
  }
  m->grads_.resize(m->params_.size());
  return m;
}

void ReplicatedProvider::AddGrad(ParamId i, const at::Tensor& full_grad) {
  ++add_grad_calls_;
  at::Tensor g = full_grad.to(at::kFloat).reshape(specs_[i].shape);
  if (grads_[i].defined()) {
    grads_[i].add_(g);
  } else {
    grads_[i] = g.clone();
  }
}

void ReplicatedProvider::ClearGrads() {
  for (at::Tensor& g : grads_) g = at::Tensor();
}

}  // namespace loom::engine
