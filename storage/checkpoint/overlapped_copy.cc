#include "storage/checkpoint/overlapped_copy.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <map>
#include <mutex>
#include <pthread.h>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "storage/checkpoint/mapped_chunks.h"
#include "storage/checkpoint/shard_format.h"

namespace loom::storage {
namespace {

// One unit of work: bytes [offset, offset + size) of spans[span].
struct Chunk {
  size_t span = 0;
  int64_t offset = 0;
  size_t size = 0;
};

// Writes `n` bytes of `in` at `src` to `out_fd` at *out_offset: copy_file_range while the kernel
// supports it for this pair of files (*kernel_copy), then pwrite(2) from a read-only map.
absl::Status CopyChunk(const CopySpan& in, int64_t src, size_t n, int out_fd, int64_t* out_offset,
                       const std::string& out_path, bool* kernel_copy) {
  size_t done = 0;
  while (done < n && *kernel_copy) {
    loff_t in_off = src + static_cast<int64_t>(done);
    loff_t out_off = *out_offset;
    const ssize_t k = ::copy_file_range(in.fd, &in_off, out_fd, &out_off, n - done, 0);
    if (k > 0) {
      done += static_cast<size_t>(k);
      *out_offset += k;
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k == 0 || errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) {
      *kernel_copy = false;
      break;
    }
    return ErrnoError("cannot write", out_path);
  }
  if (done == n) return absl::OkStatus();
  const int64_t rest_at = src + static_cast<int64_t>(done);
  return ForEachMappedChunk(in.fd, rest_at, static_cast<int64_t>(n - done), n - done, *in.path,
                            [&](const char* data, size_t size) -> absl::Status {
                              for (size_t w = 0; w < size;) {
                                const ssize_t k = ::pwrite(out_fd, data + w, size - w, *out_offset);
                                if (k < 0 && errno == EINTR) continue;
                                if (k <= 0) return ErrnoError("cannot write", out_path);
                                w += static_cast<size_t>(k);
                                *out_offset += k;
                              }
                              return absl::OkStatus();
                            });
}

// Enough for ForEachMappedChunk and ISA-L's CRC (a few KiB); glibc's default would be 8 MiB.
constexpr size_t kCheckerStackBytes = 256 << 10;

}  // namespace

absl::Status CopySpansOverlapped(const std::vector<CopySpan>& spans, int out_fd,
                                 int64_t* out_offset, const std::string& out_path,
                                 const OverlappedCopyOptions& options,
                                 std::vector<uint32_t>* crcs) {
  if (options.chunk_bytes < 1 || options.lookahead_chunks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        out_path, ": bad overlapped copy options: chunk_bytes ", options.chunk_bytes,
        ", lookahead_chunks ", options.lookahead_chunks, " (both must be at least 1)"));
  }
  // Validate every span before the first byte moves.
  std::map<int, int64_t> file_bytes;  // fstat size per input fd
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < spans.size(); ++i) {
    const CopySpan& s = spans[i];
    if (s.path == nullptr || s.offset < 0 || s.size < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          out_path, ": bad copy span ", i, ": offset ", s.offset, ", size ", s.size,
          s.path == nullptr ? ", no path" : ""));
    }
    if (s.size == 0) continue;
    auto it = file_bytes.find(s.fd);
    if (it == file_bytes.end()) {
      struct stat st;
      if (::fstat(s.fd, &st) != 0) return ErrnoError("cannot stat", *s.path);
      it = file_bytes.emplace(s.fd, st.st_size).first;
    }
    if (it->second < s.offset + s.size) {
      return absl::DataLossError(absl::StrCat(*s.path, ": ends at byte ", it->second,
                                              ", expected at least ", s.offset + s.size));
    }
    for (int64_t pos = s.offset; pos < s.offset + s.size;) {
      const size_t n = static_cast<size_t>(
          std::min<int64_t>(static_cast<int64_t>(options.chunk_bytes), s.offset + s.size - pos));
      chunks.push_back({i, pos, n});
      pos += static_cast<int64_t>(n);
    }
  }
  if (options.checksum) crcs->assign(spans.size(), Crc32(0, nullptr, 0));

  // The window: the checker may work on chunk i only while i < copied + lookahead_chunks.
  std::mutex mu;
  std::condition_variable cv;
  size_t copied = 0;
  bool stop = false;
  absl::Status checker_status;
  const size_t lookahead = static_cast<size_t>(options.lookahead_chunks);
  // The checker's loop. It allocates nothing (so glibc gives the thread no malloc arena) and
  // runs on a small stack: the process's peak address space stays near the one-thread path's
  // (consolidate_process_test caps it).
  auto check = [&] {
    for (size_t i = 0; i < chunks.size(); ++i) {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || i < copied + lookahead; });
        if (stop) return;
      }
      const Chunk& c = chunks[i];
      const CopySpan& s = spans[c.span];
      uint32_t& crc = (*crcs)[c.span];  // only this thread touches crcs until the join
      absl::Status st = ForEachMappedChunk(s.fd, c.offset, static_cast<int64_t>(c.size), c.size,
                                           *s.path, [&](const char* data, size_t n) {
                                             crc = Crc32(crc, data, n);
                                             return absl::OkStatus();
                                           });
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        checker_status = std::move(st);
        stop = true;
        cv.notify_all();
        return;
      }
    }
  };
  using CheckFn = decltype(check);
  pthread_t checker;
  bool checker_started = false;
  if (options.checksum && !chunks.empty()) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, kCheckerStackBytes);
    checker_started =
        ::pthread_create(&checker, &attr,
                         [](void* fn) -> void* {
                           (*static_cast<CheckFn*>(fn))();
                           return nullptr;
                         },
                         &check) == 0;
    pthread_attr_destroy(&attr);
    if (!checker_started) {
      return absl::ResourceExhaustedError(
          absl::StrCat(out_path, ": cannot start the checksum thread"));
    }
  }

  absl::Status copy_status;
  bool kernel_copy = true;
  for (const Chunk& c : chunks) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stop) break;  // the checker failed
    }
    copy_status = CopyChunk(spans[c.span], c.offset, c.size, out_fd, out_offset, out_path,
                            &kernel_copy);
    if (!copy_status.ok()) break;
    if (options.after_chunk) options.after_chunk(c.size);
    {
      std::lock_guard<std::mutex> lock(mu);
      ++copied;
    }
    cv.notify_all();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!copy_status.ok()) stop = true;
  }
  cv.notify_all();
  if (checker_started) ::pthread_join(checker, nullptr);
  if (!copy_status.ok()) return copy_status;
  return checker_status;
}

}  // namespace loom::storage
