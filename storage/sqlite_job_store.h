// File: storage/sqlite_job_store.h
//
// The production JobStore: one SQLite file (WAL mode) holding tables `jobs`, `job_ranks` (rank
// placement; foreign keys to jobs and nodes) and `nodes`. Specs, progress and inventories are
// serialized protos in BLOB columns; times are INTEGER microseconds since the Unix epoch (NULL =
// not set). The schema is versioned with PRAGMA user_version and migrated forward on Open();
// a file written by a newer binary is refused.
#ifndef LOOM_STORAGE_SQLITE_JOB_STORE_H_
#define LOOM_STORAGE_SQLITE_JOB_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "storage/job_store.h"
#include "storage/sqlite_db.h"

namespace loom {

// Thread-safe (one connection, serialized by a mutex).
class SqliteJobStore final : public JobStore {
 public:
  // The schema version this binary writes.
  static constexpr int64_t kSchemaVersion = 5;

  // Opens or creates the database at `path` and migrates it to kSchemaVersion.
  // FAILED_PRECONDITION if the file's schema is newer than kSchemaVersion; UNAVAILABLE if the
  // file cannot be opened.
  static absl::StatusOr<std::unique_ptr<SqliteJobStore>> Open(const std::string& path);

  absl::Status CreateJob(const JobRecord& job) override;
  absl::Status UpdateJob(const JobRecord& job) override;
  absl::Status CreateJobs(const std::vector<JobRecord>& jobs) override;  // one transaction
  absl::Status UpdateJobs(const std::vector<JobRecord>& jobs) override;  // one transaction
  absl::StatusOr<JobRecord> GetJob(const std::string& id) override;
  absl::StatusOr<std::vector<JobRecord>> ListJobs(loom::v1::JobPhase phase) override;
  absl::Status UpsertNode(const NodeRecord& node) override;
  absl::StatusOr<NodeRecord> GetNode(const std::string& id) override;
  absl::StatusOr<std::vector<NodeRecord>> ListNodes() override;
  absl::Status WriteMetrics(const std::vector<MetricRow>& rows) override;
  absl::StatusOr<std::vector<MetricRow>> ListMetrics(const std::string& job_id, int64_t after_key,
                                                     int limit) override;

 private:
  explicit SqliteJobStore(std::unique_ptr<SqliteDb> db) : db_(std::move(db)) {}
  absl::Status Migrate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteJob(const JobRecord& job, bool insert) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The statements of WriteJob without a transaction of their own.
  absl::Status WriteJobRows(const JobRecord& job, bool insert) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<JobRecord>> QueryJobs(const std::string& where_sql,
                                                   const std::string& text_param,
                                                   int64_t int_param)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::unique_ptr<SqliteDb> db_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom

#endif  // LOOM_STORAGE_SQLITE_JOB_STORE_H_
