// File: worker/gpu_inventory.h
//
// The accelerators of a GPU node, from NVIDIA's nvidia-smi:
//
//   nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits
//
// prints one line per GPU, the four columns separated by ", " and memory.total in MiB, e.g.
//
//   0, GPU-6d3a2b1c-8f4e-4c7a-9b2d-1e5f6a7b8c90, NVIDIA H100 80GB HBM3, 81559
//
// (nvidia-smi(1), "--query-gpu" / "--format=csv"; worker/testdata/nvidia_smi_*.csv are recorded
// outputs of 8x H100 80GB HBM3, 8x H200 and 1x GH200 nodes). The product name gives the
// accelerator kind the scheduler knows (loom.v1.AcceleratorKind): "GH200" -> GH200 (an aarch64
// superchip whose Grace LPDDR5X is the node's host memory, offload capacity over NVLink-C2C),
// "H200" -> H200, "H100" -> H100. A node without nvidia-smi is a CPU node, as before.
//
// Thread-safety: pure functions, except DetectGpuInventory, which runs a process.
#ifndef LOOM_WORKER_GPU_INVENTORY_H_
#define LOOM_WORKER_GPU_INVENTORY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/common.pb.h"
#include "proto/worker_service.pb.h"

namespace loom::worker {

// The arguments loom-worker passes to nvidia-smi.
inline constexpr char kNvidiaSmiQuery[] =
    "--query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits";

struct GpuInventory {
  // CPU when `devices` is empty.
  loom::v1::AcceleratorKind kind = loom::v1::ACCELERATOR_KIND_CPU;
  // In index order; memory_bytes = memory.total MiB * 2^20.
  std::vector<loom::v1::AcceleratorDevice> devices;
  // The product name every device shares ("" on a CPU node).
  std::string model;
  // The smallest device memory, bytes (NodeInventory.accelerator_memory_bytes; 0 on CPU).
  int64_t min_memory_bytes = 0;
};

// Parses nvidia-smi's CSV output above. `source` names where it came from (a file path or
// "nvidia-smi") in errors. Blank lines are skipped; no lines is a CPU node. Errors:
// INVALID_ARGUMENT "<source>:<line>: ..." for a line without exactly the four columns, an index
// that is not a non-negative integer or repeats, a uuid not starting "GPU-", a memory that is not
// a positive number of MiB (e.g. "[N/A]"); FAILED_PRECONDITION "<source>:<line>: ..." for a
// product that is none of H100/H200/GH200 or differs from line 1's (one kind per node).
absl::StatusOr<GpuInventory> ParseNvidiaSmiCsv(const std::string& text, const std::string& source);

// Reads a recorded output (--gpu_inventory_file). NOT_FOUND naming the path if unreadable.
absl::StatusOr<GpuInventory> ReadGpuInventoryFile(const std::string& path);

// Runs `nvidia_smi` (a path, or a name looked up on PATH) with kNvidiaSmiQuery and parses its
// stdout. An nvidia-smi that is not there is a CPU node (kind CPU, no devices), as is one that
// exits non-zero printing no lines (nvidia-smi says "No devices were found" and exits 6). A
// non-zero exit after printing lines: INTERNAL with its status.
absl::StatusOr<GpuInventory> DetectGpuInventory(const std::string& nvidia_smi);

// Writes `gpus` into the node inventory: accelerator kind, slots = device count,
// accelerator_memory_bytes = the smallest device's, devices, and superchip for GH200. A CPU
// inventory (no devices) leaves `node` unchanged.
void ApplyGpuInventory(const GpuInventory& gpus, loom::v1::NodeInventory* node);

}  // namespace loom::worker

#endif  // LOOM_WORKER_GPU_INVENTORY_H_
