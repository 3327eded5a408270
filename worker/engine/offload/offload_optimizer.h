// ZeRO-Offload / ZeRO-Infinity optimizer for one rank's fp32 partition: optimizer state
// (fp32 master, exp_avg, exp_avg_sq) in host memory ("cpu") or on files ("nvme"), the step on
// the CPU with CpuAdam, sub-group by sub-group; optionally the rank's parameter partitions on
// files too (offload_param "nvme"), read for the all-gathers.
//
// Sources: ZeRO-Offload (Ren et al., ATC'21, §4: fp32 state and the Adam step on the CPU);
// ZeRO-Infinity (Rajbhandari et al., SC'21, §5-§6: NVMe state per rank, sub-group tiling,
// overlap of the next sub-group's read and the previous one's write with the current one's
// compute); DeepSpeed stage3.py (_optimizer_step per sub-group with
// _prepare_fp32_grad_for_sub_group / swap in / step / swap out), swap_tensor/
// pipelined_optimizer_swapper.py, partitioned_param_swapper.py. docs/design/TECHNIQUES.md
// §1.7-§1.8.
//
// Layout: the rank's flat partition is the concatenation of its parameter partitions (p_i
// elements each, in model order — the order of the checkpoint sections). Sub-groups are runs of
// whole parameters of at most sub_group_size elements (a larger parameter is a sub-group of its
// own), as DeepSpeed's stage 3 builds fp32 sub-groups: the cut of optim::SubGroupPlan
// (worker/engine/optim/sub_groups.h), plan(). Each is one record of each NVMe stream.
//
// Where things live (fp32 training: the "16-bit" model parameter is fp32 too):
//   optimizer cpu,  params in memory: master = the model's partition tensors (updated in place,
//                                     no copy); exp_avg/exp_avg_sq in host memory.
//   optimizer cpu,  params nvme:      master, exp_avg, exp_avg_sq in host memory; the model's
//                                     partitions on files (written after each step).
//   optimizer nvme, params in memory: master/exp_avg/exp_avg_sq on files, sub-group buffers in
//                                     memory; the updated master is copied to the model.
//   optimizer nvme, params nvme:      all of it on files; memory holds only the buffers.
// The update math is CpuAdam's in every case, so all four give bit-identical parameters and
// state for the same gradients.
//
// Not thread-safe: one caller at a time. The training loop is the caller, except that SuperOffload's
// speculation thread calls the held-group functions below while backward runs, and the training
// thread calls nothing on this object until that thread has finished (the pipeline's queue lock
// orders the two).
#ifndef LOOM_WORKER_ENGINE_OFFLOAD_OFFLOAD_OPTIMIZER_H_
#define LOOM_WORKER_ENGINE_OFFLOAD_OFFLOAD_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/offload/cpu_adam.h"
#include "worker/engine/offload/nvme_swapper.h"
#include "worker/engine/optim/sub_groups.h"

namespace loom::engine::offload {

struct OffloadOptimizerOptions {
  CpuAdamOptions adam;
  int64_t sub_group_size = 1000000000;  // elements (zero_optimization.sub_group_size)
  // offload_optimizer
  bool optimizer_nvme = false;
  std::string optimizer_dir;            // files of master/exp_avg/exp_avg_sq when nvme
  int64_t optimizer_buffer_count = 4;   // >= 3 (one per stream); 6 lets reads run ahead
  bool pipeline_read = false;           // prefetch sub-group i+1 while i computes
  bool pipeline_write = false;          // write sub-group i back while i+1 computes
  // offload_param
  bool params_nvme = false;
  std::string param_dir;
  int64_t param_buffer_count = 5;
  int64_t param_buffer_elements = 100000000;  // offload_param.buffer_size
  bool direct_io = true;
  int64_t aio_block_bytes = 1 << 20;  // aio.block_size: bytes per submitted transfer
  int aio_queue_depth = 8;            // aio.queue_depth: io_uring entries
};

class OffloadOptimizer {
 public:
  // partition_numels: p_i of every parameter in model order.
  // Errors: INVALID_ARGUMENT naming the offending option (buffer_count, buffer_size, ...);
  // file errors from the swapper, naming the file.
  static absl::StatusOr<std::unique_ptr<OffloadOptimizer>> Create(
      const OffloadOptimizerOptions& options, const std::vector<int64_t>& partition_numels);

  // Sets parameter i's initial value (p_i floats): master, and the parameter file when params
  // are on NVMe; exp_avg = exp_avg_sq = 0. Call for every i before the first Step, in model
  // order (cheapest: each NVMe sub-group record is written once; any order is correct). With
  // params in memory and optimizer cpu the model's tensor is the master and this does nothing
  // (the moments start at zero).
  absl::Status InitParam(size_t i, const float* values);

  // One step t (1-based) at learning rate lr. grads[i]: parameter i's gradient partition
  // (p_i floats) or null for zero. model_params[i]: the model's partition in memory (updated
  // with the new values), or null when params are on NVMe (their files are updated).
  absl::Status Step(int64_t t, double lr, const std::vector<float*>& model_params,
                    const std::vector<const float*>& grads);

  // Step's work for the listed sub-groups only, in that order (the same read/write pipelining),
  // then Flush. Step(t, lr, ...) is StepGroups(every sub-group, ...).
  absl::Status StepGroups(const std::vector<int64_t>& groups, int64_t t, double lr,
                          const std::vector<float*>& model_params,
                          const std::vector<const float*>& grads);

  // SuperOffload's delayed write-back (optimizer state on NVMe only; the caller is
  // optim/super_offload_pipeline.h). A held sub-group was read into three swap buffers and
  // stepped there, and is not written yet: its files still hold the pre-step master and moments,
  // so releasing the buffers undoes the step bit for bit with no copy, and writing them commits
  // it. At most holdable_groups() more can be held (free swap buffers / 3: a sub-group holds
  // three until it is committed or dropped).
  struct HeldGroup {
    int64_t group = -1;         // the sub-group; -1 = none held
    int buf[3] = {-1, -1, -1};  // master, exp_avg, exp_avg_sq
  };
  int64_t holdable_groups() const;
  // Reads sub-group g's state, waits for it, and steps it in the buffers with `adam` (the
  // caller's CpuAdam: same options as this object's, any thread count; the kernels are
  // bit-identical) at step t and lr. grads as in Step (only g's parameters are read). Errors:
  // FAILED_PRECONDITION when the optimizer state is not on NVMe or no three buffers are free;
  // OUT_OF_RANGE for g; the swapper's read errors, naming the file (nothing is then held).
  absl::StatusOr<HeldGroup> StepGroupHeld(int64_t g, int64_t t, double lr,
                                          const std::vector<const float*>& grads,
                                          CpuAdam& adam);
  // Copies the held master into model_params (as in Step) and starts writing the three buffers
  // back (they return to the pool when written; Flush waits). *h is emptied.
  absl::Status CommitHeldGroup(HeldGroup* h, const std::vector<float*>& model_params);
  // Releases the buffers unwritten: that sub-group's step never happened. *h is emptied.
  void DropHeldGroup(HeldGroup* h);
  // Writes the sub-group InitParam is filling, if any, and waits for every write started so
  // far (afterwards every buffer is free); the first write error.
  absl::Status Flush();

  // Parameter i's current partition (params on NVMe only): p_i floats into dst.
  absl::Status FetchParam(size_t i, float* dst);
  // The same in two halves, so the read overlaps compute (ZeRO-Infinity §6.2: parameters are
  // prefetched from NVMe ahead of their all-gather): StartFetchParam starts reading into a swap
  // buffer and returns it (FAILED_PRECONDITION when no buffer is free: keep at most
  // offload_param.buffer_count - 1 in flight so FetchParam always finds one); FinishFetchParam
  // waits for it, verifies it and copies it into dst (p_i floats); CancelFetchParam waits for it
  // and drops it. Each started fetch is finished or cancelled exactly once.
  absl::StatusOr<int> StartFetchParam(size_t i);
  absl::Status FinishFetchParam(size_t i, int buffer, float* dst);
  void CancelFetchParam(int buffer);
  int64_t param_buffer_count() const { return options_.param_buffer_count; }

  // Checkpoint I/O: the three sections (concatenation of partitions in model order, Σ p_i
  // floats each). model_params as in Step (needed when the model's tensors are the master).
  absl::Status ExportState(const std::vector<float*>& model_params, float* master, float* exp_avg,
                           float* exp_avg_sq);
  absl::Status ImportState(const std::vector<float*>& model_params, const float* master,
                           const float* exp_avg, const float* exp_avg_sq);
  // The same, one sub-group of one section at a time (which: 0 master, 1 exp_avg,
  // 2 exp_avg_sq), for checkpoints streamed through a buffer of one sub-group
  // (storage::WriteShardPieces / ReadShardPieces with pieces ending at group_end(g)).
  // dst/src: group_numel(g) floats. Importing section 0 also sets the parameters (model tensors
  // or parameter files).
  absl::Status ExportGroupSection(int64_t g, int which, const std::vector<float*>& model_params,
                                  float* dst);
  absl::Status ImportGroupSection(int64_t g, int which, const std::vector<float*>& model_params,
                                  const float* src);
  int64_t group_end(int64_t g) const { return plan_->group_end(g); }
  // The sub-group cut (its readiness state is unused here).
  const optim::SubGroupPlan& plan() const { return *plan_; }

  bool params_nvme() const { return options_.params_nvme; }
  bool optimizer_nvme() const { return options_.optimizer_nvme; }
  int64_t num_sub_groups() const { return plan_->num_sub_groups(); }
  // Bytes of model state this object keeps in host memory (moments, master copies, buffers).
  int64_t resident_bytes() const;
  const CpuAdam& adam() const { return adam_; }
  // Bytes moved to / from files so far (both swappers).
  int64_t nvme_bytes_read() const;
  int64_t nvme_bytes_written() const;

 private:
  using Group = optim::SubGroup;
  OffloadOptimizer(const OffloadOptimizerOptions& options);
  // Updates the sub-group whose master/m/v are at the given pointers with `adam`.
  void UpdateGroup(const Group& g, int64_t t, double lr, float* master, float* m, float* v,
                   const std::vector<const float*>& grads, CpuAdam& adam);
  // Copies the new master values of g into the model or the parameter files.
  absl::Status PublishGroup(const Group& g, const float* master,
                            const std::vector<float*>& model_params);
  bool master_is_model() const { return !options_.optimizer_nvme && !options_.params_nvme; }
  // Writes the sub-group InitParam is filling, if any.
  absl::Status FinishInit();

  OffloadOptimizerOptions options_;
  CpuAdam adam_;
  std::vector<int64_t> numels_, offsets_;
  std::optional<optim::SubGroupPlan> plan_;  // set by Create
  int64_t total_ = 0;
  // Host-memory state (optimizer cpu).
  std::vector<float> master_, exp_avg_, exp_avg_sq_;
  // NVMe state.
  std::unique_ptr<NvmeSwapper> opt_swapper_, param_swapper_;
  int s_master_ = -1, s_m_ = -1, s_v_ = -1, s_param_ = -1;
  int64_t init_group_ = -1;  // sub-group InitParam is filling (optimizer nvme)
  int init_buf_ = -1;
};

}  // namespace loom::engine::offload

#endif  // LOOM_WORKER_ENGINE_OFFLOAD_OFFLOAD_OPTIMIZER_H_
