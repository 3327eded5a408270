// A checksummed file-to-file copy whose CRC-32 runs beside the copy instead of before it
// (consolidation's F32 hot path: docs/benchmarks.md "Consolidation"). No LibTorch, no gRPC.
//
// The calling thread copies the spans chunk by chunk inside the kernel (copy_file_range, page
// cache to page cache, as coreutils cp does); one checker thread maps the same chunks read-only
// (ForEachMappedChunk) and computes their CRC-32s. The checker runs ahead of the copy by at most
// `lookahead_chunks` chunks (a bounded window, so its page-cache reads are still hot when the
// copy reaches them, and on a cold cache it acts as read-ahead for the copy): the checksum of
// chunk k + 1 is computed while chunk k is copied, and the checksum leaves the copy's critical
// path. The output bytes are the input bytes, unchanged (the checker never touches the output).
// The CRC-32s are of the input spans: the caller compares them with what the input should hold
// before it trusts (publishes) the output.
#ifndef LOOM_STORAGE_CHECKPOINT_OVERLAPPED_COPY_H_
#define LOOM_STORAGE_CHECKPOINT_OVERLAPPED_COPY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace loom::storage {

// Bytes [offset, offset + size) of the open file `fd` (named `path` in errors).
struct CopySpan {
  int fd = -1;
  const std::string* path = nullptr;  // not owned; must outlive the copy
  int64_t offset = 0;
  int64_t size = 0;
};

struct OverlappedCopyOptions {
  // Bytes per chunk (>= 1): the unit of the copy, of the checker's maps and of the lookahead.
  size_t chunk_bytes = 4 << 20;
  // How many chunks the checker may be ahead of the copy (>= 1).
  int lookahead_chunks = 2;
  // false: no checker thread; the spans are only copied and `crcs` is left untouched.
  bool checksum = true;
  // Called on the copying thread after each chunk with the number of bytes it copied (e.g. to
  // start writeback with sync_file_range); may be empty.
  std::function<void(size_t)> after_chunk;
};

// Copies `spans` in order to `out_fd`, starting at byte *out_offset (advanced by the bytes
// copied), and with options.checksum sets (*crcs)[i] to the CRC-32 (Crc32, shard_format.h) of
// spans[i] (resized to spans.size()). Falls back to pwrite(2) from a read-only map where
// copy_file_range is not supported for the pair of files (EXDEV, EINVAL, ENOSYS, EOPNOTSUPP).
// Errors (the first one; the other side is stopped and joined before returning): INVALID_ARGUMENT
// for chunk_bytes < 1, lookahead_chunks < 1, a span with a negative offset or size or without
// a path; DATA_LOSS "<path>: ends at byte X, expected at least Y" for an input shorter than a
// span (checked for every span before anything is copied, so no map can fault past the end);
// ErrnoError("cannot map"/"cannot stat", input path); ErrnoError("cannot write", out_path) for
// the output (RESOURCE_EXHAUSTED when the disk is full). On an error the output holds a prefix
// of the copy and *crcs is unspecified.
// Precondition: no input is truncated while this runs (committed checkpoint shards are never
// rewritten). Thread-compatible: one call uses one extra thread and no shared state.
absl::Status CopySpansOverlapped(const std::vector<CopySpan>& spans, int out_fd,
                                 int64_t* out_offset, const std::string& out_path,
                                 const OverlappedCopyOptions& options,
                                 std::vector<uint32_t>* crcs);

}  // namespace loom::storage

#endif  // LOOM_STORAGE_CHECKPOINT_OVERLAPPED_COPY_H_
