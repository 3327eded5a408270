// ZenFlowPipeline's host-thread side (zenflow_pipeline.h, overlap_step): the CPU step posted in
// chunks behind the accumulations, every wait of the training thread for the host thread
// (ReleaseGradients, a CPU step in flight, Quiesce), and the deferred selective updates' claims
// (defer_selective: whichever of the host thread and AwaitMaster claims an update runs it).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "worker/engine/optim/zenflow_pipeline.h"
#include "worker/engine/optim/zenflow_pipeline_internal.h"

namespace loom::engine::optim {

using zenflow_internal::Seconds;

void ZenFlowPipeline::Quiesce() {
  if (host_ != nullptr) host_->WaitAll();
  if (cpu_in_flight_) {
    cpu_in_flight_ = false;
    pending_ = true;
  }
}

void ZenFlowPipeline::Flush() {
  Quiesce();
  if (pending_) Publish();
}

bool ZenFlowPipeline::ClaimSelective(size_t i) {
  int pending = kSelPending;
  return sel_state_[i].compare_exchange_strong(pending, kSelClaimed, std::memory_order_acq_rel);
}

void ZenFlowPipeline::AwaitMaster(size_t i) {
  if (i >= sel_ticket_.size() || sel_ticket_[i] == 0) return;
  if (ClaimSelective(i)) {
    // The host thread has not started it: run it here rather than wait behind the updates
    // queued before it (the training thread's own selective update, as without deferral: not
    // stall).
    pass_.Run(sel_args_[i]);
    sel_state_[i].store(kSelDone, std::memory_order_release);
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    host_->WaitUrgent(sel_ticket_[i]);
    release_wait_s_ += Seconds(t0);
  }
  sel_ticket_[i] = 0;
}

void ZenFlowPipeline::WaitCpu() {
  if (!cpu_in_flight_) return;
  const auto t0 = std::chrono::steady_clock::now();
  host_->WaitBackground(cpu_ticket_);
  cpu_in_flight_ = false;
  pending_ = true;
  metrics_.stall_s += Seconds(t0);
}

absl::Status ZenFlowPipeline::OnReleaseGradients() {
  // With two gradient buffers the one about to be written holds the gradients of the step
  // before last: wait only for what was posted up to the previous release.
  const int64_t ticket = opt_.gradient_buffers == 2 ? acc_ticket_at_release_ : acc_ticket_;
  acc_ticket_at_release_ = acc_ticket_;
  last_release_wait_ = host_acc_ ? ticket : 0;
  if (!host_acc_ || ticket == 0) return absl::OkStatus();
  const auto t0 = std::chrono::steady_clock::now();
  host_->WaitUrgent(ticket);
  release_wait_s_ += Seconds(t0);
  return absl::OkStatus();
}

void ZenFlowPipeline::PostCpuStep(int64_t t, double lr, int buffer) {
  // Chunks of 2^18 elements (whole 64-byte lines, ~0.2 ms of CpuAdam on one thread), so that an
  // accumulation posted meanwhile waits at most one chunk for the thread; CpuAdam is
  // element-wise, so the chunks change no bit.
  constexpr int64_t kChunk = 1 << 18;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!is2d(i)) continue;
    const int64_t n = cpu_param_[i].numel();
    for (int64_t b = 0; b < n; b += kChunk) {
      const int64_t e = std::min(n, b + kChunk);
      cpu_ticket_ = host_->PostBackground([this, t, lr, buffer, i, b, e] {
        OptimizerPartition p = source_(i);
        cpu_adam_.StepRange(t, lr, cpu_param_[i].data_ptr<float>(),
                            acc_[buffer][i].data_ptr<float>(), p.exp_avg.data_ptr<float>(),
                            p.exp_avg_sq.data_ptr<float>(), b, e);
      });
    }
  }
  cpu_in_flight_ = true;
}

}  // namespace loom::engine::optim
