#include "storage/checkpoint/tokenizer_export.h"

#include <sys/stat.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace loom {

namespace {

constexpr char kModel[] = "tokenizer.model";
constexpr char kConfig[] = "tokenizer_config.json";
constexpr int64_t kMaxBytes = int64_t{256} << 20;

}  // namespace

absl::StatusOr<std::vector<std::string>> StageTokenizerFiles(const std::string& checkpoint_dir,
                                                             const std::string& staging,
                                                             nlohmann::json* config) {
  const std::string model_path = absl::StrCat(checkpoint_dir, "/", kModel);
  struct stat st;
  if (::stat(model_path.c_str(), &st) != 0) return std::vector<std::string>{};
  const std::string config_path = absl::StrCat(checkpoint_dir, "/", kConfig);
  ASSIGN_OR_RETURN(std::string model, ReadRegularFile(model_path, kMaxBytes));
  absl::StatusOr<std::string> tok_text = ReadRegularFile(config_path, kMaxBytes);
  if (!tok_text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        config_path, ": missing beside ", model_path, " (", tok_text.status().message(), ")"));
  }
  nlohmann::json tok = nlohmann::json::parse(*tok_text, nullptr, /*allow_exceptions=*/false);
  if (tok.is_discarded() || !tok.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a JSON object"));
  }
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    auto it = tok.find(key);
    if (it == tok.end() || it->is_null()) {
      config->erase(key);
    } else if (it->is_number_integer()) {
      (*config)[key] = *it;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path, ": ", key, " is not an integer or null"));
    }
  }
  RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(staging, "/", kModel), model));
  RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(staging, "/", kConfig), *tok_text));
  return std::vector<std::string>{kConfig, kModel};
}

}  // namespace loom
