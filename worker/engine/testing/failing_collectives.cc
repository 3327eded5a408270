#include "worker/engine/testing/failing_collectives.h"

#include <utility>

namespace loom::engine::testing {

namespace {

// Waits for the real collective (so its buffers are free and the ranks stay matched), then
// reports the injected status when there is one.
class FailingPending : public PendingCollective {
 public:
  FailingPending(std::unique_ptr<PendingCollective> inner, absl::Status injected,
                 FailingCollectives* owner)
      : inner_(std::move(inner)), injected_(std::move(injected)), owner_(owner) {}
  absl::Status Wait() override {
    absl::Status real = inner_->Wait();
    owner_->SyncCounters();
    return injected_.ok() ? real : injected_;
  }

 private:
  std::unique_ptr<PendingCollective> inner_;
  absl::Status injected_;
  FailingCollectives* owner_;
};

}  // namespace

FailingCollectives::FailingCollectives(Collectives& inner, int64_t fail_at, absl::Status status,
                                       bool sticky)
    : inner_(inner), fail_at_(fail_at), status_(std::move(status)), sticky_(sticky) {
  if (status_.ok()) status_ = absl::InternalError("FailingCollectives: injected failure");
  SyncCounters();
}

void FailingCollectives::SyncCounters() {
  bytes_communicated_ = inner_.bytes_communicated();
  collective_count_ = inner_.collective_count();
  elements_moved_ = inner_.elements_moved();
  collective_hash_ = inner_.collective_hash();
  blocked_seconds_ = inner_.blocked_seconds();
}

absl::Status FailingCollectives::Next() {
  ++started_;
  if (fail_at_ <= 0) return absl::OkStatus();
  if (started_ == fail_at_ || (sticky_ && started_ > fail_at_)) return status_;
  return absl::OkStatus();
}

std::unique_ptr<PendingCollective> FailingCollectives::Wrap(
    std::unique_ptr<PendingCollective> inner, absl::Status injected) {
  SyncCounters();
  return std::make_unique<FailingPending>(std::move(inner), std::move(injected), this);
}

std::unique_ptr<PendingCollective> FailingCollectives::StartAllGather(const at::Tensor& part,
                                                                      at::Tensor& full) {
  absl::Status injected = Next();
  return Wrap(inner_.StartAllGather(part, full), std::move(injected));
}

std::unique_ptr<PendingCollective> FailingCollectives::StartReduceScatterSum(
    const at::Tensor& full, at::Tensor& part) {
  absl::Status injected = Next();
  return Wrap(inner_.StartReduceScatterSum(full, part), std::move(injected));
}

std::unique_ptr<PendingCollective> FailingCollectives::StartReduceScatterSumCoalesced(
    const std::vector<at::Tensor>& fulls, const std::vector<at::Tensor>& parts) {
  absl::Status injected = Next();
  return Wrap(inner_.StartReduceScatterSumCoalesced(fulls, parts), std::move(injected));
}

std::unique_ptr<PendingCollective> FailingCollectives::StartAllReduce(at::Tensor& tensor,
                                                                      ReduceOp op) {
  absl::Status injected = Next();
  return Wrap(inner_.StartAllReduce(tensor, op), std::move(injected));
}

std::unique_ptr<PendingCollective> FailingCollectives::StartAllToAll(const at::Tensor& input,
                                                                     at::Tensor& output) {
  absl::Status injected = Next();
  return Wrap(inner_.StartAllToAll(input, output), std::move(injected));
}

absl::Status FailingCollectives::Broadcast(at::Tensor& tensor, int root) {
  absl::Status injected = Next();
  absl::Status real = inner_.Broadcast(tensor, root);
  SyncCounters();
  return injected.ok() ? real : injected;
}

absl::Status FailingCollectives::Barrier() {
  absl::Status injected = Next();
  absl::Status real = inner_.Barrier();
  SyncCounters();
  return injected.ok() ? real : injected;
}

absl::StatusOr<std::unique_ptr<Collectives>> FailingCollectives::NewSubgroup(
    const std::vector<int>& ranks, absl::string_view name) {
  absl::Status injected = Next();
  absl::StatusOr<std::unique_ptr<Collectives>> real = inner_.NewSubgroup(ranks, name);
  SyncCounters();
  if (!injected.ok()) return injected;
  return real;
}

}  // namespace loom::engine::testing
