// ZeRO-Offload / ZeRO-Infinity (zero_optimization.offload_optimizer / offload_param) as the ZeRO
// provider's PartitionSource (worker/engine/zero/partition_source.h): every parameter the
// provider builds is handed to the offload optimizer, which keeps its fp32 master and Adam
// moments; with offload_param nvme the stage-3 partitions live in the optimizer's files and
// all-gathers read them, with reads started ahead of the prefetch trace (one swap buffer always
// left for a fetch nobody hinted). docs/design/TECHNIQUES.md §1.7-§1.8.
//
// Not thread-safe: the provider calls it from the training thread only.
#ifndef LOOM_WORKER_ENGINE_OFFLOAD_PARTITION_SOURCE_H_
#define LOOM_WORKER_ENGINE_OFFLOAD_PARTITION_SOURCE_H_

#include <cstdint>
#include <map>
#include <vector>

#include "worker/engine/offload/offload_optimizer.h"
#include "worker/engine/zero/partition_source.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {

class OffloadPartitionSource : public PartitionSource {
 public:
  // `offload` must outlive this object; `partition_numels[i]`: parameter i's partition elements
  // p (the fp32 [p] tensor Fetch returns).
  OffloadPartitionSource(offload::OffloadOptimizer* offload, bool params_nvme,
                         std::vector<int64_t> partition_numels)
      : offload_(offload), params_nvme_(params_nvme), numels_(std::move(partition_numels)) {}

  // Hands parameter i's master to the offload optimizer; with params_nvme, master and shard
  // become stride-0 placeholders of [p] (nothing resident). Errors: the optimizer's, as they are.
  absl::Status OnParamBuilt(ParamId i, ZeroParam& p) override;
  bool serves_partitions() const override { return params_nvme_; }
  // Parameter i's fp32 partition [p], from a read started ahead when there is one. Throws
  // CollectiveError carrying the read's status.
  at::Tensor Fetch(ParamId i) override;
  // Starts parameter i's read; false when every swap buffer but one is busy (or the read could
  // not start: its error shows up in the fetch).
  bool ReadAhead(ParamId i) override;
  // Waits for and discards reads no fetch took.
  void DropReadAhead() override;
  int64_t reads_ahead() const { return reads_ahead_; }  // fetches served by a read ahead

 private:
  offload::OffloadOptimizer* offload_;
  bool params_nvme_;
  std::vector<int64_t> numels_;       // partition elements per parameter
  std::map<size_t, int> read_ahead_;  // parameter -> swap buffer of a read started ahead
  int64_t reads_ahead_ = 0;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_OFFLOAD_PARTITION_SOURCE_H_
