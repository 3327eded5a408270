// File: worker/inventory.h
//
// The node inventory a worker registers (proto NodeInventory): flag parsing and host
// detection for loom-worker (services/worker/main.cc). Thread-safe (pure functions).
#ifndef LOOM_WORKER_INVENTORY_H_
#define LOOM_WORKER_INVENTORY_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace loom::worker {

// "k=v,k2=v2" -> {k: v, k2: v2}; "" -> {}. INVALID_ARGUMENT naming the bad item ("--labels:
// 'zone' is not key=value", duplicate or empty keys, keys or values over 63 bytes).
absl::StatusOr<std::map<std::string, std::string>> ParseLabels(const std::string& text);

// The CPU architecture as the scheduler names it: "x86_64" or "aarch64" (from uname's machine:
// amd64 -> x86_64, arm64 -> aarch64); any other machine name is returned unchanged.
std::string NormalizeCpuArch(const std::string& machine);
// NormalizeCpuArch(uname().machine).
std::string DetectCpuArch();

}  // namespace loom::worker

#endif  // LOOM_WORKER_INVENTORY_H_
