// Sub-groups of a rank's optimizer partitions and the per-step "sub-group k ready" events.
//
// The rank's flat fp32 partition is the concatenation of its parameter partitions (p_i elements
// each, in model order — the order of the checkpoint sections). A sub-group is a run of whole
// parameters of at most sub_group_size elements, cut greedily; a parameter larger than
// sub_group_size is a sub-group of its own. This is the cut DeepSpeed's stage 3 uses for its fp32
// sub-groups (stage3.py _create_fp16_sub_groups) and the one definition Loom uses for the offload
// optimizer's NVMe records, the checkpoint pieces and the optimizer pipeline
// (worker/engine/optim/optimizer_pipeline.h). docs/design/TECHNIQUES.md §1.8, §4.1 (SuperOffload
// steps a sub-group as soon as its gradients are complete).
//
// Readiness: per optimizer step, every parameter's reduced gradient partition becomes final
// once (MarkParamReady(i)); a sub-group is ready when all of its parameters are. Today the
// Trainer marks every parameter after FinishMicroStep, in order; a ZeRO provider listener
// (OnPartitionGradReady) may mark them as reductions complete, in any order.
//
// Thread-safety: the cut is immutable after Create. ResetReadiness / MarkParamReady /
// all_ready are serialised by an internal mutex, so a listener on another thread may mark
// parameters while the training thread reads all_ready().
#ifndef LOOM_WORKER_ENGINE_OPTIM_SUB_GROUPS_H_
#define LOOM_WORKER_ENGINE_OPTIM_SUB_GROUPS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::engine::optim {

struct SubGroup {
  size_t first = 0, last = 0;  // parameters [first, last), model order
  int64_t offset = 0;          // flat element offset of parameter `first` in the rank's partition
  int64_t numel = 0;           // elements (sum of the parameters' partition numels)
};

class SubGroupPlan {
 public:
  // partition_numels: p_i (>= 0) of every parameter in model order; sub_group_size in elements
  // (zero_optimization.sub_group_size). Errors: INVALID_ARGUMENT naming
  // zero_optimization.sub_group_size when it is not positive, or a negative partition numel.
  static absl::StatusOr<SubGroupPlan> Create(const std::vector<int64_t>& partition_numels,
                                             int64_t sub_group_size);

  SubGroupPlan(const SubGroupPlan& other);
  SubGroupPlan& operator=(const SubGroupPlan& other);

  int64_t num_sub_groups() const { return static_cast<int64_t>(groups_.size()); }
  size_t num_params() const { return numels_.size(); }
  const SubGroup& sub_group(int64_t k) const { return groups_[k]; }
  const std::vector<SubGroup>& sub_groups() const { return groups_; }
  // The sub-group holding parameter i (i < num_params()).
  int64_t sub_group_of(size_t i) const { return group_of_[i]; }
  int64_t partition_numel(size_t i) const { return numels_[i]; }
  // Flat element offset of parameter i.
  int64_t partition_offset(size_t i) const { return offsets_[i]; }
  int64_t total_numel() const { return total_; }
  // One past the last flat element of sub-group k (checkpoint piece ends).
  int64_t group_end(int64_t k) const { return groups_[k].offset + groups_[k].numel; }

  // Starts a new step: no parameter is ready.
  void ResetReadiness();
  // Parameter i's reduced gradient partition is final for this step. Returns the sub-group that
  // became ready with it, or -1 when its sub-group still waits for other parameters.
  // Errors: OUT_OF_RANGE for i >= num_params(); FAILED_PRECONDITION when i was already marked
  // since the last ResetReadiness.
  absl::StatusOr<int64_t> MarkParamReady(size_t i);
  // Every sub-group is ready (vacuously true with no parameters).
  bool all_ready() const;

 private:
  SubGroupPlan() = default;

  std::vector<int64_t> numels_, offsets_, group_of_;
  std::vector<SubGroup> groups_;
  int64_t total_ = 0;
  mutable std::mutex mu_;
  std::vector<bool> param_ready_;         // guarded by mu_
  std::vector<int64_t> pending_params_;   // per sub-group, guarded by mu_
  int64_t groups_ready_ = 0;              // guarded by mu_
};

}  // namespace loom::engine::optim

#endif  // LOOM_WORKER_ENGINE_OPTIM_SUB_GROUPS_H_
