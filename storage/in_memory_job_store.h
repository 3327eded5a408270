// File: storage/in_memory_job_store.h
//
// A JobStore kept in process memory, for tests of the scheduler core. It enforces the same
// contract as SqliteJobStore (the shared conformance suite runs against both), but nothing
// survives the object.
#ifndef LOOM_STORAGE_IN_MEMORY_JOB_STORE_H_
#define LOOM_STORAGE_IN_MEMORY_JOB_STORE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "storage/job_store.h"

namespace loom {

// Thread-safe.
class InMemoryJobStore final : public JobStore {
 public:
  InMemoryJobStore() = default;

  absl::Status CreateJob(const JobRecord& job) override;
  absl::Status UpdateJob(const JobRecord& job) override;
  absl::Status CreateJobs(const std::vector<JobRecord>& jobs) override;
  absl::Status UpdateJobs(const std::vector<JobRecord>& jobs) override;
  absl::StatusOr<JobRecord> GetJob(const std::string& id) override;
  absl::StatusOr<std::vector<JobRecord>> ListJobs(loom::v1::JobPhase phase) override;
  absl::Status UpsertNode(const NodeRecord& node) override;
  absl::StatusOr<NodeRecord> GetNode(const std::string& id) override;
  absl::StatusOr<std::vector<NodeRecord>> ListNodes() override;
  absl::Status WriteMetrics(const std::vector<MetricRow>& rows) override;
  absl::StatusOr<std::vector<MetricRow>> ListMetrics(const std::string& job_id, int64_t after_key,
                                                     int limit) override;

 private:
  absl::Status CheckRankNodes(const JobRecord& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CreateLocked(const JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status UpdateLocked(const JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::map<std::string, JobRecord> jobs_ ABSL_GUARDED_BY(mu_);    // by id
  std::map<std::string, NodeRecord> nodes_ ABSL_GUARDED_BY(mu_);  // by id
  std::map<std::pair<std::string, int64_t>, std::string> metrics_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom

#endif  // LOOM_STORAGE_IN_MEMORY_JOB_STORE_H_
