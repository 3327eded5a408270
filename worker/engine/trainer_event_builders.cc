// The Trainer's events as loom.TrainerEvent messages (proto/trainer_events.proto, whose field
// comments are the schema), built where the engine makes them; loom-trainer prints each with
// protobuf's JSON printer (worker/trainer/trainer_events.h).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "storage/checkpoint/shard_format.h"
#include "worker/engine/trainer_impl.h"
#include "worker/engine/zero/memory_tracker.h"

namespace loom::engine::internal {

template <typename Message>
void Trainer::SetMemoryFields(Message* m) {
  MemoryTracker& mem = model_->memory();
  m->set_param_bytes(mem.peak(MemoryKind::kParams));
  m->set_grad_bytes(mem.peak(MemoryKind::kGrads));
  m->set_optimizer_state_bytes(mem.peak(MemoryKind::kOptimizerStates));
  m->set_buffer_bytes(mem.peak(MemoryKind::kBuffers));
  m->set_cached_bytes(mem.peak(MemoryKind::kCached));
  m->set_activation_offload_bytes(mem.peak(MemoryKind::kActivationOffload));
  m->set_peak_bytes(mem.peak_total());
}

loom::TrainerEvent Trainer::StartedEvent(int64_t start) {
  loom::TrainerEvent ev;
  loom::TrainerEvent::Started* s = ev.mutable_started();
  s->set_rank(coll_.rank());
  s->set_world_size(coll_.world_size());
  s->set_params(spec::LlamaParamCount(o_.model));
  s->set_zero_stage(o_.ds.zero.stage);
  s->set_partition_bytes(model_->partition_bytes());
  s->set_offload_optimizer(o_.ds.zero.offload_optimizer.device);
  s->set_offload_param(o_.ds.zero.offload_param.device);
  s->set_offload_resident_bytes(offload_ ? offload_->resident_bytes() : 0);
  s->set_superoffload_copy_bytes(super_ ? super_->copy_bytes() : 0);
  s->set_superoffload_casting(super_ ? super_choice_.casting : "");
  s->set_superoffload_sub_group_size(super_ ? super_choice_.sub_group_size : 0);
  s->set_start_step(start);
  SetMemoryFields(s);
  return ev;
}

loom::TrainerEvent Trainer::StepEvent(const StepMeasures& m) {
  const int64_t global_tokens = o_.ds.train_batch_size * o_.sequence_length;
  MemoryTracker& mem = model_->memory();
  loom::TrainerEvent ev;
  loom::TrainerEvent::Step* s = ev.mutable_step();
  s->set_step(m.step);
  s->set_loss(m.loss);
  s->set_tokens_per_s(global_tokens / std::max(m.seconds, 1e-9));
  s->set_step_time_s(m.seconds);
  s->set_optimizer_s(last_optimizer_s_);
  s->set_comm_bytes(coll_.bytes_communicated());
  s->set_lr(m.lr);
  s->set_grad_norm(m.grad_norm);
  s->set_loss_scale(m.loss_scale);
  s->set_skipped(m.skipped);
  s->set_optimizer_step(optimizer_step_);
  s->set_gathered_bytes_between_steps(mem.current(MemoryKind::kBuffers));
  s->set_param_reads_ahead(partition_source_ ? partition_source_->reads_ahead() : 0);
  s->set_peak_gathered_bytes(mem.peak(MemoryKind::kBuffers));
  s->set_partition_bytes(model_->partition_bytes());
  s->set_prefetch_hits(model_->prefetch_hits());
  s->set_trace_invalidations(model_->trace_invalidations());
  s->set_on_demand_fetches(model_->on_demand_fetches());
  s->set_comm_s(m.comm_s);
  s->set_comm_elements(m.comm_elements);
  s->set_data_s(m.data_s);
  SetMemoryFields(s);
  if (zenflow_ != nullptr) {  // zenflow_setup.h: the CPU optimizer's share of the step
    const optim::ZenFlowMetrics& z = zenflow_->metrics();
    s->set_zenflow_stall_s(z.stall_s);
    s->set_zenflow_selected_mass_fraction(z.selected_mass_fraction);
    s->set_zenflow_update_interval(z.update_interval);
    s->set_zenflow_bytes_moved(z.bytes_moved);
  }
  if (super_ != nullptr) {  // this step's rollbacks and overlap, and the counters so far
    const optim::SuperOffloadStats now = super_->stats(), p = super_prev_;
    super_prev_ = now;
    optim::SuperOffloadStats d;  // this step's share
    d.speculative_s = now.speculative_s - p.speculative_s;
    d.overlapped_s = now.overlapped_s - p.overlapped_s;
    d.finish_work_s = now.finish_work_s - p.finish_work_s;
    s->set_optimizer_rollbacks(now.step_rollbacks - p.step_rollbacks);
    s->set_speculated_sub_groups(now.speculated);
    s->set_speculation_hits(now.hits);
    s->set_rollbacks_overflow(now.rollbacks_overflow);
    s->set_rollbacks_clip(now.rollbacks_clip);
    s->set_speculation_paused(now.not_speculated_paused);
    s->set_speculation_no_buffer(now.not_speculated_no_buffer);
    s->set_replays(now.replays);
    s->set_optimizer_overlap_fraction(d.overlap_fraction());
    s->set_optimizer_work_s(d.speculative_s + d.finish_work_s);
  }
  return ev;
}

loom::TrainerEvent Trainer::EvalEvent(int64_t step, double loss) {
  loom::TrainerEvent ev;
  ev.mutable_eval()->set_step(step);
  ev.mutable_eval()->set_loss(loss);
  return ev;
}

loom::TrainerEvent Trainer::StoppedEvent(int64_t step, int64_t checkpoint_step) {
  loom::TrainerEvent ev;
  ev.mutable_stopped()->set_step(step);
  if (checkpoint_step >= 0) ev.mutable_stopped()->set_checkpoint_step(checkpoint_step);
  return ev;
}

loom::TrainerEvent Trainer::CheckpointEvent(int64_t step) const {
  loom::TrainerEvent ev;
  ev.mutable_checkpoint()->set_step(step);
  ev.mutable_checkpoint()->set_dir(
      absl::StrCat(o_.checkpoint_dir, "/", storage::StepDirName(step)));
  return ev;
}

loom::TrainerEvent Trainer::DoneEvent(double initial_eval, double final_eval) const {
  loom::TrainerEvent ev;
  loom::TrainerEvent::Done* d = ev.mutable_done();
  d->set_step(o_.steps);
  d->set_initial_eval_loss(initial_eval);
  d->set_final_eval_loss(final_eval);
  d->set_collective_count(coll_.collective_count());
  d->set_collective_hash(absl::StrCat(absl::Hex(coll_.collective_hash())));
  return ev;
}

loom::TrainerEvent Trainer::WarningEvent(const std::string& message) {
  loom::TrainerEvent ev;
  ev.mutable_warning()->set_message(message);
  return ev;
}

}  // namespace loom::engine::internal
