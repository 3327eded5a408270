// The interface a model is written against to reach its parameters and hand back their
// gradients (issue 12; docs/engine.md). The model never sees how parameters are stored:
// replicated (ReplicatedProvider), ZeRO stage 0-3 partitioned (worker/engine/zero), or anything a
// later technique adds. Pattern: torchtitan's split between models/llama3/model (plain modules)
// and infra/parallelize.py (parallelism applied from outside).
//
// Protocol, per parameter i (ids index param_specs()):
//   forward   NoteUse(i) once per use that will produce a backward contribution, then
//             Acquire(i) -> full weight [spec(i).shape] in the parameter dtype (fp32, bf16 or
//             fp16), valid until the matching Release(i). Acquire/Release pairs nest by count.
//   backward  Acquire/Release as in forward for the weight itself; the weight gradient (full
//             [shape]) goes to the sink either
//               - by GradDestination(i, compute_dtype): a [shape] fp32 tensor to write the
//                 gradient into, then CommitGrad(i) once written (undefined tensor: use AddGrad),
//               - or by AddGrad(i, full_grad) (any float dtype, [shape]).
//             Each CommitGrad/AddGrad is one contribution; NoteUse counts the contributions a
//             provider waits for before it may reduce a gradient.
//   deferral  BeginGradDeferral(ids) .. EndGradDeferral(ids) (or GradDeferral, RAII): the
//             contributions of those params in between (several tiles of one op, a recompute)
//             accumulate locally and are reduced ONCE when the deferral closes (DeepSpeed's
//             ds_grad_is_ready). Deferrals nest by count per parameter.
// Every rank must make the same calls in the same order (providers issue collectives from them).
// Errors: providers throw CollectiveError (below) from any call that communicates; LibTorch
// errors propagate as c10::Error. Not thread-safe (one training thread and autograd's backward
// on the same CPU device).
#ifndef LOOM_WORKER_ENGINE_MODEL_PARAM_ACCESS_H_
#define LOOM_WORKER_ENGINE_MODEL_PARAM_ACCESS_H_

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "spec/model_config.h"

namespace loom::engine {

// Index into ParamAccess::param_specs().
using ParamId = size_t;

// Thrown from inside forward/backward when a collective fails; carries the status. Catch it at
// the engine boundary.
class CollectiveError : public std::runtime_error {
 public:
  explicit CollectiveError(absl::Status status)
      : std::runtime_error(std::string(status.message())), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

class ParamAccess {
 public:
  virtual ~ParamAccess() = default;

  // Every parameter the provider holds, in id order (name, shape, kind).
  virtual const std::vector<spec::ParamSpec>& param_specs() const = 0;
  const spec::ParamSpec& spec(ParamId i) const { return param_specs()[i]; }

  // The full weight of i ([shape], parameter dtype), valid until the matching Release(i).
  virtual const at::Tensor& Acquire(ParamId i) = 0;
  virtual void Release(ParamId i) = 0;
  // One forward use of i in a training micro-step = one backward contribution expected.
  virtual void NoteUse(ParamId i) = 0;
  // A [shape] fp32 tensor to write one full gradient contribution of i into, or an undefined
  // tensor (then use AddGrad). `compute_dtype`: the dtype the op computes its gradient in.
  virtual at::Tensor GradDestination(ParamId i, at::ScalarType compute_dtype) = 0;
  // The tensor of the last GradDestination(i) holds the contribution.
  virtual void CommitGrad(ParamId i) = 0;
  // One full gradient contribution of i ([shape], any float dtype).
  virtual void AddGrad(ParamId i, const at::Tensor& full_grad) = 0;

  virtual void BeginGradDeferral(const std::vector<ParamId>& ids) = 0;
  // Reduces what the ids accumulated since the matching Begin (when no outer deferral of the
  // same id is open). May throw CollectiveError.
  virtual void EndGradDeferral(const std::vector<ParamId>& ids) = 0;

  // Activations' dtype (fp32, or bf16 when the parameters are bf16).
  virtual at::ScalarType activation_dtype() const = 0;
  // An empty fp32 leaf requiring grad: passed to every custom op so that it is part of the
  // autograd graph even when its data inputs (token ids) do not require grad.
  virtual const at::Tensor& anchor() const = 0;
};

// Scoped gradient deferral over `ids`. Close() ends it (may throw CollectiveError); the
// destructor closes it if still open, except while an exception unwinds (then the collectives
// are left unmatched anyway and the engine fails the step).
class GradDeferral {
 public:
  GradDeferral(ParamAccess* access, std::vector<ParamId> ids)
      : access_(access), ids_(std::move(ids)), uncaught_(std::uncaught_exceptions()) {
    access_->BeginGradDeferral(ids_);
  }
  GradDeferral(const GradDeferral&) = delete;
  GradDeferral& operator=(const GradDeferral&) = delete;
  void Close() {
    if (open_) {
      open_ = false;
      access_->EndGradDeferral(ids_);
    }
  }
  ~GradDeferral() noexcept(false) {
    if (open_ && std::uncaught_exceptions() == uncaught_) Close();
  }

 private:
  ParamAccess* access_;
  std::vector<ParamId> ids_;
  int uncaught_;
  bool open_ = true;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_MODEL_PARAM_ACCESS_H_
