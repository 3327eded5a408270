// File: scheduler/rank_reconciler.h
//
// The scheduler's rank reconciler (docs/scheduling.md "The scheduler's pieces"): what the
// scheduler knows of every rank of every job's current attempt, and the decisions the heartbeat
// path and the liveness checks take from it.
//
//   * The rank table: one RankRuntime per (job id, rank), with an index of each node's ranks so
//     a heartbeat touches only its own node's ranks (O(its ranks), not O(cluster)).
//   * Capacity counts kept incrementally (issue 16): live/lost nodes, free/used rank slots and
//     accelerators by (kind, state), updated at the places ranks and nodes change (Put, Erase,
//     SetState, SetNode), so refreshing the gauges costs O(accelerator kinds), not a walk over
//     every rank and node. CountCapacity() is the full recount they must always equal.
//   * Step timing: when each job's rank 0 step last advanced, the recent seconds per step (hang
//     detection), and every rank's step (RankProgress: node liveness).
//   * Decisions: which node to suspect for a rank failure (a peer node gone silent), how a
//     reported rank failure is classified (restart_policy.h), whether a silent node's ranks are
//     still stepping, the rendezvous port check.
//
// Units: absl::Time / absl::Duration; slots and accelerators are counts of rank slots.
// Thread-safety: NOT thread-safe and holds no lock. It is owned by the Scheduler facade and
// every call must be made with the facade's mutex held (Scheduler::mu_). It calls nothing
// outside itself (no store, no clock, no metrics): times come in as arguments, so it is tested
// directly with plain values (rank_reconciler_test.cc).
// Errors: none; lookups of unknown keys are no-ops or return empty values.
#ifndef LOOM_SCHEDULER_RANK_RECONCILER_H_
#define LOOM_SCHEDULER_RANK_RECONCILER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "proto/common.pb.h"
#include "proto/worker_service.pb.h"
#include "scheduler/rank_progress.h"

namespace loom {

using RankKey = std::pair<std::string, int32_t>;  // (job id, rank)

// What the scheduler knows of one rank of a job's current attempt. In memory only: rebuilt from
// the job's placement on restart and confirmed by the workers' next heartbeats.
struct RankRuntime {
  int32_t attempt = 0;
  std::string node_id;  // change only through RankReconciler::Put
  loom::v1::RankState state = loom::v1::RANK_STATE_UNSPECIFIED;  // only through SetState
  bool reported = false;        // the worker has reported this rank at least once
  bool stop_requested = false;  // the job ended; the worker must stop the rank
  bool graceful_stop = false;   // with stop_requested: checkpoint, then stop (CancelJob)
  // The node device it is bound to (device_binding.h; JobSchedulingState.rank_device_indices),
  // -1 = none. Held until the entry is erased or the rank ended.
  int32_t device_index = -1;
};

// What of a node the capacity gauges need.
struct NodeCapacity {
  loom::v1::AcceleratorKind kind = loom::v1::ACCELERATOR_KIND_CPU;
  int slots = 0;
  bool lost = false;
  bool cordoned = false;  // cordoned or draining
  int64_t host_memory_bytes = 0;         // NodeInventory's (0: not reported)
  int64_t accelerator_memory_bytes = 0;  // per accelerator (0: CPU node or not reported)
};

// A node's shape for the submission's memory check: (kind, slots, host memory, accelerator
// memory), bytes as NodeCapacity's.
using NodeShapeKey = std::tuple<loom::v1::AcceleratorKind, int, int64_t, int64_t>;

// The cluster's capacity as the gauges show it. A rank holds a slot until it ended; ranks on a
// lost or unknown node count for no node. Accelerator states: "free", "allocated", "cordoned"
// (free slots of a cordoned or draining node), "lost" (every slot of a lost node).
struct CapacityCounts {
  int live_nodes = 0;
  int lost_nodes = 0;
  // On live nodes, max(0, slots - used) each: of schedulable nodes (free_slots) and of cordoned
  // or draining ones (cordoned_slots, which take no new rank).
  int free_slots = 0;
  int cordoned_slots = 0;
  int used_slots = 0;  // on live nodes
  std::map<std::pair<loom::v1::AcceleratorKind, std::string>, int> accelerators;
  // Nodes not lost (cordoned ones included) per (kind, slots): the submission check of
  // resources.accelerators_per_node asks for the largest (LargestNodeSlots) without walking
  // every node (issue 16: it was O(nodes) per submission under the scheduler's lock).
  std::map<std::pair<loom::v1::AcceleratorKind, int>, int> live_nodes_by_slots;
  // The same nodes per shape: the submission's memory check (spec/memory_fit.h, issue 48) reads
  // O(distinct shapes), not every node.
  std::map<NodeShapeKey, int> live_node_shapes;

  // Per accelerator kind, the most slots of a node that is not lost (kinds without one absent).
  // O(distinct (kind, slots) pairs).
  std::map<loom::v1::AcceleratorKind, int> LargestNodeSlots() const;

  // Equal counts; accelerator, live_nodes_by_slots and live_node_shapes entries that are 0 count
  // as absent.
  bool operator==(const CapacityCounts& other) const;
  bool operator!=(const CapacityCounts& other) const { return !(*this == other); }
  std::string DebugString() const;
};

// The full recount (the gauges' definition): one pass over `ranks` and `nodes`.
CapacityCounts CountCapacity(const std::map<std::string, NodeCapacity>& nodes,
                             const std::map<RankKey, RankRuntime>& ranks);

// Which node to blame for a failed rank (see RankReconciler::ChooseSuspect).
struct SuspectChoice {
  std::string node_id;
  std::string explanation;  // appended to the failure message; empty when the reporter is blamed
};

// How a reported rank failure is charged (see RankReconciler::ClassifyFailure).
struct FailureVerdict {
  loom::v1::FailureClass failure_class = loom::v1::FAILURE_CLASS_UNSPECIFIED;
  std::string reason;
  bool no_restart = false;  // a configuration error: fail the job whatever its budget
};

class RankReconciler {
 public:
  using RankMap = std::map<RankKey, RankRuntime>;

  // ---- The rank table. ----
  const RankMap& ranks() const { return ranks_; }
  // Mutable access to a rank's flags (reported, stop_requested, graceful_stop). Its `state` and
  // `node_id` must change only through SetState / Put, which keep the counts. Null if absent.
  RankRuntime* Find(const RankKey& key);
  // Adds or replaces a rank.
  void Put(const RankKey& key, RankRuntime rt);
  // Sets a rank's state (no-op if absent).
  void SetState(const RankKey& key, loom::v1::RankState state);
  // Forgets a rank (its slot is free); returns the next entry.
  RankMap::iterator Erase(RankMap::const_iterator it);
  void Erase(const RankKey& key);
  // Forgets every rank and node (the facade's Resync).
  void Clear();
  // The keys of `node_id`'s ranks, in key order (a copy: callers may erase while iterating).
  std::vector<RankKey> RanksOnNode(const std::string& node_id) const;
  // True if any rank of `job_id` is in the table.
  bool HasRanks(const std::string& job_id) const;
  // Forgets the job's ended ranks and marks its live ones stop_requested (graceful or not).
  void StopLiveRanks(const std::string& job_id, bool graceful);
  // Sets graceful_stop on every rank of the job (and stop_requested when `request_stop`).
  void SetGracefulStop(const std::string& job_id, bool graceful, bool request_stop);
  // Per node of `nodes`: the device indices live ranks of jobs other than `job_id` hold there.
  // O(ranks on those nodes), through the per-node index.
  std::map<std::string, std::set<int32_t>> HeldDevices(const std::string& job_id,
                                                       const std::vector<std::string>& nodes) const;
  // Live (not ended) ranks on `node_id`.
  int UsedSlots(const std::string& node_id) const;

  // ---- Capacity counts (kept incrementally). ----
  // A node registered or changed (lost, cordoned, slots, kind).
  void SetNode(const std::string& node_id, const NodeCapacity& node);
  void RemoveNode(const std::string& node_id);
  const CapacityCounts& capacity() const { return counts_; }
  // The recount of the same state, for checks (O(ranks + nodes)).
  CapacityCounts Recount() const { return CountCapacity(nodes_, ranks_); }

  // ---- Step timing. ----
  // `job_id`'s rank 0 step moved from `from_step` to `to_step` at `now`: one more step-time
  // sample (the last 32 are kept) unless it is the attempt's first report.
  void RecordStepAdvance(const std::string& job_id, int64_t from_step, int64_t to_step,
                         absl::Time now);
  // Median seconds per step over the kept samples (0 with fewer than 3).
  double MedianStepSeconds(const std::string& job_id) const;
  std::optional<absl::Time> LastStepAdvance(const std::string& job_id) const;
  // Any rank's reported step (rank_progress.h); true if it advanced.
  bool ObserveRankStep(const std::string& job_id, int32_t attempt, int32_t rank, int64_t step,
                       absl::Time now) {
    return progress_.Observe(job_id, attempt, rank, step, now);
  }
  // The attempt ended or was replaced: drop its step baseline (rank 0's and every rank's).
  void ForgetAttemptSteps(const std::string& job_id);
  // The job ended: drop every timing record of it.
  void ForgetJob(const std::string& job_id);
  // A new attempt was placed: its rank 0's first report gives no step interval (every rank's
  // steps, RankProgress, are keyed by attempt and left alone).
  void ForgetLastStepAdvance(const std::string& job_id) { last_step_advance_.erase(job_id); }

  // ---- Change generation. ----
  // Bumped by every change the admission cycle can see in this table: a rank added, erased, or
  // moving between live and ended, asked to stop, a node added, changed or removed. Equal
  // values mean the ranks' slot use and the nodes' capacity are as they were (the facade skips
  // an admission pass whose inputs did not change; docs/scheduling.md "Admission passes").
  uint64_t generation() const { return generation_; }

  // ---- Decisions. ----
  // A job with a rank on `node_id` that advanced a step (any rank, through any node, or rank 0)
  // within `timeout` before `now`; nullopt if none. Only the node's own ranks are visited.
  std::optional<std::string> SteppingJobOnNode(const std::string& node_id, absl::Time now,
                                               absl::Duration timeout) const;
  // Suspect-node choice for a rank that failed on `reporting_node`: the first other node of the
  // job (`rank_nodes`, rank order) silent for more than 2 x `heartbeat_interval` (its last
  // heartbeat from `last_heartbeat`, nullopt for an unknown node), else the reporting node.
  // A rank that lost a peer fails with a collective error; the silent peer is the likelier cause.
  static SuspectChoice ChooseSuspect(
      const std::string& reporting_node, const std::vector<std::string>& rank_nodes,
      const std::function<std::optional<absl::Time>(const std::string&)>& last_heartbeat,
      absl::Time now, absl::Duration heartbeat_interval);
  // Classification of a reported FAILED/STOPPED rank (restart_policy.h ClassifyRankExit):
  // blamed on a silent peer (`own` false) -> INFRA, reason "RankFailed"; a rank that only saw a
  // peer go away is charged to INFRA provisionally while `infra_restarts_left`; otherwise the
  // exit's own class and reason (no_restart for a configuration error).
  static FailureVerdict ClassifyFailure(const loom::v1::RankStatus& st, bool had_run, bool own,
                                        bool infra_restarts_left);
  // A rank 0 rendezvous port the other ranks can use: 0 (not bound yet) or [1, 65535].
  static bool ValidRendezvousPort(int32_t port) { return port >= 0 && port <= 65535; }

 private:
  // Moves `node_id`'s contribution to the counts out (sign -1) or in (+1).
  void Contribute(const std::string& node_id, int sign);
  void AddUsed(const std::string& node_id, int delta);

  RankMap ranks_;
  std::map<std::string, std::set<RankKey>> by_node_;
  std::map<std::string, int> used_by_node_;  // live ranks per node id (known node or not)
  std::map<std::string, NodeCapacity> nodes_;
  CapacityCounts counts_;
  uint64_t generation_ = 0;
  std::map<std::string, absl::Time> last_step_advance_;
  // A job's last 32 seconds-per-step samples and their median, kept up to date where a sample
  // is added (a job steps about once a heartbeat; cycles, which read it, run more often).
  struct StepWindow {
    std::deque<double> samples;
    double median = 0;  // 0 with fewer than 3 samples
  };
  std::map<std::string, StepWindow> step_seconds_;
  RankProgress progress_;
};

}  // namespace loom

#endif  // LOOM_SCHEDULER_RANK_RECONCILER_H_
