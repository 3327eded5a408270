// Reading a byte range of a file through short-lived read-only memory maps, so that checksums and
// copies work on the page cache's own pages instead of a pread copy of them (consolidation's hot
// path: docs/benchmarks.md "Consolidation"). No LibTorch, no gRPC.
#ifndef LOOM_STORAGE_CHECKPOINT_MAPPED_CHUNKS_H_
#define LOOM_STORAGE_CHECKPOINT_MAPPED_CHUNKS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"

namespace loom::storage {

// Receives one chunk: `size` bytes at `data`, valid only during the call.
using ChunkFn = std::function<absl::Status(const char* data, size_t size)>;

// Calls `fn` on consecutive chunks covering bytes [offset, offset + size) of the open file `fd`,
// in order, each of at most `chunk_bytes` bytes (>= 1). Each chunk is mapped read-only
// (mmap MAP_SHARED | MAP_POPULATE from its page-aligned start) and unmapped when `fn` returns, so
// at most one chunk (plus under a page) is mapped at a time whatever `size` is: address space and
// resident memory stay O(chunk_bytes).
// Errors: INVALID_ARGUMENT for a negative offset or size or chunk_bytes < 1; DATA_LOSS
// "<path>: ends at byte X, expected at least Y" when fstat says the file is shorter than
// offset + size (checked before anything is mapped, so no access can fault past the end);
// ErrnoError for fstat/mmap failures; otherwise the first error `fn` returns (then stops).
// Precondition: the file is not truncated while this runs (a truncation under a live map would
// raise SIGBUS); checkpoint shards are immutable once committed. Thread-safe (no shared state).
absl::Status ForEachMappedChunk(int fd, int64_t offset, int64_t size, size_t chunk_bytes,
                                const std::string& path, const ChunkFn& fn);

// Copies bytes [offset, offset + size) of `in_fd` to `out_fd` at byte *out_offset (advanced by
// size) inside the kernel (copy_file_range, page cache to page cache, as coreutils cp does),
// calling `before_copy` on each chunk's mapped bytes (ForEachMappedChunk) just before the chunk is
// copied, e.g. to checksum exactly the range being copied. Falls back to write(2) from the map
// where copy_file_range is not supported for the pair of files (EXDEV, EINVAL, ENOSYS,
// EOPNOTSUPP). Errors: those of ForEachMappedChunk and `before_copy`; ErrnoError("cannot write",
// out_path) for the output (RESOURCE_EXHAUSTED when the disk is full). Same precondition.
absl::Status CopyRangeMapped(int in_fd, int64_t offset, int64_t size, size_t chunk_bytes,
                             const std::string& in_path, int out_fd, int64_t* out_offset,
                             const std::string& out_path, const ChunkFn& before_copy);

}  // namespace loom::storage

#endif  // LOOM_STORAGE_CHECKPOINT_MAPPED_CHUNKS_H_
