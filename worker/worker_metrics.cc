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
                .Help("Last completed optimizer step of the rank.")
                .Register(registry)),
      loss_(prometheus::BuildGauge()
                .Name("loom_trainer_loss")
                .Help("Training loss (nats per token) of the last step.")
                .Register(registry)),
      tokens_(prometheus::BuildCounter()
                  .Name("loom_trainer_tokens_total")
                  .Help("Global training tokens of the job's steps this rank took part in "
                        "(rate() is the job's throughput).")
                  .Register(registry)),
      tokens_per_second_(prometheus::BuildGauge()
                             .Name("loom_trainer_tokens_per_second")
                             .Help("Global training tokens per second of the job's last step.")
                             .Register(registry)),
      eval_loss_(prometheus::BuildGauge()
                     .Name("loom_trainer_eval_loss")
                     .Help("Most recent held-out loss (nats per token).")
                     .Register(registry)),
      step_seconds_(prometheus::BuildGauge()
                 .Name("loom_trainer_step_seconds")
                 .Help("Wall time of the last optimizer step of the rank.")
                 .Register(registry)),
      param_bytes_(prometheus::BuildGauge()
                 .Name("loom_trainer_param_bytes")
                 .Help("Bytes of the rank's parameters in their training dtype (its ZeRO partition, replicas, persistent gathered parameters). Model-state gauges (param, grad, optimizer_state) add up.")
                 .Register(registry)),
      grad_bytes_(prometheus::BuildGauge()
                 .Name("loom_trainer_grad_bytes")
                 .Help("Bytes of the rank's gradient accumulators and partitions.")
                 .Register(registry)),
      optimizer_state_bytes_(prometheus::BuildGauge()
                 .Name("loom_trainer_optimizer_state_bytes")
                 .Help("Bytes of the rank's optimizer state (Adam moments, fp32 master weights when separate, SuperOffload rollback copies).")
                 .Register(registry)),
      buffer_peak_bytes_(prometheus::BuildGauge()
                 .Name("loom_trainer_buffer_peak_bytes")
                 .Help("Peak bytes of temporary buffers in the rank's last step: gathered parameters, reduction buckets, all-gather buffers.")
                 .Register(registry)),
      cached_peak_bytes_(prometheus::BuildGauge()
                 .Name("loom_trainer_cached_peak_bytes")
                 .Help("Peak bytes of idle buffers kept for reuse (pooled) in the rank's last step.")
                 .Register(registry)),
      activation_offload_peak_bytes_(prometheus::BuildGauge()
                 .Name("loom_trainer_activation_offload_peak_bytes")
                 .Help("Peak bytes of checkpointed layer inputs held in host memory in the rank's last step (activation_checkpointing.cpu_checkpointing).")
                 .Register(registry)),
      memory_peak_bytes_(prometheus::BuildGauge()
                 .Name("loom_trainer_memory_peak_bytes")
                 .Help("Peak of the rank's total tracked memory (all kinds together) in its last step: what must fit.")
                 .Register(registry)),
      zero_partition_bytes_(prometheus::BuildGauge()
                 .Name("loom_trainer_zero_partition_bytes")
                 .Help("Bytes of this rank's ZeRO-3 parameter partition (part of loom_trainer_param_bytes).")
                 .Register(registry)),
      zero_gathered_peak_bytes_(prometheus::BuildGauge()
                 .Name("loom_trainer_zero_gathered_peak_bytes")
                 .Help("Peak all-gathered parameter bytes in the rank's last step (part of loom_trainer_buffer_peak_bytes).")
                 .Register(registry)),
      last_step_time_(prometheus::BuildGauge()
                 .Name("loom_trainer_last_step_timestamp_seconds")
                 .Help("Unix time of the rank's last step (or of its start before the first step).")
                 .Register(registry)),
      last_checkpoint_step_(prometheus::BuildGauge()
                 .Name("loom_trainer_last_checkpoint_step")
                 .Help("Step of the newest checkpoint the rank wrote or resumed from.")
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
      zenflow_selected_mass_ratio_(
          prometheus::BuildGauge()
              .Name("loom_trainer_zenflow_selected_mass_ratio")
              .Help("ZenFlow: the selected columns' share of the 2-D gradients' L1 mass.")
              .Register(registry)),
      zenflow_update_interval_steps_(
          prometheus::BuildGauge()
              .Name("loom_trainer_zenflow_update_interval_steps")
              .Help("ZenFlow: optimizer steps in the last completed CPU update interval.")
              .Register(registry)),
      zenflow_moved_bytes_(
          prometheus::BuildCounter()
              .Name("loom_trainer_zenflow_moved_bytes_total")
              .Help("ZenFlow: bytes moved between the device-side partitions and the host "
                    "buffers.")
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
      superoffload_hit_ratio_(
          prometheus::BuildGauge()
              .Name("loom_trainer_superoffload_speculation_hit_ratio")
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
      superoffload_overlap_ratio_(
          prometheus::BuildGauge()
              .Name("loom_trainer_superoffload_optimizer_overlap_ratio")
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

prometheus::Labels WorkerMetrics::RankLabels(const Key& key) {
  const auto& [job_id, attempt, rank] = key;
  return {{"job_id", job_id}, {"attempt", std::to_string(attempt)}, {"rank", std::to_string(rank)}};
}

prometheus::Gauge& WorkerMetrics::RankGauge(RankSeries& s, GaugeFamily& family,
                                            const prometheus::Labels& labels) {
  prometheus::Gauge& g = family.Add(labels);
  s.gauges.insert({&family, &g});
  return g;
}

prometheus::Counter& WorkerMetrics::RankCounter(RankSeries& s, CounterFamily& family,
                                                const prometheus::Labels& labels) {
  prometheus::Counter& c = family.Add(labels);
  s.counters.insert({&family, &c});
  return c;
}

void WorkerMetrics::SetTimestamp(RankSeries& s, GaugeFamily& family,
                                 const prometheus::Labels& labels, double unix_seconds) {
  prometheus::Gauge& g = family.Add(labels);
  s.timestamps.insert({&family, &g});
  g.Set(unix_seconds);
}

void WorkerMetrics::RemoveTimestamps(RankSeries& s) {
  for (const auto& [family, gauge] : s.timestamps) family->Remove(gauge);
  s.timestamps.clear();
}

void WorkerMetrics::RemoveAll(RankSeries& s) {
  RemoveTimestamps(s);
  for (const auto& [family, gauge] : s.gauges) family->Remove(gauge);
  for (const auto& [family, counter] : s.counters) family->Remove(counter);
  s.gauges.clear();
  s.counters.clear();
}

void WorkerMetrics::RecordRanks(const std::vector<loom::v1::RankStatus>& ranks, int slots) {
  slots_.Add({}).Set(slots);
  std::map<std::string, int> by_state;
  for (int s = loom::v1::RANK_STATE_STARTING; s <= loom::v1::RANK_STATE_STOPPED; ++s) {
    by_state[loom::v1::RankState_Name(static_cast<loom::v1::RankState>(s))] = 0;
  }
  for (const loom::v1::RankStatus& r : ranks) by_state[loom::v1::RankState_Name(r.state())]++;
  for (const auto& [state, n] : by_state) ranks_.Add({{"state", state}}).Set(n);

  absl::MutexLock l(&mu_);
  // Series of ranks the worker no longer reports go, with all their labels.
  std::set<Key> reported;
  for (const loom::v1::RankStatus& r : ranks) reported.insert({r.job_id(), r.attempt(), r.rank()});
  for (auto it = series_.begin(); it != series_.end();) {
    if (reported.count(it->first) == 0) {
      RemoveAll(it->second);
      it = series_.erase(it);
    } else {
      ++it;
    }
  }
  for (const loom::v1::RankStatus& r : ranks) {
    const Key key{r.job_id(), r.attempt(), r.rank()};
    RankSeries& s = series_[key];
    s.running = r.state() == loom::v1::RANK_STATE_RUNNING;
    if (!s.running) RemoveTimestamps(s);  // an ended rank does not age
    s.stepped = r.progress().step() > 0;
    if (!s.stepped) continue;  // nothing (no zeros) before the rank's first step
    const prometheus::Labels labels = RankLabels(key);
    RankGauge(s, step_, labels).Set(static_cast<double>(r.progress().step()));
    RankGauge(s, loss_, labels).Set(r.progress().loss());
    RankGauge(s, tokens_per_second_, labels).Set(r.progress().tokens_per_second());
    if (r.progress().has_eval_loss()) {
      RankGauge(s, eval_loss_, labels).Set(r.progress().eval_loss());
    }
    RankGauge(s, last_checkpoint_step_, labels)
        .Set(static_cast<double>(r.progress().last_checkpoint_step()));
  }

  // The info series follow the set of starting and running ranks exactly.
  std::set<Key> live;
  for (const loom::v1::RankStatus& r : ranks) {
    if (r.state() == loom::v1::RANK_STATE_STARTING || r.state() == loom::v1::RANK_STATE_RUNNING) {
      live.insert({r.job_id(), r.attempt(), r.rank()});
    }
  }
  for (auto it = info_.begin(); it != info_.end();) {
    if (live.count(it->first) == 0) {
      rank_info_.Remove(it->second);
      it = info_.erase(it);
    } else {
      ++it;
    }
  }
  for (const Key& key : live) {
    if (info_.count(key) > 0) continue;
    prometheus::Gauge& g = rank_info_.Add(RankLabels(key));
    g.Set(1);
    info_[key] = &g;
  }
}

void WorkerMetrics::RecordRankStats(const loom::v1::RankStatus& rank, const RankStats& stats) {
  const Key key{rank.job_id(), rank.attempt(), rank.rank()};
  absl::MutexLock l(&mu_);
  auto found = series_.find(key);
  if (found == series_.end()) return;  // not reported by the last RecordRanks: no series
  RankSeries& s = found->second;
  const prometheus::Labels labels = RankLabels(key);
  auto with = [&labels](const char* name, const std::string& value) {
    prometheus::Labels l = labels;
    l[name] = value;
    return l;
  };
  if (s.running) {
    // From the rank's start ("started" sets both), so that a rank hung before its first step
    // or checkpoint ages too.
    if (stats.last_step_unix_seconds > 0) {
      SetTimestamp(s, last_step_time_, labels, stats.last_step_unix_seconds);
    }
    if (stats.last_checkpoint_unix_seconds > 0) {
      SetTimestamp(s, last_checkpoint_time_, labels, stats.last_checkpoint_unix_seconds);
    }
  }
  if (!s.stepped) return;
  if (stats.process_id != s.process_id) {  // a new trainer process: its counts start at 0
    s.process_id = stats.process_id;
    s.cumulative_seen.clear();
  }
  AddCumulative(s, RankCounter(s, tokens_, labels), "tokens", stats.tokens);
  RankGauge(s, step_seconds_, labels).Set(stats.step_seconds);
  RankGauge(s, zero_partition_bytes_, labels).Set(stats.partition_bytes);
  RankGauge(s, zero_gathered_peak_bytes_, labels).Set(stats.peak_gathered_bytes);
  if (stats.memory_reported) {
    RankGauge(s, param_bytes_, labels).Set(stats.param_bytes);
    RankGauge(s, grad_bytes_, labels).Set(stats.grad_bytes);
    RankGauge(s, optimizer_state_bytes_, labels).Set(stats.optimizer_state_bytes);
    RankGauge(s, buffer_peak_bytes_, labels).Set(stats.buffer_peak_bytes);
    RankGauge(s, cached_peak_bytes_, labels).Set(stats.cached_peak_bytes);
    RankGauge(s, activation_offload_peak_bytes_, labels).Set(stats.activation_offload_peak_bytes);
    RankGauge(s, memory_peak_bytes_, labels).Set(stats.memory_peak_bytes);
  }
  RankGauge(s, communication_seconds_, labels).Set(stats.communication_seconds);
  RankGauge(s, stall_seconds_, labels).Set(stats.stall_seconds);
  AddCumulative(s, RankCounter(s, optimizer_rollbacks_, labels), "optimizer_rollbacks",
                stats.optimizer_rollbacks);
  if (stats.zenflow) {
    RankGauge(s, zenflow_stall_seconds_, labels).Set(stats.zenflow_stall_seconds);
    RankGauge(s, zenflow_selected_mass_ratio_, labels).Set(stats.zenflow_selected_mass_fraction);
    RankGauge(s, zenflow_update_interval_steps_, labels).Set(stats.zenflow_update_interval_steps);
    AddCumulative(s, RankCounter(s, zenflow_moved_bytes_, labels), "zenflow_moved_bytes",
                  stats.zenflow_bytes_moved);
  }
  if (stats.superoffload) {
    AddCumulative(s, RankCounter(s, superoffload_speculated_, labels), "speculated",
                  stats.superoffload_speculated);
    AddCumulative(s, RankCounter(s, superoffload_hits_, labels), "hits", stats.superoffload_hits);
    AddCumulative(s, RankCounter(s, superoffload_paused_, labels), "paused",
                  stats.superoffload_speculation_paused);
    AddCumulative(s, RankCounter(s, superoffload_no_buffer_, labels), "no_buffer",
                  stats.superoffload_speculation_no_buffer);
    AddCumulative(s, RankCounter(s, superoffload_rollbacks_, with("reason", "overflow")),
                  "rollbacks_overflow", stats.superoffload_rollbacks_overflow);
    AddCumulative(s, RankCounter(s, superoffload_rollbacks_, with("reason", "clip")),
                  "rollbacks_clip", stats.superoffload_rollbacks_clip);
    AddCumulative(s, RankCounter(s, superoffload_replays_, with("reason", "clip")), "replays",
                  stats.superoffload_replays);
    RankGauge(s, superoffload_hit_ratio_, labels)
        .Set(stats.superoffload_speculated > 0
                 ? stats.superoffload_hits / stats.superoffload_speculated
                 : 0.0);
    RankGauge(s, superoffload_overlap_ratio_, labels).Set(stats.superoffload_overlap_fraction);
    RankGauge(s, superoffload_optimizer_work_seconds_, labels)
        .Set(stats.superoffload_optimizer_work_seconds);
  }
}

void WorkerMetrics::AddCumulative(RankSeries& s, prometheus::Counter& counter,
                                  const std::string& name, double cumulative) {
  double& seen = s.cumulative_seen[name];
  if (cumulative > seen) counter.Increment(cumulative - seen);
  seen = std::max(seen, cumulative);
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
