// File: scheduler/scheduler_options.h
//
// The scheduling core's configuration (loom-scheduler's flags map onto it) and the request
// bounds it enforces. SchedulerOptions::Validate and the API view of a stored job live in
// scheduler_options.cc. Plain data: thread-compatible.
#ifndef LOOM_SCHEDULER_SCHEDULER_OPTIONS_H_
#define LOOM_SCHEDULER_SCHEDULER_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "scheduler/checkpoint_worker.h"
#include "scheduler/job_spec_validation.h"
#include "scheduler/queues.h"

namespace loom {

// Longest job or node id accepted in requests: ids are short ("job-1a2b3c4d", host names), and an
// error message echoing a huge one would exceed gRPC's metadata limit (the caller would see
// RESOURCE_EXHAUSTED instead of the real answer).
inline constexpr size_t kMaxIdBytes = 256;
// Most rank slots one node may offer (RegisterWorker); keeps slot arithmetic and placement small.
inline constexpr int32_t kMaxSlotsPerNode = 1024;
// Longest cordon / drain reason: it is stored with the node and returned by every ListNodes.
inline constexpr size_t kMaxAdminReasonBytes = 1024;

struct SchedulerOptions {
  // Directory under which each job's checkpoints live (<checkpoint_root>/<job id>). Required.
  std::string checkpoint_root;
  // A node whose last heartbeat is older than this is declared lost, unless a job with a rank
  // on it is still stepping (then it is "unreachable": kept, no new ranks). Default 40 s, as
  // Kubernetes' node-monitor grace period (Slurm's SlurmdTimeout: 300 s); docs/scheduling.md
  // "Node liveness" says why.
  absl::Duration heartbeat_timeout = absl::Seconds(40);
  // Re-registration grace after a scheduler start (as Slurm gives nodes after a controller
  // restart): a node loaded from the store that has neither heartbeated nor registered since
  // Create() is declared lost only after max(heartbeat_timeout, reregistration_grace) from
  // Create(); once heard from it is judged by heartbeat_timeout again. Default 30 s, >= 0.
  absl::Duration reregistration_grace = absl::Seconds(30);
  // Heartbeat period the scheduler asks workers for (RegisterWorkerResponse). Must be shorter
  // than heartbeat_timeout. Default 1 s.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Hang detection: a RUNNING job whose step has not advanced for
  // max(hang_min_timeout, hang_step_time_factor x its median step time) ends its attempt
  // (reason "Hang", class INFRA). The median is over the last 32 step intervals and needs at
  // least 3 of them; evaluation and checkpoint pauses must fit under the threshold.
  double hang_step_time_factor = 20;
  absl::Duration hang_min_timeout = absl::Minutes(2);
  // How long a graceful stop (CancelJob of a running job) may take before the ranks are killed.
  absl::Duration cancel_grace = absl::Minutes(2);
  JobSpecValidationOptions validation;
  // Confine the paths a spec names (model.init_from, dataset.path) to the tenant's own jobs'
  // checkpoint directories and its data roots (queues.data_roots / tenant_data_roots, default
  // {validation.fortunes_dir}); scheduler/path_policy.h. PERMISSION_DENIED at submission.
  // loom-scheduler turns it on (--confine_paths); off here so unit tests may use any temp path.
  bool confine_paths = false;

  // Queues, tenants and quotas (scheduler/queues.h; docs/scheduling.md). Default: one "default"
  // queue open to every tenant, no quota.
  QueuesConfig queues = QueuesConfig::Default();
  // Infra restart budget of a job whose spec.max_infra_restarts is -1.
  int32_t default_max_infra_restarts = 3;
  // A STARTING attempt whose ranks are not all RUNNING this long after placement is torn down
  // (reason "ReadyTimeout", class INFRA, infra budget) and requeued after an exponential backoff:
  // ready_backoff_base x 2^(k-1) for the k-th consecutive timeout, at most ready_backoff_cap.
  absl::Duration ready_timeout = absl::Minutes(5);
  absl::Duration ready_backoff_base = absl::Seconds(10);
  absl::Duration ready_backoff_cap = absl::Minutes(10);
  // A failed attempt (RECOVERING) is placed again only after restart_backoff_base x 2^(k-1)
  // for the job's k-th restart (user + infra), at most restart_backoff_cap (restart_policy.h).
  // Zero base: at once.
  absl::Duration restart_backoff_base = absl::Seconds(1);
  absl::Duration restart_backoff_cap = absl::Minutes(1);
  // A pending job that cannot be placed may preempt lower-priority jobs of its kind.
  bool enable_preemption = true;
  // Jobs behind a blocked head job may start when they do not delay it (docs/scheduling.md).
  bool enable_backfill = true;
  // Resume lookups and retention (scheduler/checkpoint_worker.h): retry backoff and how long a
  // definite resume answer is reused.
  CheckpointWorkerOptions checkpoint_worker;
  // How long a scheduling cycle waits (off the lock) for the resume lookups it just asked for;
  // a job whose lookup has not answered by then waits for a later cycle. Default 1 s, >= 0.
  absl::Duration resume_lookup_wait = absl::Seconds(1);
  // Admission passes (docs/scheduling.md "Admission passes"). A cycle runs no placement at all
  // when nothing it reads changed since the last pass (no job record, rank, node or resume
  // answer changed, no backoff expired). A pass that runs considers the first
  // admission_queue_depth waiting jobs in queue order (0 = all; as Slurm's default_queue_depth),
  // except a full pass over every waiting job, which runs at most every admission_full_interval
  // (as Slurm's sched_interval) when a change came since the last one, or when the last pass left
  // jobs unconsidered. admission_queue_depth >= 0; admission_full_interval >= 0.
  int admission_queue_depth = 1000;
  absl::Duration admission_full_interval = absl::Seconds(10);
  // Rank 0's step progress (step, loss, tokens/s) is held in memory and published at once; a
  // job's progress-only change is stored by the first cycle at least this long after it (so at
  // most one write per job per interval; 0 = the next cycle), and at shutdown (FlushProgress).
  // A crash loses at most this much displayed progress, which the workers report again; it is
  // not training state (checkpoints are). Phase, rendezvous and checkpoint changes are written
  // at once regardless. >= 0. Storing it with every cycle instead (~1,700 jobs stepping once a
  // second at 2,000 nodes) meant hundreds of full job records in each cycle's transaction
  // (docs/benchmarks.md, "Progress writes").
  absl::Duration progress_store_interval = absl::Seconds(5);
  // Most unfinished jobs (not yet SUCCEEDED/FAILED/CANCELLED, submissions being committed
  // included) one tenant may have; a submission over it is RESOURCE_EXHAUSTED naming the limit
  // (as Slurm's MaxSubmitJobs per user). queues.tenant_max_unfinished_jobs overrides it per
  // tenant. 0 = no limit; >= 0 (scheduler_tenant_limits.cc).
  int64_t max_unfinished_jobs_per_tenant = 1000;

  // INVALID_ARGUMENT naming the field if the options are unusable.
  absl::Status Validate() const;
};

}  // namespace loom

#endif  // LOOM_SCHEDULER_SCHEDULER_OPTIONS_H_
