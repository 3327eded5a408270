#include "storage/sqlite_job_store.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "storage/job_store_conformance.h"
#include "storage/sqlite_db.h"

namespace loom {
namespace {

std::unique_ptr<JobStore> MakeSqliteStore(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<SqliteJobStore>> store =
      SqliteJobStore::Open(absl::StrCat(dir, "/loom.db"));
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return nullptr;
  return std::move(*store);
}

INSTANTIATE_TEST_SUITE_P(Sqlite, JobStoreConformanceTest,
                         ::testing::Values(JobStoreFactory{"sqlite", &MakeSqliteStore}));

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/sqlite_", name);
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

TEST(SqliteJobStoreTest, ReopeningTheFileKeepsJobsAndNodes) {
  const std::string path = TestDir("reopen") + "/loom.db";
  JobRecord job = SampleJob("job-0000abcd", 7);
  job.rank_nodes = {"node-a", "node-a"};
  {
    absl::StatusOr<std::unique_ptr<SqliteJobStore>> store = SqliteJobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->UpsertNode(SampleNode("node-a", 2)).ok());
    ASSERT_TRUE((*store)->CreateJob(job).ok());
  }
  absl::StatusOr<std::unique_ptr<SqliteJobStore>> reopened = SqliteJobStore::Open(path);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  absl::StatusOr<JobRecord> got = (*reopened)->GetJob("job-0000abcd");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->sequence, 7);
  EXPECT_EQ(got->spec.resources().num_ranks(), 2);
  EXPECT_EQ(got->phase, loom::v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(got->message, job.message);
  EXPECT_EQ(got->create_time, job.create_time);
  EXPECT_EQ(got->rank_nodes, job.rank_nodes);
  EXPECT_EQ(got->rendezvous_port, 29500);
  absl::StatusOr<std::vector<NodeRecord>> nodes = (*reopened)->ListNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ((*nodes)[0].inventory.slots(), 2);
}

// The jobs table's indexes by name, from sqlite_master (a second connection).
std::vector<std::string> JobIndexes(const std::string& path) {
  std::vector<std::string> names;
  absl::StatusOr<std::unique_ptr<SqliteDb>> db = SqliteDb::Open(path);
  EXPECT_TRUE(db.ok()) << db.status();
  if (!db.ok()) return names;
  absl::StatusOr<SqliteStatement> stmt = (*db)->Prepare(
      "SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='jobs' ORDER BY name");
  EXPECT_TRUE(stmt.ok()) << stmt.status();
  if (!stmt.ok()) return names;
  while (true) {
    absl::StatusOr<bool> row = stmt->Step();
    if (!row.ok() || !*row) break;
    names.push_back(stmt->ColumnText(0));
  }
  return names;
}

// id's primary key, sequence's UNIQUE, and the request-id index (idempotent submission).
const std::vector<std::string> kJobIndexes = {"jobs_by_request_id", "sqlite_autoindex_jobs_1",
                                              "sqlite_autoindex_jobs_2"};

TEST(SqliteJobStoreTest, ConnectionUsesWalForeignKeysAndSchemaVersion) {
  const std::string path = TestDir("pragmas") + "/loom.db";
  {
    absl::StatusOr<std::unique_ptr<SqliteJobStore>> store = SqliteJobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
  }
  absl::StatusOr<std::unique_ptr<SqliteDb>> db = SqliteDb::Open(path);
  ASSERT_TRUE(db.ok()) << db.status();
  absl::StatusOr<int64_t> version = (*db)->UserVersion();
  ASSERT_TRUE(version.ok());
  EXPECT_EQ(*version, SqliteJobStore::kSchemaVersion);
  for (const auto& [pragma, want] : std::vector<std::pair<std::string, std::string>>{
           {"PRAGMA journal_mode", "wal"}, {"PRAGMA foreign_keys", "1"}}) {
    absl::StatusOr<SqliteStatement> stmt = (*db)->Prepare(pragma);
    ASSERT_TRUE(stmt.ok());
    absl::StatusOr<bool> row = stmt->Step();
    ASSERT_TRUE(row.ok() && *row);
    EXPECT_EQ(stmt->ColumnText(0), want) << pragma;
  }
}

TEST(SqliteJobStoreTest, RefusesANewerSchema) {
  const std::string path = TestDir("newer") + "/loom.db";
  {
    absl::StatusOr<std::unique_ptr<SqliteDb>> db = SqliteDb::Open(path);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE((*db)->SetUserVersion(SqliteJobStore::kSchemaVersion + 1).ok());
  }
  absl::StatusOr<std::unique_ptr<SqliteJobStore>> store = SqliteJobStore::Open(path);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(store.status().message().find("newer"), std::string::npos) << store.status();
}

// A database written by the first release (schema version 1, no request ids) opens, is migrated
// to the current version, and keeps its jobs.
TEST(SqliteJobStoreTest, MigratesAVersion1Database) {
  const std::string path = TestDir("v1") + "/loom.db";
  {
    absl::StatusOr<std::unique_ptr<SqliteDb>> db = SqliteDb::Open(path);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE((*db)->Exec(R"sql(
CREATE TABLE jobs (
  id TEXT PRIMARY KEY NOT NULL, sequence INTEGER NOT NULL UNIQUE, spec BLOB NOT NULL,
  phase INTEGER NOT NULL, failure_class INTEGER NOT NULL DEFAULT 0,
  reason TEXT NOT NULL DEFAULT '', message TEXT NOT NULL DEFAULT '', create_time_us INTEGER,
  start_time_us INTEGER, end_time_us INTEGER, attempt INTEGER NOT NULL DEFAULT 0,
  progress BLOB NOT NULL, checkpoint_dir TEXT NOT NULL DEFAULT '',
  rendezvous_port INTEGER NOT NULL DEFAULT 0);
CREATE INDEX jobs_by_phase ON jobs(phase, sequence);
CREATE TABLE nodes (id TEXT PRIMARY KEY NOT NULL, inventory BLOB NOT NULL,
  last_heartbeat_us INTEGER, lost INTEGER NOT NULL DEFAULT 0);
CREATE TABLE job_ranks (job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
  rank INTEGER NOT NULL, node_id TEXT NOT NULL REFERENCES nodes(id), PRIMARY KEY (job_id, rank));
INSERT INTO jobs (id, sequence, spec, phase, progress) VALUES ('job-old', 1, x'', 1, x'');
INSERT INTO nodes (id, inventory, last_heartbeat_us) VALUES ('node-old', x'', 5);
)sql")
                    .ok());
    ASSERT_TRUE((*db)->SetUserVersion(1).ok());
  }
  absl::StatusOr<std::unique_ptr<SqliteJobStore>> store = SqliteJobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<JobRecord> job = (*store)->GetJob("job-old");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->phase, loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(job->request_id, "");
  // Version 3's columns have their defaults on migrated rows.
  EXPECT_EQ(job->tenant, "default");
  EXPECT_EQ(job->state.ByteSizeLong(), 0u);
  absl::StatusOr<NodeRecord> node = (*store)->GetNode("node-old");
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_FALSE(node->admin.cordoned());
  EXPECT_FALSE(node->admin.draining());
  JobRecord next = SampleJob("job-new", 2);
  next.request_id = "client-1";
  EXPECT_TRUE((*store)->CreateJob(next).ok());
  store->reset();
  EXPECT_EQ(JobIndexes(path), kJobIndexes);
}

// Version 4 dropped jobs_by_phase and jobs_by_tenant (no query of the daemon reads them; every
// write paid for them). A new file has the same indexes as a migrated one, and listing by phase
// still works without its index.
TEST(SqliteJobStoreTest, JobsHaveOnlyTheIndexesTheirQueriesUse) {
  const std::string path = TestDir("indexes") + "/loom.db";
  absl::StatusOr<std::unique_ptr<SqliteJobStore>> store = SqliteJobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  JobRecord pending = SampleJob("job-a", 1);
  pending.phase = loom::v1::JOB_PHASE_PENDING;
  JobRecord running = SampleJob("job-b", 2);
  running.phase = loom::v1::JOB_PHASE_RUNNING;
  ASSERT_TRUE((*store)->CreateJobs({pending, running}).ok());
  absl::StatusOr<std::vector<JobRecord>> listed = (*store)->ListJobs(loom::v1::JOB_PHASE_RUNNING);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ(listed->front().id, "job-b");
  store->reset();
  EXPECT_EQ(JobIndexes(path), kJobIndexes);
}

TEST(SqliteJobStoreTest, UnopenablePathIsUnavailable) {
  absl::StatusOr<std::unique_ptr<SqliteJobStore>> store =
      SqliteJobStore::Open(TestDir("unopenable") + "/no/such/dir/loom.db");
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable) << store.status();
  EXPECT_NE(store.status().message().find("no/such/dir"), std::string::npos);
}

TEST(SqliteDbTest, FailedTransactionRollsBack) {
  absl::StatusOr<std::unique_ptr<SqliteDb>> db = SqliteDb::Open(TestDir("rollback") + "/t.db");
  ASSERT_TRUE(db.ok());
  ASSERT_TRUE((*db)->Exec("CREATE TABLE t (x INTEGER)").ok());
  absl::Status s = (*db)->InTransaction([&]() -> absl::Status {
    absl::StatusOr<SqliteStatement> ins = (*db)->Prepare("INSERT INTO t VALUES (?1)");
    if (!ins.ok()) return ins.status();
    if (absl::Status b = ins->BindInt64(1, 42); !b.ok()) return b;
    if (absl::Status r = ins->Run(); !r.ok()) return r;
    return absl::AbortedError("injected");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  absl::StatusOr<SqliteStatement> count = (*db)->Prepare("SELECT COUNT(*) FROM t");
  ASSERT_TRUE(count.ok());
  ASSERT_TRUE(*count->Step());
  EXPECT_EQ(count->ColumnInt64(0), 0);
}

TEST(SqliteDbTest, CachedStatementIsResetWithBindingsClearedAndCountsChanges) {
  absl::StatusOr<std::unique_ptr<SqliteDb>> db = SqliteDb::Open(TestDir("cached") + "/t.db");
  ASSERT_TRUE(db.ok());
  ASSERT_TRUE((*db)->Exec("CREATE TABLE t (x INTEGER, y INTEGER)").ok());
  constexpr char kInsert[] = "INSERT INTO t VALUES (?1, ?2)";
  absl::StatusOr<SqliteStatement*> first = (*db)->PrepareCached(kInsert);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*first)->BindInt64(1, 1).ok());
  ASSERT_TRUE((*first)->BindInt64(2, 10).ok());
  ASSERT_TRUE((*first)->Run().ok());
  EXPECT_EQ((*db)->Changes(), 1);
  // The same statement, reset: ?2 left unbound is NULL again, not the 10 bound before.
  absl::StatusOr<SqliteStatement*> second = (*db)->PrepareCached(kInsert);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second, *first);
  ASSERT_TRUE((*second)->BindInt64(1, 2).ok());
  ASSERT_TRUE((*second)->Run().ok());
  absl::StatusOr<SqliteStatement> nulls = (*db)->Prepare("SELECT x FROM t WHERE y IS NULL");
  ASSERT_TRUE(nulls.ok());
  ASSERT_TRUE(*nulls->Step());
  EXPECT_EQ(nulls->ColumnInt64(0), 2);
  EXPECT_FALSE(*nulls->Step());
  ASSERT_TRUE((*db)->Exec("UPDATE t SET y = 5").ok());
  EXPECT_EQ((*db)->Changes(), 2);
  absl::StatusOr<SqliteStatement> rows =
      (*db)->Prepare("SELECT COUNT(*), SUM(x) FROM t WHERE y = 5");
  ASSERT_TRUE(rows.ok());
  ASSERT_TRUE(*rows->Step());
  EXPECT_EQ(rows->ColumnInt64(0), 2);
  EXPECT_EQ(rows->ColumnInt64(1), 3);
  // A bad statement is an error naming it, and is not cached.
  absl::StatusOr<SqliteStatement*> bad = (*db)->PrepareCached("INSERT INTO missing VALUES (1)");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(bad.status().message().find("missing"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace loom
