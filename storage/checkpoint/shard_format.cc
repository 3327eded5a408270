#include "storage/checkpoint/shard_format.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <isa-l/crc.h>

#include <algorithm>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace loom::storage {

using nlohmann::json;

std::string StepDirName(int64_t step) { return absl::StrFormat("step_%08d", step); }

std::optional<int64_t> ParseStepDirName(absl::string_view name) {
  int64_t step = 0;
  if (!absl::ConsumePrefix(&name, "step_") || !absl::SimpleAtoi(name, &step) || step < 0 ||
      StepDirName(step) != absl::StrCat("step_", name)) {
    return std::nullopt;
  }
  return step;
}
std::string ShardFileName(int32_t rank) { return absl::StrCat("rank_", rank, ".shard"); }
std::string ManifestFileName(int32_t rank) { return absl::StrCat("rank_", rank, ".manifest.json"); }

int64_t PartitionNumel(int64_t numel, int32_t world_size) {
  return (numel + world_size - 1) / world_size;
}

void AssignPartitionLayout(ShardManifest& m) {
  int64_t offset = 0;
  for (ShardParam& p : m.params) {
    p.partition_numel = PartitionNumel(p.numel, m.world_size);
    p.partition_offset = offset;
    offset += p.partition_numel;
  }
  m.section_numel = offset;
}

uint32_t Crc32(uint32_t crc, const void* data, size_t size_bytes) {
  // ISA-L's crc32_gzip_refl is zlib's crc32 (reflected CRC-32/ISO-HDLC, same pre/post inversion,
  // same chaining) computed with carry-less multiplication (PCLMULQDQ folding): about 4x zlib's
  // table-driven speed on this project's machines (docs/benchmarks.md).
  if (size_bytes == 0) return crc;
  return ::crc32_gzip_refl(crc, static_cast<const unsigned char*>(data),
                           static_cast<uint64_t>(size_bytes));
}

std::string ManifestToJson(const ShardManifest& m) {
  json j;
  j["format"] = m.format;
  j["step"] = m.step;
  j["rank"] = m.rank;
  j["world_size"] = m.world_size;
  j["zero_stage"] = m.zero_stage;
  j["model_config"] = json::parse(m.model_config_json, nullptr, /*allow_exceptions=*/false);
  j["tokenizer"] = m.tokenizer;
  j["optimizer"] = {{"type", m.optimizer}, {"step", m.optimizer_step}};
  if (!m.metrics.empty()) j["metrics"] = m.metrics;
  j["sections"] = m.sections;
  j["section_numel"] = m.section_numel;
  j["shard_file"] = ShardFileName(m.rank);
  j["shard_bytes"] = m.shard_bytes;
  j["shard_crc32"] = m.shard_crc32;
  json params = json::array();
  for (const ShardParam& p : m.params) {
    params.push_back({{"name", p.name},
                      {"shape", p.shape},
                      {"numel", p.numel},
                      {"partition_numel", p.partition_numel},
                      {"partition_offset", p.partition_offset}});
  }
  j["params"] = std::move(params);
  if (!m.side_files.empty()) {
    json side = json::array();
    for (const SideFile& f : m.side_files) {
      side.push_back({{"name", f.name}, {"bytes", f.bytes}, {"crc32", f.crc32}});
    }
    j["side_files"] = std::move(side);
  }
  return j.dump(1);
}

namespace {

// j[key] as an exact integer of type Int: nlohmann's get<Int>() silently converts floats and
// wraps out-of-range values, so 1e30 or 2^64 would become arbitrary numbers.
template <typename Int>
Int ExactInt(const json& j, const char* key) {
  const json& v = j.at(key);
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u <= static_cast<uint64_t>(std::numeric_limits<Int>::max())) return static_cast<Int>(u);
  } else if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    const bool fits = i < 0 ? i >= static_cast<int64_t>(std::numeric_limits<Int>::min())
                            : static_cast<uint64_t>(i) <=
                                  static_cast<uint64_t>(std::numeric_limits<Int>::max());
    if (fits) return static_cast<Int>(i);
  }
  throw std::out_of_range(absl::StrCat("'", key, "' is ", v.dump(), ", not an integer in [",
                                       std::numeric_limits<Int>::min(), ", ",
                                       std::numeric_limits<Int>::max(), "]"));
}

}  // namespace

absl::StatusOr<ShardManifest> ManifestFromJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("manifest: not a JSON object");
  }
  ShardManifest m;
  try {
    m.format = j.at("format").get<std::string>();
    if (m.format != kShardFormatVersion) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest.format: unsupported '", m.format, "', want ", kShardFormatVersion));
    }
    m.step = ExactInt<int64_t>(j, "step");
    m.rank = ExactInt<int32_t>(j, "rank");
    m.world_size = ExactInt<int32_t>(j, "world_size");
    m.zero_stage = ExactInt<int32_t>(j, "zero_stage");
    m.model_config_json = j.at("model_config").dump();
    m.tokenizer = j.value("tokenizer", "byte");
    m.optimizer = j.at("optimizer").at("type").get<std::string>();
    m.optimizer_step = ExactInt<int64_t>(j.at("optimizer"), "step");
    m.sections = j.at("sections").get<std::vector<std::string>>();
    if (j.contains("metrics")) {
      const json& metrics = j.at("metrics");
      if (!metrics.is_object()) {
        return absl::InvalidArgumentError("manifest.metrics: not an object");
      }
      for (const auto& [name, value] : metrics.items()) {
        if (!value.is_number() || !std::isfinite(value.get<double>())) {
          return absl::InvalidArgumentError(
              absl::StrCat("manifest.metrics.", name, ": not a finite number"));
        }
        m.metrics[name] = value.get<double>();
      }
    }
    m.section_numel = ExactInt<int64_t>(j, "section_numel");
    m.shard_bytes = ExactInt<int64_t>(j, "shard_bytes");
    m.shard_crc32 = ExactInt<uint32_t>(j, "shard_crc32");
    for (const json& jp : j.at("params")) {
      ShardParam p;
      p.name = jp.at("name").get<std::string>();
      const json& shape = jp.at("shape");
      if (!shape.is_array()) throw std::out_of_range(absl::StrCat("'shape' of ", p.name, " is not a list"));
      for (const json& d : shape) {
        json holder = {{"dim", d}};
        p.shape.push_back(ExactInt<int64_t>(holder, "dim"));
      }
      p.numel = ExactInt<int64_t>(jp, "numel");
      p.partition_numel = ExactInt<int64_t>(jp, "partition_numel");
      p.partition_offset = ExactInt<int64_t>(jp, "partition_offset");
      m.params.push_back(std::move(p));
    }
    if (j.contains("side_files")) {
      const json& side = j.at("side_files");
      if (!side.is_array()) throw std::out_of_range("'side_files' is not a list");
      for (const json& jf : side) {
        SideFile f;
        f.name = jf.at("name").get<std::string>();
        // A plain name inside the step directory: never a path out of it.
        if (f.name.empty() || f.name == "." || f.name == ".." ||
            f.name.find('/') != std::string::npos || f.name.find('\0') != std::string::npos) {
          throw std::out_of_range(absl::StrCat("side file name '", f.name,
                                               "' is not a plain file name"));
        }
        f.bytes = ExactInt<int64_t>(jf, "bytes");
        if (f.bytes < 0) throw std::out_of_range(absl::StrCat("side file '", f.name, "': negative bytes"));
        f.crc32 = ExactInt<uint32_t>(jf, "crc32");
        m.side_files.push_back(std::move(f));
      }
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("manifest: ", e.what()));
  } catch (const std::out_of_range& e) {
    return absl::InvalidArgumentError(absl::StrCat("manifest: ", e.what()));
  }
  // Consistency: the layout must be exactly what AssignPartitionLayout produces.
  if (m.world_size < 1 || m.world_size > kMaxManifestWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("manifest.world_size: ", m.world_size,
                                                   " is not in [1, ", kMaxManifestWorldSize, "]"));
  }
  if (m.rank < 0 || m.rank >= m.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest.rank: ", m.rank, " outside [0, ", m.world_size, ")"));
  }
  ShardManifest expected = m;
  for (ShardParam& p : expected.params) {
    int64_t numel = 1;
    for (int64_t d : p.shape) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat("manifest.params[", p.name, "].shape: negative dim"));
      if (__builtin_mul_overflow(numel, d, &numel)) {
        return absl::InvalidArgumentError(
            absl::StrCat("manifest.params[", p.name, "].shape: element count overflows int64"));
      }
    }
    if (numel != p.numel) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest.params[", p.name, "].numel: ", p.numel, " != product of shape ", numel));
    }
  }
  // The layout's offsets and the shard's byte count must not overflow either.
  int64_t offset = 0;
  for (const ShardParam& p : expected.params) {
    if (__builtin_add_overflow(offset, PartitionNumel(p.numel, m.world_size), &offset)) {
      return absl::InvalidArgumentError("manifest.params: total partition size overflows int64");
    }
  }
  int64_t section_bytes = 0, shard_bytes = 0;
  if (__builtin_mul_overflow(offset, int64_t{4}, &section_bytes) ||
      __builtin_mul_overflow(section_bytes, static_cast<int64_t>(m.sections.size()), &shard_bytes)) {
    return absl::InvalidArgumentError("manifest: shard size overflows int64");
  }
  AssignPartitionLayout(expected);
  for (size_t i = 0; i < m.params.size(); ++i) {
    if (m.params[i].partition_numel != expected.params[i].partition_numel ||
        m.params[i].partition_offset != expected.params[i].partition_offset) {
      return absl::InvalidArgumentError(absl::StrCat("manifest.params[", m.params[i].name,
                                                     "]: partition layout inconsistent with world_size ",
                                                     m.world_size));
    }
  }
  if (expected.section_numel != m.section_numel) {
    return absl::InvalidArgumentError("manifest.section_numel: inconsistent with params");
  }
  if (m.shard_bytes != shard_bytes) {
    return absl::InvalidArgumentError("manifest.shard_bytes: != sections * section_numel * 4");
  }
  return m;
}

absl::Status WriteShard(const std::string& step_dir, ShardManifest m,
                        absl::Span<const float* const> section_data) {
  if (section_data.size() != m.sections.size()) {
    return absl::InvalidArgumentError(absl::StrCat("WriteShard: ", section_data.size(),
                                                   " section buffers for ", m.sections.size(),
                                                   " sections"));
  }
  const int64_t n = m.section_numel;
  return WriteShardPieces(step_dir, std::move(m), std::vector<int64_t>{n},
                          [&](size_t section, size_t, int64_t, int64_t count, float* dst) {
                            std::memcpy(dst, section_data[section], count * sizeof(float));
                            return absl::OkStatus();
                          });
}

namespace {

absl::Status CheckPieces(const ShardManifest& m, absl::Span<const int64_t> ends,
                         int64_t* largest) {
  int64_t prev = 0;
  *largest = 0;
  for (int64_t e : ends) {
    if (e <= prev) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard pieces: end ", e, " after ", prev, " is not ascending"));
    }
    *largest = std::max(*largest, e - prev);
    prev = e;
  }
  if (prev != m.section_numel) {
    return absl::InvalidArgumentError(absl::StrCat("shard pieces end at ", prev,
                                                   ", the section has ", m.section_numel));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// `path` (rank `rank`'s file) opened for reading: a regular file of `bytes` bytes, or DATA_LOSS.
absl::StatusOr<ScopedFd> OpenRegularFileOfSize(const std::string& path, int32_t rank,
                                               int64_t bytes) {
  // O_NONBLOCK: a FIFO planted as a shard must not block the reader (it is refused below).
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) {
    if (errno == ENOENT) {
      return absl::DataLossError(absl::StrCat(path, " (rank ", rank, "): missing"));
    }
    return ErrnoError(absl::StrCat("cannot open (rank ", rank, ")"), path);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError("cannot stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::DataLossError(absl::StrCat(path, " (rank ", rank, "): not a regular file"));
  }
  if (st.st_size != bytes) {
    return absl::DataLossError(absl::StrCat(path, " (rank ", rank, "): ", st.st_size,
                                            " bytes, manifest says ", bytes));
  }
  return fd;
}

}  // namespace

absl::StatusOr<ScopedFd> OpenShardFile(const std::string& step_dir, const ShardManifest& m) {
  return OpenRegularFileOfSize(absl::StrCat(step_dir, "/", ShardFileName(m.rank)), m.rank,
                               m.shard_bytes);
}

absl::StatusOr<ScopedFd> OpenSideFile(const std::string& step_dir, int32_t rank,
                                      const SideFile& want) {
  return OpenRegularFileOfSize(absl::StrCat(step_dir, "/", want.name), rank, want.bytes);
}

absl::Status CheckSideFileData(const std::string& path, int32_t rank, const SideFile& want,
                               absl::string_view data) {
  if (static_cast<int64_t>(data.size()) != want.bytes) {
    return absl::DataLossError(absl::StrCat(path, " (rank ", rank, "): ", data.size(),
                                            " bytes, manifest says ", want.bytes));
  }
  const uint32_t crc = Crc32(0, data.data(), data.size());
  if (crc != want.crc32) {
    return absl::DataLossError(absl::StrFormat("%s (rank %d): CRC-32 %08x, manifest says %08x",
                                               path, rank, crc, want.crc32));
  }
  return absl::OkStatus();
}

absl::Status WriteShardPieces(const std::string& step_dir, ShardManifest m,
                              absl::Span<const int64_t> piece_ends,
                              const ShardPieceProducer& produce) {
  int64_t largest = 0;
  if (m.section_numel > 0) RETURN_IF_ERROR(CheckPieces(m, piece_ends, &largest));
  RETURN_IF_ERROR(MakeDirs(step_dir));
  ASSIGN_OR_RETURN(AtomicFileWriter writer,
                   AtomicFileWriter::Open(absl::StrCat(step_dir, "/", ShardFileName(m.rank))));
  uint32_t crc = Crc32(0, nullptr, 0);
  std::vector<float> buf(static_cast<size_t>(largest));
  for (size_t s = 0; s < m.sections.size() && m.section_numel > 0; ++s) {
    int64_t begin = 0;
    for (size_t k = 0; k < piece_ends.size(); ++k) {
      const int64_t count = piece_ends[k] - begin;
      RETURN_IF_ERROR(produce(s, k, begin, count, buf.data()));
      const size_t bytes = static_cast<size_t>(count) * sizeof(float);
      RETURN_IF_ERROR(writer.Append(buf.data(), bytes));
      crc = Crc32(crc, buf.data(), bytes);
      begin = piece_ends[k];
    }
  }
  m.shard_bytes = writer.bytes_written();
  m.shard_crc32 = crc;
  RETURN_IF_ERROR(writer.Commit());
  return WriteFileAtomically(absl::StrCat(step_dir, "/", ManifestFileName(m.rank)),
                             ManifestToJson(m));
}

absl::Status ReadShardPieces(const std::string& step_dir, const ShardManifest& m,
                             absl::Span<const int64_t> piece_ends,
                             const ShardPieceConsumer& consume) {
  int64_t largest = 0;
  if (m.section_numel > 0) RETURN_IF_ERROR(CheckPieces(m, piece_ends, &largest));
  const std::string path = absl::StrCat(step_dir, "/", ShardFileName(m.rank));
  ASSIGN_OR_RETURN(ScopedFd file, OpenShardFile(step_dir, m));
  const int fd = file.get();
  const int64_t want = static_cast<int64_t>(m.sections.size()) * m.section_numel * 4;
  if (m.shard_bytes != want) {
    return absl::DataLossError(absl::StrCat(path, " (rank ", m.rank, "): manifest says ",
                                            m.shard_bytes, " bytes but ", m.sections.size(),
                                            " sections of ", m.section_numel, " floats"));
  }
  const int64_t file_bytes = m.shard_bytes;
  auto crc_mismatch = [&](uint32_t crc, const char* when) {
    return absl::DataLossError(absl::StrFormat("%s (rank %d): CRC-32 %08x, manifest says %08x%s",
                                               path, m.rank, crc, m.shard_crc32, when));
  };
  // Pass 1: verify before anything is handed out.
  {
    std::vector<char> chunk(std::min<int64_t>(file_bytes, 4 << 20));
    uint32_t crc = Crc32(0, nullptr, 0);
    for (int64_t off = 0; off < file_bytes;) {
      const size_t n = static_cast<size_t>(std::min<int64_t>(chunk.size(), file_bytes - off));
      RETURN_IF_ERROR(PreadExactly(fd, chunk.data(), n, off, path));
      crc = Crc32(crc, chunk.data(), n);
      off += static_cast<int64_t>(n);
    }
    if (crc != m.shard_crc32) return crc_mismatch(crc, "");
  }
  // Pass 2: the pieces.
  std::vector<float> buf(static_cast<size_t>(largest));
  uint32_t crc = Crc32(0, nullptr, 0);
  for (size_t s = 0; s < m.sections.size() && m.section_numel > 0; ++s) {
    int64_t begin = 0;
    for (size_t k = 0; k < piece_ends.size(); ++k) {
      const int64_t count = piece_ends[k] - begin;
      const size_t bytes = static_cast<size_t>(count) * sizeof(float);
      const off_t at = static_cast<off_t>((static_cast<int64_t>(s) * m.section_numel + begin) * 4);
      RETURN_IF_ERROR(PreadExactly(fd, buf.data(), bytes, at, path));
      crc = Crc32(crc, buf.data(), bytes);
      RETURN_IF_ERROR(consume(s, k, begin, count, buf.data()));
      begin = piece_ends[k];
    }
  }
  if (crc != m.shard_crc32) return crc_mismatch(crc, " on the second read (changed meanwhile)");
  return absl::OkStatus();
}

absl::StatusOr<ShardManifest> ReadManifest(const std::string& step_dir, int32_t rank) {
  std::string path = absl::StrCat(step_dir, "/", ManifestFileName(rank));
  ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path, kMaxManifestBytes));
  // A manifest file that does not parse, or names another rank, is a damaged checkpoint
  // (DATA_LOSS: the trainer exits 65, and the scheduler skips the step for an older one), not a
  // configuration error: ManifestFromJson's INVALID_ARGUMENT is about bytes, here about a file.
  auto m = ManifestFromJson(text);
  if (!m.ok()) {
    return absl::DataLossError(absl::StrCat(path, ": ", m.status().message()));
  }
  if (m->rank != rank) {
    return absl::DataLossError(absl::StrCat(path, ": manifest.rank is ", m->rank));
  }
  return m;
}

absl::StatusOr<std::vector<float>> ReadShardVerified(const std::string& step_dir,
                                                     const ShardManifest& m) {
  std::vector<float> out;
  RETURN_IF_ERROR(ReadShardPieces(
      step_dir, m, std::vector<int64_t>{m.section_numel},
      [&](size_t section, size_t, int64_t offset, int64_t count, const float* src) {
        // Sized only now: the file's size has been checked against the manifest.
        if (out.empty()) out.resize(m.sections.size() * static_cast<size_t>(m.section_numel));
        std::memcpy(out.data() + section * m.section_numel + offset, src, count * sizeof(float));
        return absl::OkStatus();
      }));
  return out;
}

absl::StatusOr<int64_t> SectionOffset(const ShardManifest& m, const std::string& section) {
  for (size_t i = 0; i < m.sections.size(); ++i) {
    if (m.sections[i] == section) return static_cast<int64_t>(i) * m.section_numel;
  }
  return absl::NotFoundError(absl::StrCat("shard has no section '", section, "'"));
}

}  // namespace loom::storage
