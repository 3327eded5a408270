// ZeroProvider, stages 1/2 after the optimizer step: the updated fp32 partitions all-gathered
// back into the full replicas (zero_provider.h RefreshParams).
//
// A parameter is partitioned on its own (p = ceil(n/N), rank r owns [r*p, (r+1)*p)), so its
// [N*p] all-gather output is its flat replica whenever n == N*p: with fp32 params the master
// partition is the send buffer and the replica the receive buffer, no copies and no fresh
// buffers (perf: the earlier bucketed gather allocated a send and a receive buffer per bucket
// every step, page clearing under them, and copied into and out of them). All gathers are
// waited before RefreshReplicas returns (the master partition is the send buffer, and an
// overlapped optimizer may write it afterwards); the Acquire / FinishMicroStep waits remain
// as a guard. A padded parameter (n < N*p) or a 16-bit replica (a cast send buffer) goes through
// pooled buffers and is waited here, at most allgather_bucket_size gathered elements in flight.
// Errors: CollectiveError, thrown here for a synchronous gather, or by the Acquire / wait that
// finds a direct gather failed.
#include <ATen/ATen.h>

#include <utility>
#include <vector>

#include "worker/engine/zero/zero_common.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {

using zero_internal::ThrowIfError;
using zero_internal::Wire;

void ZeroProvider::RefreshReplicas() {
  WaitReplicas();
  const at::ScalarType dt = options_.param_dtype;
  const int64_t n_ranks = collectives_->world_size();
  if (replica_pending_.size() != params_.size()) replica_pending_.resize(params_.size());
  struct Staged {
    size_t i = 0;
    at::Tensor send, full;  // pooled: a cast send buffer, and/or an [N*p] receive buffer
    bool pooled_send = false, pooled_full = false;
    std::unique_ptr<PendingCollective> pending;
  };
  std::vector<Staged> staged;
  int64_t staged_elems = 0;
  absl::Status status = absl::OkStatus();
  auto complete = [&]() {
    for (Staged& g : staged) {
      absl::Status s = g.pending->Wait();
      g.pending.reset();
      ZeroParam& p = params_[g.i];
      if (s.ok() && status.ok() && g.pooled_full) {
        p.replica.view({-1}).copy_(g.full.narrow(0, 0, p.numel));  // rank q's slice at q*p
      }
      if (status.ok()) status = s;
      if (g.pooled_send) pool_.Put(std::move(g.send));
      if (g.pooled_full) pool_.Put(std::move(g.full));
    }
    staged.clear();
    staged_elems = 0;
  };
  for (size_t i = 0; i < params_.size() && status.ok(); ++i) {
    ZeroParam& p = params_[i];
    const int64_t part = p.slice.partition_numel;
    const bool direct_send = p.master.scalar_type() == dt && p.master.is_contiguous();
    const bool direct_full = n_ranks * part == p.numel;
    if (direct_send && direct_full) {
      at::Tensor full = p.replica.view({-1});
      replica_pending_[i] = collectives_->StartAllGather(p.master, full);
      ++replicas_pending_;
      continue;
    }
    Staged g;
    g.i = i;
    if (direct_send) {
      g.send = p.master;
    } else {
      g.send = pool_.Get(part, dt);
      g.send.copy_(p.master);
      g.pooled_send = true;
    }
    if (direct_full) {
      g.full = p.replica.view({-1});
    } else {
      g.full = pool_.Get(n_ranks * part, dt);
      g.pooled_full = true;
    }
    at::Tensor wire_full = Wire(g.full);
    g.pending = collectives_->StartAllGather(Wire(g.send), wire_full);
    staged.push_back(std::move(g));
    staged_elems += n_ranks * part;
    if (staged_elems >= options_.allgather_bucket_size) complete();
  }
  complete();
  if (!status.ok()) WaitReplicas(/*throw_errors=*/false);  // the group is unusable anyway
  ThrowIfError(status);
  // Waited here, not at the next Acquire: an optimizer that writes master partitions off the
  // training thread (ZenFlow's overlapped CPU step) may write a partition while its gather
  // still sends it, and the replicas would then depend on thread timing
  // (offload_resume_e2e_test's ZenFlow case diverged by 2e-4 in its loss when left in flight).
  WaitReplicas();
}

void ZeroProvider::WaitReplica(size_t i) {
  std::unique_ptr<PendingCollective> pending = std::move(replica_pending_[i]);
  if (!pending) return;
  --replicas_pending_;
  ThrowIfError(pending->Wait());
}

void ZeroProvider::WaitReplicas(bool throw_errors) {
  absl::Status first = absl::OkStatus();
  for (size_t i = 0; i < replica_pending_.size() && replicas_pending_ > 0; ++i) {
    std::unique_ptr<PendingCollective> pending = std::move(replica_pending_[i]);
    if (!pending) continue;
    --replicas_pending_;
    absl::Status s = pending->Wait();
    if (first.ok()) first = s;
  }
  if (throw_errors) ThrowIfError(first);
}

}  // namespace loom::engine
