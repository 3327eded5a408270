// Durable file helpers: whole-file reads and crash-safe writes.
#ifndef LOOM_COMMON_FILE_UTIL_H_
#define LOOM_COMMON_FILE_UTIL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom {

// The status for the current errno after a failed system call on `path`, message
// "<what> <path>: <strerror>": NOT_FOUND (ENOENT), PERMISSION_DENIED (EACCES, EPERM),
// RESOURCE_EXHAUSTED (ENOSPC), INTERNAL otherwise. Call it right after the failing call.
absl::Status ErrnoError(absl::string_view what, const std::string& path);
// The same mapping for an explicit error number (e.g. -res of an io_uring completion):
// "<message>: <strerror>"; ENOSPC, EDQUOT and ENOMEM are RESOURCE_EXHAUSTED.
absl::Status ErrnoToStatus(int err, absl::string_view message);

// Reads up to `size` bytes at byte `offset` of the open file `fd` (pread, retried on EINTR and
// short reads); returns how many were read, fewer only at end of file. I/O errors are
// ErrnoError("cannot read", path).
absl::StatusOr<size_t> PreadUpTo(int fd, void* dst, size_t size, int64_t offset,
                                 const std::string& path);
// Exactly `size` bytes at `offset`: as PreadUpTo, and DATA_LOSS "<path>: ends at byte X,
// expected at least Y" when the file is shorter.
absl::Status PreadExactly(int fd, void* dst, size_t size, int64_t offset,
                          const std::string& path);

// Owns a file descriptor and closes it when destroyed. Movable, not copyable.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  ScopedFd& operator=(ScopedFd&& o) = delete;
  ScopedFd(const ScopedFd&) = delete;
  ~ScopedFd();
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

// Reads the whole file. NOT_FOUND if it does not exist, INTERNAL on other I/O errors.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Reads a whole regular file of at most `max_bytes` bytes, for inputs that someone else controls
// (job specs, checkpoint manifests). Never blocks on a FIFO and never reads an endless device:
// the file is opened O_NONBLOCK and must be a regular file. NOT_FOUND if it does not exist;
// FAILED_PRECONDITION naming the path if it is a directory or another non-regular file, or is
// larger than `max_bytes`; INTERNAL on other I/O errors.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes);

// Writes `contents` to `path` crash-safely: writes `path.tmp.<pid>`, fsyncs it, renames it over
// `path`, then fsyncs the directory. After a crash either the old file or the complete new one is
// at `path`, never a partial one. Thread-compatible (distinct paths may be written concurrently).
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// A file written in pieces and published atomically on Commit() (same protocol as above).
// Abandoned (not committed) writers remove their temporary file. Not thread-safe.
class AtomicFileWriter {
 public:
  struct Options {
    // Every this many appended bytes, start asynchronous writeback of what was written
    // (sync_file_range SYNC_FILE_RANGE_WRITE), so the disk works while the writer goes on and
    // Commit()'s fsync finds little left. 0 = leave it all to Commit().
    int64_t writeback_bytes = 0;
  };
  static absl::StatusOr<AtomicFileWriter> Open(const std::string& path, Options options);
  static absl::StatusOr<AtomicFileWriter> Open(const std::string& path) {
    return Open(path, Options());
  }
  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) = delete;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  absl::Status Append(const void* data, size_t size_bytes);
  // fsync, rename, fsync directory. The writer is unusable afterwards.
  absl::Status Commit();
  int64_t bytes_written() const { return bytes_written_; }

 private:
  AtomicFileWriter(std::string path, std::string tmp_path, int fd, Options options)
      : path_(std::move(path)), tmp_path_(std::move(tmp_path)), fd_(fd), options_(options) {}
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  Options options_;
  int64_t bytes_written_ = 0;
  int64_t unsynced_bytes_ = 0;
};

// Creates `path` and its parents (mkdir -p). OK if it exists.
absl::Status MakeDirs(const std::string& path);

// The regular files directly inside `dir` (symbolic links, directories and other kinds are
// skipped; "." and ".." too) whose name `keep` accepts, as "<dir>/<name>", sorted by name, so
// every rank and every restart sees the same order. ErrnoError("cannot open", dir) when the
// directory cannot be opened (NOT_FOUND if it does not exist).
absl::StatusOr<std::vector<std::string>> ListRegularFiles(
    const std::string& dir, const std::function<bool(absl::string_view name)>& keep);

// fsyncs a directory so that renames inside it are durable.
absl::Status SyncDir(const std::string& dir);

}  // namespace loom

#endif  // LOOM_COMMON_FILE_UTIL_H_
