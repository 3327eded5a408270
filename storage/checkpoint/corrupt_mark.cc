#include "storage/checkpoint/corrupt_mark.h"

#include <dirent.h>
#include <sys/stat.h>

#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/file_util.h"

namespace loom::storage {
namespace {

using json = nlohmann::json;

struct FileId {
  int64_t ino = 0, size = 0, mtime_ns = 0;
  bool operator==(const FileId& o) const {
    return ino == o.ino && size == o.size && mtime_ns == o.mtime_ns;
  }
};

// Rank shards and manifests of the step ("rank_*"), by name.
std::map<std::string, FileId> RankFiles(const std::string& step_dir) {
  std::map<std::string, FileId> out;
  DIR* d = ::opendir(step_dir.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (!absl::StartsWith(name, "rank_") || absl::StrContains(name, ".tmp")) continue;
    struct stat st;
    if (::stat(absl::StrCat(step_dir, "/", name).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      continue;
    }
    out[name] = FileId{static_cast<int64_t>(st.st_ino), static_cast<int64_t>(st.st_size),
                       static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
  }
  ::closedir(d);
  return out;
}

}  // namespace

absl::Status MarkCheckpointCorrupt(const std::string& step_dir, const std::string& reason) {
  struct stat st;
  if (::stat(step_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint step directory ", step_dir));
  }
  json files = json::object();
  for (const auto& [name, id] : RankFiles(step_dir)) {
    files[name] = {{"ino", id.ino}, {"size", id.size}, {"mtime_ns", id.mtime_ns}};
  }
  json mark = {{"reason", reason},
               {"marked_unix_s", absl::ToUnixSeconds(absl::Now())},
               {"files", std::move(files)}};
  return WriteFileAtomically(absl::StrCat(step_dir, "/", kCorruptMarkFile), mark.dump(2));
}

std::optional<std::string> CorruptMarkReason(const std::string& step_dir) {
  absl::StatusOr<std::string> text =
      ReadRegularFile(absl::StrCat(step_dir, "/", kCorruptMarkFile), 1 << 20);
  if (!text.ok()) return std::nullopt;
  json mark = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (mark.is_discarded() || !mark.is_object() || !mark.contains("files") ||
      !mark["files"].is_object() || !mark.contains("reason") || !mark["reason"].is_string()) {
    return std::nullopt;
  }
  std::map<std::string, FileId> recorded;
  for (const auto& [name, id] : mark["files"].items()) {
    if (!id.is_object()) return std::nullopt;
    recorded[name] = FileId{id.value("ino", int64_t{-1}), id.value("size", int64_t{-1}),
                            id.value("mtime_ns", int64_t{-1})};
  }
  if (recorded.empty() || recorded != RankFiles(step_dir)) return std::nullopt;  // rewritten
  return mark["reason"].get<std::string>();
}

}  // namespace loom::storage
