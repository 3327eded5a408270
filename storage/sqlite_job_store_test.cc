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

}  // namespace
}  // namespace loom
