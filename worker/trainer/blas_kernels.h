// Which OpenBLAS GEMM kernels a rank runs.
//
// Debian's LibTorch calls the BLAS of the libblas.so.3 alternative, OpenBLAS (DYNAMIC_ARCH) as
// scripts/install_deps.sh installs it, which picks its kernels by CPU model when the library is
// loaded. Debian 12's OpenBLAS 0.3.21 does not know CPUs newer than itself (e.g. Intel family 6
// model 207, Emerald Rapids) and then falls back to its SSE3 "Prescott" kernels: on such a
// machine every GEMM of every rank ran without AVX. Measured on one (docs/benchmarks.md,
// SuperOffload section, 2026-12-03): a 1-rank 12.9M-parameter offload step at 8 tokens took
// 0.076 s with the Prescott kernels and 0.062 s with SKYLAKEX, and the ZeRO-Offload optimizer's
// share of the step went from 19% to 24%.
//
// loom-trainer therefore re-executes itself once with OPENBLAS_CORETYPE set to the newest
// kernel family the CPU can run when OpenBLAS fell back to Prescott on a CPU with AVX2 or
// AVX-512; an OPENBLAS_CORETYPE already in the environment is always left as it is (so
// OPENBLAS_CORETYPE=Prescott keeps the fallback). Different kernels round GEMMs differently, so
// results are reproducible per kernel family, not across them.
//
// Thread-safety: DetectCpuFeatures, LoadedBlasCoreName and BlasCoreTypeFor are pure or read
// process-wide state; ReexecForBlasKernels and BlasReport change the environment: call them from
// main() before other threads start.
#ifndef LOOM_WORKER_TRAINER_BLAS_KERNELS_H_
#define LOOM_WORKER_TRAINER_BLAS_KERNELS_H_

#include <optional>
#include <string>
#include "absl/strings/string_view.h"

namespace loom::trainer {

struct CpuFeatures {
  bool avx512_skx = false;  // AVX-512 F, CD, BW, DQ and VL: what OpenBLAS's SKYLAKEX kernels use
  bool avx2_fma = false;    // AVX2 and FMA3: what its HASWELL kernels use
};

// This CPU's features (cpuid; GCC's checks include the OS's enabling of the AVX state).
CpuFeatures DetectCpuFeatures();

// openblas_get_corename() of the BLAS this process loaded, e.g. "SkylakeX" or "Prescott"; empty
// when the BLAS is not OpenBLAS (the symbol is looked up at run time).
std::string LoadedBlasCoreName();

// The OPENBLAS_CORETYPE to run instead of `detected` (a core name as LoadedBlasCoreName
// returns it, any case), or nullopt to keep it: "SKYLAKEX" or "HASWELL" when OpenBLAS fell
// back to Prescott and the CPU can run them; nullopt for any core OpenBLAS recognised, for an
// empty name, and for a CPU without AVX2.
std::optional<std::string> BlasCoreTypeFor(absl::string_view detected, const CpuFeatures& cpu);

// At the start of main(), before any other thread or output: when OPENBLAS_CORETYPE is unset and
// BlasCoreTypeFor picks other kernels, sets it (and a note of the detected core for BlasReport)
// and execv()s this binary by its own path with `argv` (the process keeps its name). Returns
// only when nothing is to change or the exec failed (then the variables are removed again).
void ReexecForBlasKernels(char** argv);

// One line for the log: "BLAS: OpenBLAS core <name>", plus "(OPENBLAS_CORETYPE=<v> set by
// loom-trainer: ... chose <detected>)" after ReexecForBlasKernels' exec; empty when the BLAS is
// not OpenBLAS. Consumes the note (call once).
std::string BlasReport();

}  // namespace loom::trainer

#endif  // LOOM_WORKER_TRAINER_BLAS_KERNELS_H_
