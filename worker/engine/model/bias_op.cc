#include "worker/engine/model/bias_op.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace loom::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct BiasAddFn : public torch::autograd::Function<BiasAddFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& anchor,
                            ParamAccess* m, int64_t i) {
    ctx->saved_data["access"] = reinterpret_cast<int64_t>(m);
    ctx->saved_data["index"] = i;
    at::Tensor y = x + m->Acquire(static_cast<ParamId>(i)).to(x.scalar_type());
    m->Release(static_cast<ParamId>(i));
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* m = reinterpret_cast<ParamAccess*>(ctx->saved_data["access"].toInt());
    const auto i = static_cast<ParamId>(ctx->saved_data["index"].toInt());
    const at::Tensor& gy = grads[0];
    const int64_t out_f = m->spec(i).shape[0];
    m->AddGrad(i, gy.reshape({-1, out_f}).to(at::kFloat).sum(0));
    return {gy, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor BiasAddOp(ParamAccess* access, ParamId i, const at::Tensor& x) {
  return BiasAddFn::apply(x, access->anchor(), access, static_cast<int64_t>(i));
}

}  // namespace loom::engine
