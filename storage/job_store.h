// File: storage/job_store.h
//
// The scheduler's durable state behind an interface (docs/design/DESIGN.md "Layers and rooms"):
// jobs with their spec, phase, failure, progress and current rank placement, and worker nodes with
// their inventory and last heartbeat. Two implementations run one conformance suite
// (job_store_conformance.h): SqliteJobStore (sqlite_job_store.h, the production store) and
// InMemoryJobStore (in_memory_job_store.h, for tests).
//
// Every method is atomic: a job's row and its rank placement are written in one transaction, so
// after a crash a reader sees either the old or the new record, never a mix.
#ifndef LOOM_STORAGE_JOB_STORE_H_
#define LOOM_STORAGE_JOB_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/common.pb.h"
#include "proto/scheduler_state.pb.h"
#include "proto/worker_service.pb.h"

namespace loom {

// One job as persisted. Times use absl::InfinitePast() for "not yet" (create_time is always set).
struct JobRecord {
  std::string id;  // "job-1a2b3c4d"; primary key
  // Submission order, unique and increasing; the FIFO queue order. Chosen by the caller.
  int64_t sequence = 0;
  loom::v1::JobSpec spec;  // persisted as serialized proto bytes
  loom::v1::JobPhase phase = loom::v1::JOB_PHASE_UNSPECIFIED;
  loom::v1::FailureClass failure_class = loom::v1::FAILURE_CLASS_UNSPECIFIED;
  std::string reason;   // machine-readable ("Unschedulable", "RankFailed", ...)
  std::string message;  // human-readable
  absl::Time create_time = absl::InfinitePast();
  absl::Time start_time = absl::InfinitePast();
  absl::Time end_time = absl::InfinitePast();
  int32_t attempt = 0;  // 1-based; 0 before the first placement
  loom::v1::Progress progress;  // persisted as serialized proto bytes
  std::string checkpoint_dir;
  // Node id of each rank of the current attempt (index = rank); empty when not placed. Each id
  // must name a stored node (FAILED_PRECONDITION otherwise).
  std::vector<std::string> rank_nodes;
  // The current attempt's c10d rendezvous port reported by rank 0 (0 = not yet known).
  int32_t rendezvous_port = 0;
  // The client's request id of the submission ("" = none); unique among jobs that have one.
  std::string request_id;
  // Tenant owning the job ("default" when the scheduler runs without authentication).
  std::string tenant = "default";
  // Restart budgets, backoff, preemptions, ... (persisted as serialized proto bytes).
  loom::internal::JobSchedulingState state;
};

// One worker node as persisted.
struct NodeRecord {
  std::string id;  // chosen by the worker; primary key
  loom::v1::NodeInventory inventory;  // persisted as serialized proto bytes
  absl::Time last_heartbeat_time = absl::InfinitePast();
  // True once the scheduler declared the node lost (missed heartbeats); a new registration
  // clears it.
  bool lost = false;
  // Cordon / drain (persisted as serialized proto bytes).
  loom::internal::NodeAdminState admin;
  // The worker process that registered last (RegisterWorkerRequest.instance_id). In memory
  // only: after a scheduler restart the first instance heard from is adopted.
  std::string instance_id;
};

// One record of a job's training metric history (issue 45): the scheduler's serialized
// loom.v1.MetricPoint (opaque here) under an ordering key it chooses (step x 2, + 1 for a
// held-out evaluation), so a store needs no schema change when a metric is added.
struct MetricRow {
  std::string job_id;
  int64_t key = 0;
  std::string data;
};

// Persistent store of jobs and nodes. Implementations are thread-safe.
class JobStore {
 public:
  virtual ~JobStore() = default;

  // Inserts a new job. ALREADY_EXISTS if the id, the sequence or a non-empty request_id is taken; FAILED_PRECONDITION if
  // a rank_nodes entry names an unknown node.
  virtual absl::Status CreateJob(const JobRecord& job) = 0;

  // Replaces every field of an existing job (matched by id), its rank placement included.
  // NOT_FOUND if absent; FAILED_PRECONDITION if a rank_nodes entry names an unknown node.
  virtual absl::Status UpdateJob(const JobRecord& job) = 0;

  // Batches (group commit, and one write per scheduling cycle): all records or none, in one
  // transaction; errors as CreateJob / UpdateJob for the first record that fails.
  virtual absl::Status CreateJobs(const std::vector<JobRecord>& jobs) = 0;
  virtual absl::Status UpdateJobs(const std::vector<JobRecord>& jobs) = 0;

  // NOT_FOUND if absent.
  virtual absl::StatusOr<JobRecord> GetJob(const std::string& id) = 0;

  // Jobs in `phase` (UNSPECIFIED = all), ordered by sequence.
  virtual absl::StatusOr<std::vector<JobRecord>> ListJobs(
      loom::v1::JobPhase phase = loom::v1::JOB_PHASE_UNSPECIFIED) = 0;

  // Inserts or replaces the node with this id.
  virtual absl::Status UpsertNode(const NodeRecord& node) = 0;

  // NOT_FOUND if absent.
  virtual absl::StatusOr<NodeRecord> GetNode(const std::string& id) = 0;

  // All nodes, ordered by id.
  virtual absl::StatusOr<std::vector<NodeRecord>> ListNodes() = 0;

  // Metric history (MetricRow). Writes every row in one transaction; a row whose (job_id, key)
  // exists replaces it (a resumed attempt runs a step again). The job need not exist.
  virtual absl::Status WriteMetrics(const std::vector<MetricRow>& rows) = 0;
  // Rows of `job_id` with key > after_key, by key, at most `limit` (INVALID_ARGUMENT if < 1).
  virtual absl::StatusOr<std::vector<MetricRow>> ListMetrics(const std::string& job_id,
                                                             int64_t after_key, int limit) = 0;
};

}  // namespace loom

#endif  // LOOM_STORAGE_JOB_STORE_H_
