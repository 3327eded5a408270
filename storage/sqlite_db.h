// File: storage/sqlite_db.h
//
// A small RAII wrapper over the sqlite3 C API: the connection and prepared statements live in
// unique_ptrs with custom deleters, every value is a bound parameter, and every failure comes
// back as an absl::Status naming the database file and the statement. Open() configures each
// connection the way Loom's stores rely on: journal_mode=WAL, synchronous=FULL, busy_timeout,
// foreign_keys=ON. Writes go through Transaction, which starts with BEGIN IMMEDIATE so that the
// write lock is taken up front (no SQLITE_BUSY upgrade deadlock between two writers; see Mozilla
// application-services' sql_concurrency.md).
#ifndef LOOM_STORAGE_SQLITE_DB_H_
#define LOOM_STORAGE_SQLITE_DB_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

struct sqlite3;
struct sqlite3_stmt;

namespace loom {

class SqliteDb;

// A prepared statement. Bind indexes are 1-based (SQLite's convention); column indexes 0-based.
// Not thread-safe; use from the thread that holds the owning SqliteDb's lock.
class SqliteStatement {
 public:
  SqliteStatement(SqliteStatement&&) = default;
  SqliteStatement& operator=(SqliteStatement&&) = default;

  absl::Status BindInt64(int index, int64_t value);
  absl::Status BindText(int index, absl::string_view value);
  absl::Status BindBlob(int index, absl::string_view bytes);
  absl::Status BindNull(int index);

  // Advances: true if a row is available, false when done. Constraint violations map to
  // ALREADY_EXISTS (UNIQUE / PRIMARY KEY) and FAILED_PRECONDITION (FOREIGN KEY, CHECK, NOT
  // NULL); a busy database past busy_timeout to UNAVAILABLE; anything else to INTERNAL.
  absl::StatusOr<bool> Step();
  // Steps until done (for statements that return no rows).
  absl::Status Run();

  bool ColumnIsNull(int col) const;
  int64_t ColumnInt64(int col) const;
  std::string ColumnText(int col) const;
  std::string ColumnBlob(int col) const;

 private:
  friend class SqliteDb;
  struct Finalizer {
    void operator()(sqlite3_stmt* stmt) const;
  };
  SqliteStatement(SqliteDb* db, sqlite3_stmt* stmt, std::string sql)
      : db_(db), stmt_(stmt), sql_(std::move(sql)) {}
  absl::Status BindResult(int rc, int index);

  SqliteDb* db_;
  std::unique_ptr<sqlite3_stmt, Finalizer> stmt_;
  std::string sql_;
};

// One SQLite connection. Not thread-safe: callers serialize access (SqliteJobStore holds a
// mutex around every use).
class SqliteDb {
 public:
  struct Options {
    // How long a statement waits for another connection's lock before UNAVAILABLE.
    absl::Duration busy_timeout = absl::Seconds(5);
  };

  // Opens (creating if needed) the database file at `path` and configures the connection.
  // UNAVAILABLE if the file cannot be opened; INTERNAL if a pragma fails.
  static absl::StatusOr<std::unique_ptr<SqliteDb>> Open(const std::string& path,
                                                        const Options& options);
  static absl::StatusOr<std::unique_ptr<SqliteDb>> Open(const std::string& path) {
    return Open(path, Options());
  }

  // Runs one or more statements without parameters (schema, pragmas).
  absl::Status Exec(absl::string_view sql);

  absl::StatusOr<SqliteStatement> Prepare(absl::string_view sql);

  // The connection's own prepared statement for `sql`, compiled on first use and kept (SQLite's
  // prepare parses and plans the text: tens of microseconds for a job row's UPDATE, more than
  // running it). Returned reset, with its bindings cleared; valid until the next
  // PrepareCached of the same text or the connection closes, so finish stepping it before
  // asking for it again. For statements run to completion (writes): a SELECT stepped only
  // part-way would keep its read transaction open until the next use. Errors as Prepare.
  absl::StatusOr<SqliteStatement*> PrepareCached(absl::string_view sql);

  // Rows changed by the last INSERT, UPDATE or DELETE on this connection (sqlite3_changes64).
  int64_t Changes() const;

  // PRAGMA user_version: the schema version this database is at (0 for a new file).
  absl::StatusOr<int64_t> UserVersion();
  absl::Status SetUserVersion(int64_t version);

  // Runs `body` inside BEGIN IMMEDIATE ... COMMIT; rolls back if `body` fails (its status is
  // returned) or if COMMIT fails.
  absl::Status InTransaction(const std::function<absl::Status()>& body);

  const std::string& path() const { return path_; }

  // A status for SQLite result code `rc` on this connection, naming the file and `what`.
  absl::Status Error(int rc, absl::string_view what) const;

 private:
  struct Closer {
    void operator()(sqlite3* db) const;
  };
  SqliteDb(std::string path, sqlite3* db) : path_(std::move(path)), db_(db) {}

  std::string path_;
  std::unique_ptr<sqlite3, Closer> db_;
  // After db_: the statements are finalized before the connection closes.
  std::map<std::string, SqliteStatement, std::less<>> cached_;
};

}  // namespace loom

#endif  // LOOM_STORAGE_SQLITE_DB_H_
