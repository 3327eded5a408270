// File: scheduler/cluster_snapshot.h
//
// What one admission cycle (admission_cycle.h) sees of the cluster: the nodes, the ranks that
// hold slots, the jobs waiting for a placement and the jobs holding slots. Built by the
// Scheduler facade under its lock at the start of the placement pass (scheduler_snapshot.cc)
// and by tests by hand; in the manner of Kueue's cache snapshot (pkg/cache/snapshot.go), it is
// a plain value the cycle reads and never writes.
//
// The snapshot borrows the job records (`const JobRecord*`): they must stay unchanged while the
// cycle runs (the facade holds its lock; a test owns them). Thread-safety: none (a value).
#ifndef LOOM_SCHEDULER_CLUSTER_SNAPSHOT_H_
#define LOOM_SCHEDULER_CLUSTER_SNAPSHOT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/common.pb.h"
#include "scheduler/placement.h"
#include "storage/job_store.h"

namespace loom {

struct ClusterSnapshot {
  // The scheduler clock's time of the cycle (backoff expiry, expected end of running jobs).
  absl::Time now = absl::UnixEpoch();

  // Every known node, sorted by id (required). `live`: not declared lost; `cordoned`: cordoned
  // or draining; `schedulable`: live, not cordoned and not unreachable (a node that missed
  // heartbeats while a job on it still steps keeps its ranks but gets no new ones). Shared: the
  // facade rebuilds it only when a node changes, not every cycle (2,000 nodes' inventories and
  // topology index cost milliseconds to copy).
  std::shared_ptr<const NodePool> pool;

  // One rank of some job's attempt, in (job id, rank) order. A rank that ended holds no slot;
  // a live rank asked to stop holds its slot until it ends ("releasing").
  struct Rank {
    std::string job_id;
    std::string node_id;
    bool ended = false;
    bool stop_requested = false;
  };
  std::vector<Rank> ranks;

  // A job waiting for a placement (PENDING or RECOVERING), in job id order.
  struct WaitingJob {
    const JobRecord* job = nullptr;
    // For a job placed before (attempt >= 1): why its resume checkpoint is not known yet
    // (the lookup has not answered, or the catalog failed); nullopt when it is known (or
    // there is none). A job with a value is not started (reason "CheckpointsUnavailable").
    std::optional<std::string> resume_unavailable;
    // The job's id, tenant, order and kind, copied from the record when the facade indexes it
    // (its spec does not change after submission), so that ordering every waiting job reads
    // this vector and not the records of the jobs past a pass's depth.
    const std::string* id = nullptr;      // &job->id
    const std::string* tenant = nullptr;  // &job->tenant
    int32_t priority = 0;                 // job->spec.priority()
    int64_t sequence = 0;                 // job->sequence
    loom::v1::AcceleratorKind kind = loom::v1::ACCELERATOR_KIND_CPU;  // KindOf(resources)
    int32_t attempt = 0;                                              // job->attempt
    int64_t not_before_us = 0;  // job->state.not_before_us(): backoff expiry (0: none)

    // `job`'s keys, with no resume_unavailable; `job` must outlive the value.
    static WaitingJob Of(const JobRecord& job) {
      WaitingJob w;
      w.job = &job;
      w.id = &job.id;
      w.tenant = &job.tenant;
      w.priority = job.spec.priority();
      w.sequence = job.sequence;
      w.kind = KindOf(job.spec.resources());
      w.attempt = job.attempt;
      w.not_before_us = job.state.not_before_us();
      return w;
    }
  };
  std::vector<WaitingJob> waiting;

  // A job some live rank belongs to, by id (its phase says whether it may be preempted or
  // backfilled around: STARTING and RUNNING jobs).
  struct PlacedJob {
    const JobRecord* job = nullptr;
    // Median seconds per step over its recent steps (0: fewer than 3 known; no end estimate).
    double median_step_seconds = 0;
  };
  std::map<std::string, PlacedJob> placed;
};

}  // namespace loom

#endif  // LOOM_SCHEDULER_CLUSTER_SNAPSHOT_H_
