// SchedulerOptions::Validate and the API view of a stored job.
#include "scheduler/scheduler.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "scheduler/job_state.h"
#include "scheduler/path_policy.h"
#include "scheduler/placement.h"
#include "scheduler/preemption.h"
#include "scheduler/record_helpers.h"
#include "scheduler/restart_policy.h"
#include "scheduler/scheduler_internal.h"

namespace loom {

absl::Status SchedulerOptions::Validate() const {
  if (checkpoint_root.empty()) {
    return absl::InvalidArgumentError("checkpoint_root: required");
  }
  if (heartbeat_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeat_timeout: must be > 0, got ", absl::FormatDuration(heartbeat_timeout)));
  }
  if (!(hang_step_time_factor >= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("hang_step_time_factor: must be >= 1, got ", hang_step_time_factor));
  }
  if (hang_min_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("hang_min_timeout: must be > 0");
  }
  if (cancel_grace <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("cancel_grace: must be > 0");
  }
  if (resume_lookup_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resume_lookup_wait: must be >= 0, got ", absl::FormatDuration(resume_lookup_wait)));
  }
  if (checkpoint_worker.retry_initial <= absl::ZeroDuration() ||
      checkpoint_worker.retry_max < checkpoint_worker.retry_initial) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint_worker.retry_initial: must be in (0, retry_max], got ",
                     absl::FormatDuration(checkpoint_worker.retry_initial)));
  }
  if (heartbeat_interval <= absl::ZeroDuration() || heartbeat_interval >= heartbeat_timeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat_interval: must be in (0, heartbeat_timeout = ",
        absl::FormatDuration(heartbeat_timeout), "), got ",
        absl::FormatDuration(heartbeat_interval)));
  }
  if (reregistration_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("reregistration_grace: must be >= 0");
  }
  if (queues.queues.empty()) return absl::InvalidArgumentError("queues: at least one queue");
  if (max_unfinished_jobs_per_tenant < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_unfinished_jobs_per_tenant: must be >= 0 (0 = no limit), got ",
        max_unfinished_jobs_per_tenant));
  }
  if (default_max_infra_restarts < 0) {
    return absl::InvalidArgumentError(absl::StrCat("default_max_infra_restarts: must be >= 0, got ",
                                                   default_max_infra_restarts));
  }
  if (ready_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ready_timeout: must be > 0");
  }
  if (ready_backoff_base <= absl::ZeroDuration() || ready_backoff_cap < ready_backoff_base) {
    return absl::InvalidArgumentError(
        "ready_backoff_base: must be > 0 and at most ready_backoff_cap");
  }
  if (restart_backoff_base < absl::ZeroDuration() || restart_backoff_cap < restart_backoff_base) {
    return absl::InvalidArgumentError(
        "restart_backoff_base: must be >= 0 and at most restart_backoff_cap");
  }
  if (admission_queue_depth < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "admission_queue_depth: must be >= 0 (0 = every waiting job), got ", admission_queue_depth));
  }
  if (progress_store_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("progress_store_interval: must be >= 0, got ",
                                                   absl::FormatDuration(progress_store_interval)));
  }
  if (admission_full_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("admission_full_interval: must be >= 0, got ",
                                                   absl::FormatDuration(admission_full_interval)));
  }
  return absl::OkStatus();
}

loom::v1::Job JobRecordToProto(const JobRecord& r) {
  loom::v1::Job job;
  job.set_id(r.id);
  job.set_request_id(r.request_id);
  job.set_tenant(r.tenant);
  job.set_user_restarts(r.state.user_restarts());
  job.set_infra_restarts(r.state.infra_restarts());
  job.set_preemptions(r.state.preemptions());
  job.set_checkpoint_retention_error(r.state.checkpoint_retention_error());
  if (r.state.has_chosen_technique()) *job.mutable_technique() = r.state.chosen_technique();
  *job.mutable_spec() = r.spec;
  job.set_phase(r.phase);
  job.set_failure_class(r.failure_class);
  job.set_reason(r.reason);
  job.set_message(r.message);
  if (r.create_time != absl::InfinitePast()) SetTimestamp(r.create_time, job.mutable_create_time());
  if (r.start_time != absl::InfinitePast()) SetTimestamp(r.start_time, job.mutable_start_time());
  if (r.end_time != absl::InfinitePast()) SetTimestamp(r.end_time, job.mutable_end_time());
  job.set_attempt(r.attempt);
  *job.mutable_progress() = r.progress;
  job.set_checkpoint_dir(r.checkpoint_dir);
  for (const std::string& node : r.rank_nodes) job.add_rank_nodes(node);
  return job;
}

loom::v1::Job JobRecordToProto(JobRecord&& r) {
  loom::v1::JobSpec spec = std::move(r.spec);  // r.spec is left empty: copying it costs nothing
  loom::v1::Job job = JobRecordToProto(static_cast<const JobRecord&>(r));
  *job.mutable_spec() = std::move(spec);
  return job;
}

}  // namespace loom
