// A Collectives fake that fails the k-th collective, modelled on c10d's FakeProcessGroup (a
// process group whose collectives do no communication, for testing): it wraps a real group
// (Gloo, or local) and forwards every call to it, so data still moves and every rank's real
// collective sequence stays matched, but the k-th started collective's Wait (or the return of
// a blocking call) reports the chosen status instead of the real one. With `sticky` (default),
// every later collective reports it too, as a real group is unusable after a failure. Lets
// tests drive every CollectiveError path of the engine deterministically.
//
// Collectives are counted from 1 in the order they are started (Start*, the blocking
// Broadcast and Barrier, and NewSubgroup, whose result is then the status); count, hash,
// elements, bytes and blocked seconds mirror the wrapped group's. A subgroup made through the
// fake is the wrapped group's subgroup (it does not fail). Not thread-safe, like Collectives.
#ifndef LOOM_WORKER_ENGINE_TESTING_FAILING_COLLECTIVES_H_
#define LOOM_WORKER_ENGINE_TESTING_FAILING_COLLECTIVES_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/engine/collectives.h"

namespace loom::engine::testing {

class FailingCollectives : public Collectives {
 public:
  // fail_at: 1-based index of the collective that fails (0 or negative: none fails).
  // status: what it reports (DEADLINE_EXCEEDED, UNAVAILABLE, INTERNAL, ...; must not be OK).
  // `inner` must outlive this object and every handle it returned.
  FailingCollectives(Collectives& inner, int64_t fail_at, absl::Status status,
                     bool sticky = true);

  // Collectives started through this object so far.
  int64_t started() const { return started_; }
  // Whether the failing collective has been started.
  bool failed() const { return fail_at_ > 0 && started_ >= fail_at_; }

  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  std::unique_ptr<PendingCollective> StartAllGather(const at::Tensor& part,
                                                    at::Tensor& full) override;
  std::unique_ptr<PendingCollective> StartReduceScatterSum(const at::Tensor& full,
                                                           at::Tensor& part) override;
  std::unique_ptr<PendingCollective> StartReduceScatterSumCoalesced(
      const std::vector<at::Tensor>& fulls, const std::vector<at::Tensor>& parts) override;
  std::unique_ptr<PendingCollective> StartAllReduce(at::Tensor& tensor, ReduceOp op) override;
  std::unique_ptr<PendingCollective> StartAllToAll(const at::Tensor& input,
                                                   at::Tensor& output) override;
  absl::Status Broadcast(at::Tensor& tensor, int root) override;
  absl::Status Barrier() override;
  absl::StatusOr<std::unique_ptr<Collectives>> NewSubgroup(const std::vector<int>& ranks,
                                                           absl::string_view name) override;

  // Copies the wrapped group's counters into this object's (done after every call and Wait).
  void SyncCounters();

 private:
  // Counts one started collective; returns the status it must report (OK: the real one).
  absl::Status Next();
  std::unique_ptr<PendingCollective> Wrap(std::unique_ptr<PendingCollective> inner,
                                          absl::Status injected);

  Collectives& inner_;
  int64_t fail_at_;
  absl::Status status_;
  bool sticky_;
  int64_t started_ = 0;
};

}  // namespace loom::engine::testing

#endif  // LOOM_WORKER_ENGINE_TESTING_FAILING_COLLECTIVES_H_
