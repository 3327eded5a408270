// The bias of a linear layer as a custom autograd op over ParamAccess (Qwen2's q/k/v projection
// biases; Hugging Face Qwen2Attention's nn.Linear(..., bias=True)). Written like the ops in
// autograd_ops.h: the bias is acquired just before use and released right after, and its
// gradient goes to the provider's sink as one contribution (the caller does NoteUse(i)).
// Errors: CollectiveError from the provider, c10::Error from LibTorch. Not thread-safe.
#ifndef LOOM_WORKER_ENGINE_MODEL_BIAS_OP_H_
#define LOOM_WORKER_ENGINE_MODEL_BIAS_OP_H_

#include <ATen/core/Tensor.h>

#include "worker/engine/model/param_access.h"

namespace loom::engine {

// y = x + b with b = param i [out] (parameter dtype, cast to x's dtype); x [..., out] in the
// activation dtype -> y [..., out]. Backward: dx = dy; db = Σ dy over all leading dims, summed
// in fp32 and handed to AddGrad (the bias itself is not needed, so backward does not gather it).
at::Tensor BiasAddOp(ParamAccess* access, ParamId i, const at::Tensor& x);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_MODEL_BIAS_OP_H_
