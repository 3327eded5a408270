#include "common/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace loom {
namespace {

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

absl::Status ErrnoToStatus(int err, absl::string_view message) {
  std::string msg = absl::StrCat(message, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  if (err == ENOSPC || err == EDQUOT || err == ENOMEM) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  const int err = errno;
  return ErrnoToStatus(err, absl::StrCat(what, " ", path));
}

namespace {

// Reads `fd` to its end and closes it. FAILED_PRECONDITION once more than `max_bytes` (if >= 0)
// arrive: a file can grow while it is read.
absl::StatusOr<std::string> ReadAndClose(int fd, const std::string& path, int64_t max_bytes) {
  std::string out;
  char buf[1 << 16];
  absl::Status status;
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      status = ErrnoError("cannot read", path);
      break;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (max_bytes >= 0 && static_cast<int64_t>(out.size()) > max_bytes) {
      status = absl::FailedPreconditionError(
          absl::StrCat(path, " is more than the limit of ", max_bytes, " bytes"));
      break;
    }
  }
  ::close(fd);
  if (!status.ok()) return status;
  return out;
}

}  // namespace

absl::StatusOr<size_t> PreadUpTo(int fd, void* dst, size_t size, int64_t offset,
                                 const std::string& path) {
  char* p = static_cast<char*>(dst);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, p + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("cannot read", path);
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

absl::Status PreadExactly(int fd, void* dst, size_t size, int64_t offset,
                          const std::string& path) {
  ASSIGN_OR_RETURN(size_t got, PreadUpTo(fd, dst, size, offset, path));
  if (got < size) {
    return absl::DataLossError(absl::StrCat(path, ": ends at byte ", offset + got,
                                            ", expected at least ", offset + size));
  }
  return absl::OkStatus();
}

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path);
  return ReadAndClose(fd, path, /*max_bytes=*/-1);
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoError("cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status s = ErrnoError("cannot stat", path);
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, S_ISDIR(st.st_mode) ? " is a directory, not a regular file"
                                               : " is not a regular file (a FIFO, socket or device)"));
  }
  if (st.st_size > max_bytes) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, " is ", st.st_size,
                                                      " bytes, more than the limit of ",
                                                      max_bytes));
  }
  return ReadAndClose(fd, path, max_bytes);
}

absl::Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open directory", dir);
  int rc = ::fsync(fd);
  absl::Status s = rc == 0 ? absl::OkStatus() : ErrnoError("cannot fsync directory", dir);
  ::close(fd);
  return s;
}

absl::Status MakeDirs(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("MakeDirs: empty path");
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoError("cannot create directory", partial);
    }
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " exists and is not a directory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Open(const std::string& path,
                                                        Options options) {
  std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot create", tmp);
  return AtomicFileWriter(path, tmp, fd, options);
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      tmp_path_(std::move(other.tmp_path_)),
      fd_(other.fd_),
      options_(other.options_),
      bytes_written_(other.bytes_written_),
      unsynced_bytes_(other.unsynced_bytes_) {
  other.fd_ = -1;
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

absl::Status AtomicFileWriter::Append(const void* data, size_t size_bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError("AtomicFileWriter already committed");
  const char* p = static_cast<const char*>(data);
  while (size_bytes > 0) {
    ssize_t n = ::write(fd_, p, size_bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("cannot write", tmp_path_);
    }
    p += n;
    size_bytes -= static_cast<size_t>(n);
    bytes_written_ += n;
    unsynced_bytes_ += n;
  }
  if (options_.writeback_bytes > 0 && unsynced_bytes_ >= options_.writeback_bytes) {
    unsynced_bytes_ = 0;
    (void)::sync_file_range(fd_, 0, 0, SYNC_FILE_RANGE_WRITE);  // a hint: errors surface in fsync
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (fd_ < 0) return absl::FailedPreconditionError("AtomicFileWriter already committed");
  if (::fsync(fd_) != 0) return ErrnoError("cannot fsync", tmp_path_);
  if (::close(fd_) != 0) {
    fd_ = -1;
    return ErrnoError("cannot close", tmp_path_);
  }
  fd_ = -1;
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    absl::Status s = ErrnoError("cannot rename onto", path_);
    ::unlink(tmp_path_.c_str());
    return s;
  }
  return SyncDir(DirName(path_));
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  auto writer = AtomicFileWriter::Open(path);
  if (!writer.ok()) return writer.status();
  absl::Status s = writer->Append(contents.data(), contents.size());
  if (!s.ok()) return s;
  return writer->Commit();
}

absl::StatusOr<std::vector<std::string>> ListRegularFiles(
    const std::string& dir, const std::function<bool(absl::string_view name)>& keep) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoError("cannot open", dir);
  std::vector<std::string> files;
  while (dirent* e = ::readdir(d)) {
    const absl::string_view name = e->d_name;
    if (name == "." || name == ".." || !keep(name)) continue;
    std::string path = absl::StrCat(dir, "/", name);
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) files.push_back(std::move(path));
  }
  ::closedir(d);
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace loom
