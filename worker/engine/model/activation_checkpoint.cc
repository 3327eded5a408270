#include "worker/engine/model/activation_checkpoint.h"

#include <ATen/Context.h>
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <string>
#include <utility>

#include "worker/engine/zero/memory_tracker.h"

namespace loom::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What one checkpointed layer keeps between its forward and its recompute.
struct CheckpointState : torch::CustomClassHolder {
  CheckpointedFn fn;
  ActivationCheckpointOptions options;
  at::Tensor host;  // the offloaded input (offload on)
  c10::Device device = c10::Device(c10::kCPU);
  int64_t counted = 0;  // bytes counted in options.memory

  void DropHost() {
    host = at::Tensor();
    if (counted > 0 && options.memory != nullptr) {
      options.memory->Release(MemoryKind::kActivationOffload, counted);
    }
    counted = 0;
  }
  ~CheckpointState() override { DropHost(); }
};

struct CheckpointFn : public torch::autograd::Function<CheckpointFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& anchor,
                            c10::intrusive_ptr<CheckpointState> state) {
    at::Tensor out;
    {
      at::NoGradGuard no_grad;
      out = state->fn(h, CheckpointPhase::kForward);
    }
    if (state->options.cpu_offload) {
      state->device = h.device();
      state->host = at::empty(h.sizes(), h.options()
                                             .device(at::kCPU)
                                             .pinned_memory(at::hasCUDA() && !h.is_cpu()));
      state->host.copy_(h);
      state->counted = static_cast<int64_t>(state->host.nbytes());
      if (state->options.memory != nullptr) {
        state->options.memory->Acquire(MemoryKind::kActivationOffload, state->counted);
      }
    } else {
      ctx->save_for_backward({h});
    }
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state = ctx->saved_data["state"].toCapsule();
    auto* s = static_cast<CheckpointState*>(state.get());
    at::Tensor h;
    if (s->options.cpu_offload) {
      h = s->host.to(s->device);  // on a CPU node the host buffer itself
      s->DropHost();
    } else {
      h = ctx->get_saved_variables()[0];
    }
    at::Tensor x = h.detach().requires_grad_(true);
    at::Tensor dx;
    {
      at::AutoGradMode grad_on(true);
      at::Tensor out = s->fn(x, CheckpointPhase::kRecompute);
      dx = torch::autograd::grad({out}, {x}, {grads[0]})[0];
    }
    return {dx, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor CheckpointLayer(CheckpointedFn fn, const at::Tensor& h, const at::Tensor& anchor,
                           const ActivationCheckpointOptions& options) {
  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = std::move(fn);
  state->options = options;
  return CheckpointFn::apply(h, anchor, state);
}

}  // namespace loom::engine
