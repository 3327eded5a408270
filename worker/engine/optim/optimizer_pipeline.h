// The optimizer pipeline: how one optimizer step of a rank's fp32 partitions runs, sub-group by
// sub-group, so that an optimizer can start work as soon as gradients are final and commit or
// roll back once the step is validated.
//
// Per optimizer step, on one pipeline:
//   BeginStep(step, lr)            before the last micro-step's backward (step: the 1-based
//                                  optimizer step count the update will have if committed;
//                                  lr: this step's learning rate).
//   OnSubGroupReady(k)             once per sub-group k of plan(), in any order, when the reduced
//                                  gradient partitions of all its parameters are final (raised
//                                  through SubGroupPlan::MarkParamReady). An implementation may
//                                  start work now (copy the gradients out, speculate a CPU step
//                                  on an unscaled, unclipped gradient, ...); the in-memory one
//                                  only records it.
//   FinishStep(validation)         after the overflow check and the global gradient norm: with
//                                  validation.overflow the step is rolled back (anything
//                                  speculative is discarded; parameters, moments and the step
//                                  count are as before BeginStep: the step is skipped);
//                                  otherwise it is committed: every sub-group's update is
//                                  applied with the gradients multiplied by
//                                  validation.grad_multiplier = 1 / (clip * loss_scale).
// Then the caller refreshes the model's working parameters from the masters and clears the
// gradients; a pipeline whose reads_gradients_after_finish() is true still reads them after
// FinishStep returns (ZenFlow with overlap_step accumulates them on its host thread while the
// next forward runs), and the caller must call ReleaseGradients() before it clears or overwrites
// them (before the next backward). The update math is unchanged by the pipeline: the in-memory
// implementation is torch.optim.Adam/AdamW (worker/engine/optimizer.h), the offload one CpuAdam
// (worker/engine/offload/cpu_adam.h); per element the two differ by FMA rounding only.
//
// Thread-safety: the three calls are serialised by the pipeline's mutex, and the hooks run
// under it. OnSubGroupReady may be called from another thread (a ZeRO provider's reduction
// listener) while backward still runs for parameters of other sub-groups: a hook may then read
// and write only sub-group k's partitions and its own state. BeginStep and FinishStep are
// called from the training thread with no backward in flight.
//
// Errors (absl::Status, never throws for protocol errors): FAILED_PRECONDITION for calls out of
// order (BeginStep while a step is open, OnSubGroupReady or FinishStep without BeginStep, a
// sub-group raised twice, a commit while a sub-group is not ready — the message names it);
// OUT_OF_RANGE for a sub-group index outside plan(); an implementation's own errors (NVMe I/O:
// the swapper's status naming the file). After any error from FinishStep the step is closed and
// the state is unspecified: training must stop.
//
// Sources: DeepSpeed stage3.py step() (overflow check, then _optimizer_step per sub-group);
// SuperOffload (superoffload_stage3.py: speculative CPU step per sub-group, rollback on
// overflow; docs/design/TECHNIQUES.md §4.1); ZenFlow (zenflow_stage_1_and_2.py: per-bucket
// selective update, asynchronous CPU step at update boundaries; §2.4).
#ifndef LOOM_WORKER_ENGINE_OPTIM_OPTIMIZER_PIPELINE_H_
#define LOOM_WORKER_ENGINE_OPTIM_OPTIMIZER_PIPELINE_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "worker/engine/optim/sub_groups.h"
#include "worker/engine/optimizer.h"

namespace loom::engine::optim {

// The validation result of one step, the same on every rank.
struct StepValidation {
  bool overflow = false;         // fp16: a non-finite gradient on some rank (all-reduced MAX)
  double grad_norm = 0.0;        // global L2 norm of the unscaled gradients (0 on overflow)
  double clip_coef = 1.0;        // DeepSpeed's clip = (grad_norm + 1e-6) / gradient_clipping
                                 // when that is > 1, else 1 (no clipping)
  double grad_multiplier = 1.0;  // 1 / (clip_coef * loss_scale): unscale and clip fused;
                                 // exactly 1.0 skips the multiply
};

// Parameter i's partition (model order) as the pipeline reads and writes it: fp32 master [p_i]
// (a stride-0 placeholder when parameters live on NVMe), gradient [p_i] (the data-parallel mean,
// still loss-scaled; undefined = zero), exp_avg / exp_avg_sq [p_i] (undefined when the offload
// optimizer owns the moments). Called from the pipeline's calls, at the time the tensors are
// needed (gradient tensors change between steps). Must stay valid for the pipeline's lifetime.
using PartitionSource = std::function<OptimizerPartition(size_t i)>;

class OptimizerPipeline {
 public:
  explicit OptimizerPipeline(SubGroupPlan plan) : plan_(std::move(plan)) {}
  virtual ~OptimizerPipeline() = default;
  OptimizerPipeline(const OptimizerPipeline&) = delete;
  OptimizerPipeline& operator=(const OptimizerPipeline&) = delete;

  // The sub-group cut the events refer to. Callers copy it to track readiness.
  const SubGroupPlan& plan() const { return plan_; }
  // e.g. "in-memory Adam", "offload cpu".
  virtual std::string name() const = 0;

  absl::Status BeginStep(int64_t step, double lr);
  absl::Status OnSubGroupReady(int64_t k);
  absl::Status FinishStep(const StepValidation& validation);
  bool step_open() const;
  // See above. ReleaseGradients blocks until the pipeline no longer reads the gradients of the
  // last FinishStep; call it from the training thread, outside FinishStep, before the gradients
  // change (open step or not).
  virtual bool reads_gradients_after_finish() const { return false; }
  absl::Status ReleaseGradients();
  // Parameter i's local squared gradient norm, Σ g² in fp64 exactly as
  // optim::SumOfSquares(grad, numel) computes it (grad_norm.h), when the pipeline has already
  // computed it this step while the sub-group was ready (SuperOffload's speculation thread does,
  // in the same read as its finiteness check); false when it has not (or never does), and the
  // caller computes it. Either way the value is the same bits, so summing per-parameter values
  // in parameter order gives optim::LocalSquaredNorm's result exactly. Call from the training
  // thread while the step is open, after backward (the gradients are final); lock-free, not
  // serialised with the calls above.
  virtual bool ComputedSquaredNorm(size_t /*i*/, double* /*squared_norm*/) const {
    return false;
  }

 protected:
  // The hooks, called under the mutex after the protocol checks. `step_` / `lr_` hold
  // BeginStep's arguments. OnReady may run concurrently with backward (see above).
  virtual absl::Status OnBegin() { return absl::OkStatus(); }
  virtual absl::Status OnReady(int64_t /*k*/) { return absl::OkStatus(); }
  virtual absl::Status Commit(const StepValidation& validation) = 0;
  virtual absl::Status Rollback() { return absl::OkStatus(); }
  virtual absl::Status OnReleaseGradients() { return absl::OkStatus(); }

  int64_t step_ = 0;
  double lr_ = 0.0;

 private:
  const SubGroupPlan plan_;
  mutable std::mutex mu_;
  bool open_ = false;
  std::vector<bool> ready_;
};

}  // namespace loom::engine::optim

#endif  // LOOM_WORKER_ENGINE_OPTIM_OPTIMIZER_PIPELINE_H_
