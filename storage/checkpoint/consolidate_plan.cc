// Consolidation options (ParseShardSize, NormalizeOutputDtype), bf16 rounding and the
// huggingface_hub shard plan (PlanShards).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "storage/checkpoint/consolidate_internal.h"

namespace loom::storage {

using consolidate_internal::kSafetensorsName;

absl::StatusOr<int64_t> ParseShardSize(absl::string_view text) {
  std::string t(absl::StripAsciiWhitespace(text));
  if (t.empty()) return 0;
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_shard_size: '", text, "' is not a size (e.g. \"5GB\", \"500MB\", \"1.5GiB\", bytes)"));
  };
  size_t i = 0;
  while (i < t.size() && (absl::ascii_isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  const std::string number = t.substr(0, i);
  const std::string unit = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(t.substr(i)));
  static const std::map<std::string, double> kUnits = {
      {"", 1},          {"B", 1},           {"KB", 1e3},        {"MB", 1e6},
      {"GB", 1e9},      {"TB", 1e12},       {"KIB", 1024.0},    {"MIB", 1048576.0},
      {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  auto u = kUnits.find(unit);
  if (number.empty() || u == kUnits.end() || std::count(number.begin(), number.end(), '.') > 1) {
    return bad();
  }
  double value = 0;
  if (!absl::SimpleAtod(number, &value) || !std::isfinite(value)) return bad();
  const double bytes = value * u->second;
  if (bytes >= 9.2e18) return bad();
  if (value > 0 && bytes < 1) return bad();
  return static_cast<int64_t>(bytes);
}

absl::StatusOr<std::string> NormalizeOutputDtype(absl::string_view text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t.empty() || t == "f32" || t == "fp32" || t == "float32") return std::string("F32");
  if (t == "bf16" || t == "bfloat16") return std::string("BF16");
  return absl::InvalidArgumentError(
      absl::StrCat("dtype: '", text, "' is not an output dtype (fp32 or bf16)"));
}

uint16_t Fp32ToBf16(float value) {
  if (std::isnan(value)) return 0x7FC0;
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint32_t rounding_bias = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

std::vector<ShardPlanFile> PlanShards(const std::vector<std::pair<std::string, int64_t>>& tensors,
                                      int64_t max_shard_size_bytes) {
  std::vector<ShardPlanFile> shards;
  if (max_shard_size_bytes <= 0) {
    ShardPlanFile one;
    for (const auto& [name, bytes] : tensors) {
      one.tensors.push_back(name);
      one.tensor_bytes += bytes;
    }
    shards.push_back(std::move(one));
  } else {
    ShardPlanFile current;
    for (const auto& [name, bytes] : tensors) {
      if (bytes > max_shard_size_bytes) {
        shards.push_back({"", {name}, bytes});
        continue;
      }
      if (current.tensor_bytes + bytes > max_shard_size_bytes) {
        shards.push_back(std::move(current));
        current = ShardPlanFile();
      }
      current.tensors.push_back(name);
      current.tensor_bytes += bytes;
    }
    if (!current.tensors.empty() || shards.empty()) shards.push_back(std::move(current));
  }
  if (shards.size() == 1) {
    shards[0].file_name = kSafetensorsName;
  } else {
    for (size_t k = 0; k < shards.size(); ++k) {
      shards[k].file_name =
          absl::StrFormat("model-%05d-of-%05d.safetensors", k + 1, shards.size());
    }
  }
  return shards;
}

std::string DefaultConsolidationDir(const std::string& checkpoint_dir, int64_t step,
                                    const std::string& dtype) {
  return absl::StrCat(checkpoint_dir, "/", StepDirName(step), dtype == "BF16" ? "/hf-bf16" : "/hf");
}

}  // namespace loom::storage
