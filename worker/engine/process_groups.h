// The engine's named process groups, built from the world group and sequence_parallel_size P
// in DeepSpeed's layout (deepspeed/utils/groups.py, initialize_sequence_parallel;
// docs/design/TECHNIQUES.md §3): with world size W = D * P,
//   sequence_parallel  consecutive ranks: rank r's group is [r - r%P, ..., r - r%P + P-1]
//                      (DeepSpeed-Ulysses all-to-alls run here)
//   data_parallel      the ranks with equal r % P: [r%P, r%P + P, ..., r%P + (D-1)P]
//   zero_partition     data parallel x sequence parallel, which is the whole world when there is
//                      no other parallelism (DeepSpeed's sequence_data_parallel group: ZeRO
//                      partitions parameters, gradients and optimizer state over it)
//   world              every rank
// Each group carries its gradient divide factor as data: the number of ranks whose gradient
// contributions its reduction averages, i.e. its size (world: W, today's ZeRO divide;
// zero_partition: D*P, DeepSpeed's stage-3 pre-divide over the partition group; data_parallel:
// D; sequence_parallel: P). The ALST loss convention overrides the sequence factor
// (docs/design/TECHNIQUES.md §3.2, DeepSpeed issue #5248; SequenceLoss below), and with it the
// partition group's: zero_partition's factor is D x the sequence factor. The ZeRO provider divides
// every gradient contribution by zero_partition().grad_divide_factor (trainer_zero_options.h).
//
// Building is collective over the world group (every rank calls Create with the same P): for
// 1 < P < W it makes W/P sequence-parallel then P data-parallel Gloo subgroups (each rank keeps
// its two). Groups equal to the world reuse the world group and one-rank groups are local, so
// P = 1 creates no process group at all (existing jobs pay nothing), and P = W creates none
// either. Errors: INVALID_ARGUMENT naming sequence_parallel_size when P < 1 or P does not
// divide W; subgroup creation errors as Collectives::NewSubgroup returns them.
// The world group must outlive the ProcessGroups. Not thread-safe (like Collectives).
#ifndef LOOM_WORKER_ENGINE_PROCESS_GROUPS_H_
#define LOOM_WORKER_ENGINE_PROCESS_GROUPS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/collectives.h"

namespace loom::engine {

struct ProcessGroup {
  std::string name;                    // "world", "data_parallel", ...
  Collectives* collectives = nullptr;  // this rank's group; never null
  std::vector<int> ranks;              // world ranks of the members; group rank i is ranks[i]
  double grad_divide_factor = 1;       // gradients reduced over this group are divided by it
  int rank() const { return collectives->rank(); }
  int size() const { return static_cast<int>(ranks.size()); }
};

// How the P ranks of a sequence-parallel group turn their shards' losses into the sample's loss,
// which decides what the group's local gradients sum to (DeepSpeed issue #5248's ambiguity):
enum class SequenceLoss {
  // Each rank backpropagates its own shard's token-mean loss (DeepSpeed's differentiable
  // all_gather path): the local gradients sum to P x the sample's gradient, so the sequence
  // factor is P (zero_partition: D*P, DeepSpeed's stage-3 pre-divide).
  kMeanPerShard,
  // Rank r backpropagates loss_r * n_r / N (SequenceParallelRunner, sequence_parallel.h): the
  // local gradients sum to the sample's gradient, so the sequence factor is 1 (zero_partition:
  // D, the mean over the data-parallel samples).
  kShareOfSample,
};

class ProcessGroups {
 public:
  static absl::StatusOr<std::unique_ptr<ProcessGroups>> Create(
      Collectives& world, int sequence_parallel_size,
      SequenceLoss loss = SequenceLoss::kMeanPerShard);

  // The layout, for any rank (no communication): world ranks of rank's groups.
  static std::vector<int> SequenceParallelRanks(int rank, int world_size, int sp_size);
  static std::vector<int> DataParallelRanks(int rank, int world_size, int sp_size);

  const ProcessGroup& world() const { return world_; }
  const ProcessGroup& data_parallel() const { return data_parallel_; }
  const ProcessGroup& sequence_parallel() const { return sequence_parallel_; }
  const ProcessGroup& zero_partition() const { return zero_partition_; }
  int sequence_parallel_size() const { return sequence_parallel_.size(); }
  int data_parallel_size() const { return data_parallel_.size(); }
  // Gloo process groups this rank created for its groups (0 when P = 1 or P = W).
  int created_process_groups() const { return created_; }

 private:
  ProcessGroups() = default;
  ProcessGroup world_, data_parallel_, sequence_parallel_, zero_partition_;
  std::vector<std::unique_ptr<Collectives>> owned_;
  int created_ = 0;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_PROCESS_GROUPS_H_
