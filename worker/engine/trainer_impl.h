// PRIVATE to //worker/engine:engine (not part of the engine's API; include engine.h instead).
// The Trainer class behind RunTraining (engine.h): one rank's training loop over a LlamaModel on
// the ZeRO stage 0-3 provider. Its members are defined in four files, one job each:
//   engine.cc                 RunTraining, Run (the step loop), stop agreement, checkpoints
//   trainer_setup.cc          SetUp: corpus, process groups, provider, model, offload, pipeline
//   trainer_step.cc           one optimizer step (micro-steps, validation, update), evaluation
//   trainer_event_builders.cc the loom.TrainerEvent messages (proto/trainer_events.proto)
// Thread-safety: the training thread only (GradReadyListener calls arrive on it, during
// backward). Errors: CollectiveError is thrown by Check and by communicating calls; RunTraining
// turns it and LibTorch's exceptions into a Status.
#ifndef LOOM_WORKER_ENGINE_TRAINER_IMPL_H_
#define LOOM_WORKER_ENGINE_TRAINER_IMPL_H_

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "proto/trainer_events.pb.h"
#include "worker/engine/checkpoint_io.h"
#include "worker/engine/collectives.h"
#include "data/corpus.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_options.h"
#include "worker/engine/loss_scaler.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/offload/offload_optimizer.h"
#include "worker/engine/offload_partition_source.h"
#include "worker/engine/optim/optimizer_pipeline.h"
#include "worker/engine/optim/sub_groups.h"
#include "worker/engine/optim/super_offload_setup.h"
#include "worker/engine/optim/zenflow_pipeline.h"
#include "worker/engine/process_groups.h"
#include "worker/engine/sequence_parallel.h"
#include "worker/engine/trajectory.h"
#include "worker/engine/zero/partition_source.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine::internal {

// Throws CollectiveError for a failed status (inside a step, where Status cannot be returned).
inline void Check(const absl::Status& s) {
  if (!s.ok()) throw CollectiveError(s);
}

// What one step measured, for its step event (StepEvent).
struct StepMeasures {
  int64_t step = 0;         // 1-based optimizer step just finished
  double loss = 0;          // mean training loss, nats per token
  double seconds = 0;       // wall seconds of the step
  double lr = 0;
  double grad_norm = 0;
  double loss_scale = 1;    // the scale the step ran with
  bool skipped = false;
  double comm_s = 0;        // seconds blocked in collectives during the step
  int64_t comm_elements = 0;
  double data_s = 0;        // seconds building input batches during the step
};

class Trainer : public GradReadyListener {
 public:
  Trainer(const EngineOptions& o, Collectives& coll, const EventCallback& emit,
          const std::atomic<bool>* stop, const std::atomic<bool>* checkpoint_stop)
      : o_(o), coll_(coll), emit_(emit), stop_(stop), checkpoint_stop_(checkpoint_stop) {}

  absl::Status Run();

 private:
  void Emit(const loom::TrainerEvent& event) { emit_(event); }
  // trainer_setup.cc: everything before the first evaluation (corpus, warnings, groups, provider,
  // model, offload, pipeline, checkpoint I/O, resume); *start = the step training starts at.
  absl::Status SetUp(int64_t* start);
  // [rows, seq+1] int64 windows of `stream` starting at `starts`.
  at::Tensor Windows(const data::TokenStream& stream, const std::vector<int64_t>& starts);
  // One micro-batch from its windows: ids, targets [rows, seq] int64 (targets = the next
  // tokens). With dataset.pack_documents (rows == 1) also the packed sample's per-document
  // positions and document ids [seq] int64 (1-based), and the targets that would cross a
  // document boundary set to kIgnoreLabel; otherwise those two are undefined.
  struct Sample {
    at::Tensor window;  // [rows, sequence_length + 1], as Windows returns it
    at::Tensor ids, targets, positions, document_ids;
    std::vector<int64_t> window_positions;  // packed: positions of the seq + 1 window tokens
  };
  Sample MakeSample(const data::TokenStream& stream, const data::DocumentBoundaries& documents,
                    const std::vector<int64_t>& starts, int64_t seq);
  double MeanAcrossRanks(double local);
  double Evaluate();
  // One optimizer step (0-based `step`): GAS micro-batches, overflow check (fp16), clip, Adam.
  // Returns the mean loss; *skipped when an fp16 overflow skipped the update.
  double TrainStep(int64_t step, double* grad_norm, double* lr, bool* skipped);
  // After the last micro-step: sub-group events, overflow check, global norm and clip, then the
  // pipeline's FinishStep (commit, or roll back on overflow). `step`: 0-based, as TrainStep's;
  // `scale`: this step's loss scale.
  void OptimizerStep(int64_t step, double scale, double* grad_norm, bool* skipped);
  // See grads_to_clear_.
  void ReleaseGradsBeforeBackward();
  // GradReadyListener: parameter i's reduced gradient partition is final for this step (the ZeRO
  // provider raises it as the last micro-step's reductions complete, during backward): raises
  // its sub-group's OnSubGroupReady once the whole sub-group is. Idempotent within a step, so
  // the sweep after FinishMicroStep marks the parameters the provider did not raise (no
  // gradient this step).
  void OnPartitionGradReady(ParamId i) override;
  // pipeline_ over the model's partitions: the offload optimizer's when offload_ is set, else
  // in-memory Adam cut by zero_optimization.sub_group_size.
  absl::Status SetUpPipeline();
  // trainer_event_builders.cc. The memory fields (peaks per MemoryKind) of Started and Step.
  template <typename Message>
  void SetMemoryFields(Message* m);
  loom::TrainerEvent StartedEvent(int64_t start);
  // Reads the stage-3, offload, ZenFlow and SuperOffload counters; SuperOffload's per-step
  // shares are measured from the previous call, so call it once per step.
  loom::TrainerEvent StepEvent(const StepMeasures& m);
  static loom::TrainerEvent EvalEvent(int64_t step, double loss);
  // checkpoint_step < 0: a plain stop (no checkpoint_step field).
  static loom::TrainerEvent StoppedEvent(int64_t step, int64_t checkpoint_step);
  loom::TrainerEvent CheckpointEvent(int64_t step) const;
  loom::TrainerEvent DoneEvent(double initial_eval, double final_eval) const;
  static loom::TrainerEvent WarningEvent(const std::string& message);
  // engine.cc.
  absl::Status SaveCheckpoint(int64_t step);
  // The optimizer step and the recorded losses of `step`, for a checkpoint of it.
  CheckpointMeta MetaAt(int64_t step) const;
  // (step, value) of the latest training loss and held-out loss, for checkpoint metrics.
  std::pair<int64_t, double> metric_step_loss_{-1, 0};
  std::pair<int64_t, double> metric_eval_loss_{-1, 0};
  // 0 = go on, 1 = checkpoint and stop, 2 = stop now; the same on every rank (all-reduce MAX).
  int StopAgreed();
  // ZeRO-Offload / ZeRO-Infinity (zero_optimization.offload_optimizer / offload_param): builds
  // offload_ and the model hooks that hand it each parameter as it is created.
  absl::Status SetUpOffload(ZeroOptions* z);
  // Offload's PartitionSource (null without offload); ZeroOptions::partition_source points here.
  std::unique_ptr<OffloadPartitionSource> partition_source_;

  const EngineOptions& o_;
  Collectives& coll_;
  const EventCallback& emit_;
  const std::atomic<bool>* stop_;
  const std::atomic<bool>* checkpoint_stop_;
  data::Corpus corpus_;
  // The parameter state (ZeRO stage 0-3 provider) and the Llama model written against it.
  std::unique_ptr<ZeroProvider> model_;
  std::unique_ptr<LlamaModel> llama_;
  int64_t optimizer_step_ = 0;
  // --test_inject_inf_grad_steps: rank 0's first gradient element becomes +inf this step, written
  // when that partition's gradient is raised ready (OnPartitionGradReady), so that a pipeline
  // that reads gradients as they become ready (SuperOffload's speculation) sees it too.
  bool inject_inf_pending_ = false;
  LossScaler scaler_;
  // The NVMe swap directories this rank made (<nvme_path>/loom_swap_<job>_pid<p>_rank<r> and
  // its optimizer/ and params/), removed (when empty) after offload_, declared below and so
  // destroyed first, has deleted its swap files: nothing is left in nvme_path.
  struct ScratchDirs {
    std::vector<std::string> made;  // parents before children
    ~ScratchDirs();
  } scratch_dirs_;
  std::unique_ptr<offload::OffloadOptimizer> offload_;  // null: optimizer state in memory
  std::unique_ptr<optim::OptimizerPipeline> pipeline_;   // every optimizer update goes here
  optim::ZenFlowPipeline* zenflow_ = nullptr;            // pipeline_ when ZenFlow runs
  std::optional<optim::SubGroupPlan> ready_;             // pipeline_'s cut: this step's readiness
  // SuperOffload (offload_optimizer.super_offload): pipeline_ itself, for its counters.
  optim::SuperOffloadPipeline* super_ = nullptr;
  optim::SuperOffloadChoice super_choice_;
  optim::SuperOffloadStats super_prev_;  // counters at the previous step event
  std::vector<char> marked_;  // per parameter: OnPartitionGradReady seen in this step
  std::unique_ptr<CheckpointIo> checkpoints_;
  double last_optimizer_s_ = 0;  // wall time of the last OptimizerStep
  // The last committed step's gradients are still read by the pipeline
  // (reads_gradients_after_finish): ClearGrads waits for ReleaseGradients, before the next
  // backward (ReleaseGradsBeforeBackward).
  bool grads_to_clear_ = false;
  double data_seconds_ = 0;  // wall seconds spent building input batches so far
  std::unique_ptr<TrajectoryRecorder> trajectory_;  // null unless o_.trajectory_dir is set
  // The named process groups (process_groups.h), built for every job (P = 1 creates no process
  // group); the ZeRO provider divides gradients by groups_->zero_partition()'s factor
  // (trainer_zero_options.h). sp_: the runner of Ulysses' sharded micro-steps (issue 13;
  // sequence_parallel.h), null when sequence_parallel_size is 1.
  std::unique_ptr<ProcessGroups> groups_;
  std::unique_ptr<SequenceParallelRunner> sp_;
  // Data-parallel rank and size: the samples a rank sees (the world without sequence parallelism).
  int64_t DataRank() const { return groups_ ? groups_->data_parallel().rank() : coll_.rank(); }
  int64_t DataRanks() const {
    return groups_ ? groups_->data_parallel_size() : coll_.world_size();
  }
};

}  // namespace loom::engine::internal

#endif  // LOOM_WORKER_ENGINE_TRAINER_IMPL_H_
