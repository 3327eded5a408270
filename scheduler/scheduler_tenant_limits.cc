// Per-tenant limits on what a tenant may hold in the scheduler (docs/operations.md "Per-tenant
// limits"): the number of its unfinished jobs. Without one, a tenant could fill the scheduler's
// memory and its database with jobs that never run (e.g. Unschedulable ones).
#include "absl/strings/str_cat.h"
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
  const int64_t unfinished = jobs_.UnfinishedJobs(tenant);
  if (unfinished < limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "tenant ", tenant, " has ", unfinished, " unfinished jobs, the limit (", source, ") is ",
      limit, ": wait for some to end, or cancel some, before submitting more"));
}

}  // namespace loom
