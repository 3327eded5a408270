#include "storage/checkpoint/mapped_chunks.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

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

}  // namespace loom::storage
