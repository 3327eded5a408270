// ZenFlow (arXiv 2505.12242; docs/design/TECHNIQUES.md §2, docs/design/TECHNIQUES-TESTS.md §2.1):
// stall-free offloading behind the OptimizerPipeline protocol (optimizer_pipeline.h).
//
// Per 2-D weight W [out, in] the top-k columns (input features, column_selection.h) are updated
// "on the compute device" every step: here the model's in-memory fp32 master partition, with
// fp32 Adam moments for the selected elements only (DeepSpeed keeps them in the 16-bit dtype with
// no fp32 master; Loom keeps fp32 so bf16 runs do not lose their precision). Every column's
// gradient (selected ones included, as DeepSpeed does, so the CPU moments integrate the full
// gradient) is added into a host accumulation buffer; at an update boundary a CPU Adam applies
// the interval's mean gradient (sum / number of steps: the explicit loss normalisation that
// DeepSpeed's auto mode lacks) to its own fp32 copy of the partition, and the result is
// published into the master for the unselected columns only: selected columns are never
// overwritten by CPU values. 1-D parameters (norms, biases) are updated on the device every step.
// The first full_warm_up_rounds steps are synchronous full ZeRO-Offload steps.
//
// overlap_step (DeepSpeed's "Parallel" variant, §2.4): the pipeline has a host thread
// (host_worker.h) that does the CPU side. Each step's accumulation of the gradient into the
// interval's buffer is posted to it in FinishStep and runs while the training thread applies the
// selective update and the next forward runs (the trainer calls ReleaseGradients before the next
// backward, which waits for it: reads_gradients_after_finish(); so the gradients stay allocated
// through that forward, which matters only where ClearGrads frees them, with
// contiguous_gradients false). At an update boundary the CPU step of interval k is posted behind
// it, in chunks that the next steps' accumulations overtake,
// while interval k+1 accumulates into the second buffer (double buffering: the CPU step reads
// buffer s, the accumulations write buffer s^1, never aliased); its result is published at
// boundary k+1. On a CPU node this keeps the training thread's optimizer work to the selective
// update (DeepSpeed's device-side accumulation is a GPU kernel; a CPU rank's is a pass over the
// partition as large as the CPU Adam's reads, docs/benchmarks.md). Staleness: an unselected
// column's gradient of a step in interval k reaches the master at the end of interval k+1, i.e.
// at most 2*update_interval - 1 steps later (at most update_interval - 1 without overlap, where
// the accumulation is fused into the selective pass on the training thread and the CPU step
// runs there at the boundary). A select boundary first waits for a CPU step in flight and
// publishes it early, then re-selects: the CPU copy of the previously selected columns is
// resynced from the master. A column that stays selected keeps its selective moments and
// their update counts. A newly selected column's first moment starts at zero and its second
// moment from the CPU optimizer's (which has integrated the column's interval means over
// cpu_steps_ CPU steps), each bias-corrected by its own update count (CpuAdam's
// StepWithMomentCounts), so its first step is neither a sign step nor driven by the CPU's
// momentum, which averages over update_interval times as many steps and lags.
// - DeepSpeed zeroes every selected column's moments at each select boundary and keeps the old
//   count, which inflates the first update ~3.2x (docs/design/TECHNIQUES-TESTS.md §2.1.2(b)).
// - Loom before 2026-12-04 zeroed them and restarted the count: every re-selection's first step
//   was then a sign step of size lr on the most important columns (3.0% of held-out loss in
//   docs/benchmarks.md's small-batch regime, against 0.2% now).
// - Starting from both CPU moments was worse where gradients are less noisy (5.2% in the
//   fortunes regime, against 2.0% now): the lagging momentum (docs/benchmarks.md).
//
// Selection cohorts: the selected columns of a parameter that entered the selection at the same
// select boundary share their update counts (CpuAdam takes one pair per call); the fused pass
// updates all of a parameter's cohorts in one sweep, one CpuAdam call per cohort and block
// (zenflow_step_pass.h). At most kMaxCohorts per parameter: past that the two oldest merge
// at the younger one's counts (the older columns' counts are then too small by the difference,
// at least select_interval; a smaller count gives a smaller step once past Adam's first few
// steps, so the merge is conservative).
//
// Step indices: the CPU Adam uses the optimizer step of the boundary as t (DeepSpeed's
// micro_step + 1), so update_interval 1 with topk_ratio 0 and no overlap is ZeRO-Offload bit for
// bit; 1-D parameters use the optimizer step too, with the model's moments (the ones warm-up's
// CPU steps built). Gradients are unscaled and clipped with the step's grad_multiplier before
// anything reads them (DeepSpeed clips only the CPU path): in place at warm-up, select and
// Zen-auto steps and for 1-D parameters, otherwise on read by the fused per-step pass.
//
// Per step, each 2-D partition is streamed once on the training thread (zenflow_step_pass.h:
// accumulation, the interval's mean at its last step, the selective AdamW), or, with
// overlap_step, the selective AdamW there and the accumulation on the host thread (the same
// arithmetic, so the same bits); the CPU step reads the accumulator, and an accumulator whose
// count is 0 is overwritten by its next step (never zeroed).
//
// defer_selective (one rank, the model's parameters are the masters): the selective update of
// each 2-D parameter is posted to the host thread too, ahead of the accumulation, in parameter
// order; at its first read in the next forward parameter i's update is waited for (AwaitMaster,
// called by the provider's master fence) or, if the host thread has not started it yet, run by
// the training thread itself; so later layers are updated while earlier ones run forward.
//
// Sub-group events: OnSubGroupReady only records (the protocol's bookkeeping); all work starts
// in FinishStep on the training thread, because the clip multiplier is known only then and the
// selection's all-reduce must be issued in the same order on every rank. So the pipeline is
// correct whether the provider raises the events during backward or after FinishMicroStep. An
// overflowed (skipped) step leaves every buffer untouched: nothing ran before validation.
//
// Collectives (all in FinishStep, the same sequence on every rank): at a select boundary one
// all-reduce (fp64) of the concatenated [in] column sums; in Zen-auto mode one all-reduce of
// [2 * #2-D params] doubles per step after warm-up.
//
// Thread-safety: OptimizerPipeline's contract. The accessors (metrics, selection, state) are for
// the training thread between steps; accumulator() after ReleaseGradients. Quiesce() waits for
// everything posted to the host thread (call it before reading the moments or masters, e.g. for
// a checkpoint).
#ifndef LOOM_WORKER_ENGINE_OPTIM_ZENFLOW_PIPELINE_H_
#define LOOM_WORKER_ENGINE_OPTIM_ZENFLOW_PIPELINE_H_

#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/collectives.h"
#include "worker/engine/offload/cpu_adam.h"
#include "worker/engine/optim/column_selection.h"
#include "worker/engine/optim/host_worker.h"
#include "worker/engine/optim/optimizer_pipeline.h"
#include "worker/engine/optim/zenflow_step_pass.h"

namespace loom::engine::optim {

// One parameter as this rank holds it. cols == 0: a 1-D parameter (always updated on the device).
struct ZenFlowParam {
  int64_t rows = 0, cols = 0;  // W [rows, cols] = [out, in]
  int64_t begin = 0, end = 0;  // this rank's flat elements [begin, end) (partition.h)
};

struct ZenFlowOptions {
  offload::CpuAdamOptions adam;  // hyper-parameters; threads = the CPU optimizer's threads
  int device_threads = 1;        // threads of the selective ("device") update
  double topk_ratio = 0.1;
  ZenFlowSchedule schedule;      // update_interval 0 = Zen-auto
  bool overlap_step = false;
  // With overlap_step: accumulate on the host thread (see above). false keeps the accumulation
  // fused into the training thread's pass, as without overlap_step (the same bits; a test
  // reference, loom-trainer --test_zenflow_fused_accumulation).
  bool host_accumulation = true;
  // With overlap_step and host_accumulation: the selective update of each 2-D parameter also
  // runs on the host thread, posted in FinishStep ahead of the accumulation, and the next forward
  // waits for it at the parameter's first read (AwaitMaster). Set it only when every read or
  // write of a master outside this pipeline calls AwaitMaster(i) first (MakeTrainerZenFlow sets
  // it where the provider's parameters view the masters and wires its master fence).
  bool defer_selective = false;
  // 2: the gradients of a step stay intact until the second ReleaseGradients after its
  // FinishStep (a provider with two gradient buffers, ZeroProvider::gradient_buffers(); the
  // caller calls ReleaseGradients before every switch of buffers), so ReleaseGradients waits only
  // for the host thread's reads of the step before last, and the accumulation overlaps the next
  // backward as well as its forward. 1: until the next ReleaseGradients.
  int gradient_buffers = 1;
  double auto_ratio = 0.99;
};

// Observability, per the last committed step.
struct ZenFlowMetrics {
  double stall_s = 0;                  // training thread blocked on the CPU optimizer (this
                                       // step's FinishStep, and with overlap_step the wait in
                                       // ReleaseGradients before its backward and, with
                                       // defer_selective, the forward's AwaitMaster waits)
  double selected_mass_fraction = 0;   // Σ|g| of selected columns / Σ|g| of 2-D params (last
                                       // selection, or every step in auto mode)
  int64_t update_interval = 0;         // steps in the last completed CPU interval
  int64_t bytes_moved = 0;             // cumulative bytes between device-side and host buffers
  int64_t cpu_updates = 0;             // CPU steps started
};

class ZenFlowPipeline : public OptimizerPipeline {
 public:
  // params[i] describes the partitions source(i) returns (fp32 param [p_i], grad, exp_avg,
  // exp_avg_sq all defined; the moments are the CPU optimizer's for 2-D parameters and the
  // device update's for 1-D ones). `collectives` (not owned) must outlive the pipeline.
  // Errors: INVALID_ARGUMENT for a parameter list that does not match the plan.
  static absl::StatusOr<std::unique_ptr<ZenFlowPipeline>> Create(
      const ZenFlowOptions& options, SubGroupPlan plan, std::vector<ZenFlowParam> params,
      PartitionSource source, Collectives* collectives);
  ~ZenFlowPipeline() override;

  std::string name() const override { return "zenflow"; }
  const ZenFlowMetrics& metrics() const { return metrics_; }
  // Per parameter: the selected columns (empty for 1-D parameters and before the first select).
  const std::vector<std::vector<int64_t>>& selection() const { return selected_; }
  // The accumulation buffer training currently adds into (zeros while its count is 0: its
  // memory then holds the last interval's values until the next step overwrites them), and its
  // step count (tests).
  at::Tensor accumulator(size_t i) const;
  int64_t accumulated_steps() const { return acc_steps_[state_]; }
  // The selective Adam steps that column `column` of parameter i has taken since it entered the
  // selection (its cohort's t); 0 for a column not selected (tests).
  int64_t selective_steps(size_t i, int64_t column) const;
  // The host-thread accumulation (its urgent ticket, 1-based in posting order) that the last
  // ReleaseGradients waited for; 0 when it waited for none (tests).
  int64_t last_release_wait() const { return last_release_wait_; }
  // A CPU step was started and not yet waited for (it may have finished).
  bool cpu_step_in_flight() const { return cpu_in_flight_; }
  bool reads_gradients_after_finish() const override { return host_acc_; }
  // The selective updates run on the host thread (defer_selective took effect: it also needs
  // overlap_step and host_accumulation); every master read outside the pipeline must then call
  // AwaitMaster first.
  bool defers_selective() const { return defer_; }
  // Waits for everything on the host thread (a CPU step's result stays pending for the next
  // boundary).
  void Quiesce();
  // Returns once parameter i's master is not being written by a deferred selective update
  // (ZenFlowOptions::defer_selective); at once otherwise. The wait counts as stall in the next
  // step's metrics. Training thread only.
  void AwaitMaster(size_t i);
  // Waits for a CPU step in flight and publishes any pending result (end of training).
  void Flush();

  // Checkpoint: every piece of ZenFlow state that the model's master/exp_avg/exp_avg_sq
  // sections do not hold (the CPU copy, both accumulators and counts, the selection with its
  // cohorts, moments and step counts, the buffer state, the pending flag, the auto-interval
  // counters), as named contiguous CPU tensors. ExportState quiesces first. ImportState checks
  // names, sizes and cohort numbers, and that no step count exceeds `max_steps` (each counts
  // steps, so the checkpoint's step bounds them all): INVALID_ARGUMENT naming the tensor.
  std::vector<std::pair<std::string, at::Tensor>> ExportState();
  absl::Status ImportState(const std::vector<std::pair<std::string, at::Tensor>>& state,
                           int64_t max_steps = std::numeric_limits<int64_t>::max());

 protected:
  absl::Status Commit(const StepValidation& validation) override;
  absl::Status OnReleaseGradients() override;

 private:
  ZenFlowPipeline(const ZenFlowOptions& options, SubGroupPlan plan,
                  std::vector<ZenFlowParam> params, PartitionSource source,
                  Collectives* collectives);
  bool is2d(size_t i) const { return params_[i].cols > 0; }
  void InitCpuCopies();
  // zenflow_pipeline_selection.cc: Reselect, BuildCohorts, AutoBoundary.
  absl::Status Reselect();
  // Rebuilds parameter i's cohorts for the selection col_cohort ([cols]: the cohort of each
  // selected column, -1 elsewhere) with update counts t (per cohort: m's, v's), and
  // sel_idx_[i]. An element whose column was selected before keeps its moments; any other
  // starts with m = 0 and v = init_v ([n] local elements; nullptr: zero).
  void BuildCohorts(size_t i, std::vector<int> col_cohort,
                    std::vector<std::pair<int64_t, int64_t>> t, const float* init_v);
  absl::StatusOr<bool> AutoBoundary();
  // cpu_param -> master for the unselected columns of every 2-D parameter.
  void Publish();
  void RunCpuStep(int64_t t, double lr, int buffer);
  // zenflow_pipeline_host.cc (with Quiesce, AwaitMaster, Flush, OnReleaseGradients and
  // ClaimSelective). Blocks on the CPU step in flight, counting the wait as stall.
  void WaitCpu();
  // Posts RunCpuStep's work to the host thread in chunks (overlap_step).
  void PostCpuStep(int64_t t, double lr, int buffer);

  const ZenFlowOptions opt_;
  const std::vector<ZenFlowParam> params_;
  const PartitionSource source_;
  Collectives* const coll_;
  offload::CpuAdam cpu_adam_, device_adam_;
  ZenFlowStepPass pass_;  // the per-step accumulation + selective update (zenflow_step_pass.h)
  ZenFlowStepPass host_pass_;  // the host thread's (defer_selective): one thread, own buffers
  int64_t acc_ticket_ = 0;             // the last accumulation posted (HostWorker urgent ticket)
  int64_t acc_ticket_at_release_ = 0;  // acc_ticket_ when ReleaseGradients was last called
  int64_t last_release_wait_ = 0;      // last_release_wait()
  int64_t cpu_ticket_ = 0;             // the last chunk of the CPU step posted (background)
  bool cpu_in_flight_ = false;
  double release_wait_s_ = 0;          // ReleaseGradients' wait, added to the next step's stall
  const bool host_acc_;                // overlap_step && host_accumulation
  const bool defer_;                   // host_acc_ && defer_selective
  // defer_selective, per parameter: the host ticket of its update posted in the last Commit (0:
  // none or already awaited), its arguments, and who runs it: whichever of the host thread and
  // AwaitMaster claims it first (kSelPending -> kSelClaimed), the other does not. Waiting
  // instead cut stall_reduction from 0.96 to 0.63-0.66 (docs/benchmarks.md, 2026-12-04).
  static constexpr int kSelPending = 0, kSelClaimed = 1, kSelDone = 2;
  bool ClaimSelective(size_t i);
  std::vector<int64_t> sel_ticket_;
  std::vector<ZenFlowPassArgs> sel_args_;  // per parameter: its one pass over all cohorts
  std::vector<std::vector<ZenFlowCohortArgs>> cohort_args_;  // per parameter: what it points at
  std::unique_ptr<std::atomic<int>[]> sel_state_;
  bool initialized_ = false;
  std::vector<at::Tensor> cpu_param_;  // per parameter [p_i]: the CPU optimizer's fp32 copy
  std::vector<at::Tensor> acc_[2];     // per parameter [p_i]: host accumulators (2-D only)
  int64_t acc_steps_[2] = {0, 0};
  int state_ = 0;                      // the buffer training accumulates into
  bool pending_ = false;               // a finished CPU result not yet published
  std::vector<std::vector<int64_t>> selected_;
  std::vector<std::vector<int64_t>> sel_idx_;  // per parameter: all selected local elements
  // Columns that entered the selection at the same select boundary (header comment).
  struct Cohort {
    int64_t t = 0;              // selective Adam steps taken: m's update count
    int64_t t_sq = 0;           // v's update count (t + the CPU steps v started from)
    std::vector<int64_t> idx;   // ascending local element indices
    std::vector<float> m, v;    // [idx.size()] the selective AdamW moments
  };
  static constexpr int kMaxCohorts = 8;
  std::vector<std::vector<Cohort>> cohorts_;   // per parameter
  std::vector<std::vector<int>> col_cohort_;   // per parameter [cols]: cohort, -1 unselected
  std::unique_ptr<ZenFlowAutoInterval> auto_;
  int64_t interval_steps_ = 0;         // steps since the last update boundary
  int64_t cpu_steps_ = 0;              // CPU Adam steps applied to the moments (warm-up's too)
  ZenFlowMetrics metrics_;
  // overlap_step: the CPU side's thread (null otherwise). Last, so it is joined before any
  // buffer its tasks use is destroyed (the destructor quiesces it first anyway).
  std::unique_ptr<HostWorker> host_;
};

}  // namespace loom::engine::optim

#endif  // LOOM_WORKER_ENGINE_OPTIM_ZENFLOW_PIPELINE_H_
