// SuperOffloadPipeline's speculation thread (super_offload_pipeline.h): its queue of sub-group
// steps, one queued step (the finiteness check and squared norms, the snapshot, the unscaled
// gradient, the CpuAdam step), and FinishStep's thread taking queued steps from the other end
// of the queue until both threads are done (Drain), for speculated and in-commit steps alike.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/engine/optim/grad_norm.h"
#include "worker/engine/optim/super_offload_pipeline.h"

namespace loom::engine::optim {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

void SuperOffloadPipeline::WorkerLoop() {
  std::unique_lock<std::mutex> l(q_mu_);
  while (true) {
    q_cv_.wait(l, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_
    Task t = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    l.unlock();
    RunTask(t, adam_);
    l.lock();
    busy_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

void SuperOffloadPipeline::RunTask(const Task& t, offload::CpuAdam& adam) {
  if (options_.test_on_task) options_.test_on_task(t.k, &adam == &helper_adam_);
  if (t.in_commit) {
    StepCpuGroup(t.k, t.multiplier, adam);
    return;
  }
  CpuGroup& g = cpu_[t.k - first_cpu_];
  g.start = Clock::now();
  // The finiteness check is the squared norm (finite iff every element is: a float's square and
  // any sum of them fit a double), published for step validation (ComputedSquaredNorm).
  bool finite = true;
  for (const Slice& s : t.slices) {
    const double sq = s.grad != nullptr ? SumOfSquares(s.grad, s.numel) : 0.0;
    norms_.Publish(s.index, t.epoch, sq);
    finite = finite && std::isfinite(sq);
  }
  if (!finite) {
    g.nonfinite = true;  // the step overflows: nothing to speculate
  } else if (options_.nvme != nullptr) {
    RunNvmeTask(t, g, adam);
  } else {
    for (const Slice& s : t.slices) {
      if (!options_.exact_rollback) break;  // no rollback can happen: no snapshot
      std::memcpy(g.param.data() + s.offset, s.param, s.numel * sizeof(float));
      std::memcpy(g.exp_avg.data() + s.offset, s.exp_avg, s.numel * sizeof(float));
      std::memcpy(g.exp_avg_sq.data() + s.offset, s.exp_avg_sq, s.numel * sizeof(float));
    }
    const float mul = static_cast<float>(t.unscale);  // at::mul_'s fp32 scalar
    for (const Slice& s : t.slices) {
      const float* grad = s.grad;
      if (grad != nullptr && t.unscale != 1.0) {
        float* slot = g.grad.data() + s.offset;
        for (int64_t j = 0; j < s.numel; ++j) slot[j] = s.grad[j] * mul;
        grad = slot;
      }
      adam.Step(t.step, t.lr, s.param, grad, s.exp_avg, s.exp_avg_sq, s.numel);
    }
    g.stepped = true;
  }
  g.end = Clock::now();
}

bool SuperOffloadPipeline::Drain() {
  std::unique_lock<std::mutex> l(q_mu_);
  // Help with what is still queued (backward's last sub-groups), newest first: the speculation
  // thread takes the oldest, so the two threads meet in the middle of the queue.
  // Not with the state on NVMe: the swapper takes one thread at a time.
  while (options_.nvme == nullptr && !queue_.empty()) {
    Task t = std::move(queue_.back());
    queue_.pop_back();
    l.unlock();
    RunTask(t, helper_adam_);
    l.lock();
  }
  return idle_cv_.wait_for(l, options_.wait_deadline,
                           [this] { return queue_.empty() && !busy_; });
}

bool SuperOffloadPipeline::StepCpuGroupsInCommit(const std::vector<int64_t>& ks,
                                                 double multiplier) {
  if (ks.empty()) return true;
  {
    std::lock_guard<std::mutex> l(q_mu_);
    for (int64_t k : ks) {
      Task t{k, step_, lr_, 1.0, {}};
      t.in_commit = true;
      t.multiplier = multiplier;
      queue_.push_back(std::move(t));
    }
  }
  q_cv_.notify_one();
  return Drain();
}

absl::Status SuperOffloadPipeline::DeadlineInCommit() const {
  return absl::DeadlineExceededError(absl::StrCat(
      name(), ": step ", step_, ": CPU sub-group steps in FinishStep did not finish within ",
      options_.wait_deadline.count(), " ms"));
}

}  // namespace loom::engine::optim
