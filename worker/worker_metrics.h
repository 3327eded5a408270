// Prometheus metrics of a worker daemon and of the trainer ranks it runs. Built once from an
// injected registry.
//
// Per-rank series (loom_trainer_*) carry {job_id, attempt, rank}: the ranks of two jobs (or two
// attempts) on one worker never share a series. (Not `job`: that is the label Prometheus gives
// every scraped series for its scrape job, and an exported `job` would be renamed exported_job.)
// Labels stay bounded by what the worker runs at once: a rank's series exist from its first
// step (the loom_trainer_*_timestamp_seconds gauges: from its start) and are removed when the
// worker stops reporting the rank (a terminal rank is reported a few heartbeats, so its final
// numbers are scraped, then forgotten); the two timestamp gauges go as soon as the rank is no
// longer RUNNING, so an ended rank never "ages".
//   loom_worker_heartbeats_total{result}                 counter: heartbeats, "ok" / "error"
//   loom_worker_last_heartbeat_timestamp_seconds         gauge: Unix time of the last ok heartbeat
//   loom_worker_ranks{state}                             gauge: rank processes by RankState name
//   loom_worker_slots                                    gauge: rank slots this node offers
//   loom_worker_rank_info{job_id,attempt,rank}           gauge: 1 per rank process this worker runs
//                                                        (STARTING or RUNNING); for joins (job ->
//                                                        worker instance), e.g. with DCGM series
// Per rank, labels {job_id,attempt,rank} (+ the ones named):
//   loom_trainer_step                                    gauge: last completed optimizer step
//   loom_trainer_loss                                    gauge: training loss (nats per token)
//   loom_trainer_tokens_total                            counter: global training tokens of the
//                                                        job's steps this rank took part in (the
//                                                        job's throughput is its rate(); every
//                                                        rank of a job counts the same tokens)
//   loom_trainer_tokens_per_second                       gauge: the last step's global throughput
//   loom_trainer_eval_loss                               gauge: last held-out loss
//   loom_trainer_step_seconds                            gauge: wall time of the last step
//   Memory, bytes, one gauge per quantity (kinds are disjoint: MemoryKind in
//   worker/engine/zero/memory_tracker.h). param + grad + optimizer_state add up to the rank's
//   model-state footprint; the *_peak_bytes are peaks within the last step:
//   loom_trainer_param_bytes                             gauge: parameters in their training dtype
//   loom_trainer_grad_bytes                              gauge: gradient accumulators/partitions
//   loom_trainer_optimizer_state_bytes                   gauge: Adam moments, fp32 master weights
//   loom_trainer_buffer_peak_bytes                       gauge: temporary buffers (gathered
//                                                        params, buckets)
//   loom_trainer_cached_peak_bytes                       gauge: idle pooled buffers
//   loom_trainer_activation_offload_peak_bytes           gauge: checkpointed layer inputs in host
//                                                        memory (ALST's activation offload)
//   loom_trainer_memory_peak_bytes                       gauge: peak of the total (all kinds)
//   loom_trainer_zero_partition_bytes                    gauge: this rank's ZeRO-3 parameter shard
//                                                        (part of param_bytes)
//   loom_trainer_zero_gathered_peak_bytes                gauge: peak all-gathered parameters (part
//                                                        of buffer_peak_bytes)
//   loom_trainer_last_step_timestamp_seconds             gauge: Unix time of the last step (or of
//                                                        the rank's start before its first step)
//   loom_trainer_last_checkpoint_step                    gauge: step of the newest checkpoint this
//                                                        attempt wrote or resumed from
//   loom_trainer_last_checkpoint_timestamp_seconds       gauge: Unix time of that checkpoint (or of
//                                                        the rank's start before the first one)
//   loom_trainer_communication_seconds                   gauge: seconds of the last step the rank's
//                                                        training thread was blocked in
//                                                        collectives ("comm_s")
//   loom_trainer_stall_seconds                           gauge: communication seconds + seconds
//                                                        producing the step's input batches
//                                                        ("data_s"); step - stall = compute
//   loom_trainer_optimizer_rollbacks_total               counter: optimizer steps rolled back
//                                                        (SuperOffload's speculative CPU step)
//   ZenFlow jobs only:
//   loom_trainer_zenflow_stall_seconds                   gauge: seconds of the last step the
//                                                        training thread waited on the CPU
//                                                        optimizer
//   loom_trainer_zenflow_selected_mass_ratio             gauge: selected columns' share of the 2-D
//                                                        gradients' L1 mass (last selection)
//   loom_trainer_zenflow_update_interval_steps           gauge: steps in the last CPU interval
//   loom_trainer_zenflow_moved_bytes_total               counter: bytes moved between device-side
//                                                        partitions and host buffers
//   SuperOffload jobs only (offload_optimizer.super_offload; the trainer's step events):
//   loom_trainer_superoffload_speculated_sub_groups_total counter: sub-group CPU optimizer steps
//                                                        started speculatively during backward
//   loom_trainer_superoffload_speculation_paused_sub_groups_total,
//   loom_trainer_superoffload_speculation_no_buffer_sub_groups_total
//                                                        counters: not speculated (the step before
//                                                        clipped / no NVMe swap buffer free)
//   loom_trainer_superoffload_speculation_hits_total     counter: of them, committed unchanged
//   loom_trainer_superoffload_speculation_hit_ratio      gauge: hits / speculated since the rank
//                                                        started (0 before any speculation)
//   loom_trainer_superoffload_rollbacks_total{reason}    counter: speculative sub-group steps
//                                                        undone; reason = "overflow" (fp16
//                                                        non-finite gradients: step skipped) or
//                                                        "clip" (gradient clipping was active)
//   loom_trainer_superoffload_replays_total{reason}      counter: rolled-back sub-group steps run
//                                                        again; reason = "clip"
//   loom_trainer_superoffload_optimizer_overlap_ratio    gauge: share (0-1) of the last step's
//                                                        optimizer work done before the end of
//                                                        backward (hidden under it)
//   loom_trainer_superoffload_optimizer_work_seconds     gauge: that optimizer work, seconds
//   loom_rank_accelerator_info{node,accelerator_index,job_id,rank}
//                                                        gauge: 1 per starting/running rank with the
//                                                        node id and the index of the accelerator
//                                                        (slot) the worker gave it (the trainer's
//                                                        LOOM_ACCELERATOR_INDEX). Join with DCGM's
//                                                        DCGM_FI_*{gpu="<index>",Hostname=...}:
//                                                        docs/metrics.md.
// Renamed in issue 53 (no old names kept): ..._speculation_hit_rate -> ..._hit_ratio,
// ..._optimizer_overlap_fraction -> ..._overlap_ratio, ..._zenflow_selected_mass_fraction ->
// ..._selected_mass_ratio, loom_trainer_zenflow_bytes_moved (a cumulative gauge) ->
// loom_trainer_zenflow_moved_bytes_total (a counter).
#ifndef LOOM_WORKER_WORKER_METRICS_H_
#define LOOM_WORKER_WORKER_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

#include "proto/worker_service.pb.h"
#include "worker/rank_process.h"

namespace loom::worker {

// Thread-safe.
class WorkerMetrics {
 public:
  explicit WorkerMetrics(prometheus::Registry& registry);

  void RecordHeartbeat(bool ok);
  // `ranks` is every rank the worker reports now (any state). Updates the ranks-by-state, slots
  // and rank-info gauges and the per-rank progress gauges of ranks that have stepped
  // (progress.step() > 0); removes the series of ranks not in `ranks` and the timestamp gauges
  // of ranks that are not RUNNING.
  void RecordRanks(const std::vector<loom::v1::RankStatus>& ranks, int slots);
  // The per-step series (step time, memory, tokens, stalls, offload counters, timestamps) of
  // one rank of the last RecordRanks call (`rank` as passed there); ignored for other ranks.
  void RecordRankStats(const loom::v1::RankStatus& rank, const RankStats& stats);

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
  using Key = std::tuple<std::string, int, int>;  // job id, attempt, rank
  using GaugeFamily = prometheus::Family<prometheus::Gauge>;
  using CounterFamily = prometheus::Family<prometheus::Counter>;
  // The series one rank process owns, so that they can all be removed with it.
  struct RankSeries {
    bool stepped = false;      // progress.step() > 0 at the last RecordRanks
    bool running = false;      // RANK_STATE_RUNNING at the last RecordRanks
    std::set<std::pair<GaugeFamily*, prometheus::Gauge*>> gauges;
    std::set<std::pair<CounterFamily*, prometheus::Counter*>> counters;
    std::set<std::pair<GaugeFamily*, prometheus::Gauge*>> timestamps;  // only while running
    // The trainer process the cumulative counts below came from, and the last count seen per
    // counter: the trainer reports counts since its start, Prometheus wants increments.
    int64_t process_id = 0;
    std::map<std::string, double> cumulative_seen;
  };
  static prometheus::Labels RankLabels(const Key& key);
  prometheus::Gauge& RankGauge(RankSeries& s, GaugeFamily& family, const prometheus::Labels& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  prometheus::Counter& RankCounter(RankSeries& s, CounterFamily& family,
                                   const prometheus::Labels& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetTimestamp(RankSeries& s, GaugeFamily& family, const prometheus::Labels& labels,
                    double unix_seconds) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void RemoveTimestamps(RankSeries& s);
  static void RemoveAll(RankSeries& s);
  // Adds to `counter` what `cumulative` (a count since the rank's trainer process started) grew
  // by since the last call for (`s`, `name`).
  static void AddCumulative(RankSeries& s, prometheus::Counter& counter, const std::string& name,
                            double cumulative);

  CounterFamily& heartbeats_;
  GaugeFamily& last_heartbeat_;
  GaugeFamily& ranks_;
  GaugeFamily& slots_;
  GaugeFamily& step_;
  GaugeFamily& loss_;
  CounterFamily& tokens_;
  GaugeFamily& tokens_per_second_;
  GaugeFamily& eval_loss_;
  GaugeFamily& step_seconds_;
  GaugeFamily& param_bytes_;
  GaugeFamily& grad_bytes_;
  GaugeFamily& optimizer_state_bytes_;
  GaugeFamily& buffer_peak_bytes_;
  GaugeFamily& cached_peak_bytes_;
  GaugeFamily& activation_offload_peak_bytes_;
  GaugeFamily& memory_peak_bytes_;
  GaugeFamily& zero_partition_bytes_;
  GaugeFamily& zero_gathered_peak_bytes_;
  GaugeFamily& last_step_time_;
  GaugeFamily& last_checkpoint_step_;
  GaugeFamily& last_checkpoint_time_;
  GaugeFamily& rank_info_;
  GaugeFamily& communication_seconds_;
  GaugeFamily& stall_seconds_;
  CounterFamily& optimizer_rollbacks_;
  GaugeFamily& accelerator_info_;
  GaugeFamily& zenflow_stall_seconds_;
  GaugeFamily& zenflow_selected_mass_ratio_;
  GaugeFamily& zenflow_update_interval_steps_;
  CounterFamily& zenflow_moved_bytes_;
  CounterFamily& superoffload_speculated_;
  CounterFamily& superoffload_paused_;
  CounterFamily& superoffload_no_buffer_;
  CounterFamily& superoffload_hits_;
  GaugeFamily& superoffload_hit_ratio_;
  CounterFamily& superoffload_rollbacks_;
  CounterFamily& superoffload_replays_;
  GaugeFamily& superoffload_overlap_ratio_;
  GaugeFamily& superoffload_optimizer_work_seconds_;
  absl::Mutex mu_;
  // (job id, attempt, rank) -> its loom_worker_rank_info series.
  std::map<Key, prometheus::Gauge*> info_ ABSL_GUARDED_BY(mu_);
  // (job id, attempt, rank) -> the loom_trainer_* series of that rank process.
  std::map<Key, RankSeries> series_ ABSL_GUARDED_BY(mu_);
  // (job id, rank, accelerator index) -> its loom_rank_accelerator_info series.
  std::map<AcceleratorAssignment, prometheus::Gauge*> accelerator_series_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::worker

#endif  // LOOM_WORKER_WORKER_METRICS_H_
