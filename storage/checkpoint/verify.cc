#include "storage/checkpoint/verify.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "storage/checkpoint/consolidate.h"
#include "storage/checkpoint/shard_format.h"
#include "storage/safetensors/safetensors.h"

namespace loom::storage {
namespace {

using nlohmann::json;

constexpr char kIndexName[] = "model.safetensors.index.json";
constexpr char kSingleName[] = "model.safetensors";

bool StatIs(const std::string& path, bool dir) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  return dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode);
}

std::vector<std::string> DirNames(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (struct dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}


absl::StatusOr<VerifyReport> VerifySharded(const std::string& dir) {
  const std::string index_path = absl::StrCat(dir, "/", kIndexName);
  ASSIGN_OR_RETURN(std::string text, ReadFile(index_path));
  json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": ", what));
  };
  if (index.is_discarded() || !index.is_object()) return bad("not a JSON object");
  auto meta = index.find("metadata");
  if (meta == index.end() || !meta->is_object()) return bad("no \"metadata\" object");
  auto total = meta->find("total_size");
  if (total == meta->end() || !total->is_number_integer() || total->get<int64_t>() < 0) {
    return bad("metadata.total_size is missing or not a non-negative integer");
  }
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) return bad("no \"weight_map\" object");
  std::map<std::string, std::string> weight_map;
  std::set<std::string> files;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string()) {
      return bad(absl::StrCat("weight_map[\"", it.key(), "\"] is not a file name string"));
    }
    const std::string file = it.value().get<std::string>();
    if (file.empty() || absl::StrContains(file, '/') || file == "." || file == "..") {
      return bad(absl::StrCat("weight_map[\"", it.key(), "\"] = \"", file,
                              "\" is not a plain file name"));
    }
    weight_map[it.key()] = file;
    files.insert(file);
  }

  VerifyReport report;
  report.kind = "sharded safetensors";
  report.files.push_back(index_path);
  std::map<std::string, std::string> found;  // tensor -> file holding it
  for (const std::string& file : files) {
    const std::string path = absl::StrCat(dir, "/", file);
    if (!StatIs(path, /*dir=*/false)) {
      return absl::DataLossError(
          absl::StrCat(index_path, ": weight_map names ", file, ", which does not exist"));
    }
    ASSIGN_OR_RETURN(VerifyReport one, VerifySafetensorsFile(path));
    auto reader = safetensors::Reader::Open(path);
    if (!reader.ok()) return reader.status();
    for (const safetensors::TensorEntry& e : (*reader)->tensors()) {
      auto prev = found.find(e.name);
      if (prev != found.end()) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", e.name, "' is stored twice: in ",
                                                       prev->second, " and in ", file));
      }
      found[e.name] = file;
      auto mapped = weight_map.find(e.name);
      if (mapped == weight_map.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": tensor '", e.name, "' is not in the weight_map of ", kIndexName));
      }
      if (mapped->second != file) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", e.name, "' is in ",
                                                       file, " but weight_map says ",
                                                       mapped->second));
      }
    }
    report.files.push_back(path);
    report.num_tensors += one.num_tensors;
    report.tensor_bytes += one.tensor_bytes;
  }
  for (const auto& [name, file] : weight_map) {
    if (found.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map says tensor '",
                                                     name, "' is in ", file,
                                                     ", which has no such tensor"));
    }
  }
  if (total->get<int64_t>() != report.tensor_bytes) {
    return bad(absl::StrCat("metadata.total_size is ", total->get<int64_t>(),
                            " but the shards hold ", report.tensor_bytes, " bytes of tensors"));
  }
  for (const std::string& n : DirNames(dir)) {
    if (absl::StartsWith(n, "model-") && absl::EndsWith(n, ".safetensors") &&
        absl::StrContains(n, "-of-") && files.count(n) == 0) {
      return bad(absl::StrCat("shard file ", n, " in the directory is not in the weight_map"));
    }
  }
  return report;
}

}  // namespace

absl::StatusOr<VerifyReport> VerifySafetensorsFile(const std::string& path) {
  ScopedFd file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  const int fd = file.get();
  if (fd < 0) return ErrnoError("cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError("cannot stat", path);
  const int64_t size = st.st_size;
  if (size < 8) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", size, " bytes, too short for the 8-byte header length"));
  }
  unsigned char prefix[8];
  RETURN_IF_ERROR(PreadExactly(fd, prefix, 8, 0, path));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];
  if (n > static_cast<uint64_t>(safetensors::kMaxHeaderBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", n, " exceeds ",
                                                   safetensors::kMaxHeaderBytes));
  }
  if (8 + static_cast<int64_t>(n) > size) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", n,
                                            " runs past the end of the file (", size, " bytes)"));
  }
  std::string header(static_cast<size_t>(8 + n), '\0');
  RETURN_IF_ERROR(PreadExactly(fd, header.data(), header.size(), 0, path));
  header.erase(0, 8);
  if (header.empty() || header.front() != '{') {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: header does not start with '{' (first byte 0x%02x)", path,
        header.empty() ? 0 : static_cast<unsigned char>(header.front())));
  }
  size_t end = header.size();
  while (end > 0 && header[end - 1] == ' ') --end;
  if (end == 0 || header[end - 1] != '}') {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: header padding after the JSON object must be spaces (0x20); byte 0x%02x at header "
        "offset %d",
        path, end == 0 ? 0 : static_cast<unsigned char>(header[end - 1]), end - 1));
  }
  if (n % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": header length ", n, " is not a multiple of 8 (not padded as the reference writer "
        "pads it; the data buffer is misaligned)"));
  }
  ASSIGN_OR_RETURN(safetensors::Header h,
                   safetensors::ParseHeader(header, size - 8 - static_cast<int64_t>(n), path));
  VerifyReport report;
  report.kind = "safetensors";
  report.files.push_back(path);
  report.num_tensors = static_cast<int64_t>(h.tensors.size());
  report.tensor_bytes = h.data_bytes;
  return report;
}

absl::StatusOr<VerifyReport> VerifyPath(const std::string& path) {
  if (StatIs(path, /*dir=*/false)) return VerifySafetensorsFile(path);
  if (!StatIs(path, /*dir=*/true)) return absl::NotFoundError(absl::StrCat("no such file or directory: ", path));
  if (StatIs(absl::StrCat(path, "/", kIndexName), false)) return VerifySharded(path);
  if (StatIs(absl::StrCat(path, "/", kSingleName), false)) {
    return VerifySafetensorsFile(absl::StrCat(path, "/", kSingleName));
  }
  bool has_manifest = false;
  for (const std::string& n : DirNames(path)) {
    if (absl::StartsWith(n, "rank_") && absl::EndsWith(n, ".manifest.json")) has_manifest = true;
  }
  if (has_manifest) {
    ASSIGN_OR_RETURN(CheckpointInfo info, VerifyCheckpointDir(path));
    VerifyReport report;
    report.kind = "loom checkpoint";
    for (int32_t r : info.ranks_reported) {
      report.files.push_back(absl::StrCat(info.path, "/", ShardFileName(r)));
    }
    report.tensor_bytes = info.total_bytes;
    return report;
  }
  return absl::NotFoundError(absl::StrCat(
      path, ": nothing to verify (no ", kIndexName, ", ", kSingleName, " or rank manifests)"));
}

}  // namespace loom::storage
