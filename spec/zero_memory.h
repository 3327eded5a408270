// Per-rank model-state memory of a ZeRO job: the formulas of ZeRO (Rajbhandari et al., "ZeRO:
// Memory Optimizations Toward Training Trillion Parameter Models", SC'20, §5.1 and Figure 1),
// in two forms:
//   * PaperZeroModelStateBytes: the paper's mixed-precision Adam accounting, Ψ parameters, N
//     data-parallel ranks, K = 12 bytes of optimizer state per parameter (fp32 master, m, v):
//       stage 0 (DDP)  (2 + 2 + K)Ψ          stage 2 (P_os+g)  2Ψ + (2 + K)Ψ/N
//       stage 1 (P_os) 4Ψ + KΨ/N             stage 3 (P_os+g+p) (4 + K)Ψ/N
//   * ZeroModelStateBytes: Loom's own layouts (worker/engine/zero/zero_provider.cc, zero_grads.cc;
//     measured per rank by worker/trainer:zero_stages_test), computed per parameter tensor so
//     the padding of each partition counts. With d = bytes of the parameter dtype (4 fp32,
//     2 bf16/fp16), P = Σ ceil(n_i/N) (this rank's partition elements) and gradients always
//     accumulated in fp32:
//       stage 0: params dΨ, grads 4Ψ,              optimizer 8Ψ (+4Ψ fp32 master unless d = 4)
//       stage 1: params dΨ, grads 4NP + 4P (peak), optimizer 12P (m, v, fp32 master partition)
//       stage 2: params dΨ, grads 4P,              optimizer 12P
//       stage 3: params dP + R, grads 4P,          optimizer 8P (+4P fp32 master unless d = 4)
//     R = Σ d·N·ceil(n_i/N) over persistent tensors (n_i <= stage3_param_persistence_threshold:
//     kept gathered, as DeepSpeed does).
// Device-resident bytes without offload: offload_optimizer / offload_param, activations and
// temporary buffers (all-gather, reduction buckets) are not counted. Units: bytes. Pure and
// thread-safe. Errors: INVALID_ARGUMENT naming the argument (world_size < 1, stage not 0-3,
// dtype bytes not 2 or 4, a negative numel).
#ifndef LOOM_SPEC_ZERO_MEMORY_H_
#define LOOM_SPEC_ZERO_MEMORY_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "spec/ds_config.h"
#include "spec/model_config.h"

namespace loom::spec {

struct ModelStateBytes {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer_states = 0;
  int64_t total() const { return params + grads + optimizer_states; }
};

// The paper's formulas (above) for `psi` parameters on `world_size` ranks, K = 12. Doubles: the
// paper's figures are in these units (e.g. Ψ = 7.5e9, N = 64: 120 GB, 31.4 GB, 16.6 GB, 1.88 GB).
absl::StatusOr<double> PaperZeroModelStateBytes(double psi, int stage, int world_size);

// Loom's layouts (above) for parameter tensors of `param_numels` elements each.
absl::StatusOr<ModelStateBytes> ZeroModelStateBytes(const std::vector<int64_t>& param_numels,
                                                    int stage, int world_size,
                                                    int param_dtype_bytes,
                                                    int64_t persistence_threshold);

// The same for a job: the tensors of LlamaParamSpecs(model), zero_optimization.stage, bf16 or
// fp16 (2 bytes) else fp32, stage3_param_persistence_threshold; world_size = resources.num_ranks.
absl::StatusOr<ModelStateBytes> ZeroModelStateBytes(const LlamaConfig& model,
                                                    const DeepSpeedConfig& ds, int world_size);

}  // namespace loom::spec

#endif  // LOOM_SPEC_ZERO_MEMORY_H_
