#include "storage/sqlite_job_store.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace loom {
namespace {

// Migration i (0-based) takes the schema from user_version i to i + 1.
const char* const kMigrations[] = {
    // 0 -> 1: initial schema.
    R"sql(
CREATE TABLE jobs (
  id TEXT PRIMARY KEY NOT NULL,
  sequence INTEGER NOT NULL UNIQUE,
  spec BLOB NOT NULL,
  phase INTEGER NOT NULL,
  failure_class INTEGER NOT NULL DEFAULT 0,
  reason TEXT NOT NULL DEFAULT '',
  message TEXT NOT NULL DEFAULT '',
  create_time_us INTEGER,
  start_time_us INTEGER,
  end_time_us INTEGER,
  attempt INTEGER NOT NULL DEFAULT 0,
  progress BLOB NOT NULL,
  checkpoint_dir TEXT NOT NULL DEFAULT '',
  rendezvous_port INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX jobs_by_phase ON jobs(phase, sequence);
CREATE TABLE nodes (
  id TEXT PRIMARY KEY NOT NULL,
  inventory BLOB NOT NULL,
  last_heartbeat_us INTEGER,
  lost INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE job_ranks (
  job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
  rank INTEGER NOT NULL,
  node_id TEXT NOT NULL REFERENCES nodes(id),
  PRIMARY KEY (job_id, rank)
);
)sql",
    // 1 -> 2: client request ids make submission idempotent (empty = none given).
    R"sql(
ALTER TABLE jobs ADD COLUMN request_id TEXT NOT NULL DEFAULT '';
CREATE UNIQUE INDEX jobs_by_request_id ON jobs(request_id) WHERE request_id != '';
)sql",
    // 2 -> 3: tenants, and extensible scheduling state for jobs (restart budgets, backoff,
    // preemptions) and nodes (cordon / drain) as serialized protos (proto/scheduler_state.proto).
    R"sql(
ALTER TABLE jobs ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
ALTER TABLE jobs ADD COLUMN state BLOB NOT NULL DEFAULT x'';
ALTER TABLE nodes ADD COLUMN admin BLOB NOT NULL DEFAULT x'';
CREATE INDEX jobs_by_tenant ON jobs(tenant, sequence);
)sql",
    // 3 -> 4: drop the two secondary indexes that no query of the daemon reads. The scheduler
    // reads the whole jobs table once at start (ORDER BY sequence: sequence's own unique index)
    // and otherwise addresses rows by id; ListJobs(phase), which only tools and tests call,
    // scans. Each index cost every submission batch and every phase change a b-tree page
    // written to the WAL and fsynced (docs/benchmarks.md "Control plane": 6 b-trees per job row
    // became 4).
    R"sql(
DROP INDEX IF EXISTS jobs_by_phase;
DROP INDEX IF EXISTS jobs_by_tenant;
)sql",
    // 4 -> 5: the training metric history (issue 45), one row per job and key (MetricRow).
    R"sql(
CREATE TABLE job_metrics (
  job_id TEXT NOT NULL,
  key INTEGER NOT NULL,
  data BLOB NOT NULL,
  PRIMARY KEY (job_id, key)
) WITHOUT ROWID;
)sql",
};
constexpr int64_t kNumMigrations = sizeof(kMigrations) / sizeof(kMigrations[0]);
static_assert(kNumMigrations == SqliteJobStore::kSchemaVersion,
              "one migration per schema version");

constexpr char kJobColumns[] =
    "id, sequence, spec, phase, failure_class, reason, message, create_time_us, start_time_us, "
    "end_time_us, attempt, progress, checkpoint_dir, rendezvous_port, request_id, tenant, state";

absl::Status BindTime(SqliteStatement& stmt, int index, absl::Time t) {
  if (t == absl::InfinitePast()) return stmt.BindNull(index);
  return stmt.BindInt64(index, absl::ToUnixMicros(t));
}

absl::Time ColumnTime(const SqliteStatement& stmt, int col) {
  if (stmt.ColumnIsNull(col)) return absl::InfinitePast();
  return absl::FromUnixMicros(stmt.ColumnInt64(col));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SqliteJobStore>> SqliteJobStore::Open(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<SqliteDb> db, SqliteDb::Open(path));
  std::unique_ptr<SqliteJobStore> store(new SqliteJobStore(std::move(db)));
  {
    absl::MutexLock lock(&store->mu_);
    RETURN_IF_ERROR(store->Migrate());
  }
  return store;
}

absl::Status SqliteJobStore::Migrate() {
  SqliteDb& db = *db_;  // the lambda runs under mu_, which the analysis cannot see
  return db.InTransaction([&]() -> absl::Status {
    ASSIGN_OR_RETURN(int64_t version, db.UserVersion());
    if (version > kSchemaVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          db.path(), ": database schema version ", version,
          " is newer than this binary supports (", kSchemaVersion, ")"));
    }
    for (int64_t v = version; v < kSchemaVersion; ++v) {
      RETURN_IF_ERROR(db.Exec(kMigrations[v]));
    }
    if (version != kSchemaVersion) RETURN_IF_ERROR(db.SetUserVersion(kSchemaVersion));
    return absl::OkStatus();
  });
}

absl::Status SqliteJobStore::WriteJob(const JobRecord& job, bool insert) {
  SqliteDb& db = *db_;  // the lambda runs under mu_, which the analysis cannot see
  return db.InTransaction([&]() -> absl::Status { return WriteJobRows(job, insert); });
}

absl::Status SqliteJobStore::WriteJobRows(const JobRecord& job, bool insert) {
  SqliteDb& db = *db_;
  {
    // The connection's cached statements (PrepareCached): a progress write rewrites a job row
    // and its rank rows, and preparing them cost more than running them.
    static const std::string* const kInsert = new std::string(absl::StrCat(
        "INSERT INTO jobs (", kJobColumns,
        ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"));
    static constexpr absl::string_view kUpdate =
        "UPDATE jobs SET sequence=?2, spec=?3, phase=?4, failure_class=?5, "
        "reason=?6, message=?7, create_time_us=?8, start_time_us=?9, "
        "end_time_us=?10, attempt=?11, progress=?12, checkpoint_dir=?13, "
        "rendezvous_port=?14, request_id=?15, tenant=?16, state=?17 WHERE id=?1";
    ASSIGN_OR_RETURN(SqliteStatement * stmt,
                     db.PrepareCached(insert ? absl::string_view(*kInsert) : kUpdate));
    RETURN_IF_ERROR(stmt->BindText(1, job.id));
    RETURN_IF_ERROR(stmt->BindInt64(2, job.sequence));
    RETURN_IF_ERROR(stmt->BindBlob(3, job.spec.SerializeAsString()));
    RETURN_IF_ERROR(stmt->BindInt64(4, job.phase));
    RETURN_IF_ERROR(stmt->BindInt64(5, job.failure_class));
    RETURN_IF_ERROR(stmt->BindText(6, job.reason));
    RETURN_IF_ERROR(stmt->BindText(7, job.message));
    RETURN_IF_ERROR(BindTime(*stmt, 8, job.create_time));
    RETURN_IF_ERROR(BindTime(*stmt, 9, job.start_time));
    RETURN_IF_ERROR(BindTime(*stmt, 10, job.end_time));
    RETURN_IF_ERROR(stmt->BindInt64(11, job.attempt));
    RETURN_IF_ERROR(stmt->BindBlob(12, job.progress.SerializeAsString()));
    RETURN_IF_ERROR(stmt->BindText(13, job.checkpoint_dir));
    RETURN_IF_ERROR(stmt->BindInt64(14, job.rendezvous_port));
    RETURN_IF_ERROR(stmt->BindText(15, job.request_id));
    RETURN_IF_ERROR(stmt->BindText(16, job.tenant));
    RETURN_IF_ERROR(stmt->BindBlob(17, job.state.SerializeAsString()));
    absl::Status s = stmt->Run();
    if (s.code() == absl::StatusCode::kAlreadyExists) {
      return absl::AlreadyExistsError(absl::StrCat("job ", job.id, " (sequence ", job.sequence,
                                                   ") conflicts with a stored job: ",
                                                   s.message()));
    }
    RETURN_IF_ERROR(s);
    if (!insert) {
      if (db.Changes() == 0) return absl::NotFoundError(absl::StrCat("job ", job.id, " not found"));
      ASSIGN_OR_RETURN(SqliteStatement * del,
                       db.PrepareCached("DELETE FROM job_ranks WHERE job_id=?1"));
      RETURN_IF_ERROR(del->BindText(1, job.id));
      RETURN_IF_ERROR(del->Run());
    }
    for (size_t rank = 0; rank < job.rank_nodes.size(); ++rank) {
      ASSIGN_OR_RETURN(
          SqliteStatement * ins,
          db.PrepareCached("INSERT INTO job_ranks (job_id, rank, node_id) VALUES (?1, ?2, ?3)"));
      RETURN_IF_ERROR(ins->BindText(1, job.id));
      RETURN_IF_ERROR(ins->BindInt64(2, static_cast<int64_t>(rank)));
      RETURN_IF_ERROR(ins->BindText(3, job.rank_nodes[rank]));
      absl::Status rs = ins->Run();
      if (rs.code() == absl::StatusCode::kFailedPrecondition) {
        return absl::FailedPreconditionError(absl::StrCat(
            "job ", job.id, " rank ", rank, ": unknown node '", job.rank_nodes[rank], "'"));
      }
      RETURN_IF_ERROR(rs);
    }
    return absl::OkStatus();
  }
}

absl::Status SqliteJobStore::CreateJob(const JobRecord& job) {
  absl::MutexLock lock(&mu_);
  return WriteJob(job, /*insert=*/true);
}

absl::Status SqliteJobStore::UpdateJob(const JobRecord& job) {
  absl::MutexLock lock(&mu_);
  return WriteJob(job, /*insert=*/false);
}

absl::Status SqliteJobStore::CreateJobs(const std::vector<JobRecord>& jobs) {
  absl::MutexLock lock(&mu_);
  SqliteDb& db = *db_;  // the lambda runs under mu_, which the analysis cannot see
  return db.InTransaction([&]() -> absl::Status {
    for (const JobRecord& job : jobs) RETURN_IF_ERROR(WriteJobRows(job, /*insert=*/true));
    return absl::OkStatus();
  });
}

absl::Status SqliteJobStore::UpdateJobs(const std::vector<JobRecord>& jobs) {
  absl::MutexLock lock(&mu_);
  SqliteDb& db = *db_;  // the lambda runs under mu_, which the analysis cannot see
  return db.InTransaction([&]() -> absl::Status {
    for (const JobRecord& job : jobs) RETURN_IF_ERROR(WriteJobRows(job, /*insert=*/false));
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<JobRecord>> SqliteJobStore::QueryJobs(const std::string& where_sql,
                                                                 const std::string& text_param,
                                                                 int64_t int_param) {
  std::vector<JobRecord> jobs;
  SqliteDb& db = *db_;  // the lambda runs under mu_, which the analysis cannot see
  RETURN_IF_ERROR(db.InTransaction([&]() -> absl::Status {
    // One read transaction so that jobs and their ranks are a consistent snapshot.
    ASSIGN_OR_RETURN(SqliteStatement stmt,
                     db.Prepare(absl::StrCat("SELECT ", kJobColumns, " FROM jobs ", where_sql,
                                               " ORDER BY sequence")));
    if (where_sql.find("?1") != std::string::npos) RETURN_IF_ERROR(stmt.BindText(1, text_param));
    if (where_sql.find("?2") != std::string::npos) RETURN_IF_ERROR(stmt.BindInt64(2, int_param));
    std::map<std::string, size_t> index;
    while (true) {
      ASSIGN_OR_RETURN(bool row, stmt.Step());
      if (!row) break;
      JobRecord job;
      job.id = stmt.ColumnText(0);
      job.sequence = stmt.ColumnInt64(1);
      if (!job.spec.ParseFromString(stmt.ColumnBlob(2))) {
        return absl::DataLossError(
            absl::StrCat(db.path(), ": job ", job.id, ": spec is not a valid JobSpec"));
      }
      job.phase = static_cast<loom::v1::JobPhase>(stmt.ColumnInt64(3));
      job.failure_class = static_cast<loom::v1::FailureClass>(stmt.ColumnInt64(4));
      job.reason = stmt.ColumnText(5);
      job.message = stmt.ColumnText(6);
      job.create_time = ColumnTime(stmt, 7);
      job.start_time = ColumnTime(stmt, 8);
      job.end_time = ColumnTime(stmt, 9);
      job.attempt = static_cast<int32_t>(stmt.ColumnInt64(10));
      if (!job.progress.ParseFromString(stmt.ColumnBlob(11))) {
        return absl::DataLossError(
            absl::StrCat(db.path(), ": job ", job.id, ": progress is not a valid Progress"));
      }
      job.checkpoint_dir = stmt.ColumnText(12);
      job.rendezvous_port = static_cast<int32_t>(stmt.ColumnInt64(13));
      job.request_id = stmt.ColumnText(14);
      job.tenant = stmt.ColumnText(15);
      if (!job.state.ParseFromString(stmt.ColumnBlob(16))) {
        return absl::DataLossError(absl::StrCat(
            db.path(), ": job ", job.id, ": state is not a valid JobSchedulingState"));
      }
      index[job.id] = jobs.size();
      jobs.push_back(std::move(job));
    }
    if (jobs.empty()) return absl::OkStatus();
    // One job: only its ranks; a listing: all ranks (cheaper than a query per job).
    const bool one_job = where_sql.find("?1") != std::string::npos;
    ASSIGN_OR_RETURN(SqliteStatement ranks,
                     db.Prepare(one_job ? "SELECT job_id, rank, node_id FROM job_ranks "
                                          "WHERE job_id=?1 ORDER BY rank"
                                        : "SELECT job_id, rank, node_id FROM job_ranks "
                                          "ORDER BY job_id, rank"));
    if (one_job) RETURN_IF_ERROR(ranks.BindText(1, text_param));
    while (true) {
      ASSIGN_OR_RETURN(bool row, ranks.Step());
      if (!row) break;
      auto it = index.find(ranks.ColumnText(0));
      if (it == index.end()) continue;
      JobRecord& job = jobs[it->second];
      int64_t rank = ranks.ColumnInt64(1);
      if (rank != static_cast<int64_t>(job.rank_nodes.size())) {
        return absl::DataLossError(absl::StrCat(db.path(), ": job ", job.id,
                                                ": rank placement has a gap at rank ",
                                                job.rank_nodes.size()));
      }
      job.rank_nodes.push_back(ranks.ColumnText(2));
    }
    return absl::OkStatus();
  }));
  return jobs;
}

absl::StatusOr<JobRecord> SqliteJobStore::GetJob(const std::string& id) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(std::vector<JobRecord> jobs, QueryJobs("WHERE id=?1", id, 0));
  if (jobs.empty()) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  return std::move(jobs.front());
}

absl::StatusOr<std::vector<JobRecord>> SqliteJobStore::ListJobs(loom::v1::JobPhase phase) {
  absl::MutexLock lock(&mu_);
  if (phase == loom::v1::JOB_PHASE_UNSPECIFIED) return QueryJobs("", "", 0);
  return QueryJobs("WHERE phase=?2", "", phase);
}

absl::Status SqliteJobStore::UpsertNode(const NodeRecord& node) {
  absl::MutexLock lock(&mu_);
  SqliteDb& db = *db_;  // the lambda runs under mu_, which the analysis cannot see
  return db.InTransaction([&]() -> absl::Status {
    ASSIGN_OR_RETURN(
        SqliteStatement stmt,
        db.Prepare("INSERT INTO nodes (id, inventory, last_heartbeat_us, lost, admin) "
                     "VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT(id) DO UPDATE SET "
                     "inventory=excluded.inventory, last_heartbeat_us=excluded.last_heartbeat_us, "
                     "lost=excluded.lost, admin=excluded.admin"));
    RETURN_IF_ERROR(stmt.BindText(1, node.id));
    RETURN_IF_ERROR(stmt.BindBlob(2, node.inventory.SerializeAsString()));
    RETURN_IF_ERROR(BindTime(stmt, 3, node.last_heartbeat_time));
    RETURN_IF_ERROR(stmt.BindInt64(4, node.lost ? 1 : 0));
    RETURN_IF_ERROR(stmt.BindBlob(5, node.admin.SerializeAsString()));
    return stmt.Run();
  });
}

namespace {

absl::StatusOr<std::vector<NodeRecord>> ReadNodes(SqliteDb& db, SqliteStatement& stmt) {
  std::vector<NodeRecord> nodes;
  while (true) {
    ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    NodeRecord node;
    node.id = stmt.ColumnText(0);
    if (!node.inventory.ParseFromString(stmt.ColumnBlob(1))) {
      return absl::DataLossError(
          absl::StrCat(db.path(), ": node ", node.id, ": inventory is not a valid NodeInventory"));
    }
    node.last_heartbeat_time = ColumnTime(stmt, 2);
    node.lost = stmt.ColumnInt64(3) != 0;
    if (!node.admin.ParseFromString(stmt.ColumnBlob(4))) {
      return absl::DataLossError(
          absl::StrCat(db.path(), ": node ", node.id, ": admin is not a valid NodeAdminState"));
    }
    nodes.push_back(std::move(node));
  }
  return nodes;
}

}  // namespace

absl::StatusOr<NodeRecord> SqliteJobStore::GetNode(const std::string& id) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(SqliteStatement stmt,
                   db_->Prepare("SELECT id, inventory, last_heartbeat_us, lost, admin FROM nodes "
                                "WHERE id=?1"));
  RETURN_IF_ERROR(stmt.BindText(1, id));
  ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes, ReadNodes(*db_, stmt));
  if (nodes.empty()) return absl::NotFoundError(absl::StrCat("node ", id, " not found"));
  return std::move(nodes.front());
}

absl::StatusOr<std::vector<NodeRecord>> SqliteJobStore::ListNodes() {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(SqliteStatement stmt,
                   db_->Prepare("SELECT id, inventory, last_heartbeat_us, lost, admin FROM nodes "
                                "ORDER BY id"));
  return ReadNodes(*db_, stmt);
}

absl::Status SqliteJobStore::WriteMetrics(const std::vector<MetricRow>& rows) {
  if (rows.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  SqliteDb& db = *db_;  // the lambda runs under mu_, which the analysis cannot see
  return db.InTransaction([&]() -> absl::Status {
    for (const MetricRow& row : rows) {
      ASSIGN_OR_RETURN(
          SqliteStatement * stmt,
          db.PrepareCached("INSERT INTO job_metrics (job_id, key, data) VALUES (?1, ?2, ?3) "
                           "ON CONFLICT(job_id, key) DO UPDATE SET data=excluded.data"));
      RETURN_IF_ERROR(stmt->BindText(1, row.job_id));
      RETURN_IF_ERROR(stmt->BindInt64(2, row.key));
      RETURN_IF_ERROR(stmt->BindBlob(3, row.data));
      RETURN_IF_ERROR(stmt->Run());
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<MetricRow>> SqliteJobStore::ListMetrics(const std::string& job_id,
                                                                   int64_t after_key, int limit) {
  if (limit < 1) return absl::InvalidArgumentError(absl::StrCat("limit: ", limit, " < 1"));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(SqliteStatement stmt,
                   db_->Prepare("SELECT key, data FROM job_metrics WHERE job_id=?1 AND key>?2 "
                                "ORDER BY key LIMIT ?3"));
  RETURN_IF_ERROR(stmt.BindText(1, job_id));
  RETURN_IF_ERROR(stmt.BindInt64(2, after_key));
  RETURN_IF_ERROR(stmt.BindInt64(3, limit));
  std::vector<MetricRow> rows;
  while (true) {
    ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    rows.push_back(MetricRow{job_id, stmt.ColumnInt64(0), stmt.ColumnBlob(1)});
  }
  return rows;
}

}  // namespace loom
