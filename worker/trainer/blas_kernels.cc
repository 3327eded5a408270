#include "worker/trainer/blas_kernels.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

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

namespace {
constexpr char kDetected[] = "LOOM_OPENBLAS_DETECTED_CORE";  // set only across our own exec
}  // namespace

void ReexecForBlasKernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;  // the user's choice, or done
  const std::string detected = LoadedBlasCoreName();
  const std::optional<std::string> core = BlasCoreTypeFor(detected, DetectCpuFeatures());
  if (!core.has_value()) return;
  ::setenv("OPENBLAS_CORETYPE", core->c_str(), /*overwrite=*/1);
  ::setenv(kDetected, detected.c_str(), /*overwrite=*/1);
  // The binary's own path, not /proc/self/exe: the process keeps its name (ps, pgrep).
  char self[4096];
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len > 0) {
    self[len] = '\0';
    ::execv(self, argv);
  }
  ::unsetenv("OPENBLAS_CORETYPE");  // exec failed: go on with the detected kernels
  ::unsetenv(kDetected);
}

std::string BlasReport() {
  const std::string core = LoadedBlasCoreName();
  if (core.empty()) return "";
  std::string line = absl::StrCat("BLAS: OpenBLAS core ", core);
  if (const char* detected = std::getenv(kDetected); detected != nullptr) {
    const char* set = std::getenv("OPENBLAS_CORETYPE");
    absl::StrAppend(&line, " (OPENBLAS_CORETYPE=", set != nullptr ? set : "",
                    " set by loom-trainer: OpenBLAS did not recognise this CPU and chose ",
                    detected, ")");
    ::unsetenv(kDetected);
  }
  return line;
}

}  // namespace loom::trainer
