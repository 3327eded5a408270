// SuperOffload for a job: the checks of the job spec, the casting choice and the sub-group size
// model, and the pipeline built from them (super_offload_pipeline.h). Called from the Trainer
// (worker/engine/engine.cc) when zero_optimization.offload_optimizer.super_offload is true.
//
// Optimizer state: host memory with offload_optimizer.device "cpu"; the offload optimizer's
// NVMe files with "nvme" (the pipeline then holds speculative steps in swap buffers instead of
// copying: super_offload_pipeline.h).
//
// Casting (paper §4.3 "superchip-aware casting"; docs/design/TECHNIQUES.md §4.1 item 3): where the
// fp32 <-> 16-bit casts happen is a choice between casting on the device and moving fp32 across the
// link (NVLink-C2C, ~900 GB/s on GH200) and casting on the host and moving 16-bit (PCIe). Loom's
// ranks train on CPUs: the gradients and the optimizer state are in the same host memory, nothing
// crosses a link, and the choice is recorded as "no transfer".
//
// Sub-group size (paper §4.4 "fine-grained bucketization") when zero_optimization.sub_group_size
// is not given: the speculative CPU Adam of a sub-group of n elements costs t(n) = a + n / b
// (a: per-call latency in seconds, b: elements per second), measured at start-up with the
// reserved threads on n = 2^12 and 2^18 elements (median of 5 each). The sub-group is the
// smallest n whose fixed cost a is at most 5% of t(n), n = 19 a b, and at most ceil(P / 8) for
// a rank partition of P elements (at least 8 sub-groups, so the one step not hidden under
// backward, the first layers' sub-group, is at most ~1/8 of the optimizer), and at least 4096.
// With a link, the model would add the transfer time n * bytes / bandwidth + link latency;
// on a CPU node that term is zero.
//
// Thread-safety: call from the training thread at start-up. Errors: INVALID_ARGUMENT naming the
// key (zero_optimization.stage 0, offload_param nvme).
#ifndef LOOM_WORKER_ENGINE_OPTIM_SUPER_OFFLOAD_SETUP_H_
#define LOOM_WORKER_ENGINE_OPTIM_SUPER_OFFLOAD_SETUP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "spec/ds_config.h"
#include "worker/engine/offload/offload_optimizer.h"
#include "worker/engine/optim/super_offload_pipeline.h"

namespace loom::engine::optim {


struct SuperOffloadChoice {
  std::string casting = "no transfer";  // see above
  int64_t sub_group_size = 0;           // elements; the user's, or the model's
  bool sub_group_size_modelled = false;
  double latency_s = 0;                 // the measured a (modelled only)
  double elements_per_s = 0;            // the measured b (modelled only)
  int cpu_threads = 1;                  // CpuAdam threads: cpuadam_cores_perc of the rank's
};

// The measured model above for `threads` CpuAdam threads and a partition of `partition_elems`.
SuperOffloadChoice ModelSubGroupSize(int threads, int64_t partition_elems);

// The job's choice: the CpuAdam threads (cpuadam_cores_perc of threads_per_rank, at least 1)
// and the sub-group size (zero_optimization.sub_group_size when given, else the model above for
// a partition of partition_elems).
SuperOffloadChoice ChooseSuperOffload(const spec::DeepSpeedConfig& ds, int threads_per_rank,
                                      int64_t partition_elems);

// The pipeline over the rank's partitions (numels in model order, p_i of each), with the loss
// scale read from loss_scale at every BeginStep (fp16). nvme_state: the job's offload optimizer
// when offload_optimizer.device is "nvme" (its plan is the pipeline's; build it with
// ChooseSuperOffload's sub_group_size, and pass that choice in *choice), else null: then *choice
// receives ChooseSuperOffload's result.
absl::StatusOr<std::unique_ptr<SuperOffloadPipeline>> MakeSuperOffloadPipelineForJob(
    const spec::DeepSpeedConfig& ds, int threads_per_rank, const std::vector<int64_t>& numels,
    PartitionSource source, std::function<double()> loss_scale,
    offload::OffloadOptimizer* nvme_state, SuperOffloadChoice* choice);

}  // namespace loom::engine::optim

#endif  // LOOM_WORKER_ENGINE_OPTIM_SUPER_OFFLOAD_SETUP_H_
