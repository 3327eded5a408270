#include "worker/engine/device.h"

#include <cstdint>
#include <exception>

#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/version.h>
#include <torch/csrc/cuda/nccl.h>

#include "absl/strings/str_cat.h"

namespace loom::engine {
namespace {

// "13.0" from 13000; "2.28.9" from 22809 (major*10000 + minor*100 + patch, as NCCL >= 2.9 encodes
// its version).
std::string CudaVersion(int v) { return absl::StrCat(v / 1000, ".", (v % 1000) / 10); }
std::string NcclVersion(int v) {
  return absl::StrCat(v / 10000, ".", (v % 10000) / 100, ".", v % 100);
}
std::string CudnnVersion(long v) {
  return absl::StrCat(v / 10000, ".", (v % 10000) / 100, ".", v % 100);
}

}  // namespace

LibTorchInfo DescribeLibTorch() {
  LibTorchInfo info;
  info.torch_version = TORCH_VERSION;
  try {
    const at::CUDAHooksInterface& hooks = at::detail::getCUDAHooks();
    // The base class throws "without ATen_cuda library" here: libtorch_cuda is not loaded.
    info.cuda_runtime_version = static_cast<int>(hooks.versionCUDART());
    info.cuda_linked = true;
    info.cudnn_version = hooks.versionCuDNN();
    info.cuda_devices = hooks.getNumGPUs();  // 0 without a GPU or driver; no context is made
    // torch packs (major << 32) | (minor << 16) | patch (torch/csrc/cuda/nccl.cpp).
    const std::uint64_t v = torch::cuda::nccl::version();
    info.nccl_version = static_cast<int>((v >> 32) * 10000 + ((v >> 16) & 0xffff) * 100 +
                                         (v & 0xffff));
  } catch (const std::exception&) {
    // Anything not filled in stays 0: what the line reports.
  }
  return info;
}

std::string LibTorchInfoLine(const LibTorchInfo& info) {
  if (!info.cuda_linked) {
    return absl::StrCat("LibTorch ", info.torch_version, ", CPU only (libtorch_cuda not loaded)");
  }
  return absl::StrCat("LibTorch ", info.torch_version, ", CUDA runtime ",
                      CudaVersion(info.cuda_runtime_version), ", cuDNN ",
                      CudnnVersion(info.cudnn_version), ", NCCL ", NcclVersion(info.nccl_version),
                      ", CUDA devices: ", info.cuda_devices);
}

std::string RankDevice::ToString() const {
  return cuda ? absl::StrCat("cuda:", index) : std::string("cpu");
}

absl::StatusOr<RankDevice> ResolveRankDevice(absl::string_view accelerator, int local_rank,
                                             int cuda_devices) {
  if (accelerator.empty() || accelerator == "cpu") return RankDevice{};
  if (accelerator != "h100" && accelerator != "h200" && accelerator != "gh200") {
    return absl::InvalidArgumentError(absl::StrCat(
        "resources.accelerator: \"", accelerator, "\" is not one of cpu, h100, h200, gh200"));
  }
  if (cuda_devices <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resources.accelerator: ", accelerator,
        " needs a CUDA device, and this process sees none (no GPU, no driver, or "
        "CUDA_VISIBLE_DEVICES empty); run the job on a node of that kind or set "
        "resources.accelerator: cpu"));
  }
  if (cuda_devices == 1) return RankDevice{true, 0};
  if (local_rank < 0 || local_rank >= cuda_devices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resources.accelerator: ", accelerator, ": local rank ", local_rank,
        " has no CUDA device of its own (this process sees ", cuda_devices, ")"));
  }
  return RankDevice{true, local_rank};
}

}  // namespace loom::engine
