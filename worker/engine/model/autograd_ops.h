// The custom autograd functions a model uses to touch its parameters through ParamAccess
// (moved from zero_llama.cc with the same math and op order, so results are bit-identical).
// Each op acquires the full weight just before use and releases it right after, in forward and
// again in backward (stage 3 gathers it twice), and hands the full weight gradient to the sink.
// The caller does the NoteUse(i) bookkeeping (one call per op application in training).
// Errors: CollectiveError from the provider, c10::Error from LibTorch. Not thread-safe.
#ifndef LOOM_WORKER_ENGINE_MODEL_AUTOGRAD_OPS_H_
#define LOOM_WORKER_ENGINE_MODEL_AUTOGRAD_OPS_H_

#include <ATen/core/Tensor.h>

#include "worker/engine/model/param_access.h"

namespace loom::engine {

// y = x W^T with W = param i [out, in]; x [..., in] (activation dtype) -> y [..., out].
// Backward (no recompute): dx = dy W, dW = dy^T x summed over all leading dims, written into
// GradDestination when the provider offers one.
at::Tensor LinearOp(ParamAccess* access, ParamId i, const at::Tensor& x);

// Token embedding: ids [...] int64 -> rows of W = param i [V, H] -> [..., H] in the activation
// dtype. Backward: dW = index_add of the fp32 dy rows at the ids, with row padding_idx (when
// >= 0) left zero, as torch.nn.Embedding(padding_idx) does (transformers passes pad_token_id).
at::Tensor EmbeddingOp(ParamAccess* access, ParamId i, const at::Tensor& ids,
                       int64_t padding_idx = -1);

// RMSNorm (Zhang & Sennrich 2019; HF LlamaRMSNorm), statistics in fp32, weight = param i [H]:
//   y = w * (x * rsqrt(mean(x^2, -1) + eps)).  x [..., H] -> y [..., H], x's dtype.
// Backward, closed form with r = rsqrt(mean(x^2) + eps), xhat = x r, gx = dy w:
//   dx = r (gx - xhat mean(gx xhat, -1)),  dw = Σ dy xhat over leading dims (fp32, AddGrad).
at::Tensor RmsNormOp(ParamAccess* access, ParamId i, const at::Tensor& x, double eps);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_MODEL_AUTOGRAD_OPS_H_
