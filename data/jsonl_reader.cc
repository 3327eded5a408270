#include "data/jsonl_reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/utf8.h"

namespace loom::data {

absl::StatusOr<std::vector<std::string>> ParseJsonlDocuments(absl::string_view contents,
                                                             const std::string& file,
                                                             const std::string& text_field) {
  std::vector<std::string> docs;
  size_t pos = 0;
  for (int64_t line_no = 1; pos < contents.size(); ++line_no) {
    size_t end = contents.find('\n', pos);
    if (end == absl::string_view::npos) end = contents.size();
    absl::string_view line = contents.substr(pos, end - pos);
    const size_t line_start = pos;
    pos = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == absl::string_view::npos) continue;
    auto fail = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset.path: ", file, ":", line_no, ": ", what));
    };
    if (size_t bad = FirstInvalidUtf8(line); bad != absl::string_view::npos) {
      return fail(absl::StrCat("invalid UTF-8 at byte offset ", line_start + bad));
    }
    nlohmann::json j = nlohmann::json::parse(line.begin(), line.end(), nullptr,
                                             /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      try {
        nlohmann::json rethrown = nlohmann::json::parse(line.begin(), line.end());
        (void)rethrown;
      } catch (const nlohmann::json::parse_error& e) {
        return fail(absl::StrCat("invalid JSON: ", e.what()));
      }
      return fail("invalid JSON");
    }
    if (!j.is_object()) return fail("not a JSON object");
    auto it = j.find(text_field);
    if (it == j.end() || !it->is_string()) {
      return fail(absl::StrCat("no string field \"", text_field, "\""));
    }
    docs.push_back(it->get<std::string>());
  }
  return docs;
}

absl::StatusOr<std::vector<std::string>> ListJsonlFiles(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("dataset.path: ", path, " does not exist"));
  }
  if (!S_ISDIR(st.st_mode)) return std::vector<std::string>{path};
  absl::StatusOr<std::vector<std::string>> listed = ListRegularFiles(
      path, [](absl::string_view name) { return absl::EndsWith(name, ".jsonl"); });
  if (!listed.ok()) {
    return absl::NotFoundError(absl::StrCat("dataset.path: cannot open ", path));
  }
  std::vector<std::string> files = std::move(*listed);
  if (files.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset.path: ", path, " holds no .jsonl files"));
  }
  return files;
}

}  // namespace loom::data
