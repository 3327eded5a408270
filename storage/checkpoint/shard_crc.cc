// Opening rank shards and checking their CRC-32s against the manifests (VerifyCheckpointDir).
#include <algorithm>
#include <utility>
#include <zlib.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "storage/checkpoint/consolidate_internal.h"
#include "storage/checkpoint/mapped_chunks.h"

namespace loom::storage {
namespace consolidate_internal {
namespace {

// CRC-32 of `size` bytes of `fd` at `offset`, chained onto `crc`, computed on the page cache's
// pages (ForEachMappedChunk, `chunk_bytes` at a time) rather than on a copy.
absl::StatusOr<uint32_t> CrcRange(int fd, uint32_t crc, int64_t offset, int64_t size,
                                  size_t chunk_bytes, const std::string& path) {
  RETURN_IF_ERROR(ForEachMappedChunk(fd, offset, size, chunk_bytes, path,
                                     [&](const char* data, size_t n) {
                                       crc = Crc32(crc, data, n);
                                       return absl::OkStatus();
                                     }));
  return crc;
}

}  // namespace

size_t BufferSize(int64_t io_buffer_bytes) {
  int64_t n = std::max<int64_t>(io_buffer_bytes, 4);
  return static_cast<size_t>((n + 3) / 4 * 4);
}

// Opens every rank's shard and checks its size against the manifest.
absl::StatusOr<OpenShards> OpenShardFiles(const StepScan& scan) {
  OpenShards out;
  const int32_t world_size = scan.manifests.begin()->second.world_size;
  for (int32_t r = 0; r < world_size; ++r) {
    const ShardManifest& m = scan.manifests.at(r);
    ASSIGN_OR_RETURN(ScopedFd fd, OpenShardFile(scan.info.path, m));
    out.fds.push_back(std::move(fd));
    out.paths.push_back(absl::StrCat(scan.info.path, "/", ShardFileName(r)));
  }
  return out;
}

absl::Status VerifyShardCrcs(const StepScan& scan, const OpenShards& shards, size_t chunk_bytes,
                             std::vector<std::vector<CrcPiece>>* known) {
  for (size_t r = 0; r < shards.fds.size(); ++r) {
    const int32_t rank = static_cast<int32_t>(r);
    const ShardManifest& m = scan.manifests.at(rank);
    const int fd = shards.fds[r].get();
    std::vector<CrcPiece> pieces;
    if (known != nullptr) pieces = (*known)[r];
    std::sort(pieces.begin(), pieces.end(),
              [](const CrcPiece& a, const CrcPiece& b) { return a.offset < b.offset; });
    bool overlapping = false;
    for (size_t i = 1; i < pieces.size(); ++i) {
      if (pieces[i].offset < pieces[i - 1].offset + pieces[i - 1].size) overlapping = true;
    }
    if (overlapping) pieces.clear();
    uint32_t crc = Crc32(0, nullptr, 0);
    int64_t pos = 0;
    for (const CrcPiece& p : pieces) {
      if (p.size == 0) continue;
      ASSIGN_OR_RETURN(crc, CrcRange(fd, crc, pos, p.offset - pos, chunk_bytes, shards.paths[r]));
      crc = static_cast<uint32_t>(crc32_combine64(crc, p.crc, p.size));
      pos = p.offset + p.size;
    }
    ASSIGN_OR_RETURN(crc,
                     CrcRange(fd, crc, pos, m.shard_bytes - pos, chunk_bytes, shards.paths[r]));
    if (crc != m.shard_crc32) {
      return absl::DataLossError(absl::StrFormat("%s (rank %d): CRC-32 %08x, manifest says %08x",
                                                 shards.paths[r], rank, crc, m.shard_crc32));
    }
  }
  return absl::OkStatus();
}

absl::Status VerifySideFiles(const StepScan& scan, size_t chunk_bytes) {
  for (const auto& [rank, m] : scan.manifests) {
    for (const SideFile& f : m.side_files) {
      const std::string path = absl::StrCat(scan.info.path, "/", f.name);
      ASSIGN_OR_RETURN(ScopedFd fd, OpenSideFile(scan.info.path, rank, f));
      uint32_t crc = Crc32(0, nullptr, 0);
      if (f.bytes > 0) {
        ASSIGN_OR_RETURN(crc, CrcRange(fd.get(), crc, 0, f.bytes, chunk_bytes, path));
      }
      if (crc != f.crc32) {
        return absl::DataLossError(absl::StrFormat(
            "%s (rank %d): CRC-32 %08x, manifest says %08x", path, rank, crc, f.crc32));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace consolidate_internal

using consolidate_internal::BufferSize;
using consolidate_internal::OpenShardFiles;
using consolidate_internal::OpenShards;
using consolidate_internal::ParseNumbered;
using consolidate_internal::ScanStep;
using consolidate_internal::StepScan;
using consolidate_internal::IsDir;
using consolidate_internal::VerifyShardCrcs;
using consolidate_internal::VerifySideFiles;

absl::StatusOr<CheckpointInfo> VerifyCheckpointDir(const std::string& step_dir,
                                                   int64_t io_buffer_bytes) {
  std::string dir = step_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const size_t slash = dir.rfind('/');
  const std::string base = slash == std::string::npos ? dir : dir.substr(slash + 1);
  int64_t step = 0;
  if (!ParseNumbered<int64_t>(base, "step_", "", StepDirName, &step)) {
    return absl::InvalidArgumentError(
        absl::StrCat(step_dir, ": not a checkpoint step directory (step_<8 digits>)"));
  }
  if (!IsDir(dir)) return absl::NotFoundError(absl::StrCat("no directory ", step_dir));
  ASSIGN_OR_RETURN(StepScan scan, ScanStep(dir, step));
  if (!scan.info.committed) return scan.info.commit_status;
  ASSIGN_OR_RETURN(OpenShards shards, OpenShardFiles(scan));
  RETURN_IF_ERROR(VerifyShardCrcs(scan, shards, BufferSize(io_buffer_bytes)));
  RETURN_IF_ERROR(VerifySideFiles(scan, BufferSize(io_buffer_bytes)));
  return std::move(scan.info);
}

}  // namespace loom::storage
