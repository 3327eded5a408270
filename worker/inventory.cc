#include "worker/inventory.h"

#include <sys/utsname.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace loom::worker {

absl::StatusOr<std::map<std::string, std::string>> ParseLabels(const std::string& text) {
  std::map<std::string, std::string> labels;
  if (text.empty()) return labels;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    item = absl::StripAsciiWhitespace(item);
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (item.find('=') == absl::string_view::npos || kv.first.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--labels: '", item, "' is not key=value (want k=v,k2=v2)"));
    }
    if (kv.first.size() > 63 || kv.second.size() > 63) {
      return absl::InvalidArgumentError(
          absl::StrCat("--labels: '", kv.first, "': keys and values are at most 63 bytes"));
    }
    if (!labels.emplace(kv.first, kv.second).second) {
      return absl::InvalidArgumentError(absl::StrCat("--labels: key '", kv.first, "' given twice"));
    }
  }
  return labels;
}

std::string NormalizeCpuArch(const std::string& machine) {
  if (machine == "amd64" || machine == "x86_64") return "x86_64";
  if (machine == "arm64" || machine == "aarch64") return "aarch64";
  return machine;
}

std::string DetectCpuArch() {
  struct utsname u;
  if (::uname(&u) != 0) return "";
  return NormalizeCpuArch(u.machine);
}

}  // namespace loom::worker
