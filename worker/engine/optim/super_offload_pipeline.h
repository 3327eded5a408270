// SuperOffload's optimizer pipeline (Lian et al., "SuperOffload: Unleashing the Power of
// Large-Scale LLM Training on Superchips", ASPLOS'26, arXiv 2509.21271, §4 "speculation-then-
// validation" and the heterogeneous optimizer; docs/design/TECHNIQUES.md §4.1,
// docs/design/TECHNIQUES-TESTS.md §2.2).
//
// Per optimizer step (the OptimizerPipeline protocol, optimizer_pipeline.h):
//   OnSubGroupReady(k), k a CPU sub-group: sub-group k's CpuAdam step is queued at once to the
//     pipeline's speculation thread (its own CpuAdam on the reserved threads) and runs while
//     backward continues for the other sub-groups. Before stepping, the thread copies k's fp32
//     masters and moments into k's snapshot (the exact rollback: a copy, not DeepSpeed's
//     closed-form inverse, so a rollback restores them bit for bit whatever the gradients held),
//     and steps on the unscaled, unclipped gradient g * (1 / loss_scale) (a separate fp32 slot
//     when the loss scale is not 1; DeepSpeed speculates on the scaled gradient). A sub-group
//     whose gradient holds an inf/NaN is not stepped (it is going to overflow anyway). The
//     finiteness check is the sub-group's squared gradient norm per parameter (one fp32 read;
//     non-finite iff an element is), which the caller's validation then takes instead of reading
//     the gradient again (ComputedSquaredNorm): the global norm's work moves under backward too.
//   FinishStep(v): waits for every queued step (applied to its own sub-group whatever the
//     completion order); while steps are still queued, the calling thread takes them from the
//     queue and runs them itself (its own single-threaded CpuAdam; the kernels are bit-identical
//     whatever the thread), so the tail of backward's last sub-groups is stepped by two threads.
//     The CPU sub-group steps FinishStep itself takes (replays, and steps not speculated) are
//     shared between the two threads the same way. Overflow: every speculated sub-group is
//     restored from its snapshot and nothing else runs (the step is skipped; the caller halves
//     the loss scale). Clipping active (v.clip_coef > 1; DeepSpeed turns speculation off here):
//     every speculated sub-group is restored and its step replayed with the gradient times
//     v.grad_multiplier. Otherwise the speculative steps stand (a "hit"). The device sub-groups
//     then take their in-memory Adam/AdamW step (ApplyOptimizerStep, worker/engine/optimizer.h)
//     with v.grad_multiplier.
//   Adaptive speculation (options.adaptive_speculation; the job default, offload_optimizer.
//     speculation "adaptive"): a step is speculated only if the previous committed step's
//     clipping was inactive (clip_coef <= 1; the first step is speculated). While the norm stays
//     above gradient_clipping (typical early in training, and the whole run of a small job) no
//     speculative step is taken only to be rolled back: the CPU sub-groups step in FinishStep as
//     in synchronous ZeRO-Offload (3x the optimizer's work otherwise: snapshot, step, restore and
//     replay; measured 0.55-0.60x of ZeRO-Offload's step, docs/benchmarks.md), and speculation
//     resumes the step after one whose norm was under the threshold. The prediction "as the last
//     step" costs at most one rolled-back step per transition into clipping. DeepSpeed instead
//     turns speculation off whenever gradient_clipping is configured. An overflowed step does
//     not change the decision. Results are the same either way (only where the step runs).
//
// Split (DeepSpeed zero/stage3.py): sub-group k's step runs on the CPU iff
// k >= floor((1 - ratio) * num_sub_groups), so `ratio` (offload_optimizer.ratio) is the fraction
// of sub-groups on the CPU: the last ones, whose gradients arrive first in backward. The others
// are "device" sub-groups; on a CPU-only node both live in the same host memory, and the choice
// only decides which optimizer code steps them after backward. Both sides take the same step
// count, learning rate and hyper-parameters. CpuAdam equals torch's op-by-op update up to FMA
// rounding (worker/engine/offload/cpu_adam.h), so changing ratio changes results only by that.
//
// State: the model's fp32 masters and moments (OptimizerPartition, as in-memory Adam), so a
// checkpoint holds every sub-group's optimizer state and a resume continues the trajectory; the
// pipeline adds the CPU sub-groups' snapshots (3 floats per element; none when no rollback can
// happen, options.exact_rollback false) and, when the loss scale can differ from 1, their
// unscaled-gradient slots (1 float per element): copy_bytes().
//
// NVMe optimizer state (options.nvme set: offload_optimizer.device "nvme"): every sub-group's
// master and moments live in the OffloadOptimizer's files, and a rollback needs no copy. The
// speculation thread reads CPU sub-group k's state into three swap buffers, steps it there, and
// holds the buffers until validation (OffloadOptimizer::StepGroupHeld): the files keep the
// pre-step state. A hit writes them back and copies the master into the model
// (CommitHeldGroup); an overflow or a clip drops them (DropHeldGroup), and a clip then replays
// the sub-group from the files as synchronous ZeRO-Infinity does. The model's parameter is
// written only at commit, so nothing backward reads changes while it runs. At most
// buffer_count / 3 sub-groups are held at once; a CPU sub-group that finds no free buffers is
// not speculated (not_speculated_no_buffer) and steps after validation, with the device
// sub-groups (their state is on the files too), through OffloadOptimizer::StepGroups. The
// swapper is single-threaded, so FinishStep's thread does not take queued speculative steps
// here; it waits for the speculation thread. No snapshot is allocated (copy_bytes is the
// unscaled-gradient slots only); the buffers are the optimizer's, counted in its
// resident_bytes.
//
// Thread-safety: OptimizerPipeline's contract. The speculation thread touches only the
// partitions of the sub-groups it was handed, after their gradients are final; the model's
// master of such a parameter may be its working stage-3 shard (fp32 training), which backward
// no longer reads once the parameter's gradient is final. stats() may be called from any thread.
// Errors: FinishStep returns DEADLINE_EXCEEDED when the queued steps do not finish within
// options.wait_deadline (the step is then closed and training must stop, as for any FinishStep
// error); Create returns INVALID_ARGUMENT naming offload_optimizer.ratio outside [0, 1].
#ifndef LOOM_WORKER_ENGINE_OPTIM_SUPER_OFFLOAD_PIPELINE_H_
#define LOOM_WORKER_ENGINE_OPTIM_SUPER_OFFLOAD_PIPELINE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "spec/ds_config.h"
#include "worker/engine/offload/cpu_adam.h"
#include "worker/engine/offload/offload_optimizer.h"
#include "worker/engine/optim/grad_norm.h"
#include "worker/engine/optim/optimizer_pipeline.h"

namespace loom::engine::optim {

struct SuperOffloadOptions {
  spec::OptimizerConfig optimizer;  // both sides' hyper-parameters
  double ratio = 1.0;         // fraction of sub-groups on the CPU (offload_optimizer.ratio)
  int cpu_threads = 1;        // CpuAdam threads for the speculative steps (cpuadam_cores_perc)
  // This step's loss scale, read at BeginStep (fp16 dynamic scaling); null = always 1.
  std::function<double()> loss_scale;
  bool loss_scaled = false;   // the scale can differ from 1: allocate the unscaled-grad slots
  // A step can be rolled back (clipping configured, or fp16 overflow possible): keep the
  // snapshots. false (gradient_clipping 0 and no loss scaling: no rollback can happen) drops
  // them, and their 3 floats per element of memory and of copying per step; a Commit with
  // clip_coef > 1 or a Rollback then fails with FAILED_PRECONDITION instead of guessing.
  bool exact_rollback = true;
  // See "Adaptive speculation" above; false speculates every step.
  bool adaptive_speculation = false;
  std::chrono::milliseconds wait_deadline{std::chrono::minutes(10)};
  // Optimizer state on NVMe (see above); not owned, must outlive the pipeline, and its plan()
  // must be the pipeline's. null: the state is the source's tensors in memory.
  offload::OffloadOptimizer* nvme = nullptr;
  // Tests only: called before each queued step runs, with its sub-group and whether the thread
  // in FinishStep (true) or the speculation thread (false) runs it.
  std::function<void(int64_t k, bool in_finish_step)> test_on_task;
};

// Counters since Create (all steps). Times are wall seconds.
struct SuperOffloadStats {
  int64_t steps = 0;               // FinishStep calls
  int64_t speculated = 0;          // sub-group steps started speculatively in OnSubGroupReady
  int64_t hits = 0;                // of them, committed as they were
  int64_t rollbacks_overflow = 0;  // sub-group steps undone because the step overflowed (fp16)
  int64_t rollbacks_clip = 0;      // sub-group steps undone because clipping was active
  int64_t replays = 0;             // sub-group steps replayed with the clip coefficient
  int64_t not_speculated_nonfinite = 0;  // sub-groups not stepped: their gradient was non-finite
  int64_t not_speculated_paused = 0;  // CPU sub-group steps not speculated because the previous
                                      // step clipped (adaptive speculation; stepped in FinishStep)
  int64_t not_speculated_no_buffer = 0;  // NVMe: no free swap buffers to hold it (FinishStep)
  int64_t step_rollbacks = 0;      // optimizer steps in which anything was rolled back
  double speculative_s = 0;        // the speculation thread's work (copies + CpuAdam)
  double overlapped_s = 0;         // the part of it done before FinishStep was entered
  double finish_work_s = 0;        // optimizer work inside FinishStep (restores, replays, device
                                   // sub-groups), the wait for queued steps excluded
  // Speculative sub-group steps committed / started (1 when none started).
  double hit_rate() const { return speculated == 0 ? 1.0 : double(hits) / speculated; }
  // The share of the optimizer's work hidden before FinishStep (under backward and validation).
  double overlap_fraction() const {
    const double total = speculative_s + finish_work_s;
    return total <= 0 ? 0.0 : overlapped_s / total;
  }
};

class SuperOffloadPipeline : public OptimizerPipeline {
 public:
  // `plan` cuts the source's partitions; the source returns defined fp32 param / exp_avg /
  // exp_avg_sq tensors (contiguous) and the gradient (undefined = zero).
  static absl::StatusOr<std::unique_ptr<SuperOffloadPipeline>> Create(
      const SuperOffloadOptions& options, SubGroupPlan plan, PartitionSource source);
  ~SuperOffloadPipeline() override;

  std::string name() const override { return "superoffload"; }
  // Sub-groups [first_cpu_sub_group(), num_sub_groups) step on the CPU.
  int64_t first_cpu_sub_group() const { return first_cpu_; }
  bool on_cpu(int64_t k) const { return k >= first_cpu_; }
  // Bytes of the snapshots and gradient slots (what exact rollback costs), allocated at Create.
  int64_t copy_bytes() const { return copy_bytes_; }
  SuperOffloadStats stats() const;
  // The squared norms its tasks computed this step (OptimizerPipeline::ComputedSquaredNorm).
  bool ComputedSquaredNorm(size_t i, double* squared_norm) const override;

 protected:
  absl::Status OnBegin() override;
  absl::Status OnReady(int64_t k) override;
  absl::Status Commit(const StepValidation& v) override;
  absl::Status Rollback() override;

 private:
  struct Slice {  // one parameter of a queued sub-group
    float* param;
    const float* grad;  // null = zero
    float* exp_avg;
    float* exp_avg_sq;
    int64_t numel;
    int64_t offset;  // element offset within the sub-group
    size_t index;    // the parameter's index (model order)
  };
  struct Task {
    int64_t k;
    int64_t step;
    double lr;
    double unscale;  // 1 / loss_scale
    std::vector<Slice> slices;
    int64_t epoch = 0;  // the norms' tag
    // A step posted by Commit, not a speculation: StepCpuGroup(k, multiplier), no snapshot,
    // no norm (slices empty).
    bool in_commit = false;
    double multiplier = 1.0;
  };
  struct CpuGroup {  // per CPU sub-group
    std::vector<float> param, exp_avg, exp_avg_sq;  // the snapshot
    std::vector<float> grad;                        // unscaled gradient (loss_scaled only)
    bool stepped = false;  // this step: speculated and stepped (the snapshot is live)
    bool nonfinite = false;
    bool no_buffer = false;                      // NVMe: not speculated, no buffers free
    offload::OffloadOptimizer::HeldGroup held;   // NVMe: the stepped state, not yet written
    absl::Status error;                          // NVMe: the speculative read's error
    std::chrono::steady_clock::time_point start, end;
  };

  SuperOffloadPipeline(const SuperOffloadOptions& options, SubGroupPlan plan,
                       PartitionSource source);
  // super_offload_pipeline_speculation.cc: WorkerLoop, RunTask, Drain, StepCpuGroupsInCommit,
  // DeadlineInCommit.
  void WorkerLoop();
  // Runs one queued step with `adam` (the speculation thread's adam_, or helper_adam_ on the
  // thread in FinishStep).
  void RunTask(const Task& t, offload::CpuAdam& adam);
  // RunTask's step with the state on NVMe: step k into held swap buffers (see above).
  void RunNvmeTask(const Task& t, CpuGroup& g, offload::CpuAdam& adam);
  // Runs queued steps on the calling thread until the queue is empty, then waits until no task
  // runs; false on the deadline.
  bool Drain();
  // Restores every stepped CPU sub-group from its snapshot; returns how many.
  int64_t RestoreAll();
  void StepCpuGroup(int64_t k, double multiplier, offload::CpuAdam& adam);
  // Steps the CPU sub-groups `ks` (not speculated, or replayed) with `multiplier` on both the
  // speculation thread and the calling thread; false on the deadline.
  bool StepCpuGroupsInCommit(const std::vector<int64_t>& ks, double multiplier);
  absl::Status DeadlineInCommit() const;  // StepCpuGroupsInCommit's deadline, as a status
  void StepDeviceGroups(double multiplier);
  // super_offload_pipeline_nvme.cc: RunNvmeTask, CommitNvme, RollbackNvme, TaskError.
  // Commit and Rollback with the state on NVMe (options_.nvme; see above).
  absl::Status CommitNvme(const StepValidation& v);
  absl::Status RollbackNvme();
  // The first speculative-read error of this step (NVMe), if any.
  absl::Status TaskError() const;
  // Stats of a committed step (and the adaptive decision's input), of a rolled-back one.
  void RecordCommit(const StepValidation& v, int64_t hits, int64_t rolled_back,
                    std::chrono::steady_clock::time_point work0);
  void RecordRollback(int64_t restored, std::chrono::steady_clock::time_point work0);
  // Adds the finished tasks' times to stats_ (overlap measured against `finish_entered`).
  void AccountTasks(std::chrono::steady_clock::time_point finish_entered);

  const SuperOffloadOptions options_;
  const PartitionSource source_;
  int64_t first_cpu_ = 0;
  int64_t copy_bytes_ = 0;
  double unscale_ = 1.0;
  bool speculate_ = true;             // this step's sub-groups go to the speculation thread
  bool last_clip_active_ = false;     // the last committed step had clip_coef > 1
  std::vector<CpuGroup> cpu_;  // index k - first_cpu_
  offload::CpuAdam adam_;      // speculation thread and replays (never concurrently)
  offload::CpuAdam helper_adam_;  // FinishStep's thread running queued steps (1 thread)
  // Per parameter: Σ g² of this step's gradient, published by the thread that ran its task.
  ReadySquaredNorms norms_;
  int64_t epoch_ = 0;  // advanced at every BeginStep (the norms' tag)

  std::mutex q_mu_;
  std::condition_variable q_cv_, idle_cv_;
  std::deque<Task> queue_;  // guarded by q_mu_
  bool busy_ = false;       // guarded by q_mu_
  bool stop_ = false;       // guarded by q_mu_
  std::thread worker_;

  mutable std::mutex stats_mu_;
  SuperOffloadStats stats_;  // guarded by stats_mu_
};

}  // namespace loom::engine::optim

#endif  // LOOM_WORKER_ENGINE_OPTIM_SUPER_OFFLOAD_PIPELINE_H_
