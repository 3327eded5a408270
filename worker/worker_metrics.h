// Prometheus metrics of a worker daemon and of the trainer ranks it runs. Built once from an
// injected registry. Labels are bounded: rank (< world size), state and kind; never a job id.
//   loom_worker_heartbeats_total{result}                 counter: heartbeats, "ok" / "error"
//   loom_worker_last_heartbeat_timestamp_seconds         gauge: Unix time of the last ok heartbeat
//   loom_worker_ranks{state}                             gauge: rank processes by RankState name
//   loom_worker_slots                                    gauge: rank slots this node offers
//   loom_trainer_step{rank}                              gauge: last completed optimizer step
//   loom_trainer_loss{rank}                              gauge: training loss (nats per token)
//   loom_trainer_tokens_per_second{rank}                 gauge: global training throughput
//   loom_trainer_eval_loss{rank}                         gauge: last held-out loss
//   loom_trainer_step_seconds{rank}                      gauge: wall time of the last step
//   loom_trainer_memory_bytes{rank,kind}                 gauge: kind = "partition" (this rank's
//                                                        ZeRO-3 parameter shard) or
//                                                        "peak_gathered" (peak all-gathered
//                                                        parameters during the last step)
//   loom_trainer_last_step_timestamp_seconds{rank}       gauge: Unix time of the last step (or of
//                                                        the rank's start before its first step)
//   loom_trainer_last_checkpoint_step{rank}              gauge: step of the last checkpoint written
//   loom_trainer_last_checkpoint_timestamp_seconds{rank} gauge: Unix time of that checkpoint (or of
//                                                        the rank's start before the first one)
//   loom_worker_rank_info{job_id,attempt,rank}          gauge: 1 per rank process this worker runs
//                                                        (STARTING or RUNNING); the series goes
//                                                        away when the rank ends. An info metric
//                                                        for joins (job -> worker instance, rank),
//                                                        e.g. with DCGM's per-host GPU series.
//   loom_trainer_communication_seconds{rank}            gauge: seconds of the last step the rank's
//                                                        training thread was blocked in
//                                                        collectives (all-gather, reduce-scatter,
//                                                        all-reduce, broadcast, barrier), from the
//                                                        start of each blocking call to its
//                                                        completion ("comm_s")
//   loom_trainer_stall_seconds{rank}                    gauge: seconds of the last step the
//                                                        training thread waited instead of
//                                                        computing = communication seconds above +
//                                                        seconds spent producing the step's input
//                                                        batches ("data_s"); step_seconds -
//                                                        stall_seconds is compute time
//   loom_trainer_optimizer_rollbacks_total{rank}        counter: optimizer steps rolled back
//                                                        (SuperOffload's speculative CPU step:
//                                                        steps with any sub-group rolled back)
//   loom_trainer_zenflow_stall_seconds{rank}            gauge: ZenFlow jobs only: seconds of the
//                                                        last step the training thread waited on
//                                                        the CPU optimizer
//   loom_trainer_zenflow_selected_mass_fraction{rank}   gauge: selected columns' share of the 2-D
//                                                        gradients' L1 mass (last selection)
//   loom_trainer_zenflow_update_interval_steps{rank}    gauge: steps in the last CPU interval
//   loom_trainer_zenflow_bytes_moved{rank}              gauge: bytes moved between device-side
//                                                        partitions and host buffers since the
//                                                        rank started (cumulative)
//   SuperOffload jobs only (offload_optimizer.super_offload; the trainer's step events):
//   loom_trainer_superoffload_speculated_sub_groups_total{rank}
//                                                        counter: sub-group CPU optimizer steps
//                                                        started speculatively during backward
//   loom_trainer_superoffload_speculation_hits_total{rank}
//                                                        counter: of them, committed unchanged
//   loom_trainer_superoffload_speculation_hit_rate{rank} gauge: hits / speculated since the rank
//                                                        started (0 before any speculation)
//   loom_trainer_superoffload_rollbacks_total{rank,reason}
//                                                        counter: speculative sub-group steps
//                                                        undone; reason = "overflow" (fp16
//                                                        non-finite gradients: the step was
//                                                        skipped) or "clip" (gradient clipping
//                                                        was active)
//   loom_trainer_superoffload_replays_total{rank,reason} counter: rolled-back sub-group steps run
//                                                        again; reason = "clip" (with the clip
//                                                        coefficient); an overflow never replays
//   loom_trainer_superoffload_optimizer_overlap_fraction{rank}
//                                                        gauge: share (0-1) of the last step's
//                                                        optimizer work done before the end of
//                                                        backward (hidden under it)
//   loom_trainer_superoffload_optimizer_work_seconds{rank}
//                                                        gauge: that optimizer work, seconds
//   loom_trainer_memory_bytes{rank,kind}                 also kind = param, grad, optimizer_state,
//                                                        buffer, cached, peak (peak bytes of the last step
//                                                        per kind) when the trainer reports them
//   loom_rank_accelerator_info{node,accelerator_index,job_id,rank}
//                                                        gauge: 1 per starting/running rank with the
//                                                        node id and the index of the accelerator
//                                                        (slot) the worker gave it (the trainer's
//                                                        LOOM_ACCELERATOR_INDEX). Join with DCGM's
//                                                        DCGM_FI_*{gpu="<index>",Hostname=...}:
//                                                        docs/metrics.md.
// The per-rank gauges keep the last (for a succeeded rank, final) values of a rank after it ends;
// join them with loom_worker_ranks{state="RANK_STATE_RUNNING"} to look at running ranks only.
#ifndef LOOM_WORKER_WORKER_METRICS_H_
#define LOOM_WORKER_WORKER_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

#include "proto/worker_service.pb.h"
#include "worker/rank_process.h"

namespace loom::worker {

// Thread-safe (prometheus-cpp metrics are atomic).
class WorkerMetrics {
 public:
  explicit WorkerMetrics(prometheus::Registry& registry);

  void RecordHeartbeat(bool ok);
  // Updates the ranks-by-state gauge and the per-rank trainer gauges of running and succeeded
  // ranks (a succeeded rank's final step; a running rank wins over a succeeded one with the same
  // rank number).
  void RecordRanks(const std::vector<loom::v1::RankStatus>& ranks, int slots);
  // Updates the per-step gauges (step time, memory, step and checkpoint times) of a rank.
  void RecordRankStats(int rank, const RankStats& stats);

  struct AcceleratorAssignment {
    std::string job_id;
    int rank = 0;
    int accelerator_index = 0;
    bool operator<(const AcceleratorAssignment& o) const {
      return std::tie(job_id, rank, accelerator_index) <
             std::tie(o.job_id, o.rank, o.accelerator_index);
    }
  };
  // Makes loom_rank_accelerator_info exactly the given (starting or running) ranks of `node`.
  void RecordAcceleratorAssignments(const std::string& node,
                                    const std::vector<AcceleratorAssignment>& live);

 private:
  prometheus::Family<prometheus::Counter>& heartbeats_;
  prometheus::Family<prometheus::Gauge>& last_heartbeat_;
  prometheus::Family<prometheus::Gauge>& ranks_;
  prometheus::Family<prometheus::Gauge>& slots_;
  prometheus::Family<prometheus::Gauge>& step_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& tokens_per_second_;
  prometheus::Family<prometheus::Gauge>& eval_loss_;
  prometheus::Family<prometheus::Gauge>& step_seconds_;
  prometheus::Family<prometheus::Gauge>& memory_bytes_;
  prometheus::Family<prometheus::Gauge>& last_step_time_;
  prometheus::Family<prometheus::Gauge>& last_checkpoint_step_;
  prometheus::Family<prometheus::Gauge>& last_checkpoint_time_;
  prometheus::Family<prometheus::Gauge>& rank_info_;
  prometheus::Family<prometheus::Gauge>& communication_seconds_;
  prometheus::Family<prometheus::Gauge>& stall_seconds_;
  prometheus::Family<prometheus::Counter>& optimizer_rollbacks_;
  prometheus::Family<prometheus::Gauge>& accelerator_info_;
  prometheus::Family<prometheus::Gauge>& zenflow_stall_seconds_;
  prometheus::Family<prometheus::Gauge>& zenflow_selected_mass_fraction_;
  prometheus::Family<prometheus::Gauge>& zenflow_update_interval_steps_;
  prometheus::Family<prometheus::Gauge>& zenflow_bytes_moved_;
  prometheus::Family<prometheus::Counter>& superoffload_speculated_;
  prometheus::Family<prometheus::Counter>& superoffload_paused_;
  prometheus::Family<prometheus::Counter>& superoffload_no_buffer_;
  prometheus::Family<prometheus::Counter>& superoffload_hits_;
  prometheus::Family<prometheus::Gauge>& superoffload_hit_rate_;
  prometheus::Family<prometheus::Counter>& superoffload_rollbacks_;
  prometheus::Family<prometheus::Counter>& superoffload_replays_;
  prometheus::Family<prometheus::Gauge>& superoffload_overlap_fraction_;
  prometheus::Family<prometheus::Gauge>& superoffload_optimizer_work_seconds_;
  absl::Mutex mu_;
  // (job id, attempt, rank) -> its loom_worker_rank_info series.
  std::map<std::tuple<std::string, int, int>, prometheus::Gauge*> info_ ABSL_GUARDED_BY(mu_);
  // (job id, rank, accelerator index) -> its loom_rank_accelerator_info series.
  std::map<AcceleratorAssignment, prometheus::Gauge*> accelerator_series_ ABSL_GUARDED_BY(mu_);
  // (rank, series name) -> (trainer pid, the last cumulative count seen from it), newest last,
  // at most kProcessesPerRank: a rank number's processes (a succeeded one of an earlier job and
  // a running one, or two attempts) each count on their own, never against each other.
  static constexpr size_t kProcessesPerRank = 4;
  std::map<std::pair<int, std::string>, std::vector<std::pair<int64_t, double>>> cumulative_seen_
      ABSL_GUARDED_BY(mu_);
  // Adds to `counter` what `cumulative` (a count since trainer process `pid` started) grew by
  // since the last call for (rank, name, pid); all of it for a process not seen before.
  void AddCumulative(prometheus::Counter& counter, int rank, const std::string& name,
                     int64_t pid, double cumulative) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace loom::worker

#endif  // LOOM_WORKER_WORKER_METRICS_H_
