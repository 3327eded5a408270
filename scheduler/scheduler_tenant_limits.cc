// Per-tenant limits on what a tenant may hold in the scheduler (docs/operations.md "Per-tenant
// limits"): the number of its unfinished jobs. Without one, a tenant could fill the scheduler's
// memory and its database with jobs that never run (e.g. Unschedulable ones).
#include <tuple>

#include "absl/strings/str_cat.h"
#include "scheduler/job_state.h"
#include "scheduler/scheduler.h"

namespace loom {

absl::Status Scheduler::CheckUnfinishedJobLimit(const std::string& tenant) {
  int64_t limit = options_.max_unfinished_jobs_per_tenant;
  const char* source = "--max_unfinished_jobs_per_tenant";
  if (auto it = options_.queues.tenant_max_unfinished_jobs.find(tenant);
      it != options_.queues.tenant_max_unfinished_jobs.end()) {
    limit = it->second;
    source = "tenants.<tenant>.max_unfinished_jobs";
  }
  if (limit <= 0) return absl::OkStatus();  // no limit
  int64_t unfinished = 0;
  auto in_flight = inflight_by_tenant_.find(tenant);
  if (in_flight != inflight_by_tenant_.end()) unfinished += in_flight->second;
  // tenant_counts_ is ordered by (tenant, queue, phase): this tenant's entries are contiguous.
  for (auto it = tenant_counts_.lower_bound({tenant, std::string(), v1::JOB_PHASE_UNSPECIFIED});
       it != tenant_counts_.end() && std::get<0>(it->first) == tenant; ++it) {
    if (!IsTerminal(std::get<2>(it->first))) unfinished += it->second;
  }
  if (unfinished < limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "tenant ", tenant, " has ", unfinished, " unfinished jobs, the limit (", source, ") is ",
      limit, ": wait for some to end, or cancel some, before submitting more"));
}

}  // namespace loom
