#include "storage/checkpoint/consolidate.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "storage/checkpoint/consolidate_internal.h"
#include "storage/checkpoint/mapped_chunks.h"
#include "storage/checkpoint/overlapped_copy.h"
#include "storage/checkpoint/shard_format.h"
#include "storage/checkpoint/tokenizer_export.h"
#include "storage/safetensors/safetensors.h"

namespace loom::storage {
namespace {

using nlohmann::json;
using namespace consolidate_internal;  // NOLINT: this library's own internals

bool IsOutputFile(const std::string& name) {
  if (name == kSafetensorsName || name == kIndexName) return true;
  // model-00001-of-00002.safetensors
  return absl::StartsWith(name, "model-") && absl::EndsWith(name, ".safetensors") &&
         absl::StrContains(name, "-of-");
}

// Removes a previous export in `dir`: completion markers first, so that an interrupted removal
// never leaves a complete-looking mixture.
absl::Status RemovePreviousOutputs(const std::string& dir) {
  for (const char* marker : {kIndexName, kSafetensorsName}) {
    std::string path = absl::StrCat(dir, "/", marker);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoError("cannot remove", path);
  }
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(dir));
  for (const std::string& n : names) {
    if (!IsOutputFile(n)) continue;
    std::string path = absl::StrCat(dir, "/", n);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoError("cannot remove", path);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ConsolidateResult> Consolidate(const std::string& checkpoint_dir, int64_t step,
                                              const std::string& output_dir,
                                              const ConsolidateOptions& options) {
  const absl::Time start = absl::Now();
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step ", step, " is negative"));
  ASSIGN_OR_RETURN(const std::string dtype, NormalizeOutputDtype(options.dtype));
  const bool bf16 = dtype == "BF16";
  ASSIGN_OR_RETURN(StepScan scan, SelectStep(checkpoint_dir, step));
  const CheckpointInfo& info = scan.info;
  const ShardManifest& ref = scan.manifests.begin()->second;
  const int32_t world_size = ref.world_size;

  // Open every shard once and check its size. CRC-32s: either a full pass before writing
  // anything, or (default) computed on the bytes the copy reads anyway, the rest of each shard
  // (other sections, padding, skipped tensors) read afterwards, the pieces combined in file order
  // (crc32_combine) and compared before anything is published.
  // Reads go through read-only maps of `chunk` bytes (mapped_chunks.h): the CRC-32 and the
  // write(2) into the output both read the page cache's pages, with no pread copy in between.
  // F32 copies overlap the CRC of the next chunk with the copy of this one (write_f32).
  const size_t chunk = BufferSize(options.io_buffer_bytes);
  std::vector<uint16_t> converted(bf16 ? chunk / sizeof(float) : 0);
  ASSIGN_OR_RETURN(OpenShards shards, OpenShardFiles(scan));
  const bool fused_crc = options.verify_checksums && !options.checksum_before_writing;
  if (options.verify_checksums && !fused_crc) {
    RETURN_IF_ERROR(VerifyShardCrcs(scan, shards, chunk));
  }
  std::vector<std::vector<CrcPiece>> pieces(static_cast<size_t>(world_size));

  // config.json and the tie.
  json config = json::parse(ref.model_config_json, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(info.path, ": manifest model_config is not a JSON object"));
  }
  // The dtype of the tensors written, under both names transformers reads (4.x: torch_dtype;
  // 5.x: dtype): the manifest's config says what the job trained in, which a bf16 export of fp32
  // master weights is not.
  config["torch_dtype"] = bf16 ? "bfloat16" : "float32";
  if (config.contains("dtype")) config["dtype"] = config["torch_dtype"];
  auto tie_it = config.find("tie_word_embeddings");
  const bool tied = tie_it != config.end() && tie_it->is_boolean() && tie_it->get<bool>();

  auto section = SectionOffset(ref, kParamsSection);
  if (!section.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(info.path, ": ", section.status().message()));
  }
  const int64_t section_offset = *section;

  ConsolidateResult result;
  result.step = info.step;
  result.dtype = dtype;
  const int64_t out_elem_bytes = bf16 ? 2 : 4;
  std::vector<std::pair<std::string, int64_t>> sizes;
  std::map<std::string, const ShardParam*> by_name;
  for (const ShardParam& p : ref.params) {
    if (tied && p.name == "lm_head.weight") {
      result.skipped_tensors.push_back(p.name);
      continue;
    }
    if (!by_name.emplace(p.name, &p).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(info.path, ": parameter '", p.name, "' appears twice in the manifest"));
    }
    sizes.emplace_back(p.name, p.numel * out_elem_bytes);
    result.tensor_bytes += p.numel * out_elem_bytes;
  }
  result.num_tensors = static_cast<int64_t>(sizes.size());
  const std::vector<ShardPlanFile> plan = PlanShards(sizes, options.max_shard_size_bytes);
  const bool sharded = plan.size() > 1;

  // zero_to_fp32 stage 3: full = cat_r rank_r[offset : offset + p], first numel elements.
  // Shards and safetensors are both little-endian, so F32 bytes are copied unchanged.
  auto source = [&](const safetensors::TensorEntry& e,
                    const safetensors::ByteSink& sink) -> absl::Status {
    const ShardParam& p = *by_name.at(e.name);
    int64_t remaining = p.numel;
    for (int32_t r = 0; r < world_size && remaining > 0; ++r) {
      const int64_t take = std::min(p.partition_numel, remaining);
      int64_t off = (section_offset + p.partition_offset) * static_cast<int64_t>(sizeof(float));
      int64_t left = take * static_cast<int64_t>(sizeof(float));
      CrcPiece piece{off, left, Crc32(0, nullptr, 0)};
      RETURN_IF_ERROR(ForEachMappedChunk(
          shards.fds[r].get(), off, left, chunk, shards.paths[r],
          [&](const char* data, size_t n) -> absl::Status {
            if (fused_crc) piece.crc = Crc32(piece.crc, data, n);
            if (!bf16) return sink(data, n);
            const size_t count = n / sizeof(float);
            for (size_t i = 0; i < count; ++i) {
              float f;
              std::memcpy(&f, data + i * sizeof(float), sizeof(float));
              converted[i] = Fp32ToBf16(f);
            }
            return sink(converted.data(), count * sizeof(uint16_t));
          }));
      if (fused_crc) pieces[static_cast<size_t>(r)].push_back(piece);
      remaining -= take;
    }
    return absl::OkStatus();
  };

  // F32: the bytes pass unchanged, so the file is written here rather than through
  // safetensors::WriteFile: the same header (PlanHeader + SerializeHeader, the reference writer's
  // layout), then each rank slice copied inside the kernel (copy_file_range, as cp does) while a
  // checker thread checksums the same mapped bytes one chunk ahead (CopySpansOverlapped; with
  // overlap_checksums = false, checksummed just before each chunk's copy: CopyRangeMapped). It
  // lives in the staging directory, so a partial file is never published; fsynced before it is.
  auto write_f32 = [&](const std::string& path,
                       std::vector<safetensors::TensorSpec> specs) -> absl::StatusOr<int64_t> {
    ASSIGN_OR_RETURN(safetensors::Header header,
                     safetensors::PlanHeader(std::move(specs), safetensors::WriterOptions().metadata));
    ASSIGN_OR_RETURN(std::string text, safetensors::SerializeHeader(header));
    std::string head(8, '\0');
    for (int i = 0; i < 8; ++i) head[i] = static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));
    head += text;
    ScopedFd out(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (out.get() < 0) return ErrnoError("cannot create", path);
    for (size_t done = 0; done < head.size();) {
      const ssize_t k = ::pwrite(out.get(), head.data() + done, head.size() - done, done);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return ErrnoError("cannot write", path);
      done += static_cast<size_t>(k);
    }
    int64_t pos = static_cast<int64_t>(head.size());
    int64_t unsynced = 0;
    auto writeback = [&](size_t n) {
      unsynced += static_cast<int64_t>(n);
      if (options.writeback_bytes > 0 && unsynced >= options.writeback_bytes) {
        unsynced = 0;  // a hint: errors surface in the fsync
        (void)::sync_file_range(out.get(), 0, 0, SYNC_FILE_RANGE_WRITE);
      }
    };
    // The rank slices of this file's tensors, in file order, each with its CRC piece.
    std::vector<CopySpan> spans;
    std::vector<std::pair<int32_t, CrcPiece>> span_pieces;
    for (const safetensors::TensorEntry& e : header.tensors) {
      const ShardParam& p = *by_name.at(e.name);
      int64_t remaining = p.numel;
      for (int32_t r = 0; r < world_size && remaining > 0; ++r) {
        const int64_t take = std::min(p.partition_numel, remaining);
        const int64_t off =
            (section_offset + p.partition_offset) * static_cast<int64_t>(sizeof(float));
        const int64_t left = take * static_cast<int64_t>(sizeof(float));
        spans.push_back({shards.fds[r].get(), &shards.paths[r], off, left});
        span_pieces.push_back({r, CrcPiece{off, left, Crc32(0, nullptr, 0)}});
        remaining -= take;
      }
    }
    if (options.overlap_checksums) {
      // The checker thread checksums chunk k + 1 while chunk k is copied (overlapped_copy.h).
      OverlappedCopyOptions copy_options;
      copy_options.chunk_bytes = chunk;
      copy_options.checksum = fused_crc;
      copy_options.after_chunk = writeback;
      std::vector<uint32_t> crcs;
      RETURN_IF_ERROR(CopySpansOverlapped(spans, out.get(), &pos, path, copy_options, &crcs));
      for (size_t i = 0; i < spans.size() && fused_crc; ++i) span_pieces[i].second.crc = crcs[i];
    } else {
      // One thread: each chunk's mapped bytes are checksummed just before the chunk is copied.
      for (size_t i = 0; i < spans.size(); ++i) {
        CrcPiece& piece = span_pieces[i].second;
        RETURN_IF_ERROR(CopyRangeMapped(spans[i].fd, spans[i].offset, spans[i].size, chunk,
                                        *spans[i].path, out.get(), &pos, path,
                                        [&](const char* data, size_t n) {
                                          if (fused_crc) piece.crc = Crc32(piece.crc, data, n);
                                          writeback(n);
                                          return absl::OkStatus();
                                        }));
      }
    }
    if (fused_crc) {
      for (const auto& [r, piece] : span_pieces) pieces[static_cast<size_t>(r)].push_back(piece);
    }
    if (::fsync(out.get()) != 0) return ErrnoError("cannot fsync", path);
    return pos;
  };

  result.output_dir =
      output_dir.empty() ? DefaultConsolidationDir(checkpoint_dir, info.step, result.dtype)
                         : output_dir;
  RETURN_IF_ERROR(MakeDirs(result.output_dir));
  RemoveDeadTemporaries(result.output_dir);
  const std::string staging =
      absl::StrCat(result.output_dir, "/", kStagingPrefix, ::getpid());
  (void)RemoveTree(staging);  // a previous failed run of this very process
  RETURN_IF_ERROR(MakeDirs(staging));
  struct StagingCleanup {
    std::string dir;
    ~StagingCleanup() { (void)RemoveTree(dir); }
  } cleanup{staging};

  // 1. Everything into the staging directory, each file fsynced.
  ASSIGN_OR_RETURN(const std::vector<std::string> tokenizer_files,
                   StageTokenizerFiles(checkpoint_dir, staging, &config));
  RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(staging, "/", kConfigName), config.dump(2) + "\n"));
  json weight_map = json::object();
  for (const ShardPlanFile& f : plan) {
    std::vector<safetensors::TensorSpec> specs;
    for (const std::string& name : f.tensors) {
      const ShardParam& p = *by_name.at(name);
      specs.push_back({p.name, dtype, p.shape});
      weight_map[name] = f.file_name;
    }
    const std::string path = absl::StrCat(staging, "/", f.file_name);
    int64_t bytes = 0;
    if (bf16) {
      safetensors::WriterOptions writer_options;
      writer_options.writeback_bytes = options.writeback_bytes;
      ASSIGN_OR_RETURN(bytes, safetensors::WriteFile(path, std::move(specs), source, writer_options));
    } else {
      ASSIGN_OR_RETURN(bytes, write_f32(path, std::move(specs)));
    }
    result.safetensors_bytes += bytes;
  }
  if (sharded) {
    json index = {{"metadata", {{"total_size", result.tensor_bytes}}}, {"weight_map", weight_map}};
    RETURN_IF_ERROR(
        WriteFileAtomically(absl::StrCat(staging, "/", kIndexName), index.dump(2) + "\n"));
  }

  // 2. The checksums must match.
  if (fused_crc) RETURN_IF_ERROR(VerifyShardCrcs(scan, shards, chunk, &pieces));

  // 3. Retire the previous output (its completion markers first), then publish, marker last.
  RETURN_IF_ERROR(RemovePreviousOutputs(result.output_dir));
  auto publish = [&](const std::string& name) -> absl::Status {
    const std::string from = absl::StrCat(staging, "/", name);
    const std::string to = absl::StrCat(result.output_dir, "/", name);
    if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoError("cannot rename into place", to);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(publish(kConfigName));
  for (const std::string& name : tokenizer_files) RETURN_IF_ERROR(publish(name));
  for (const ShardPlanFile& f : plan) {
    if (sharded) RETURN_IF_ERROR(publish(f.file_name));
  }
  if (sharded) {
    RETURN_IF_ERROR(SyncDir(result.output_dir));  // the shards are durable before the marker
    RETURN_IF_ERROR(publish(kIndexName));
  } else {
    RETURN_IF_ERROR(publish(kSafetensorsName));
  }
  RETURN_IF_ERROR(SyncDir(result.output_dir));

  result.config_path = absl::StrCat(result.output_dir, "/", kConfigName);
  for (const ShardPlanFile& f : plan) {
    result.files.push_back(absl::StrCat(result.output_dir, "/", f.file_name));
  }
  if (sharded) {
    result.index_path = absl::StrCat(result.output_dir, "/", kIndexName);
    result.safetensors_path = result.index_path;
  } else {
    result.safetensors_path = result.files.front();
  }
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return result;
}

}  // namespace loom::storage
