#include "storage/checkpoint/deepspeed_archive.h"

#include <fcntl.h>
#include <minizip/unzip.h>
#include <sys/stat.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace loom::storage::deepspeed {

TorchArchive::~TorchArchive() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::unique_ptr<TorchArchive>> TorchArchive::Open(const std::string& path) {
  std::unique_ptr<TorchArchive> a(new TorchArchive());
  a->path_ = path;
  a->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (a->fd_ < 0) return ErrnoError("cannot open", path);
  struct stat st;
  if (::fstat(a->fd_, &st) != 0) return ErrnoError("cannot stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  a->file_bytes_ = st.st_size;

  unzFile zip = unzOpen64(path.c_str());
  if (zip == nullptr) {
    return absl::DataLossError(absl::StrCat(
        path, ": not a complete zip archive (no end of central directory record; truncated?)"));
  }
  struct Closer {
    unzFile z;
    ~Closer() { unzClose(z); }
  } closer{zip};
  std::vector<char> name(65536);
  for (int rc = unzGoToFirstFile(zip); rc == UNZ_OK; rc = unzGoToNextFile(zip)) {
    unz_file_info64 info;
    if (unzGetCurrentFileInfo64(zip, &info, name.data(), name.size(), nullptr, 0, nullptr, 0) !=
        UNZ_OK) {
      return absl::DataLossError(absl::StrCat(path, ": unreadable zip central directory entry"));
    }
    const std::string full(name.data());
    if (info.compression_method != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": record ", full, " is compressed (method ", info.compression_method,
          "); torch.save stores every record uncompressed"));
    }
    if (unzOpenCurrentFile(zip) != UNZ_OK) {
      return absl::DataLossError(absl::StrCat(path, ": record ", full,
                                              ": unreadable local header (truncated?)"));
    }
    const int64_t offset = static_cast<int64_t>(unzGetCurrentFileZStreamPos64(zip));
    unzCloseCurrentFile(zip);
    const int64_t size = static_cast<int64_t>(info.uncompressed_size);
    if (offset < 0 || size < 0 || offset + size > a->file_bytes_) {
      return absl::DataLossError(absl::StrCat(path, ": record ", full, " (", size,
                                              " bytes at byte ", offset, ") extends past the end of "
                                              "the file (", a->file_bytes_, " bytes; truncated?)"));
    }
    const size_t slash = full.find('/');
    if (slash == std::string::npos) continue;  // torch.save puts every record under one prefix
    if (full.compare(slash, std::string::npos, "/data.pkl") == 0) a->prefix_ = full.substr(0, slash);
    a->records_[full.substr(slash + 1)] = ArchiveRecord{offset, size};
  }
  if (a->prefix_.empty() || a->records_.count("data.pkl") == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no <archive>/data.pkl record: not a torch.save file"));
  }
  return a;
}

const ArchiveRecord* TorchArchive::Find(absl::string_view name) const {
  auto it = records_.find(name);
  return it == records_.end() ? nullptr : &it->second;
}

absl::StatusOr<std::string> TorchArchive::ReadPickle(int64_t max_bytes) const {
  const ArchiveRecord* r = Find("data.pkl");
  if (r->size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": data.pkl is ", r->size,
                                                   " bytes, more than the ", max_bytes,
                                                   " this reader accepts"));
  }
  std::string out(static_cast<size_t>(r->size), '\0');
  RETURN_IF_ERROR(ReadAt(r->offset, out.data(), out.size()));
  return out;
}

absl::Status TorchArchive::ReadAt(int64_t offset, void* dst, size_t size) const {
  return PreadExactly(fd_, dst, size, offset, path_);
}

}  // namespace loom::storage::deepspeed
