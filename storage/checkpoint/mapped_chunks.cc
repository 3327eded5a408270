#include "storage/checkpoint/mapped_chunks.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"

namespace loom::storage {

absl::Status ForEachMappedChunk(int fd, int64_t offset, int64_t size, size_t chunk_bytes,
                                const std::string& path, const ChunkFn& fn) {
  if (offset < 0 || size < 0 || chunk_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": bad range: offset ", offset, ", size ",
                                                   size, ", chunk_bytes ", chunk_bytes));
  }
  if (size == 0) return absl::OkStatus();
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError("cannot stat", path);
  if (st.st_size < offset + size) {
    return absl::DataLossError(absl::StrCat(path, ": ends at byte ", st.st_size,
                                            ", expected at least ", offset + size));
  }
  static const int64_t kPage = ::sysconf(_SC_PAGESIZE);
  int64_t pos = offset;
  const int64_t end = offset + size;
  while (pos < end) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(chunk_bytes), end - pos));
    const int64_t map_start = pos / kPage * kPage;
    const size_t lead = static_cast<size_t>(pos - map_start);
    void* map = ::mmap(nullptr, lead + n, PROT_READ, MAP_SHARED | MAP_POPULATE, fd,
                       static_cast<off_t>(map_start));
    if (map == MAP_FAILED) return ErrnoError("cannot map", path);
    absl::Status s = fn(static_cast<const char*>(map) + lead, n);
    ::munmap(map, lead + n);
    if (!s.ok()) return s;
    pos += static_cast<int64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status CopyRangeMapped(int in_fd, int64_t offset, int64_t size, size_t chunk_bytes,
                             const std::string& in_path, int out_fd, int64_t* out_offset,
                             const std::string& out_path, const ChunkFn& before_copy) {
  int64_t src = offset;
  bool kernel_copy = true;
  return ForEachMappedChunk(
      in_fd, offset, size, chunk_bytes, in_path, [&](const char* data, size_t n) -> absl::Status {
        if (before_copy) {
          absl::Status s = before_copy(data, n);
          if (!s.ok()) return s;
        }
        size_t done = 0;
        while (done < n && kernel_copy) {
          loff_t in_off = src + static_cast<int64_t>(done);
          loff_t out_off = *out_offset;
          const ssize_t k = ::copy_file_range(in_fd, &in_off, out_fd, &out_off, n - done, 0);
          if (k > 0) {
            done += static_cast<size_t>(k);
            *out_offset += k;
            continue;
          }
          if (k < 0 && errno == EINTR) continue;
          if (k == 0 || errno == EXDEV || errno == EINVAL || errno == ENOSYS ||
              errno == EOPNOTSUPP) {
            kernel_copy = false;  // write(2) from the map from here on
            break;
          }
          return ErrnoError("cannot write", out_path);
        }
        while (done < n) {
          const ssize_t k = ::pwrite(out_fd, data + done, n - done, *out_offset);
          if (k < 0 && errno == EINTR) continue;
          if (k <= 0) return ErrnoError("cannot write", out_path);
          done += static_cast<size_t>(k);
          *out_offset += k;
        }
        src += static_cast<int64_t>(n);
        return absl::OkStatus();
      });
}

}  // namespace loom::storage
