#include "worker/gpu_inventory.h"

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"

namespace loom::worker {
namespace {

// The kind of a product name; UNSPECIFIED if none we know. GH200 before H200: "GH200" contains
// "H200".
loom::v1::AcceleratorKind KindOfProduct(const std::string& name) {
  if (absl::StrContains(name, "GH200")) return loom::v1::ACCELERATOR_KIND_GH200;
  if (absl::StrContains(name, "H200")) return loom::v1::ACCELERATOR_KIND_H200;
  if (absl::StrContains(name, "H100")) return loom::v1::ACCELERATOR_KIND_H100;
  return loom::v1::ACCELERATOR_KIND_UNSPECIFIED;
}

// The executable `name` names: itself if it has a '/', else the first PATH entry holding it.
std::string FindExecutable(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = ::getenv("PATH");
  if (path == nullptr) return "";
  for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(dir, "/", name);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

}  // namespace

absl::StatusOr<GpuInventory> ParseNvidiaSmiCsv(const std::string& text, const std::string& source) {
  GpuInventory inv;
  std::set<int> indices;
  int line_no = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_no;
    absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty()) continue;
    auto bad = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", line_no, ": ", what, " in '", line, "'"));
    };
    std::vector<std::string> cols = absl::StrSplit(line, ',');
    if (cols.size() != 4) {
      return bad(absl::StrCat("expected 4 columns (index, uuid, name, memory.total), got ",
                              cols.size()));
    }
    for (std::string& c : cols) absl::StripAsciiWhitespace(&c);
    int index = -1;
    if (!absl::SimpleAtoi(cols[0], &index) || index < 0) {
      return bad(absl::StrCat("index '", cols[0], "' is not a non-negative integer"));
    }
    if (!indices.insert(index).second) return bad(absl::StrCat("index ", index, " repeats"));
    if (!absl::StartsWith(cols[1], "GPU-") || cols[1].size() <= 4) {
      return bad(absl::StrCat("uuid '", cols[1], "' does not start with GPU-"));
    }
    int64_t mib = 0;
    if (!absl::SimpleAtoi(cols[3], &mib) || mib <= 0) {
      return bad(absl::StrCat("memory.total '", cols[3], "' is not a positive number of MiB"));
    }
    const loom::v1::AcceleratorKind kind = KindOfProduct(cols[2]);
    if (kind == loom::v1::ACCELERATOR_KIND_UNSPECIFIED) {
      return absl::FailedPreconditionError(absl::StrCat(
          source, ":", line_no, ": accelerator '", cols[2],
          "' is not a kind the scheduler knows (H100, H200, GH200)"));
    }
    if (inv.devices.empty()) {
      inv.kind = kind;
      inv.model = cols[2];
    } else if (cols[2] != inv.model) {
      return absl::FailedPreconditionError(absl::StrCat(
          source, ":", line_no, ": accelerator '", cols[2], "' differs from line 1's '",
          inv.model, "' (a node registers one accelerator kind)"));
    }
    loom::v1::AcceleratorDevice d;
    d.set_index(index);
    d.set_uuid(cols[1]);
    d.set_name(cols[2]);
    d.set_memory_bytes(mib << 20);
    if (inv.min_memory_bytes == 0 || d.memory_bytes() < inv.min_memory_bytes) {
      inv.min_memory_bytes = d.memory_bytes();
    }
    inv.devices.push_back(std::move(d));
  }
  std::sort(inv.devices.begin(), inv.devices.end(),
            [](const auto& a, const auto& b) { return a.index() < b.index(); });
  return inv;
}

absl::StatusOr<GpuInventory> ReadGpuInventoryFile(const std::string& path) {
  absl::StatusOr<std::string> text = loom::ReadFile(path);
  if (!text.ok()) {
    return absl::NotFoundError(
        absl::StrCat("--gpu_inventory_file: cannot read ", path, ": ", text.status().message()));
  }
  return ParseNvidiaSmiCsv(*text, path);
}

absl::StatusOr<GpuInventory> DetectGpuInventory(const std::string& nvidia_smi) {
  const std::string exe = FindExecutable(nvidia_smi);
  if (exe.empty()) return GpuInventory{};  // no nvidia-smi: a CPU node
  if (exe.find('\'') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("--nvidia_smi: ", exe, " contains a quote"));
  }
  const std::string command = absl::StrCat("'", exe, "' ", kNvidiaSmiQuery, " 2>/dev/null");
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    return absl::InternalError(absl::StrCat("cannot run ", exe));
  }
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = ::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = ::pclose(pipe);
  const bool exited_ok = status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!exited_ok) {
    if (absl::StripAsciiWhitespace(out).empty()) return GpuInventory{};  // no devices
    return absl::InternalError(absl::StrCat(exe, " ", kNvidiaSmiQuery, " failed (wait status ",
                                            status, "): ", out.substr(0, 200)));
  }
  return ParseNvidiaSmiCsv(out, exe);
}

void ApplyGpuInventory(const GpuInventory& gpus, loom::v1::NodeInventory* node) {
  if (gpus.devices.empty()) return;
  node->set_accelerator(gpus.kind);
  node->set_slots(static_cast<int32_t>(gpus.devices.size()));
  node->set_accelerator_memory_bytes(gpus.min_memory_bytes);
  node->clear_devices();
  for (const auto& d : gpus.devices) *node->add_devices() = d;
  if (gpus.kind == loom::v1::ACCELERATOR_KIND_GH200) node->set_superchip(true);
}

}  // namespace loom::worker
