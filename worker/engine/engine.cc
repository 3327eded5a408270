// RunTraining (engine.h): the Trainer's step loop, stop agreement and checkpoints. The class is
// declared in trainer_impl.h; set-up, the optimizer step and the events live in trainer_setup.cc,
// trainer_step.cc and trainer_event_builders.cc.
#include "worker/engine/engine.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "storage/checkpoint/shard_format.h"
#include "worker/engine/trainer_impl.h"
#include "worker/engine/zenflow_setup.h"

namespace loom::engine {
namespace internal {

int Trainer::StopAgreed() {
  double local = 0;
  if (stop_ != nullptr && stop_->load()) {
    local = 2;
  } else if (checkpoint_stop_ != nullptr && checkpoint_stop_->load()) {
    local = 1;
  }
  at::Tensor flag = at::full({1}, local, at::kDouble);
  Check(coll_.AllReduce(flag, ReduceOp::kMax));
  return static_cast<int>(flag.item<double>());
}

CheckpointMeta Trainer::MetaAt(int64_t step) const {
  CheckpointMeta meta;
  meta.optimizer_step = optimizer_step_;
  if (metric_step_loss_.first == step) meta.metrics["train_loss"] = metric_step_loss_.second;
  if (metric_eval_loss_.first == step) meta.metrics["eval_loss"] = metric_eval_loss_.second;
  return meta;
}

absl::Status Trainer::SaveCheckpoint(int64_t step) {
  CheckpointMeta meta = MetaAt(step);
  if (zenflow_ != nullptr) {  // before the shard, so a committed checkpoint has it
    ASSIGN_OR_RETURN(storage::SideFile state,
                     SaveZenFlowState(*zenflow_, absl::StrCat(o_.checkpoint_dir, "/",
                                                              storage::StepDirName(step)),
                                      coll_.rank()));
    meta.side_files.push_back(std::move(state));
  }
  RETURN_IF_ERROR(checkpoints_->WriteShards(o_.checkpoint_dir, step, meta));
  Emit(CheckpointEvent(step));
  return absl::OkStatus();
}

absl::Status Trainer::Run() {
  int64_t start = 0;
  RETURN_IF_ERROR(SetUp(&start));
  Emit(StartedEvent(start));
  if (!o_.trajectory_dir.empty()) {
    const TrajectoryShape shape = TrajectoryShapeFor(o_, coll_.rank(), coll_.world_size(), start);
    ASSIGN_OR_RETURN(trajectory_, TrajectoryRecorder::Open(o_.trajectory_dir, shape));
    Check(coll_.Barrier());  // every rank checked the directory before anyone writes to it
    RETURN_IF_ERROR(checkpoints_->ExportTrajectoryWeights(
        *trajectory_, trajectory_->InitialShardsDir(), start, "initial_hf", MetaAt(start)));
  }
  LOG(INFO) << "rank " << coll_.rank() << "/" << coll_.world_size() << ": "
            << spec::LlamaParamCount(o_.model) << " params, partition " << model_->partition_bytes()
            << " bytes, corpus " << corpus_.train.size() << "/" << corpus_.heldout.size()
            << " tokens, start step " << start;

  const double initial_eval = Evaluate();
  Emit(EvalEvent(start, initial_eval));
  double last_eval = initial_eval;
  int64_t last_checkpoint = o_.resume_from.empty() ? -1 : start;
  const int64_t global_tokens = o_.ds.train_batch_size * o_.sequence_length;

  for (int64_t s = start; s < o_.steps; ++s) {
    const int stop = StopAgreed();
    if (stop == 1 && !o_.checkpoint_dir.empty()) {
      // Graceful stop: a committed checkpoint of the steps done, then out.
      if (last_checkpoint != s) {
        RETURN_IF_ERROR(SaveCheckpoint(s));
        last_checkpoint = s;
      }
      Check(coll_.Barrier());  // every rank's shard is written
      Emit(StoppedEvent(s, /*checkpoint_step=*/s));
      LOG(INFO) << "stopped gracefully after step " << s << " with a final checkpoint";
      return absl::OkStatus();
    }
    if (stop != 0) {
      Emit(StoppedEvent(s, /*checkpoint_step=*/-1));
      return absl::CancelledError(absl::StrCat("stopped by signal before step ", s + 1));
    }
    model_->memory().ResetPeaks();
    const auto t0 = std::chrono::steady_clock::now();
    const double comm0 = coll_.blocked_seconds(), data0 = data_seconds_;
    const int64_t moved0 = coll_.elements_moved();
    double grad_norm = 0, lr = 0;
    bool skipped = false;
    const double loss_scale = scaler_.scale();
    const double loss = TrainStep(s, &grad_norm, &lr, &skipped);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    StepMeasures m;
    m.step = s + 1;
    m.loss = loss;
    m.seconds = secs;
    m.lr = lr;
    m.grad_norm = grad_norm;
    m.loss_scale = loss_scale;
    m.skipped = skipped;
    m.comm_s = coll_.blocked_seconds() - comm0;
    m.comm_elements = coll_.elements_moved() - moved0;
    m.data_s = data_seconds_ - data0;
    Emit(StepEvent(m));
    // Progress in the rank's log every steps_per_print steps, as DeepSpeed prints it.
    if (o_.ds.steps_per_print > 0 && ((s + 1) % o_.ds.steps_per_print == 0 || s == start)) {
      LOG(INFO) << "step " << s + 1 << "/" << o_.steps << " loss " << loss << " lr " << lr
                << " grad_norm " << grad_norm << " step_time " << secs << " s, "
                << static_cast<int64_t>(global_tokens / std::max(secs, 1e-9)) << " tokens/s";
    }
    metric_step_loss_ = {s + 1, loss};
    if (trajectory_ != nullptr) trajectory_->RecordStep(s + 1, loss, lr, grad_norm, skipped);
    const bool last = s + 1 == o_.steps;
    if (!last && o_.eval_every_steps > 0 && (s + 1) % o_.eval_every_steps == 0) {
      last_eval = Evaluate();
      metric_eval_loss_ = {s + 1, last_eval};
      Emit(EvalEvent(s + 1, last_eval));
    }
    if (!last && !o_.checkpoint_dir.empty() && o_.checkpoint_interval_steps > 0 &&
        (s + 1) % o_.checkpoint_interval_steps == 0) {
      RETURN_IF_ERROR(SaveCheckpoint(s + 1));
      last_checkpoint = s + 1;
    }
  }
  if (zenflow_ != nullptr) {
    // The last CPU result into the final weights: Flush publishes it into the fp32 master
    // partitions, and the replicas that the final evaluation and final_logits.json read must be
    // refreshed from them (collective: every rank flushes here). Without the refresh, at stages
    // 0-2 the final held-out loss and logits were the previous refresh's weights while the
    // checkpoint held the flushed ones (zenflow_trainer_test's FinalEvalSeesTheLastCpuUpdate).
    zenflow_->Flush();
    model_->RefreshParams();
  }
  if (o_.steps > start) {
    last_eval = Evaluate();
    metric_eval_loss_ = {o_.steps, last_eval};
    Emit(EvalEvent(o_.steps, last_eval));
  }
  if (!o_.checkpoint_dir.empty() && last_checkpoint != o_.steps) {
    RETURN_IF_ERROR(SaveCheckpoint(o_.steps));
  }
  if (trajectory_ != nullptr) {
    RETURN_IF_ERROR(checkpoints_->ExportTrajectoryWeights(
        *trajectory_, trajectory_->FinalShardsDir(), o_.steps, "final_hf", MetaAt(o_.steps)));
    RETURN_IF_ERROR(trajectory_->Finish());
  }
  RETURN_IF_ERROR(checkpoints_->WriteFinalLogits(corpus_.heldout));
  Check(coll_.Barrier());
  Emit(DoneEvent(initial_eval, last_eval));
  return absl::OkStatus();
}

}  // namespace internal

absl::Status RunTraining(const EngineOptions& options, Collectives& collectives,
                         const EventCallback& emit, const std::atomic<bool>* stop_requested,
                         const std::atomic<bool>* checkpoint_and_stop) {
  if (collectives.world_size() != options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("world_size: collectives have ",
                                                   collectives.world_size(), ", options ",
                                                   options.world_size));
  }
  internal::Trainer trainer(options, collectives, emit, stop_requested, checkpoint_and_stop);
  try {
    return trainer.Run();
  } catch (const CollectiveError& e) {
    return e.status();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("libtorch: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("engine: ", e.what()));
  }
}

}  // namespace loom::engine
