// The Scheduler facade's read-only job queries: GetJob, JobTenant, ListJobs, ListJobsPage and
// ExplainPending.
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
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/message_differencer.h"
#include "proto/scheduler_state.pb.h"
#include "scheduler/job_spec_validation_limits.h"
#include "scheduler/job_state.h"
#include "scheduler/path_policy.h"
#include "scheduler/placement.h"
#include "scheduler/preemption.h"
#include "scheduler/record_helpers.h"
#include "scheduler/restart_policy.h"
#include "scheduler/scheduler_internal.h"

namespace loom {

absl::Status Scheduler::JobNotFound(const std::string& job_id) {
  return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
}

absl::StatusOr<loom::v1::Job> Scheduler::GetJob(const std::string& job_id) {
  RETURN_IF_ERROR(CheckRequiredId("job_id", job_id));
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return JobNotFound(job_id);
  return JobRecordToProto(it->second);
}

absl::StatusOr<std::string> Scheduler::JobTenant(const std::string& job_id) {
  RETURN_IF_ERROR(CheckRequiredId("job_id", job_id));
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return JobNotFound(job_id);
  return it->second.tenant;
}

absl::StatusOr<std::vector<loom::v1::Job>> Scheduler::ListJobs(JobPhase phase) {
  absl::MutexLock lock(&mu_);
  std::vector<loom::v1::Job> out;
  for (const auto& [seq, id] : jobs_.order()) {
    const JobRecord& job = jobs_.at(id);
    if (phase == v1::JOB_PHASE_UNSPECIFIED || job.phase == phase) {
      out.push_back(JobRecordToProto(job));
    }
  }
  return out;
}

namespace {

// The page token that continues after job sequence `after` with the filters of `request`.
std::string ListJobsPageTokenAfter(const loom::v1::ListJobsRequest& request, int64_t after) {
  loom::internal::ListJobsPageToken token;
  token.set_after_sequence(after);
  token.set_phase(request.phase());
  token.set_name_prefix(request.name_prefix());
  token.set_tenant(request.tenant());
  token.set_queue(request.queue());
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    token.SerializeToCodedStream(&coded);
  }
  return absl::WebSafeBase64Escape(bytes);
}

// The sequence `request`'s page token continues after (0 without one). INVALID_ARGUMENT if it
// is not a token ListJobs issued (garbage, bytes added) or was issued for other filters.
absl::StatusOr<int64_t> ListJobsPageTokenStart(const loom::v1::ListJobsRequest& request) {
  if (request.page_token().empty()) return 0;
  std::string decoded;
  loom::internal::ListJobsPageToken token;
  loom::v1::ListJobsRequest issued;  // the filters the token was issued for
  if (!absl::WebSafeBase64Unescape(request.page_token(), &decoded) ||
      !token.ParseFromString(decoded) || token.after_sequence() < 0) {
    return absl::InvalidArgumentError("page_token: not a token from a previous ListJobs");
  }
  issued.set_phase(static_cast<loom::v1::JobPhase>(token.phase()));
  issued.set_name_prefix(token.name_prefix());
  issued.set_tenant(token.tenant());
  issued.set_queue(token.queue());
  // Parsing skips unknown and repeated fields: only the exact bytes ListJobs wrote are a token.
  if (ListJobsPageTokenAfter(issued, token.after_sequence()) != request.page_token()) {
    return absl::InvalidArgumentError("page_token: not a token from a previous ListJobs");
  }
  if (issued.phase() != request.phase() || issued.name_prefix() != request.name_prefix() ||
      issued.tenant() != request.tenant() || issued.queue() != request.queue()) {
    return absl::InvalidArgumentError(
        "page_token: issued for other filters (phase, name_prefix, tenant and queue must stay "
        "the same from page to page; leave page_token out to list with new filters)");
  }
  return token.after_sequence();
}

}  // namespace

absl::StatusOr<loom::v1::ListJobsResponse> Scheduler::ListJobsPage(
    const loom::v1::ListJobsRequest& request) {
  constexpr int kDefaultPageSize = 100, kMaxPageSize = 1000;
  // Well under gRPC's default 4 MB receive limit (a job's spec is at most kMaxJobSpecBytes).
  constexpr size_t kMaxPageBytes = 2 << 20;
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: must not be negative, got ", request.page_size()));
  }
  // An unknown phase number is refused naming the field (it would list nothing).
  RETURN_IF_ERROR(CheckKnownEnumValues(request, ""));
  // Larger sizes are capped, not refused (Google AIP-158): a client asking for "everything"
  // gets full pages.
  const int page_size = request.page_size() == 0 ? kDefaultPageSize
                                                 : std::min(request.page_size(), kMaxPageSize);
  ASSIGN_OR_RETURN(const int64_t after, ListJobsPageTokenStart(request));
  absl::MutexLock lock(&mu_);
  loom::v1::ListJobsResponse page;
  size_t page_bytes = 0;
  int64_t last_sequence = after;
  for (auto it = jobs_.order().upper_bound(after); it != jobs_.order().end(); ++it) {
    const JobRecord& job = jobs_.at(it->second);
    if (request.phase() != v1::JOB_PHASE_UNSPECIFIED && job.phase != request.phase()) continue;
    if (!absl::StartsWith(job.spec.name(), request.name_prefix())) continue;
    if (!request.tenant().empty() && job.tenant != request.tenant()) continue;
    if (!request.queue().empty() &&
        QueueOf(job.spec) != request.queue()) {
      continue;
    }
    if (page.jobs_size() == page_size) {
      page.set_next_page_token(ListJobsPageTokenAfter(request, last_sequence));
      break;
    }
    loom::v1::Job proto = JobRecordToProto(job);
    // Each repeated element costs its size plus a tag and a length prefix (at most 6 bytes).
    const size_t bytes = proto.ByteSizeLong() + 6;
    if (page.jobs_size() > 0 && page_bytes + bytes > kMaxPageBytes) {
      page.set_next_page_token(ListJobsPageTokenAfter(request, last_sequence));
      break;
    }
    page_bytes += bytes;
    last_sequence = job.sequence;
    *page.add_jobs() = std::move(proto);
  }
  return page;
}

absl::StatusOr<loom::v1::ExplainPendingResponse> Scheduler::ExplainPending(
    const std::string& job_id) {
  RETURN_IF_ERROR(CheckRequiredId("job_id", job_id));
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return JobNotFound(job_id);
  const JobRecord& job = it->second;
  loom::v1::ExplainPendingResponse out;
  out.set_phase(job.phase);
  out.set_reason(job.reason);
  out.set_message(job.message);
  const bool waiting = job.phase == v1::JOB_PHASE_PENDING || job.phase == v1::JOB_PHASE_RECOVERING;
  if (!waiting) return out;
  // Issue 48: a job queued for capacity (wait_for_capacity) that the registered nodes could not
  // hold for memory says so, as its submission would have been told.
  if (absl::Status memory =
          CheckJobFitsNodeMemory(job.spec, reconciler_.capacity().live_node_shapes);
      !memory.ok()) {
    out.set_message(
        absl::StrCat(out.message(), out.message().empty() ? "" : "; ", memory.message()));
  }
  const AcceleratorKind kind = KindOf(job.spec);
  const std::vector<std::string>& order = queue_order_[kind];
  if (auto pos = std::find(order.begin(), order.end(), job_id); pos != order.end()) {
    // The order of the last scheduling cycle (priority, fair share, age); at most
    // kMaxJobsAhead of the jobs ahead are named.
    constexpr int kMaxJobsAhead = 100;
    const int position = static_cast<int>(pos - order.begin()) + 1;
    out.set_queue_position(position);
    for (int i = 0; i + 1 < position && i < kMaxJobsAhead; ++i) out.add_jobs_ahead(order[i]);
    return out;
  }
  // Not yet seen by a cycle: submission order among waiting jobs of its kind.
  int position = 0;
  for (const auto& [seq, id] : jobs_.order()) {
    const JobRecord& other = jobs_.at(id);
    const bool other_waiting =
        other.phase == v1::JOB_PHASE_PENDING || other.phase == v1::JOB_PHASE_RECOVERING;
    if (!other_waiting || KindOf(other.spec) != kind) continue;
    ++position;
    if (id == job_id) break;
    out.add_jobs_ahead(id);
  }
  out.set_queue_position(position);
  return out;
}

}  // namespace loom
