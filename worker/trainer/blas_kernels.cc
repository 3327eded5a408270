#include "worker/trainer/blas_kernels.h"

#include <dlfcn.h>

#include "absl/strings/match.h"

namespace loom::trainer {

CpuFeatures DetectCpuFeatures() {
  __builtin_cpu_init();
  CpuFeatures f;
  f.avx512_skx = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                 __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                 __builtin_cpu_supports("avx512vl");
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return f;
}

std::string LoadedBlasCoreName() {
  using CoreName = char* (*)();
  auto get = reinterpret_cast<CoreName>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (get == nullptr) return "";
  const char* name = get();
  return name == nullptr ? "" : name;
}

std::optional<std::string> BlasCoreTypeFor(absl::string_view detected, const CpuFeatures& cpu) {
  // Prescott is OpenBLAS's fallback for x86-64 CPUs it does not recognise (driver/others/
  // dynamic.c); a CPU with AVX2 is not one.
  if (!absl::EqualsIgnoreCase(detected, "Prescott")) return std::nullopt;
  if (cpu.avx512_skx) return "SKYLAKEX";
  if (cpu.avx2_fma) return "HASWELL";
  return std::nullopt;
}

}  // namespace loom::trainer
