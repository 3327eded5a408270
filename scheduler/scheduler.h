// File: scheduler/scheduler.h
//
// Loom's scheduling core (docs/design/DESIGN.md "A job's path", steps 2-6), plain C++ over a
// JobStore: no gRPC, no LibTorch. The gRPC services (services/scheduler) are thin adapters over it.
//
//   * SubmitJob validates a spec (job_spec_validation.h), gives it an id "job-<8 hex>", and
//     persists it PENDING in one store transaction before answering: an acknowledged job
//     survives a restart.
//   * RunSchedulingCycle (called by the daemon's loop every schedule interval) declares nodes
//     lost whose last heartbeat is older than heartbeat_timeout, ends hung attempts and gangs
//     not ready within ready_timeout, then orders waiting jobs (priority, tenant fair share,
//     age), admits them by queue quota (with borrowing), and places each as a gang: all ranks
//     at once or none, on eligible nodes (kind, memory, arch, node_selector, not cordoned),
//     preferring one topology domain (placement.h). The first blocked job of a kind reserves
//     the slots it will start on; later jobs only backfill around it; it may preempt
//     lower-priority jobs (preemption.h). The policy is docs/scheduling.md. A job that cannot
//     fit even on an empty cluster stays PENDING with reason "Unschedulable".
//   * Placement moves the job to STARTING and starts attempt + 1. Rendezvous: rank 0 is handed
//     out at once with master_port 0 and master_addr = its node's inventory.address; rank 0
//     reports the c10d TCPStore port it bound (RankStatus.rendezvous_port), which is persisted
//     with the attempt; only then are ranks 1..N-1 handed out with that port. An assignment is
//     re-sent in every heartbeat reply to its node until the worker reports that rank.
//   * Heartbeat folds rank statuses into job state: all ranks RUNNING -> RUNNING; all
//     SUCCEEDED -> SUCCEEDED; any rank FAILED (or stopped without being asked, or no longer
//     reported by a worker that had reported it) -> FAILED with reason "RankFailed" and message
//     "rank R on node X exited with code C: <error>"; the attempt's other ranks are told to
//     stop. Rank 0's progress becomes the job's progress. A rank's slot is free again once the
//     rank ended.
//   * Retention: each time rank 0 reports a newer checkpoint, the job's checkpoint policy
//     (keep_last / keep_best) deletes older checkpoints (storage/checkpoint ApplyRetention),
//     never the newest committed one nor the one the current attempt resumed from.
//   * A RUNNING job whose step stops advancing for hang_step_time_factor x its median step time
//     (at least hang_min_timeout) is hung: its attempt ends (reason "Hang", class INFRA).
//   * A node is lost when it missed heartbeats for heartbeat_timeout AND no job with a rank on it
//     advanced its step within that time, as reported by ANY of the job's ranks through any
//     node (rank_progress.h: every rank's worker reports its ranks' steps; a late heartbeat
//     alone never kills a job that is still stepping). Until then such a node is "unreachable"
//     (NodeInfo.unreachable): kept, but given no new ranks. A lost node fails every job with a
//     rank on it (class INFRA, reason "NodeLost").
//   * Recovery: a failed attempt (rank failure, lost rank or node, bad rendezvous, hang, gang
//     not ready) of a job with restarts left (spec.max_restarts for its own failures,
//     spec.max_infra_restarts for infrastructure ones; two budgets) moves the job to
//     RECOVERING instead of FAILED: every rank of the attempt is told to stop, and once all of
//     them have ended (or their node was declared lost) the job is placed again as attempt + 1,
//     preferring nodes that were not suspects of earlier failures (the failed rank's node, the
//     lost node). Every rank of the new attempt resumes from the newest committed checkpoint
//     (RankAssignment.resume_from; storage/checkpoint), or starts over if there is none. When
//     no restart is left the job is FAILED with the last failure. Restarts back off
//     exponentially (SchedulerOptions::restart_backoff_*). A trainer exit meaning
//     "configuration error" fails the job at once; a data error (a checkpoint failing its CRC)
//     is charged to the infra budget; the resume point is verified before it is chosen and
//     corrupt steps are skipped (and marked); a later report of a likelier cause (a rank killed
//     by a signal, or one that exited first) re-attributes the failure. See restart_policy.h.
//   * History: every phase change is kept with the job (bounded, persisted in its state);
//     WatchJob of an ended job replays it as "History" events before the snapshot.
//   * Cancel vs kill (docs/design/DESIGN.md "Job model"; Determined's cancel/kill). CancelJob is
//     graceful: a RUNNING job moves to STOPPING and its ranks get a graceful stop
//     (RankAssignment.graceful_stop: the worker sends SIGUSR1, the ranks agree on a step boundary,
//     write a committed checkpoint and exit). Once every rank ended the job is CANCELLED (reason
//     "Cancelled") with a message naming the step of the final checkpoint. If the ranks have not
//     ended within SchedulerOptions::cancel_grace, or one of them fails or its node is lost
//     meanwhile, the stop escalates to a kill. A job that is not running yet (PENDING, ADMITTED,
//     STARTING, RECOVERING) is CANCELLED at once. KillJob ends the job CANCELLED at once (reason
//     "Killed") and its ranks are stopped without a checkpoint (SIGTERM, SIGKILL after the
//     worker's stop grace); it also overrides a graceful stop in progress. A scheduler restart
//     during STOPPING re-sends the graceful stop with a fresh grace period.
//   * Streaming (job_watchers.h, job_events.h): every change of a job record is published to its
//     WatchJob subscribers ("PhaseChanged" when the phase changed, else "Progress") into bounded
//     per-subscriber queues; the ranks' output lines, which workers send in heartbeats, go to an
//     in-memory JobLogBuffer (bounded, not persisted: a restart of the scheduler loses them).
//   * The checkpoint catalog (possibly a remote service) is never called under the scheduler's
//     lock nor from the scheduling loop once the scheduler runs: resume lookups and retention
//     run on the threads of a CheckpointWorker (checkpoint_worker.h) with their own queues and
//     retries with backoff. A cycle waits at most resume_lookup_wait, off the lock, for the
//     lookups it just requested; a job whose lookup has not answered stays waiting (reason
//     "CheckpointsUnavailable"), nothing else does. Retention: the latest request per job wins,
//     failures are retried until the service answers. Only Create() looks up resume
//     checkpoints under the lock, before anything else can call in.
//   * Create() reloads every job and node from the store. Non-terminal jobs keep their
//     placement; nodes get max(heartbeat_timeout, reregistration_grace) from Create() to heartbeat
//     or register again before they can be declared lost; workers re-report the ranks they
//     run and are re-adopted. A heartbeat from an unknown or lost node is NOT_FOUND (the worker
//     registers again).
#ifndef LOOM_SCHEDULER_SCHEDULER_H_
#define LOOM_SCHEDULER_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <thread>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/admin_service.pb.h"
#include "proto/common.pb.h"
#include "proto/job_service.pb.h"
#include "proto/worker_service.pb.h"
#include "scheduler/admission_pass_gate.h"
#include "scheduler/checkpoint_catalog.h"
#include "scheduler/checkpoint_worker.h"
#include "scheduler/clock.h"
#include "scheduler/cluster_snapshot.h"
#include "scheduler/job_events.h"
#include "scheduler/job_repository.h"
#include "scheduler/job_spec_validation.h"
#include "scheduler/job_spec_validation_accelerators.h"
#include "scheduler/job_table.h"
#include "scheduler/job_watchers.h"
#include "scheduler/path_policy.h"
#include "scheduler/queues.h"
#include "scheduler/rank_progress.h"
#include "scheduler/rank_reconciler.h"
#include "scheduler/scheduler_options.h"
#include "scheduler/scheduler_metrics.h"
#include "scheduler/stop_coordinator.h"
#include "storage/job_store.h"

namespace loom {

struct AutoTechnique;  // scheduler_internal.h

// Thread-safe: every public method takes one internal mutex. Store writes of Heartbeat and
// RunSchedulingCycle are made after releasing it (StoreOffLock; versioned, so the store never
// goes back), and the call returns once they are durable; the other methods write under it.
class Scheduler {
 public:
  // Loads every job and node from `store` (see the file comment for what recovery does).
  // `store` and `clock` must outlive the scheduler; `metrics` may be null (no metrics) and
  // must otherwise outlive it. INVALID_ARGUMENT for bad options; store errors as returned.
  // `checkpoints` (may be null: the storage library on the job's checkpoint_dir) must outlive
  // the scheduler.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(const SchedulerOptions& options,
                                                           JobStore* store, Clock* clock,
                                                           SchedulerMetrics* metrics,
                                                           CheckpointCatalog* checkpoints = nullptr);

  // Validates and persists a new PENDING job; returns it. INVALID_ARGUMENT (field path first)
  // or FAILED_PRECONDITION from validation; store errors (e.g. UNAVAILABLE) as returned.
  // A non-empty `request_id` makes the call idempotent: if a job was already submitted with it
  // and the same spec, that job is returned (`*deduplicated` = true when non-null) and nothing is
  // created; with a different spec, ALREADY_EXISTS naming that job. INVALID_ARGUMENT if
  // request_id is longer than kMaxIdBytes.
  // `tenant` owns the job (Job.tenant; "" means "default"); a request_id reused by another
  // tenant is ALREADY_EXISTS without naming the other job. spec.queue must name a configured
  // queue (INVALID_ARGUMENT) open to `tenant` (PERMISSION_DENIED). Concurrent calls are
  // group-committed (one store transaction per batch); a call returns once its job is stored.
  // UNAVAILABLE if another call with the same request_id is being committed right now (retry).
  absl::StatusOr<loom::v1::Job> SubmitJob(const loom::v1::JobSpec& spec,
                                          const std::string& request_id = "",
                                          bool* deduplicated = nullptr,
                                          const std::string& tenant = "default");
  // SubmitJob without waiting for the group commit: validation runs on the calling thread, then
  // `done` gets the answer (the job, or the error) with `deduplicated`. It runs on the calling
  // thread for an answer known at once (a validation error, a deduplicated retry), else on the
  // job repository's commit thread once the job's batch is durable (job_repository.h); never
  // under the scheduler's lock. For callers that must not block (gRPC callback threads).
  using SubmitDone = std::function<void(absl::StatusOr<loom::v1::Job> job, bool deduplicated)>;
  // With `wait_for_capacity` false (the gRPC API's default), a gang more than the registered
  // nodes could ever hold is refused at once (CheckGangFitsRegisteredNodes,
  // job_spec_validation_accelerators.h: FAILED_PRECONDITION) instead of queueing for nodes that
  // may never come; true queues it for capacity to come (an autoscaler, nodes being added).
  void SubmitJobAsync(const loom::v1::JobSpec& spec, const std::string& request_id,
                      const std::string& tenant, SubmitDone done, bool wait_for_capacity = true);

  // A dry run of SubmitJob for `tenant`: the same checks and errors (paths, validation, node
  // shapes, queue), no job created. The answer has validated_only, the notes (values filled in,
  // then the trainer's warnings) and the resolved deepspeed_config. Thread-safe.
  absl::StatusOr<loom::v1::SubmitJobResponse> DryRunSubmission(const loom::v1::JobSpec& spec,
                                                               const std::string& tenant,
                                                               bool wait_for_capacity = true);

  // NOT_FOUND (JobNotFound) if no such job; INVALID_ARGUMENT for an id longer than kMaxIdBytes
  // (an error message echoing it would not fit in gRPC's metadata).
  absl::StatusOr<loom::v1::Job> GetJob(const std::string& job_id);
  // The tenant owning `job_id` (no copy of the job); errors as GetJob.
  absl::StatusOr<std::string> JobTenant(const std::string& job_id);
  // The NOT_FOUND every lookup of an unknown job id answers (also for another tenant's job, so
  // that existence is not revealed).
  static absl::Status JobNotFound(const std::string& job_id);

  // Jobs in `phase` (UNSPECIFIED = all) in submission order.
  absl::StatusOr<std::vector<loom::v1::Job>> ListJobs(loom::v1::JobPhase phase);

  // One page of jobs in submission order, filtered by phase (UNSPECIFIED = all), name prefix,
  // tenant and queue. page_size 0 means 100; INVALID_ARGUMENT for page_size outside [0, 1000]
  // or a page_token that this scheduler did not issue. A page also ends early, with a
  // next_page_token, before the job that would take its serialized size past 2 MiB (it always
  // holds at least one job), so a page stays well under gRPC's 4 MB message limit whatever the
  // jobs hold. Tokens stay valid across restarts (they carry the submission sequence to
  // continue after).
  absl::StatusOr<loom::v1::ListJobsResponse> ListJobsPage(const loom::v1::ListJobsRequest& request);

  // Why `job_id` is not running (see ExplainPendingResponse). NOT_FOUND if unknown.
  absl::StatusOr<loom::v1::ExplainPendingResponse> ExplainPending(const std::string& job_id);

  // The job's metric history (JobService.GetJobMetrics; scheduler_metric_history.cc). NOT_FOUND if
  // unknown; INVALID_ARGUMENT for a bad page_size or page_token.
  absl::StatusOr<loom::v1::GetJobMetricsResponse> GetJobMetrics(
      const loom::v1::GetJobMetricsRequest& request);

  // Graceful stop (see the file comment): a RUNNING job becomes STOPPING (returned as such) and
  // ends CANCELLED once its ranks wrote their final checkpoint and exited; a job not running yet
  // is CANCELLED at once; a STOPPING job is returned unchanged. NOT_FOUND if unknown;
  // FAILED_PRECONDITION if the job already ended; INVALID_ARGUMENT for an id longer than
  // kMaxIdBytes.
  absl::StatusOr<loom::v1::Job> CancelJob(const std::string& job_id);

  // Immediate stop: CANCELLED at once (reason "Killed"); its ranks are stopped without a
  // checkpoint in their nodes' next heartbeat replies. Errors as CancelJob.
  absl::StatusOr<loom::v1::Job> KillJob(const std::string& job_id);

  // Continues a FAILED or CANCELLED job in place (issue 49; scheduler_resume.cc): same id, logs
  // and history. The job goes back to PENDING (reason "Resumed") with failure_class and end_time
  // cleared, both restart budgets' counters reset and progress.step / last_checkpoint_step set to
  // that checkpoint's step, durably; its next placement is attempt + 1 and resumes from the
  // newest committed checkpoint (RankAssignment.resume_from). Errors:
  // NOT_FOUND if unknown; INVALID_ARGUMENT for an empty or overlong id; FAILED_PRECONDITION if the job is
  // not FAILED or CANCELLED (naming its phase), if its checkpoint_dir holds no committed
  // checkpoint (naming the directory: resubmit instead), or, unless `wait_for_capacity`, if no
  // set of registered nodes could hold its gang (CheckGangFitsRegisteredNodes);
  // RESOURCE_EXHAUSTED at the tenant's unfinished-job limit; the catalog's error (e.g.
  // UNAVAILABLE) if it cannot tell; store errors as returned. The catalog is asked off the lock;
  // ABORTED if the job changed meanwhile (a concurrent ResumeJob): retry.
  absl::StatusOr<loom::v1::Job> ResumeJob(const std::string& job_id, bool wait_for_capacity = false);

  // Subscribes to `job_id`'s changes. The returned subscription already holds a "Snapshot"
  // event; `on_event` runs on the event dispatcher thread (never under the scheduler's lock)
  // whenever events were queued; the subscriber then drains it with Pop(). The subscription
  // ends after the event of a terminal phase. Call Unwatch() when done (it blocks while
  // `on_event` runs, so never call it from `on_event`). NOT_FOUND if unknown; INVALID_ARGUMENT
  // for an overlong id.
  absl::StatusOr<std::shared_ptr<JobSubscription>> WatchJob(const std::string& job_id,
                                                            std::function<void()> on_event);
  void Unwatch(const std::shared_ptr<JobSubscription>& subscription);

  // The ranks' output lines (filled from heartbeats). Thread-safe; outlives nothing but the
  // scheduler.
  JobLogBuffer& logs() { return *logs_; }

  // Blocks until every queued checkpoint retention request was carried out (tests).
  void WaitForCheckpointRetention();

  // Tests: INTERNAL describing both when the incrementally kept node/slot/accelerator counts
  // (what the gauges show) differ from a full recount over every rank and every node the facade
  // holds (CountCapacity). Takes mu_.
  absl::Status CheckCapacityCounts();

  // What the last RunSchedulingCycle's admission pass did (docs/scheduling.md "Admission
  // passes"): kSkipped (nothing it reads changed: no placement, no snapshot), kPartial (the
  // first admission_queue_depth waiting jobs in queue order) or kFull (every waiting job).
  // `considered`: waiting jobs the pass decided about; `waiting`: waiting jobs in the snapshot.
  // (admission_pass_gate.h). Takes mu_.
  using AdmissionPassStats = ::loom::AdmissionPassStats;
  AdmissionPassStats LastAdmissionPass();

  // Where the last RunSchedulingCycle's time went (wall time, absl::Now(); the daemon's
  // --cycle_trace_file writes it, bench/control_plane_bench.py reports percentiles). Under mu_:
  // `checks` (node liveness, hangs, stops, ready timeouts, resume requests and answers, the
  // admission gate's choice), `snapshot`
  // (BuildSnapshot), `decide` (the pure admission cycle), `apply` (its decisions, gauges);
  // off the lock: `resume_wait` (the lookups just requested) and `store` (the cycle's one
  // transaction). Zero for a part that did not run (a skipped pass has no snapshot). Takes mu_.
  struct CyclePhases {
    absl::Duration checks, resume_wait, snapshot, decide, apply, store;
  };
  CyclePhases LastCyclePhases();

  ~Scheduler();

  // Registers (or re-registers) a node with its inventory; a lost node becomes live again.
  // `instance_id` (the worker process's random id; may be empty) becomes the node's owner: the
  // heartbeats of any other instance are refused from now on (Heartbeat: ABORTED).
  // Returns the heartbeat interval. INVALID_ARGUMENT for an empty node id or one longer than
  // kMaxIdBytes, slots outside [1, kMaxSlotsPerNode] or an unknown accelerator kind.
  absl::StatusOr<absl::Duration> RegisterWorker(const std::string& node_id,
                                                const loom::v1::NodeInventory& inventory,
                                                const std::string& instance_id = "");

  // Records a node's heartbeat and rank statuses; returns the ranks it must start and stop.
  // NOT_FOUND if the node is unknown or was declared lost (it must register again). ABORTED if
  // another instance registered the node id since (request.instance_id differs from the
  // owner's): the sender must stop its ranks and exit. A rank 0 that
  // reports a rendezvous port outside [0, 65535] fails its job (class SETUP) rather than handing
  // the other ranks an impossible port.
  absl::StatusOr<loom::v1::HeartbeatResponse> Heartbeat(const loom::v1::HeartbeatRequest& request);

  // One scheduling pass: node liveness, hangs, gang-ready timeouts, then queue ordering,
  // quota admission, gang placement, backfill and preemption (docs/scheduling.md).
  absl::Status RunSchedulingCycle();

  // The scheduler itself did not run for `pause` (its process stopped, a VM paused, a cycle
  // that held the lock): every node's silence is shortened by `pause` (its last heartbeat time
  // moves forward, never past now), so that the next liveness check does not declare lost the
  // workers whose heartbeats could not be served (issue 53's operator pass: after a 3 min stop
  // of the scheduler, every live worker was declared lost and a finished job restarted). Hang
  // detection and gang-ready timeouts do not count the pause either (AwakeTime). The daemon's
  // loop calls it when an iteration starts late. Thread-safe.
  void ExcusePause(absl::Duration pause);

  // Writes every progress change not stored yet (progress_dirty_, whatever its age) in one
  // transaction; the daemon calls it after its last cycle at shutdown. The store's error if the
  // write fails (memory keeps the progress).
  absl::Status FlushProgress();

  // Operator API (proto/admin_service.proto). NOT_FOUND for an unknown node; INVALID_ARGUMENT
  // for a reason over kMaxAdminReasonBytes.
  absl::StatusOr<std::vector<loom::v1::NodeInfo>> ListNodes();
  absl::StatusOr<loom::v1::NodeInfo> CordonNode(const std::string& node_id,
                                                const std::string& reason);
  absl::StatusOr<loom::v1::NodeInfo> UncordonNode(const std::string& node_id);
  // Cordons the node and requeues (PENDING, reason "Drained") every job with a rank on it.
  absl::StatusOr<loom::v1::DrainNodeResponse> DrainNode(const std::string& node_id,
                                                        const std::string& reason);
  absl::StatusOr<std::vector<loom::v1::QueueInfo>> ListQueues();

 private:
  // The rank table and its decisions (rank_reconciler.h), the graceful stops (stop_coordinator.h).
  using RankRuntime = loom::RankRuntime;
  using RankKey = loom::RankKey;
  // Per accelerator kind: the most slots of a registered, not lost node (submission check of
  // resources.accelerators_per_node). Takes mu_.
  std::map<loom::v1::AcceleratorKind, int> LargestRegisteredNodes() ABSL_LOCKS_EXCLUDED(mu_);
  // The registered nodes (not lost) per (kind, slots): O(distinct shapes).
  NodesBySlots RegisteredNodesBySlots() ABSL_LOCKS_EXCLUDED(mu_);
  // The same per (kind, slots, host memory, accelerator memory): the memory check of a
  // submission (CheckJobFitsNodeMemory, issue 48).
  std::map<NodeShapeKey, int> RegisteredNodeShapes() ABSL_LOCKS_EXCLUDED(mu_);
  // Per node: the device indices live ranks of jobs other than `job_id` hold (device_binding.h).
  // Only the nodes in `nodes` are visited.
  std::map<std::string, std::set<int32_t>> HeldDevices(const std::string& job_id,
                                                       const std::vector<std::string>& nodes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Scheduler(SchedulerOptions options, JobStore* store, Clock* clock, SchedulerMetrics* metrics,
            CheckpointCatalog* checkpoints)
      : options_(std::move(options)),
        clock_(clock),
        metrics_(metrics),
        checkpoints_(checkpoints != nullptr ? checkpoints : &local_checkpoints_),
        checkpoint_worker_(std::make_unique<CheckpointWorker>(
            checkpoints_, WithRetentionReporter(options_.checkpoint_worker), clock)),
        repository_(std::make_unique<JobRepository>(
            store, [this](const std::vector<JobRecord>& batch, const absl::Status& stored) {
              AdoptSubmissions(batch, stored);
            })),
        dispatcher_(std::make_unique<WakeDispatcher>()),
        logs_(std::make_unique<JobLogBuffer>(dispatcher_.get())),
        admission_gate_(options_.admission_queue_depth, options_.admission_full_interval),
        watchers_(dispatcher_.get()) {}

  // Rank 0's step and eval events among a heartbeat's log lines, into the metric history.
  void RecordMetrics(const loom::v1::HeartbeatRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Load() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the in-memory state and loads it again from the store (after a failed write).
  void Resync() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job repository's BatchListener: adopts a committed batch of submissions into jobs_ (or
  // forgets them if the transaction failed). Takes mu_.
  void AdoptSubmissions(const std::vector<JobRecord>& batch, const absl::Status& stored)
      ABSL_LOCKS_EXCLUDED(mu_);
  // SchedulerOptions::confine_paths: the spec's paths against the tenant's (PERMISSION_DENIED).
  // The admission checks of a submission, in order: paths (before validation reads any file),
  // the spec, the node shapes, the queue. Shared by SubmitJobAsync and DryRunSubmission.
  // Then, unless `wait_for_capacity`, that the registered nodes could hold the gang.
  // With spec.technique "auto", `*chosen` gets the choice and the spec it wrote (checked after).
  absl::Status CheckAdmissible(const loom::v1::JobSpec& spec, const std::string& tenant,
                               bool wait_for_capacity, std::optional<AutoTechnique>* chosen);
  // The tenancy path policy of --queues_config (data and scratch roots; the fortunes dir without
  // data_roots) and --checkpoint_root.
  PathPolicy SubmissionPathPolicy() const;
  absl::Status ConfineSubmittedPaths(const loom::v1::JobSpec& spec, const std::string& tenant)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Persists `job` (checking its phase change against the state machine), then adopts it. With
  // deferred_writes_ set (a cycle, a heartbeat) the write waits for StoreOffLock.
  absl::Status CommitJob(JobRecord job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores the current state of the jobs named in `changed` in one versioned transaction
  // (JobRepository::UpdateJobsVersioned) after releasing `lock` (which holds mu_): I/O is never
  // done under mu_ on the heartbeat and cycle paths. Until it is durable the jobs are in
  // undurable_, and no heartbeat reply hands out their start assignments. Returns with mu_ NOT
  // held. On a failed write the state is reloaded from the store (Resync) and the error returned.
  absl::Status StoreOffLock(const std::map<std::string, JobRecord>& changed,
                            absl::ReleasableMutexLock* lock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Heartbeat's work under mu_ (scheduler_heartbeat.cc); its job writes go to deferred_writes_.
  absl::StatusOr<loom::v1::HeartbeatResponse> HeartbeatLocked(
      const loom::v1::HeartbeatRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets a job's progress in memory, publishes it and marks the job for a later cycle's write
  // (progress_dirty_, SchedulerOptions::progress_store_interval).
  void NoteProgress(const std::string& job_id, loom::v1::Progress progress)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the current attempt of `job_id` on a failure: RECOVERING if restarts are left (the
  // attempt's ranks are told to stop; `suspect_node` is avoided by later placements), else FAILED
  // through EndJob. A job already RECOVERING or terminal is left alone.
  // `no_restart`: a deterministic failure (configuration error): FAILED whatever the budget.
  absl::Status FailAttempt(const std::string& job_id, loom::v1::FailureClass failure_class,
                           const std::string& reason, const std::string& message,
                           const std::string& suspect_node, bool no_restart = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Failure attribution (restart_policy.h): remembers the rank blamed for `attempt`'s failure,
  // and re-attributes the failure when a likelier cause reports later (restart_attribution.cc).
  void RecordBlame(const std::string& job_id, int32_t attempt, const loom::v1::RankStatus& st,
                   const std::string& node_id, const std::string& cause_text,
                   loom::v1::FailureClass failure_class) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReconsiderBlame(const loom::v1::RankStatus& st, const std::string& node_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends `job_id` in `phase` (FAILED or CANCELLED) and asks its live ranks to stop.
  // Ends the job SUCCEEDED (EndJob) and applies checkpoint retention without protecting the
  // attempt's starting checkpoint. Every success path goes through here.
  absl::Status MarkSucceeded(const std::string& job_id, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status EndJob(const std::string& job_id, loom::v1::JobPhase phase,
                      loom::v1::FailureClass failure_class, const std::string& reason,
                      const std::string& message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job, if it exists and has not ended: NOT_FOUND / FAILED_PRECONDITION naming it otherwise.
  absl::StatusOr<const JobRecord*> FindUnendedJob(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the job's ended ranks (their slots are free) and tells its live ones to stop in
  // their nodes' next heartbeat replies; `graceful`: after a final checkpoint (else at once).
  void StopLiveRanks(const std::string& job_id, bool graceful) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rank table (reconciler_) with its per-node index.
  void PutRank(const RankKey& key, RankRuntime rt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  RankReconciler::RankMap::iterator EraseRank(RankReconciler::RankMap::const_iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the reconciler's capacity counts (and the admission pass) that nodes_[node_id] was
  // added or changed.
  void NoteNodeChanged(const std::string& node_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether this cycle runs an admission pass, and how deep (scheduler_admission_pass.cc).
  // `resume` is what the cycle's waiting jobs know of their resume checkpoints.
  AdmissionPassStats::Kind ChooseAdmissionPass(
      const std::map<std::string, absl::StatusOr<CommittedCheckpoint>>& resume, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a pass: the earliest backoff expiry among the waiting jobs (wakes the next pass).
  void NoteAdmissionPass(AdmissionPassStats::Kind kind, const ClusterSnapshot& snapshot,
                         int considered, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ClearRanks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The keys of `node_id`'s ranks, in key order (a copy: callers may erase while iterating).
  std::vector<RankKey> RanksOnNode(const std::string& node_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckNodeLiveness() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the attempt of RUNNING jobs whose steps stopped (see SchedulerOptions, hang_*).
  absl::Status CheckHangs() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies the job's checkpoint retention policy (spec.checkpoint.keep_*), protecting the
  // step its current attempt resumed from. Failures are logged, not returned: retention must not
  // fail the job.
  void ApplyRetention(const JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `options` with a retention reporter that records a retention failure on the job
  // (Job.checkpoint_retention_error, published to its watchers) and clears it on success.
  CheckpointWorkerOptions WithRetentionReporter(CheckpointWorkerOptions options);
  void OnRetentionReport(const std::string& job_id, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Records that `job_id`'s reported step moved from `from_step` to `to_step` now.
  void RecordStepAdvance(const std::string& job_id, int64_t from_step, int64_t to_step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The placement pass (scheduler_admission.cc): BuildSnapshot, the pure admission cycle
  // (admission_cycle.h), then its decisions applied in order.
  // `phases`: its snapshot, decide and apply times are set.
  absl::Status PlacePendingJobs(int max_jobs, CyclePhases* phases)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `waiting_records`: the waiting jobs' records, parallel to the snapshot's `waiting` (where
  // the cycle's decisions are applied).
  ClusterSnapshot BuildSnapshot(std::vector<JobRecord*>* waiting_records)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts attempt + 1 of a waiting job on `placement` (node id per rank). False (reason
  // "CheckpointsUnavailable" set) when the resume checkpoint cannot be looked up.
  absl::StatusOr<bool> StartAttempt(const std::string& job_id,
                                    const std::vector<std::string>& placement)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends STARTING attempts older than ready_timeout (see SchedulerOptions).
  absl::Status CheckReadyTimeouts() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves a placed job back to PENDING (preemption, drain): its ranks are told to stop and its
  // next attempt resumes from the newest committed checkpoint. Uses no restart budget.
  absl::Status RequeueJob(const std::string& job_id, const std::string& reason,
                          const std::string& message, bool preempted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  loom::v1::NodeInfo NodeInfoOf(const NodeRecord& node) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Missed heartbeats for heartbeat_timeout but not lost (a job on it is still stepping).
  bool Unreachable(const NodeRecord& node, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Median seconds per step of a RUNNING job (0 if fewer than 3 intervals are known).
  double MedianStepSeconds(const std::string& job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the job on when its ranks' states say so (RUNNING / SUCCEEDED).
  absl::Status AdvanceJob(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets reason/message of a waiting job in memory (recomputed every cycle; stored with the
  // job at its next phase change).
  void SetPendingReason(JobRecord& job, std::string reason, std::string message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  loom::v1::RankAssignment StartAssignment(const JobRecord& job, int32_t rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Refreshes the gauges from the state: nodes, rank slots and accelerators (kept incrementally
  // by reconciler_: O(accelerator kinds)), job phase counts, and with `with_tenant_counts` the
  // per-tenant job counts (both kept by jobs_; tenants only after a phase change).
  void UpdateGauges(bool with_tenant_counts = true) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a WatchJob event for the job's subscribers after CommitJob changed it.
  void PublishJobChange(const JobRecord& job, bool phase_changed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same with the event's type ("PhaseChanged", "Progress", "ReasonChanged").
  void PublishJobEvent(const JobRecord& job, const char* type) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Graceful stops: a stopping rank's final report, escalation to kill, and the end of the stop
  // once no rank of the job is left.
  void RecordStoppingRank(const loom::v1::RankStatus& st, const std::string& node_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status EscalateStop(const std::string& job_id, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FinishStops() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckStops() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The resume checkpoint looked up for `job_id` in this scheduling cycle (outside the lock);
  // UNAVAILABLE if it was not looked up.
  absl::StatusOr<CommittedCheckpoint> PrefetchedResume(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string NewJobId() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED if `tenant` already has its limit of unfinished jobs (JobTable's
  // UnfinishedJobs: its jobs not ended plus its submissions in flight;
  // SchedulerOptions::max_unfinished_jobs_per_tenant).
  absl::Status CheckUnfinishedJobLimit(const std::string& tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Immutable after construction.
  const SchedulerOptions options_;
  Clock* const clock_;
  SchedulerMetrics* const metrics_;
  LocalCheckpointCatalog local_checkpoints_;
  CheckpointCatalog* const checkpoints_;
  // Resume lookups and retention, on their own threads (reset first by the destructor).
  std::unique_ptr<CheckpointWorker> checkpoint_worker_;
  // Every store read and write, and the group commit of submissions on its own thread
  // (job_repository.h; reset by the destructor before anything its listener uses). Lock order:
  // mu_ before the repository's.
  std::unique_ptr<JobRepository> repository_;
  const std::unique_ptr<WakeDispatcher> dispatcher_;  // before the users of it below
  const std::unique_ptr<JobLogBuffer> logs_;

  // Guarded by mu_. jobs_ and nodes_ mirror the store (written through on every change).
  absl::Mutex mu_;
  // The job records with their indexes and counts (job_table.h).
  JobTable jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, NodeRecord> nodes_ ABSL_GUARDED_BY(mu_);       // by id (placement order)
  // Rank reconciler and stop coordinator (issue 16): their own state, no lock of their own;
  // only touched under mu_. Every read and change of the rank table and the step timing goes
  // through reconciler_, which keeps the per-node index and the capacity counts the gauges show
  // in step, so a heartbeat does O(its own ranks) work.
  RankReconciler reconciler_ ABSL_GUARDED_BY(mu_);
  StopCoordinator stop_coordinator_ ABSL_GUARDED_BY(mu_);
  CyclePhases last_cycle_phases_ ABSL_GUARDED_BY(mu_);
  // Admission passes (SchedulerOptions::admission_*; scheduler_admission_pass.cc): the change
  // counts of jobs and nodes, the unreachable nodes (missed heartbeats but kept: they take no
  // new ranks, so a change of the set is a change the pass must see) and what the last pass saw.
  AdmissionPassGate admission_gate_ ABSL_GUARDED_BY(mu_);
  // jobs_.phase_changes() when the tenant job gauges were last set.
  uint64_t tenant_counts_at_ ABSL_GUARDED_BY(mu_) = ~uint64_t{0};
  // Nodes loaded by Create() not heard from since (SchedulerOptions::reregistration_grace).
  std::set<std::string> awaiting_reregistration_ ABSL_GUARDED_BY(mu_);
  // Last cycle's queue order: per accelerator kind the waiting job ids in order
  // (ExplainPending's queue position). In memory only.
  std::map<loom::v1::AcceleratorKind, std::vector<std::string>> queue_order_ ABSL_GUARDED_BY(mu_);
  // The snapshot's node pool, rebuilt by BuildSnapshot when admission_gate_.node_changes()
  // moves past node_pool_changes_ (a registration, cordon, drain, loss, or a change of the
  // unreachable set).
  std::shared_ptr<const NodePool> node_pool_ ABSL_GUARDED_BY(mu_);
  uint64_t node_pool_changes_ ABSL_GUARDED_BY(mu_) = 0;
  // The checkpoint each job's current attempt resumes from (protected from retention); absent
  // when it starts over. Rebuilt lazily after a restart.
  std::map<std::string, CommittedCheckpoint> resume_from_ ABSL_GUARDED_BY(mu_);
  // During RunSchedulingCycle and Heartbeat: job writes collected for one transaction, stored by
  // StoreOffLock after mu_ is released (null otherwise: CommitJob writes at once).
  std::map<std::string, JobRecord>* deferred_writes_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Version of each job record handed to the store (JobRepository::UpdateJobsVersioned).
  uint64_t write_version_ ABSL_GUARDED_BY(mu_) = 0;
  // Jobs whose latest change is being stored off the lock (count of writers): their start
  // assignments are not handed out until it is durable.
  std::map<std::string, int> undurable_ ABSL_GUARDED_BY(mu_);
  // Jobs whose only change since their last write is rank 0's progress (step, loss, tokens/s),
  // each with the time of its oldest change not stored yet (scheduler clock): held in memory
  // (and published to watchers) at once, written by the first scheduling cycle's single
  // transaction at least SchedulerOptions::progress_store_interval after that time, rather than
  // one fsync per heartbeat (a crash loses at most that interval of progress, which the workers
  // report again). Everything else a heartbeat changes -- phases, the rendezvous port, a new
  // checkpoint step -- is written at once.
  std::map<std::string, absl::Time> progress_dirty_ ABSL_GUARDED_BY(mu_);
  // WatchJob's subscriptions and their events (job_watchers.h).
  JobWatchers watchers_ ABSL_GUARDED_BY(mu_);
  // Resume lookups answered by the checkpoint worker, for the current scheduling cycle.
  std::map<std::string, absl::StatusOr<CommittedCheckpoint>> prefetched_resume_ ABSL_GUARDED_BY(mu_);
  // The rank blamed for each job's last failed attempt. In memory only.
  struct Blame {
    int32_t attempt = 0;
    loom::v1::RankStatus status;  // without log lines
    std::string node_id;
    std::string cause_text;  // as it appears in the job's message
    loom::v1::FailureClass failure_class = loom::v1::FAILURE_CLASS_UNSPECIFIED;
  };
  std::map<std::string, Blame> blame_ ABSL_GUARDED_BY(mu_);
  // The scheduler's own excused pauses (ExcusePause): (end, length), the last 16. AwakeTime is
  // now - since less the parts of them inside [since, now].
  std::deque<std::pair<absl::Time, absl::Duration>> pauses_ ABSL_GUARDED_BY(mu_);
  absl::Duration AwakeTime(absl::Time since, absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::BitGen bitgen_ ABSL_GUARDED_BY(mu_);
};

// The API view of a stored job.
loom::v1::Job JobRecordToProto(const JobRecord& record);
// The same, moving the spec out of `record` instead of copying it.
loom::v1::Job JobRecordToProto(JobRecord&& record);

}  // namespace loom

#endif  // LOOM_SCHEDULER_SCHEDULER_H_
