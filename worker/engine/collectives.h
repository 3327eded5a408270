// Collective communication for the engine's process groups, behind one interface so the CPU
// path (c10d::ProcessGroupGloo, gloo_collectives.h) and a GPU path (NCCL's native
// reduce_scatter/allgather) share the ZeRO code. This header holds the interface and the
// one-rank implementation (CreateLocalCollectives).
//
// Every rank of a group must issue the same sequence of calls on it (docs/design/TECHNIQUES.md §0).
// The Start* calls return a handle at once (the collective runs on the backend's thread, so it
// overlaps with the caller's compute: DeepSpeed's overlap_comm); the plain calls are Start +
// Wait. Collectives of one group complete in the order they were started. A timeout or a peer
// failure returns DEADLINE_EXCEEDED or UNAVAILABLE/INTERNAL from Wait, and the group is unusable
// afterwards. Tensors passed to a Start* call must stay alive and untouched until its Wait
// returns (the handle keeps references).
//
// Tensors are contiguous 1-d CPU tensors of one dtype per call: fp32, fp16 or bf16 (AllReduce
// also accepts float64/int64). bf16 on the wire: the Gloo implementation moves bf16 tensors of gathers, all-to-all and broadcast as their 16-bit
// patterns (viewed as fp16: same element size, only bytes move); callers may pass bf16 directly
// (passing bf16 already viewed as fp16, as zero_llama.cc's Wire() does, still works).
// Reductions of 16-bit floats (bf16 and fp16 reduce-scatter) move the 16-bit values and sum
// them in fp32, in rank order, rounding once to the tensor's dtype (DeepSpeed reduces in the
// communication dtype; this keeps its wire bytes and the fp32 accumulation of the sum). A bf16
// AllReduce is done in fp32 (a temporary: fp32 on the wire) and rounded back once.
//
// Every call is recorded in a running count and hash of (operation, element count), so tests can
// check that all ranks issued the same collective sequence (docs/design/TECHNIQUES.md §1.11 #7). A
// subgroup (NewSubgroup) is a Collectives of its own with its own rank, world size, count and hash.
// Not thread-safe: one caller thread at a time per object (different groups may be driven by
// different threads).
#ifndef LOOM_WORKER_ENGINE_COLLECTIVES_H_
#define LOOM_WORKER_ENGINE_COLLECTIVES_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::engine {

enum class ReduceOp { kSum, kMax };

// A started collective. Wait() blocks until it is complete (or the group's timeout) and returns
// its status; call it exactly once. Destroying an unwaited handle waits first.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual absl::Status Wait() = 0;
};

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // part: [p] on every rank; full: [N*p] (preallocated) receives rank r's part at [r*p, (r+1)*p).
  virtual std::unique_ptr<PendingCollective> StartAllGather(const at::Tensor& part,
                                                            at::Tensor& full) = 0;
  // full: [N*p] on every rank; part: [p] (preallocated) receives sum over ranks of
  // full[rank*p : (rank+1)*p]. Ranks are summed in rank order (fp32).
  virtual std::unique_ptr<PendingCollective> StartReduceScatterSum(const at::Tensor& full,
                                                                   at::Tensor& part) = 0;
  // One bucket of reduce-scatters: for every k, fulls[k] [N*p_k] -> parts[k] [p_k] as
  // StartReduceScatterSum does; recorded as one collective of Σ N*p_k elements. No parts[k] may
  // overlap any fulls[j].
  virtual std::unique_ptr<PendingCollective> StartReduceScatterSumCoalesced(
      const std::vector<at::Tensor>& fulls, const std::vector<at::Tensor>& parts) = 0;
  // In place; every rank receives bit-identical results.
  virtual std::unique_ptr<PendingCollective> StartAllReduce(at::Tensor& tensor, ReduceOp op) = 0;
  // All-to-all with equal splits (Gloo's alltoall_base; DeepSpeed-Ulysses' seq<->head swap,
  // docs/design/TECHNIQUES.md §3.1): input [N*c] is cut into N chunks of c; chunk j goes to rank j,
  // and output [N*c] (preallocated, not overlapping input) receives rank j's chunk `rank()` at
  // [j*c, (j+1)*c). Recorded as one collective of N*c elements, moving N*c.
  virtual std::unique_ptr<PendingCollective> StartAllToAll(const at::Tensor& input,
                                                           at::Tensor& output) = 0;
  // In place: every rank receives root's tensor.
  virtual absl::Status Broadcast(at::Tensor& tensor, int root) = 0;
  virtual absl::Status Barrier() = 0;

  // A subgroup of this group's ranks, built as c10d's new_group is: collective over this group
  // (every rank calls it, with the same ranks and name, in the same order relative to other
  // NewSubgroup calls; members block until every member arrived, non-members return at once).
  // `ranks`: strictly increasing ranks of this group; subgroup rank i is ranks[i]. `name`:
  // non-empty, no '/', (with a per-parent counter) the key prefix of the subgroup's rendezvous.
  // Returns the subgroup for a member and nullptr for a non-member. A one-rank subgroup is local
  // (no process group). Recorded in this group's count/hash as one collective of ranks.size()
  // elements (moving none). Errors: INVALID_ARGUMENT for bad ranks or name; UNAVAILABLE /
  // DEADLINE_EXCEEDED when members do not arrive within the timeout. The subgroup may outlive
  // this object.
  virtual absl::StatusOr<std::unique_ptr<Collectives>> NewSubgroup(const std::vector<int>& ranks,
                                                                   absl::string_view name) = 0;

  absl::Status AllGather(const at::Tensor& part, at::Tensor& full) {
    return StartAllGather(part, full)->Wait();
  }
  absl::Status ReduceScatterSum(const at::Tensor& full, at::Tensor& part) {
    return StartReduceScatterSum(full, part)->Wait();
  }
  absl::Status AllReduce(at::Tensor& tensor, ReduceOp op) {
    return StartAllReduce(tensor, op)->Wait();
  }
  absl::Status AllToAll(const at::Tensor& input, at::Tensor& output) {
    return StartAllToAll(input, output)->Wait();
  }

  // Bytes this rank handed to collectives so far (inputs of gathers/reduces), for reporting.
  int64_t bytes_communicated() const { return bytes_communicated_; }
  // Number of collectives started so far and a hash of their (operation, element count)
  // sequence: equal on every rank of a correct program.
  int64_t collective_count() const { return collective_count_; }
  uint64_t collective_hash() const { return collective_hash_; }
  // Communication volume so far in elements, counted as ZeRO does per rank
  // (docs/design/TECHNIQUES.md §1.2): an all-gather or reduce-scatter moves its full (N*p) size, an
  // all-reduce twice its size (reduce-scatter + all-gather), a broadcast its size.
  int64_t elements_moved() const { return elements_moved_; }
  // Wall seconds the caller spent blocked in collective calls so far (in Wait: for a blocking
  // call, start to completion; for a started one, only the wait), for the trainer's "comm_s".
  // On CPU (Gloo) Wait returns when the data is in the caller's tensors, so the host clock
  // around Wait is the time the caller lost. On an accelerator, Wait only orders the compute
  // stream after the communication stream and returns at once; there an implementation records
  // a CUDA event on the compute stream before the Wait and one after it (after the
  // stream-wait on the work), and adds cudaEventElapsedTime of the pair once the second event
  // has completed (polled at the next Wait or at the step end, never synchronising per call).
  double blocked_seconds() const { return blocked_seconds_; }

 protected:
  // Implementations call this once per collective they start. op: the operation's code
  // (collectives_internal.h Op: the same code on every implementation, so hashes agree).
  void Record(int op, int64_t numel, int64_t moved) {
    ++collective_count_;
    elements_moved_ += moved;
    uint64_t h = collective_hash_ ^ (static_cast<uint64_t>(op) * 0x9E3779B97F4A7C15ull);
    h ^= static_cast<uint64_t>(numel) + 0x632BE59BD9B4E019ull + (h << 6) + (h >> 2);
    collective_hash_ = h * 0xBF58476D1CE4E5B9ull;
  }
  int64_t bytes_communicated_ = 0;
  int64_t collective_count_ = 0;
  int64_t elements_moved_ = 0;
  uint64_t collective_hash_ = 0;
  double blocked_seconds_ = 0;
};

// World size 1: every collective is a local copy; no process group. NewSubgroup({0}) returns
// another local group.
std::unique_ptr<Collectives> CreateLocalCollectives();

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_COLLECTIVES_H_
