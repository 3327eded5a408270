#include "worker/worker_metrics.h"

#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <utility>

namespace loom::worker {

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry)
    : heartbeats_(prometheus::BuildCounter()
                      .Name("loom_worker_heartbeats_total")
                      .Help("Heartbeats sent to the scheduler, by result.")
                      .Register(registry)),
      last_heartbeat_(prometheus::BuildGauge()
                 .Name("loom_worker_last_heartbeat_timestamp_seconds")
                 .Help("Unix time of the last heartbeat the scheduler accepted.")
                 .Register(registry)),
      ranks_(prometheus::BuildGauge()
                 .Name("loom_worker_ranks")
                 .Help("Rank processes known to this worker, by state.")
                 .Register(registry)),
      slots_(prometheus::BuildGauge()
                 .Name("loom_worker_slots")
                 .Help("Rank slots this worker offers.")
                 .Register(registry)),
      step_(prometheus::BuildGauge()
                .Name("loom_trainer_step")
                .Help("Last completed optimizer step of the rank running in this slot.")
                .Register(registry)),
      loss_(prometheus::BuildGauge()
                .Name("loom_trainer_loss")
                .Help("Training loss (nats per token) of the last step.")
                .Register(registry)),
      tokens_per_second_(prometheus::BuildGauge()
                             .Name("loom_trainer_tokens_per_second")
                             .Help("Training throughput of the job, in tokens per second.")
                             .Register(registry)),
      eval_loss_(prometheus::BuildGauge()
                     .Name("loom_trainer_eval_loss")
                     .Help("Most recent held-out loss (nats per token).")
                     .Register(registry)),
      step_seconds_(prometheus::BuildGauge()
                 .Name("loom_trainer_step_seconds")
                 .Help("Wall time of the last optimizer step of the rank.")
                 .Register(registry)),
      memory_bytes_(prometheus::BuildGauge()
                 .Name("loom_trainer_memory_bytes")
                 .Help("Trainer memory by kind: partition = this rank's ZeRO-3 parameter shard, peak_gathered = peak all-gathered parameters in the last step.")
                 .Register(registry)),
      last_step_time_(prometheus::BuildGauge()
                 .Name("loom_trainer_last_step_timestamp_seconds")
                 .Help("Unix time of the rank's last step (or of its start before the first step).")
                 .Register(registry)),
      last_checkpoint_step_(prometheus::BuildGauge()
                 .Name("loom_trainer_last_checkpoint_step")
                 .Help("Step of the last checkpoint the rank wrote.")
                 .Register(registry)),
      last_checkpoint_time_(prometheus::BuildGauge()
                 .Name("loom_trainer_last_checkpoint_timestamp_seconds")
                 .Help("Unix time of the rank's last checkpoint (or of its start before the first one).")
                 .Register(registry)),
      rank_info_(prometheus::BuildGauge()
                     .Name("loom_worker_rank_info")
                     .Help("1 for each rank process this worker runs (starting or running), "
                           "labelled with its job, attempt and rank.")
                     .Register(registry)),
      communication_seconds_(
          prometheus::BuildGauge()
              .Name("loom_trainer_communication_seconds")
              .Help("Seconds of the rank's last step its training thread was blocked in "
                    "collectives (start to completion of each blocking call).")
              .Register(registry)),
      stall_seconds_(
          prometheus::BuildGauge()
              .Name("loom_trainer_stall_seconds")
              .Help("Seconds of the rank's last step spent waiting instead of computing: "
                    "blocked in collectives plus producing the step's input batches.")
              .Register(registry)),
      optimizer_rollbacks_(
          prometheus::BuildCounter()
              .Name("loom_trainer_optimizer_rollbacks_total")
              .Help("Optimizer steps rolled back (SuperOffload's speculative CPU optimizer "
                    "step: steps in which any sub-group was rolled back).")
              .Register(registry)),
      accelerator_info_(
          prometheus::BuildGauge()
              .Name("loom_rank_accelerator_info")
              .Help("1 per starting or running rank: node id, accelerator index (the slot the "
                    "worker gave the rank), job id and rank; join with DCGM_FI_* on gpu.")
              .Register(registry)),
      zenflow_stall_seconds_(
          prometheus::BuildGauge()
              .Name("loom_trainer_zenflow_stall_seconds")
              .Help("ZenFlow: seconds of the rank's last step its training thread waited on the "
                    "CPU optimizer.")
              .Register(registry)),
      zenflow_selected_mass_fraction_(
          prometheus::BuildGauge()
              .Name("loom_trainer_zenflow_selected_mass_fraction")
              .Help("ZenFlow: the selected columns' share of the 2-D gradients' L1 mass.")
              .Register(registry)),
      zenflow_update_interval_steps_(
          prometheus::BuildGauge()
              .Name("loom_trainer_zenflow_update_interval_steps")
              .Help("ZenFlow: optimizer steps in the last completed CPU update interval.")
              .Register(registry)),
      zenflow_bytes_moved_(
          prometheus::BuildGauge()
              .Name("loom_trainer_zenflow_bytes_moved")
              .Help("ZenFlow: bytes moved between the device-side partitions and the host "
                    "buffers since the rank started.")
              .Register(registry)),
      superoffload_speculated_(
          prometheus::BuildCounter()
              .Name("loom_trainer_superoffload_speculated_sub_groups_total")
              .Help("SuperOffload: sub-group CPU optimizer steps started speculatively during "
                    "backward.")
              .Register(registry)),
      superoffload_paused_(
          prometheus::BuildCounter()
              .Name("loom_trainer_superoffload_speculation_paused_sub_groups_total")
              .Help("SuperOffload: sub-group CPU optimizer steps not speculated because the "
                    "previous step clipped (adaptive speculation); stepped after validation.")
              .Register(registry)),
      superoffload_no_buffer_(
          prometheus::BuildCounter()
              .Name("loom_trainer_superoffload_speculation_no_buffer_sub_groups_total")
              .Help("SuperOffload with NVMe optimizer state: sub-group CPU optimizer steps not "
                    "speculated because no swap buffers were free to hold them "
                    "(offload_optimizer.buffer_count); stepped after validation.")
              .Register(registry)),
      superoffload_hits_(
          prometheus::BuildCounter()
              .Name("loom_trainer_superoffload_speculation_hits_total")
              .Help("SuperOffload: speculative sub-group steps committed as they were.")
              .Register(registry)),
      superoffload_hit_rate_(
          prometheus::BuildGauge()
              .Name("loom_trainer_superoffload_speculation_hit_rate")
              .Help("SuperOffload: speculation hits / speculative sub-group steps since the rank "
                    "started (0 before any).")
              .Register(registry)),
      superoffload_rollbacks_(
          prometheus::BuildCounter()
              .Name("loom_trainer_superoffload_rollbacks_total")
              .Help("SuperOffload: speculative sub-group steps undone, by reason (overflow: fp16 "
                    "non-finite gradients, the step skipped; clip: gradient clipping active).")
              .Register(registry)),
      superoffload_replays_(
          prometheus::BuildCounter()
              .Name("loom_trainer_superoffload_replays_total")
              .Help("SuperOffload: rolled-back sub-group steps run again, by reason (clip: with "
                    "the clip coefficient).")
              .Register(registry)),
      superoffload_overlap_fraction_(
          prometheus::BuildGauge()
              .Name("loom_trainer_superoffload_optimizer_overlap_fraction")
              .Help("SuperOffload: share of the last step's optimizer work done before the end "
                    "of backward.")
              .Register(registry)),
      superoffload_optimizer_work_seconds_(
          prometheus::BuildGauge()
              .Name("loom_trainer_superoffload_optimizer_work_seconds")
              .Help("SuperOffload: seconds of optimizer work in the last step.")
              .Register(registry)) {
  for (const char* r : {"ok", "error"}) heartbeats_.Add({{"result", r}});
}

void WorkerMetrics::RecordHeartbeat(bool ok) {
  heartbeats_.Add({{"result", ok ? "ok" : "error"}}).Increment();
  if (ok) last_heartbeat_.Add({}).SetToCurrentTime();
}

void WorkerMetrics::RecordRanks(const std::vector<loom::v1::RankStatus>& ranks, int slots) {
  slots_.Add({}).Set(slots);
  std::map<std::string, int> by_state;
  for (int s = loom::v1::RANK_STATE_STARTING; s <= loom::v1::RANK_STATE_STOPPED; ++s) {
    by_state[loom::v1::RankState_Name(static_cast<loom::v1::RankState>(s))] = 0;
  }
  for (const loom::v1::RankStatus& r : ranks) by_state[loom::v1::RankState_Name(r.state())]++;
  // Succeeded ranks first (their final step), then running ones, which win on a shared label.
  for (loom::v1::RankState state : {loom::v1::RANK_STATE_SUCCEEDED, loom::v1::RANK_STATE_RUNNING}) {
    for (const loom::v1::RankStatus& r : ranks) {
      if (r.state() != state) continue;
      prometheus::Labels labels = {{"rank", std::to_string(r.rank())}};
      step_.Add(labels).Set(static_cast<double>(r.progress().step()));
      loss_.Add(labels).Set(r.progress().loss());
      tokens_per_second_.Add(labels).Set(r.progress().tokens_per_second());
      if (r.progress().has_eval_loss()) eval_loss_.Add(labels).Set(r.progress().eval_loss());
      last_checkpoint_step_.Add(labels).Set(
          static_cast<double>(r.progress().last_checkpoint_step()));
    }
  }
  for (const auto& [state, n] : by_state) ranks_.Add({{"state", state}}).Set(n);

  // The info series follow the set of starting and running ranks exactly.
  std::set<std::tuple<std::string, int, int>> live;
  for (const loom::v1::RankStatus& r : ranks) {
    if (r.state() == loom::v1::RANK_STATE_STARTING || r.state() == loom::v1::RANK_STATE_RUNNING) {
      live.insert({r.job_id(), r.attempt(), r.rank()});
    }
  }
  absl::MutexLock l(&mu_);
  for (auto it = info_.begin(); it != info_.end();) {
    if (live.count(it->first) == 0) {
      rank_info_.Remove(it->second);
      it = info_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& key : live) {
    if (info_.count(key) > 0) continue;
    const auto& [job_id, attempt, rank] = key;
    prometheus::Gauge& g = rank_info_.Add(
        {{"job_id", job_id}, {"attempt", std::to_string(attempt)}, {"rank", std::to_string(rank)}});
    g.Set(1);
    info_[key] = &g;
  }
}

void WorkerMetrics::RecordRankStats(int rank, const RankStats& stats) {
  prometheus::Labels labels = {{"rank", std::to_string(rank)}};
  step_seconds_.Add(labels).Set(stats.step_seconds);
  memory_bytes_.Add({{"rank", std::to_string(rank)}, {"kind", "partition"}})
      .Set(stats.partition_bytes);
  memory_bytes_.Add({{"rank", std::to_string(rank)}, {"kind", "peak_gathered"}})
      .Set(stats.peak_gathered_bytes);
  if (stats.last_step_unix_seconds > 0) last_step_time_.Add(labels).Set(stats.last_step_unix_seconds);
  if (stats.last_checkpoint_unix_seconds > 0) {
    last_checkpoint_time_.Add(labels).Set(stats.last_checkpoint_unix_seconds);
  }
  communication_seconds_.Add(labels).Set(stats.communication_seconds);
  stall_seconds_.Add(labels).Set(stats.stall_seconds);
  if (stats.zenflow) {
    zenflow_stall_seconds_.Add(labels).Set(stats.zenflow_stall_seconds);
    zenflow_selected_mass_fraction_.Add(labels).Set(stats.zenflow_selected_mass_fraction);
    zenflow_update_interval_steps_.Add(labels).Set(stats.zenflow_update_interval_steps);
    zenflow_bytes_moved_.Add(labels).Set(stats.zenflow_bytes_moved);
  }
  for (const auto& [kind, bytes] : stats.memory_bytes_by_kind) {
    memory_bytes_.Add({{"rank", std::to_string(rank)}, {"kind", kind}}).Set(bytes);
  }
  absl::MutexLock l(&mu_);
  const int64_t pid = stats.process_id;
  AddCumulative(optimizer_rollbacks_.Add(labels), rank, "optimizer_rollbacks", pid,
                stats.optimizer_rollbacks);
  if (stats.superoffload) {
    const std::string r = std::to_string(rank);
    AddCumulative(superoffload_speculated_.Add(labels), rank, "speculated", pid,
                  stats.superoffload_speculated);
    AddCumulative(superoffload_hits_.Add(labels), rank, "hits", pid,
                  stats.superoffload_hits);
    AddCumulative(superoffload_paused_.Add(labels), rank, "paused", pid,
                  stats.superoffload_speculation_paused);
    AddCumulative(superoffload_no_buffer_.Add(labels), rank, "no_buffer", pid,
                  stats.superoffload_speculation_no_buffer);
    AddCumulative(superoffload_rollbacks_.Add({{"rank", r}, {"reason", "overflow"}}), rank,
                  "rollbacks_overflow", pid, stats.superoffload_rollbacks_overflow);
    AddCumulative(superoffload_rollbacks_.Add({{"rank", r}, {"reason", "clip"}}), rank,
                  "rollbacks_clip", pid, stats.superoffload_rollbacks_clip);
    AddCumulative(superoffload_replays_.Add({{"rank", r}, {"reason", "clip"}}), rank, "replays", pid,
                  stats.superoffload_replays);
    superoffload_hit_rate_.Add(labels).Set(
        stats.superoffload_speculated > 0
            ? stats.superoffload_hits / stats.superoffload_speculated
            : 0.0);
    superoffload_overlap_fraction_.Add(labels).Set(stats.superoffload_overlap_fraction);
    superoffload_optimizer_work_seconds_.Add(labels).Set(
        stats.superoffload_optimizer_work_seconds);
  }
}

void WorkerMetrics::AddCumulative(prometheus::Counter& counter, int rank, const std::string& name,
                                  int64_t pid, double cumulative) {
  std::vector<std::pair<int64_t, double>>& seen = cumulative_seen_[{rank, name}];
  auto it = std::find_if(seen.begin(), seen.end(), [&](const auto& e) { return e.first == pid; });
  if (it == seen.end()) {
    if (seen.size() >= kProcessesPerRank) seen.erase(seen.begin());
    seen.emplace_back(pid, 0.0);
    it = seen.end() - 1;
  }
  if (cumulative > it->second) counter.Increment(cumulative - it->second);
  it->second = std::max(it->second, cumulative);
}

void WorkerMetrics::RecordAcceleratorAssignments(const std::string& node,
                                                 const std::vector<AcceleratorAssignment>& live) {
  std::set<AcceleratorAssignment> want(live.begin(), live.end());
  absl::MutexLock l(&mu_);
  for (auto it = accelerator_series_.begin(); it != accelerator_series_.end();) {
    if (want.count(it->first) == 0) {
      accelerator_info_.Remove(it->second);
      it = accelerator_series_.erase(it);
    } else {
      ++it;
    }
  }
  for (const AcceleratorAssignment& a : want) {
    if (accelerator_series_.count(a) > 0) continue;
    prometheus::Gauge& g = accelerator_info_.Add({{"node", node},
                                                  {"accelerator_index",
                                                   std::to_string(a.accelerator_index)},
                                                  {"job_id", a.job_id},
                                                  {"rank", std::to_string(a.rank)}});
    g.Set(1);
    accelerator_series_[a] = &g;
  }
}

}  // namespace loom::worker
