#include "storage/in_memory_job_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace loom {

absl::Status InMemoryJobStore::CheckRankNodes(const JobRecord& job) const {
  for (size_t rank = 0; rank < job.rank_nodes.size(); ++rank) {
    if (nodes_.count(job.rank_nodes[rank]) == 0) {
      return absl::FailedPreconditionError(absl::StrCat("job ", job.id, " rank ", rank,
                                                        ": unknown node '", job.rank_nodes[rank],
                                                        "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status InMemoryJobStore::CreateJob(const JobRecord& job) {
  absl::MutexLock lock(&mu_);
  return CreateLocked(job);
}

absl::Status InMemoryJobStore::UpdateJob(const JobRecord& job) {
  absl::MutexLock lock(&mu_);
  return UpdateLocked(job);
}

absl::Status InMemoryJobStore::CreateJobs(const std::vector<JobRecord>& jobs) {
  absl::MutexLock lock(&mu_);
  std::map<std::string, JobRecord> before = jobs_;  // all or nothing
  for (const JobRecord& job : jobs) {
    absl::Status s = CreateLocked(job);
    if (!s.ok()) {
      jobs_ = std::move(before);
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status InMemoryJobStore::UpdateJobs(const std::vector<JobRecord>& jobs) {
  absl::MutexLock lock(&mu_);
  std::map<std::string, JobRecord> before = jobs_;  // all or nothing
  for (const JobRecord& job : jobs) {
    absl::Status s = UpdateLocked(job);
    if (!s.ok()) {
      jobs_ = std::move(before);
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status InMemoryJobStore::CreateLocked(const JobRecord& job) {
  if (jobs_.count(job.id)) return absl::AlreadyExistsError(absl::StrCat("job ", job.id, " exists"));
  for (const auto& [id, other] : jobs_) {
    if (other.sequence == job.sequence) {
      return absl::AlreadyExistsError(
          absl::StrCat("job sequence ", job.sequence, " is taken by job ", id));
    }
    if (!job.request_id.empty() && other.request_id == job.request_id) {
      return absl::AlreadyExistsError(
          absl::StrCat("request id ", job.request_id, " is taken by job ", id));
    }
  }
  absl::Status s = CheckRankNodes(job);
  if (!s.ok()) return s;
  jobs_[job.id] = job;
  return absl::OkStatus();
}

absl::Status InMemoryJobStore::UpdateLocked(const JobRecord& job) {
  auto it = jobs_.find(job.id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job.id, " not found"));
  for (const auto& [id, other] : jobs_) {
    if (id != job.id && other.sequence == job.sequence) {
      return absl::AlreadyExistsError(
          absl::StrCat("job sequence ", job.sequence, " is taken by job ", id));
    }
  }
  absl::Status s = CheckRankNodes(job);
  if (!s.ok()) return s;
  it->second = job;
  return absl::OkStatus();
}

absl::StatusOr<JobRecord> InMemoryJobStore::GetJob(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  return it->second;
}

absl::StatusOr<std::vector<JobRecord>> InMemoryJobStore::ListJobs(loom::v1::JobPhase phase) {
  absl::MutexLock lock(&mu_);
  std::vector<JobRecord> out;
  for (const auto& [id, job] : jobs_) {
    if (phase == loom::v1::JOB_PHASE_UNSPECIFIED || job.phase == phase) out.push_back(job);
  }
  std::sort(out.begin(), out.end(),
            [](const JobRecord& a, const JobRecord& b) { return a.sequence < b.sequence; });
  return out;
}

absl::Status InMemoryJobStore::UpsertNode(const NodeRecord& node) {
  absl::MutexLock lock(&mu_);
  nodes_[node.id] = node;
  return absl::OkStatus();
}

absl::StatusOr<NodeRecord> InMemoryJobStore::GetNode(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return absl::NotFoundError(absl::StrCat("node ", id, " not found"));
  return it->second;
}

absl::StatusOr<std::vector<NodeRecord>> InMemoryJobStore::ListNodes() {
  absl::MutexLock lock(&mu_);
  std::vector<NodeRecord> out;
  for (const auto& [id, node] : nodes_) out.push_back(node);
  return out;
}

absl::Status InMemoryJobStore::WriteMetrics(const std::vector<MetricRow>& rows) {
  absl::MutexLock lock(&mu_);
  for (const MetricRow& row : rows) metrics_[{row.job_id, row.key}] = row.data;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<MetricRow>> InMemoryJobStore::ListMetrics(const std::string& job_id,
                                                                     int64_t after_key,
                                                                     int limit) {
  if (limit < 1) return absl::InvalidArgumentError(absl::StrCat("limit: ", limit, " < 1"));
  absl::MutexLock lock(&mu_);
  std::vector<MetricRow> rows;
  for (auto it = metrics_.upper_bound({job_id, after_key});
       it != metrics_.end() && it->first.first == job_id && static_cast<int>(rows.size()) < limit;
       ++it) {
    rows.push_back(MetricRow{job_id, it->first.second, it->second});
  }
  return rows;
}

}  // namespace loom
