// Collective communication for the engine's data-parallel group, behind one interface so the
// CPU path (c10d::ProcessGroupGloo) and a GPU path (NCCL's native reduce_scatter/allgather)
// share the ZeRO code.
//
// Every rank must issue the same sequence of calls (TECHNIQUES.md §0). Each call blocks until
// done or until the group's timeout; a timeout or a peer failure returns DEADLINE_EXCEEDED or
// UNAVAILABLE/INTERNAL, and the group is unusable afterwards.
// Tensors are contiguous CPU fp32 (AllReduce also accepts float64/int64).
// Not thread-safe: one caller thread at a time.
#ifndef LOOM_WORKER_ENGINE_COLLECTIVES_H_
#define LOOM_WORKER_ENGINE_COLLECTIVES_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace loom::engine {

enum class ReduceOp { kSum, kMax };

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // part: [p] on every rank; full: [N*p] (preallocated) receives rank r's part at [r*p, (r+1)*p).
  virtual absl::Status AllGather(const at::Tensor& part, at::Tensor& full) = 0;
  // full: [N*p] on every rank; part: [p] (preallocated) receives sum over ranks of
  // full[rank*p : (rank+1)*p]. Ranks are summed in rank order.
  virtual absl::Status ReduceScatterSum(const at::Tensor& full, at::Tensor& part) = 0;
  // In place.
  virtual absl::Status AllReduce(at::Tensor& tensor, ReduceOp op) = 0;
  // In place: every rank receives root's tensor.
  virtual absl::Status Broadcast(at::Tensor& tensor, int root) = 0;
  virtual absl::Status Barrier() = 0;

  // Bytes this rank handed to collectives so far (inputs of gathers/reduces), for reporting.
  int64_t bytes_communicated() const { return bytes_communicated_; }
  // Wall seconds the caller spent blocked in collective calls so far (start to completion of
  // each blocking call), for the trainer's "comm_s" step field.
  double blocked_seconds() const { return blocked_seconds_; }

 protected:
  int64_t bytes_communicated_ = 0;
  double blocked_seconds_ = 0;
};

// World size 1: every collective is a local copy; no process group.
std::unique_ptr<Collectives> CreateLocalCollectives();

struct GlooOptions {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  // Rank 0 listens here (0: the OS chooses); other ranks connect to master_addr:master_port.
  int master_port = 0;
  // Address this rank's Gloo transport binds to ("" : 127.0.0.1 when master_addr is a loopback
  // address, else the machine's hostname).
  std::string bind_address;
  absl::Duration timeout = absl::Seconds(300);
  // Rank 0 only: called with the bound TCPStore port once it listens, before waiting for peers.
  std::function<void(int port)> on_listening;
};

// Rendezvous through a c10d::TCPStore and build a c10d::ProcessGroupGloo. Reduce-scatter is
// alltoall_base (even splits) + a local sum in rank order, all-gather is allgather into views
// (Gloo in LibTorch 1.13 has neither reduce_scatter nor _allgather_base).
// Errors: INVALID_ARGUMENT for bad ranks/ports, UNAVAILABLE / DEADLINE_EXCEEDED when peers do
// not arrive within the timeout.
absl::StatusOr<std::unique_ptr<Collectives>> CreateGlooCollectives(const GlooOptions& options);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_COLLECTIVES_H_
