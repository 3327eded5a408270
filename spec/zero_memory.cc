#include "spec/zero_memory.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace loom::spec {

namespace {

absl::Status CheckStageAndWorld(int stage, int world_size) {
  if (stage < 0 || stage > 3) {
    return absl::InvalidArgumentError(absl::StrCat("stage: ", stage, " is not 0, 1, 2 or 3"));
  }
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world_size: ", world_size, " is < 1"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<double> PaperZeroModelStateBytes(double psi, int stage, int world_size) {
  absl::Status s = CheckStageAndWorld(stage, world_size);
  if (!s.ok()) return s;
  if (!(psi >= 0)) return absl::InvalidArgumentError(absl::StrCat("psi: ", psi, " is < 0"));
  constexpr double kK = 12;  // fp32 master, momentum, variance
  const double n = world_size;
  switch (stage) {
    case 0:
      return (2 + 2 + kK) * psi;
    case 1:
      return 4 * psi + kK * psi / n;
    case 2:
      return 2 * psi + (2 + kK) * psi / n;
    default:
      return (4 + kK) * psi / n;
  }
}

absl::StatusOr<ModelStateBytes> ZeroModelStateBytes(const std::vector<int64_t>& param_numels,
                                                    int stage, int world_size,
                                                    int param_dtype_bytes,
                                                    int64_t persistence_threshold) {
  absl::Status s = CheckStageAndWorld(stage, world_size);
  if (!s.ok()) return s;
  if (param_dtype_bytes != 2 && param_dtype_bytes != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("param_dtype_bytes: ", param_dtype_bytes, " is not 2 or 4"));
  }
  const int64_t n = world_size;
  const int64_t d = param_dtype_bytes;
  const bool fp32 = d == 4;
  int64_t psi = 0;         // Σ n_i
  int64_t part = 0;        // P = Σ ceil(n_i / N)
  int64_t persistent = 0;  // R (stage 3)
  for (size_t i = 0; i < param_numels.size(); ++i) {
    const int64_t numel = param_numels[i];
    if (numel < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("param_numels[", i, "]: ", numel, " is < 0"));
    }
    const int64_t p = (numel + n - 1) / n;
    psi += numel;
    part += p;
    if (numel <= persistence_threshold) persistent += d * n * p;
  }
  ModelStateBytes b;
  switch (stage) {
    case 0:
      b.params = d * psi;
      b.grads = 4 * psi;
      b.optimizer_states = 8 * psi + (fp32 ? 0 : 4 * psi);
      break;
    case 1:
      b.params = d * psi;
      b.grads = 4 * n * part + 4 * part;
      b.optimizer_states = 12 * part;
      break;
    case 2:
      b.params = d * psi;
      b.grads = 4 * part;
      b.optimizer_states = 12 * part;
      break;
    default:
      b.params = d * part + persistent;
      b.grads = 4 * part;
      b.optimizer_states = 8 * part + (fp32 ? 0 : 4 * part);
      break;
  }
  return b;
}

absl::StatusOr<ModelStateBytes> ZeroModelStateBytes(const LlamaConfig& model,
                                                    const DeepSpeedConfig& ds, int world_size) {
  std::vector<int64_t> numels;
  for (const ParamSpec& p : LlamaParamSpecs(model)) numels.push_back(p.numel());
  const int dtype_bytes = ds.bf16_enabled || ds.fp16.enabled ? 2 : 4;
  return ZeroModelStateBytes(numels, ds.zero.stage, world_size, dtype_bytes,
                             ds.zero.stage3_param_persistence_threshold);
}

}  // namespace loom::spec
