// ZenFlow's per-step work on one 2-D parameter partition, fused into one pass over its memory
// (ZenFlow, arXiv 2505.12242 §4; docs/design/TECHNIQUES.md §2.4; used by zenflow_pipeline.cc).
//
// Each training step ZenFlow (a) adds the step's gradient into the host accumulator of the
// interval and (b) applies AdamW to the selected (top-k) columns of the fp32 master. Done as
// separate LibTorch ops (grad *= clip multiplier; acc += grad; gather / step / scatter of the
// selected elements; acc *= 1 / steps at the boundary; acc = 0 after it) the optimizer-side
// work read and wrote the partition up to five times per step, more than the full CpuAdam step
// of synchronous ZeRO-Offload it is meant to replace. This pass streams the partition once, in
// blocks of kBlock elements small enough to stay in L1/L2 between (a) and (b):
//
//   g      = grad * grad_multiplier                   (fp32, as grad.mul_(multiplier) rounds)
//   acc    = first ? 0 + g : acc + g                  (first: the interval's first step; the
//                                                       accumulator is not read, no zeroing pass)
//   acc    = acc * mean_scale   if mean_scale != 1    (the interval's last step: its mean)
//   for each cohort, the selected elements of the block: gather master and g,
//   CpuAdam::StepWithMomentCounts (the same per-element math as every other CpuAdam call:
//   bit-identical to one call over the cohort's k), scatter.
//
// All cohorts are updated in the same sweep: a row-major W's selected columns touch most of
// its cache lines, so a sweep per cohort would read the master and gradient once per cohort.
//
// Every element's arithmetic is the same sequence of correctly rounded fp32 operations as the
// unfused ops, so the results are bit-identical to them (zenflow_step_pass_test checks against
// plain LibTorch ops). Compiled with -ffp-contract=off (no FMA).
//
// Shapes and units: all arrays are fp32 and flat over this rank's partition [n] of W [out, in]
// (row-major, partition.h); each cohort's `selected` holds k ascending local indices into
// [0, n) and its moments are [k], in the same order. lr is the step's learning rate.
//
// Thread-safety: one Run at a time per object; Run splits the blocks over `threads` (the
// calling thread included) with disjoint element ranges, so arrays are never shared.
#ifndef LOOM_WORKER_ENGINE_OPTIM_ZENFLOW_STEP_PASS_H_
#define LOOM_WORKER_ENGINE_OPTIM_ZENFLOW_STEP_PASS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "worker/engine/offload/cpu_adam.h"

namespace loom::engine::optim {

// One selection cohort of a parameter: the selected elements whose columns entered the
// selection at the same select boundary, so their moments share update counts
// (zenflow_pipeline.h). The cohorts of one pass hold disjoint elements.
struct ZenFlowCohortArgs {
  const int64_t* selected = nullptr;  // [k] ascending local element indices into [0, n)
  int64_t k = 0;
  float* exp_avg = nullptr;           // [k] the selective AdamW moments, in `selected` order
  float* exp_avg_sq = nullptr;        // [k]
  int64_t t_exp_avg = 1;              // update counts including this step (1-based), for the
  int64_t t_exp_avg_sq = 1;           // bias corrections (CpuAdam::StepWithMomentCounts)
};

struct ZenFlowPassArgs {
  const float* grad = nullptr;  // [n]; nullptr = a zero gradient
  float grad_multiplier = 1.0f;  // applied on read (1 when the caller already scaled grad)
  float* acc = nullptr;          // [n] the interval's host accumulator
  int64_t n = 0;
  bool first = false;            // the interval's first step: acc = 0 + g
  float mean_scale = 1.0f;       // != 1: acc *= mean_scale after the add (interval's last step)
  float* master = nullptr;       // [n] fp32 master (the selected elements are updated)
  const ZenFlowCohortArgs* cohorts = nullptr;  // [num_cohorts], all updated in the one pass
  int num_cohorts = 0;
  double lr = 0;
  // false: Run skips the accumulation (acc, first and mean_scale are not read): the caller
  // accumulates on another thread with AccumulateAll (ZenFlow with overlap_step).
  bool accumulate = true;
};

class ZenFlowStepPass {
 public:
  static constexpr int64_t kBlock = 8192;  // elements per block (32 KiB per array)

  // adam: the hyper-parameters of the selective update (its `threads` is ignored: the pass
  // uses `threads` >= 1 in all).
  ZenFlowStepPass(const offload::CpuAdamOptions& adam, int threads);

  void Run(const ZenFlowPassArgs& a);

  // The accumulation alone, over all n elements on the calling thread (grad, grad_multiplier,
  // acc, n, first and mean_scale are read): the same arithmetic as Run's, so splitting the two
  // changes no bit. It only reads grad, and Run with accumulate = false does not write acc, so
  // the two may run at the same time on one partition.
  static void AccumulateAll(const ZenFlowPassArgs& a);

 private:
  offload::ThreadPool pool_;
  std::vector<std::unique_ptr<offload::CpuAdam>> adam_;  // one per task (single-threaded)
  std::vector<std::vector<float>> w_, g_;                 // per task gather buffers [kBlock]
};

}  // namespace loom::engine::optim

#endif  // LOOM_WORKER_ENGINE_OPTIM_ZENFLOW_STEP_PASS_H_
