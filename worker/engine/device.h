// The device a rank computes on, and what the LibTorch linked into this process can drive.
//
// Loom links one LibTorch for CPU and GPU ranks: PyPI's torch 2.11.0 (CUDA 13.0, NCCL 2.28),
// third_party/libtorch.BUILD. A rank's device follows the job's resources.accelerator: "cpu"
// ranks compute on the host (c10d Gloo), the GPU kinds (h100, h200, gh200) on one CUDA device
// each (c10d NCCL). The worker gives every GPU rank its own device through CUDA_VISIBLE_DEVICES
// (worker/rank_env.h), so a rank normally sees exactly one device, index 0.
//
// This header is torch-free (the trainer's flag handling and the tests include it without
// LibTorch); device.cc asks LibTorch.
//
// Thread-safety: every function may be called from any thread.
#ifndef LOOM_WORKER_ENGINE_DEVICE_H_
#define LOOM_WORKER_ENGINE_DEVICE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::engine {

// What this process's LibTorch was built with and can see, asked of LibTorch itself.
struct LibTorchInfo {
  std::string torch_version;       // TORCH_VERSION of the headers compiled against, e.g. "2.11.0"
  // libtorch_cuda is loaded and its CUDA hooks registered (the CUDA kernels and the NCCL backend
  // are in this process). False for a CPU-only LibTorch or a link that dropped libtorch_cuda.
  bool cuda_linked = false;
  int cuda_runtime_version = 0;    // cudart's version as CUDA encodes it, e.g. 13000; 0 unlinked
  long cudnn_version = 0;          // cuDNN compiled against, e.g. 91900; 0 unlinked
  int nccl_version = 0;            // the linked NCCL, major*10000+minor*100+patch, e.g. 22809
  int cuda_devices = 0;            // CUDA devices this process sees (0 without a GPU or driver)
};

// Asks the linked LibTorch. Never throws; never initialises a CUDA context.
LibTorchInfo DescribeLibTorch();

// One line, e.g. "LibTorch 2.11.0, CUDA runtime 13.0, cuDNN 9.19.0, NCCL 2.28.9, CUDA devices: 0"
// or "LibTorch 2.11.0, CPU only (libtorch_cuda not loaded)".
std::string LibTorchInfoLine(const LibTorchInfo& info);

// A rank's device: the host, or CUDA device `index` of those the process sees.
struct RankDevice {
  bool cuda = false;
  int index = 0;  // CUDA device index (0 for the host)
  std::string ToString() const;  // "cpu" or "cuda:<index>"
};

// The device of a rank of a job whose resources.accelerator is `accelerator` ("cpu", "h100",
// "h200" or "gh200", lower case as the spec parser leaves it; "" means cpu), with this process
// seeing `cuda_devices` CUDA devices and being rank `local_rank` on its node.
// - "cpu" -> the host.
// - a GPU kind -> cuda:0 when the process sees one device (the worker narrowed
//   CUDA_VISIBLE_DEVICES to the rank's own), else cuda:<local_rank>.
// Errors (INVALID_ARGUMENT, so loom-trainer exits 78, a configuration error, never retried):
// a GPU kind with no CUDA device visible ("resources.accelerator: h100 needs a CUDA device, and
// this process sees none ..."), local_rank outside the visible devices, an unknown kind.
absl::StatusOr<RankDevice> ResolveRankDevice(absl::string_view accelerator, int local_rank,
                                             int cuda_devices);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_DEVICE_H_
