#include "storage/sqlite_db.h"

#include <sqlite3.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace loom {

void SqliteStatement::Finalizer::operator()(sqlite3_stmt* stmt) const { sqlite3_finalize(stmt); }
void SqliteDb::Closer::operator()(sqlite3* db) const { sqlite3_close_v2(db); }

absl::Status SqliteDb::Error(int rc, absl::string_view what) const {
  std::string msg = absl::StrCat(path_, ": ", what, ": ",
                                 db_ ? sqlite3_errmsg(db_.get()) : sqlite3_errstr(rc));
  switch (rc & 0xff) {
    case SQLITE_CONSTRAINT: {
      int ext = rc;
      if (ext == SQLITE_CONSTRAINT_UNIQUE || ext == SQLITE_CONSTRAINT_PRIMARYKEY) {
        return absl::AlreadyExistsError(msg);
      }
      return absl::FailedPreconditionError(msg);
    }
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(msg);
    case SQLITE_CANTOPEN:
    case SQLITE_IOERR:
    case SQLITE_FULL:
      return absl::UnavailableError(msg);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::StatusOr<std::unique_ptr<SqliteDb>> SqliteDb::Open(const std::string& path,
                                                         const Options& options) {
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &raw,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  std::unique_ptr<SqliteDb> db(new SqliteDb(path, raw));  // owns `raw` even on failure
  if (rc != SQLITE_OK) {
    return absl::UnavailableError(absl::StrCat(path, ": cannot open SQLite database: ",
                                               raw ? sqlite3_errmsg(raw) : sqlite3_errstr(rc)));
  }
  sqlite3_extended_result_codes(raw, 1);
  rc = sqlite3_busy_timeout(raw, static_cast<int>(absl::ToInt64Milliseconds(options.busy_timeout)));
  if (rc != SQLITE_OK) return db->Error(rc, "busy_timeout");
  // journal_mode returns a row ("wal"); a database on a file system without shared memory
  // support answers with the old mode, which we refuse rather than silently lose concurrency.
  ASSIGN_OR_RETURN(SqliteStatement wal, db->Prepare("PRAGMA journal_mode=WAL"));
  ASSIGN_OR_RETURN(bool has_row, wal.Step());
  if (!has_row || wal.ColumnText(0) != "wal") {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": cannot switch SQLite to WAL journal mode"));
  }
  RETURN_IF_ERROR(db->Exec("PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;"));
  return db;
}

absl::Status SqliteDb::Exec(absl::string_view sql) {
  std::string text(sql);
  char* err = nullptr;
  int rc = sqlite3_exec(db_.get(), text.c_str(), nullptr, nullptr, &err);
  if (err != nullptr) sqlite3_free(err);
  if (rc != SQLITE_OK) return Error(rc, absl::StrCat("exec '", sql, "'"));
  return absl::OkStatus();
}

absl::StatusOr<SqliteStatement> SqliteDb::Prepare(absl::string_view sql) {
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v2(db_.get(), sql.data(), static_cast<int>(sql.size()), &stmt, nullptr);
  if (rc != SQLITE_OK) {
    sqlite3_finalize(stmt);
    return Error(rc, absl::StrCat("prepare '", sql, "'"));
  }
  return SqliteStatement(this, stmt, std::string(sql));
}

absl::StatusOr<SqliteStatement*> SqliteDb::PrepareCached(absl::string_view sql) {
  auto it = cached_.find(sql);
  if (it == cached_.end()) {
    ASSIGN_OR_RETURN(SqliteStatement stmt, Prepare(sql));
    it = cached_.emplace(std::string(sql), std::move(stmt)).first;
  } else {
    // reset's result repeats the last step's error, already reported to whoever stepped it.
    (void)sqlite3_reset(it->second.stmt_.get());
    sqlite3_clear_bindings(it->second.stmt_.get());
  }
  return &it->second;
}

int64_t SqliteDb::Changes() const { return sqlite3_changes64(db_.get()); }

absl::StatusOr<int64_t> SqliteDb::UserVersion() {
  ASSIGN_OR_RETURN(SqliteStatement stmt, Prepare("PRAGMA user_version"));
  ASSIGN_OR_RETURN(bool has_row, stmt.Step());
  if (!has_row) return absl::InternalError(absl::StrCat(path_, ": PRAGMA user_version: no row"));
  return stmt.ColumnInt64(0);
}

absl::Status SqliteDb::SetUserVersion(int64_t version) {
  // PRAGMA takes no bound parameters; `version` is an integer, so formatting it is safe.
  return Exec(absl::StrCat("PRAGMA user_version=", version));
}

absl::Status SqliteDb::InTransaction(const std::function<absl::Status()>& body) {
  RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  absl::Status s = body();
  if (s.ok()) s = Exec("COMMIT");
  if (!s.ok()) {
    // ROLLBACK fails harmlessly if SQLite already rolled back (e.g. after SQLITE_FULL).
    (void)Exec("ROLLBACK");
  }
  return s;
}

absl::Status SqliteStatement::BindResult(int rc, int index) {
  if (rc == SQLITE_OK) return absl::OkStatus();
  return db_->Error(rc, absl::StrCat("bind parameter ", index, " of '", sql_, "'"));
}

absl::Status SqliteStatement::BindInt64(int index, int64_t value) {
  return BindResult(sqlite3_bind_int64(stmt_.get(), index, value), index);
}

absl::Status SqliteStatement::BindText(int index, absl::string_view value) {
  return BindResult(sqlite3_bind_text64(stmt_.get(), index, value.data(), value.size(),
                                        SQLITE_TRANSIENT, SQLITE_UTF8),
                    index);
}

absl::Status SqliteStatement::BindBlob(int index, absl::string_view bytes) {
  // A zero-length blob from a null pointer would bind NULL; use a non-null empty buffer.
  static const char kEmpty = 0;
  return BindResult(sqlite3_bind_blob64(stmt_.get(), index,
                                        bytes.empty() ? &kEmpty : bytes.data(), bytes.size(),
                                        SQLITE_TRANSIENT),
                    index);
}

absl::Status SqliteStatement::BindNull(int index) {
  return BindResult(sqlite3_bind_null(stmt_.get(), index), index);
}

absl::StatusOr<bool> SqliteStatement::Step() {
  int rc = sqlite3_step(stmt_.get());
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return db_->Error(rc, absl::StrCat("step '", sql_, "'"));
}

absl::Status SqliteStatement::Run() {
  while (true) {
    ASSIGN_OR_RETURN(bool row, Step());
    if (!row) return absl::OkStatus();
  }
}

bool SqliteStatement::ColumnIsNull(int col) const {
  return sqlite3_column_type(stmt_.get(), col) == SQLITE_NULL;
}

int64_t SqliteStatement::ColumnInt64(int col) const {
  return sqlite3_column_int64(stmt_.get(), col);
}

std::string SqliteStatement::ColumnText(int col) const {
  const unsigned char* text = sqlite3_column_text(stmt_.get(), col);
  int n = sqlite3_column_bytes(stmt_.get(), col);
  return text ? std::string(reinterpret_cast<const char*>(text), n) : std::string();
}

std::string SqliteStatement::ColumnBlob(int col) const {
  const void* data = sqlite3_column_blob(stmt_.get(), col);
  int n = sqlite3_column_bytes(stmt_.get(), col);
  return data ? std::string(static_cast<const char*>(data), n) : std::string();
}

}  // namespace loom
