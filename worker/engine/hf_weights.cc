#include "worker/engine/hf_weights.h"

#include <sys/stat.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace loom::engine {

namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HfWeights>> HfWeights::Open(const std::string& dir) {
  std::unique_ptr<HfWeights> w(new HfWeights());
  w->dir_ = dir;
  std::vector<std::string> files;
  const std::string index_path = absl::StrCat(dir, "/model.safetensors.index.json");
  if (Exists(index_path)) {
    ASSIGN_OR_RETURN(std::string text, ReadRegularFile(index_path, 64 << 20));
    nlohmann::json index = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": no weight_map object"));
    }
    std::map<std::string, std::string> weight_map;
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": weight_map[", name, "] is not a file name in ", dir));
      }
      weight_map[name] = file.get<std::string>();
    }
    for (const auto& [name, file] : weight_map) {
      if (!w->files_.count(file)) {
        ASSIGN_OR_RETURN(w->files_[file], safetensors::Reader::Open(absl::StrCat(dir, "/", file)));
      }
      const safetensors::Reader* reader = w->files_.at(file).get();
      if (reader->Find(name) == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": ", name, " is mapped to ",
                                                       file, ", which does not hold it"));
      }
      w->by_tensor_[name] = reader;
    }
    return w;
  }
  const std::string single = absl::StrCat(dir, "/model.safetensors");
  if (!Exists(single)) {
    return absl::NotFoundError(absl::StrCat(
        "model.init_from: ", dir, " holds neither model.safetensors nor model.safetensors.index.json"));
  }
  ASSIGN_OR_RETURN(w->files_["model.safetensors"], safetensors::Reader::Open(single));
  const safetensors::Reader* reader = w->files_.at("model.safetensors").get();
  for (const safetensors::TensorEntry& e : reader->tensors()) w->by_tensor_[e.name] = reader;
  return w;
}

absl::Status HfWeights::ReadRange(const std::string& name, const std::vector<int64_t>& shape,
                                  int64_t begin, int64_t count, float* dst) const {
  auto it = by_tensor_.find(name);
  if (it == by_tensor_.end()) {
    return absl::NotFoundError(absl::StrCat("model.init_from: ", dir_, " has no tensor ", name));
  }
  const safetensors::TensorEntry& e = *it->second->Find(name);
  if (e.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.init_from: ", name, " has shape [", absl::StrJoin(e.shape, ","), "], model.config wants [",
        absl::StrJoin(shape, ","), "]"));
  }
  if (count <= 0) return absl::OkStatus();
  if (e.dtype == "F32") {
    return it->second->ReadTensorRange(e, begin * 4, dst, static_cast<size_t>(count) * 4);
  }
  if (e.dtype == "BF16") {
    std::vector<uint16_t> half(static_cast<size_t>(count));
    RETURN_IF_ERROR(it->second->ReadTensorRange(e, begin * 2, half.data(), half.size() * 2));
    for (size_t i = 0; i < half.size(); ++i) {
      const uint32_t bits = static_cast<uint32_t>(half[i]) << 16;  // bf16 is fp32's top half
      std::memcpy(&dst[i], &bits, sizeof(bits));
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("model.init_from: ", name, " is ", e.dtype, "; only F32 and BF16 are read"));
}

}  // namespace loom::engine
