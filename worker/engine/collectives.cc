// The one-rank Collectives (collectives.h, CreateLocalCollectives): every collective is a local
// copy (or nothing: an all-reduce or broadcast of one rank), checked and recorded as the Gloo
// implementation checks and records it.
#include "worker/engine/collectives.h"

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "worker/engine/collectives_internal.h"

namespace loom::engine {
namespace collectives_internal {
namespace {

class LocalCollectives : public Collectives {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::unique_ptr<PendingCollective> StartAllGather(const at::Tensor& part,
                                                    at::Tensor& full) override {
    if (absl::Status s = CheckShapes(part, full, 1); !s.ok()) return Done(s);
    Record(kAllGather, part.numel(), full.numel());
    full.copy_(part);
    return Done();
  }
  std::unique_ptr<PendingCollective> StartReduceScatterSum(const at::Tensor& full,
                                                           at::Tensor& part) override {
    if (absl::Status s = CheckShapes(part, full, 1); !s.ok()) return Done(s);
    Record(kReduceScatter, full.numel(), full.numel());
    part.copy_(full);
    return Done();
  }
  std::unique_ptr<PendingCollective> StartReduceScatterSumCoalesced(
      const std::vector<at::Tensor>& fulls, const std::vector<at::Tensor>& parts) override {
    if (absl::Status s = CheckCoalesced(fulls, parts, 1); !s.ok()) return Done(s);
    int64_t total = 0;
    for (size_t k = 0; k < fulls.size(); ++k) {
      total += fulls[k].numel();
      at::Tensor out = parts[k];
      out.copy_(fulls[k]);
    }
    Record(kReduceScatter, total, total);
    return Done();
  }
  std::unique_ptr<PendingCollective> StartAllReduce(at::Tensor& t, ReduceOp) override {
    Record(kAllReduce, t.numel(), 2 * t.numel());
    return Done();
  }
  absl::Status Broadcast(at::Tensor& t, int root) override {
    if (root != 0) return absl::InvalidArgumentError("broadcast: root must be 0");
    Record(kBroadcast, t.numel(), t.numel());
    return absl::OkStatus();
  }
  absl::Status Barrier() override {
    Record(kBarrier, 0, 0);
    return absl::OkStatus();
  }
  std::unique_ptr<PendingCollective> StartAllToAll(const at::Tensor& input,
                                                   at::Tensor& output) override {
    if (absl::Status s = CheckAllToAll(input, output, 1); !s.ok()) return Done(s);
    Record(kAllToAll, input.numel(), input.numel());
    output.copy_(input);
    return Done();
  }
  absl::StatusOr<std::unique_ptr<Collectives>> NewSubgroup(const std::vector<int>& ranks,
                                                           absl::string_view name) override {
    if (absl::Status s = CheckSubgroup(ranks, name, 1); !s.ok()) return s;
    Record(kNewSubgroup, static_cast<int64_t>(ranks.size()), 0);
    return CreateLocalCollectives();
  }
};

}  // namespace
}  // namespace collectives_internal

std::unique_ptr<Collectives> CreateLocalCollectives() {
  return std::make_unique<collectives_internal::LocalCollectives>();
}

}  // namespace loom::engine
