#include "worker/engine/model/autograd_ops.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace loom::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

ParamAccess* AccessOf(AutogradContext* ctx) {
  return reinterpret_cast<ParamAccess*>(ctx->saved_data["access"].toInt());
}
ParamId IndexOf(AutogradContext* ctx) {
  return static_cast<ParamId>(ctx->saved_data["index"].toInt());
}
void SaveHandles(AutogradContext* ctx, ParamAccess* a, ParamId i) {
  ctx->saved_data["access"] = reinterpret_cast<int64_t>(a);
  ctx->saved_data["index"] = static_cast<int64_t>(i);
}

struct LinearFn : public torch::autograd::Function<LinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& anchor,
                            ParamAccess* m, int64_t i) {
    SaveHandles(ctx, m, i);
    ctx->save_for_backward({x});
    at::Tensor y = at::matmul(x, m->Acquire(i).to(x.scalar_type()).t());
    m->Release(i);
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    ParamAccess* m = AccessOf(ctx);
    const ParamId i = IndexOf(ctx);
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor& gy = grads[0];
    const spec::ParamSpec& spec = m->spec(i);
    const int64_t out_f = spec.shape[0], in_f = spec.shape[1];
    at::Tensor dx = at::matmul(gy, m->Acquire(i).to(gy.scalar_type()));
    m->Release(i);
    const at::Tensor gy_t = gy.reshape({-1, out_f}).t();  // [out, tokens]
    const at::Tensor x2 = x.reshape({-1, in_f});           // [tokens, in]
    at::Tensor dst = m->GradDestination(i, gy.scalar_type());
    if (dst.defined()) {
      at::mm_out(dst, gy_t, x2);  // dW straight into the provider's buffer
      m->CommitGrad(i);
    } else {
      m->AddGrad(i, gy_t.mm(x2));
    }
    return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct EmbeddingFn : public torch::autograd::Function<EmbeddingFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& ids,
                            const at::Tensor& anchor, ParamAccess* m, int64_t i,
                            int64_t padding_idx) {
    SaveHandles(ctx, m, i);
    ctx->saved_data["padding_idx"] = padding_idx;
    ctx->save_for_backward({ids});
    std::vector<int64_t> shape = ids.sizes().vec();
    shape.push_back(m->spec(i).shape[1]);
    at::Tensor out = m->Acquire(i)
                         .index_select(0, ids.reshape({-1}))
                         .to(m->activation_dtype())
                         .view(shape);
    m->Release(i);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    ParamAccess* m = AccessOf(ctx);
    const ParamId i = IndexOf(ctx);
    const at::Tensor ids = ctx->get_saved_variables()[0];
    const spec::ParamSpec& spec = m->spec(i);
    const int64_t hidden = spec.shape[1];
    at::Tensor dst = m->GradDestination(i, at::kFloat);
    at::Tensor dw = dst.defined() ? dst.zero_() : at::zeros(spec.shape, at::kFloat);
    dw.index_add_(0, ids.reshape({-1}), grads[0].reshape({-1, hidden}).to(at::kFloat));
    const int64_t padding_idx = ctx->saved_data["padding_idx"].toInt();
    if (padding_idx >= 0) dw[padding_idx].zero_();
    if (dst.defined()) {
      m->CommitGrad(i);
    } else {
      m->AddGrad(i, dw);
    }
    return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct RmsNormFn : public torch::autograd::Function<RmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& anchor,
                            ParamAccess* m, int64_t i, double eps) {
    SaveHandles(ctx, m, i);
    ctx->saved_data["eps"] = eps;
    ctx->save_for_backward({x});
    const at::Tensor xf = x.to(at::kFloat);
    at::Tensor r = at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true) + eps);
    at::Tensor y = m->Acquire(i).to(x.scalar_type()) * (xf * r).to(x.scalar_type());
    m->Release(i);
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    ParamAccess* m = AccessOf(ctx);
    const ParamId i = IndexOf(ctx);
    const double eps = ctx->saved_data["eps"].toDouble();
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor xf = x.to(at::kFloat);
    const at::Tensor gy = grads[0].to(at::kFloat);
    const int64_t hidden = m->spec(i).shape[0];
    at::Tensor r = at::rsqrt(xf.pow(2).mean({-1}, true) + eps);
    at::Tensor xhat = xf * r;
    at::Tensor gx = gy * m->Acquire(i).to(at::kFloat);
    m->Release(i);
    at::Tensor dx = (r * (gx - xhat * (gx * xhat).mean({-1}, true))).to(x.scalar_type());
    at::Tensor dw = (gy * xhat).reshape({-1, hidden}).sum(0);
    m->AddGrad(i, dw);
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor LinearOp(ParamAccess* access, ParamId i, const at::Tensor& x) {
  return LinearFn::apply(x, access->anchor(), access, static_cast<int64_t>(i));
}

at::Tensor EmbeddingOp(ParamAccess* access, ParamId i, const at::Tensor& ids,
                       int64_t padding_idx) {
  return EmbeddingFn::apply(ids, access->anchor(), access, static_cast<int64_t>(i), padding_idx);
}

at::Tensor RmsNormOp(ParamAccess* access, ParamId i, const at::Tensor& x, double eps) {
  return RmsNormFn::apply(x, access->anchor(), access, static_cast<int64_t>(i), eps);
}

}  // namespace loom::engine
