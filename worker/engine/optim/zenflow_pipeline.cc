// ZenFlowPipeline: construction, the per-step Commit (warm-up, the fused pass, the update
// boundary) and the CPU step's publication into the masters. The host thread's side (posting,
// waiting, the deferred selective updates' claims) is in zenflow_pipeline_host.cc, the
// selection side (re-selection, cohorts, Zen-auto's boundary) in zenflow_pipeline_selection.cc,
// the checkpoint state in zenflow_pipeline_state.cc.
#include "worker/engine/optim/zenflow_pipeline.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/engine/optim/zenflow_pipeline_internal.h"

namespace loom::engine::optim {
namespace {

offload::CpuAdamOptions WithThreads(offload::CpuAdamOptions o, int threads) {
  o.threads = std::max(1, threads);
  return o;
}

}  // namespace

using zenflow_internal::GradPtr;
using zenflow_internal::Seconds;

absl::StatusOr<std::unique_ptr<ZenFlowPipeline>> ZenFlowPipeline::Create(
    const ZenFlowOptions& options, SubGroupPlan plan, std::vector<ZenFlowParam> params,
    PartitionSource source, Collectives* collectives) {
  if (params.size() != plan.num_params()) {
    return absl::InvalidArgumentError(absl::StrCat("zenflow: ", params.size(),
                                                   " parameter shapes for a plan of ",
                                                   plan.num_params()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const ZenFlowParam& p = params[i];
    const int64_t n = p.cols > 0 ? p.rows * p.cols : p.end;
    if (p.begin < 0 || p.end < p.begin || p.end > n || p.end - p.begin > plan.partition_numel(i)) {
      return absl::InvalidArgumentError(absl::StrCat("zenflow: parameter ", i, " partition [",
                                                     p.begin, ", ", p.end,
                                                     ") does not fit its shape or plan"));
    }
  }
  return std::unique_ptr<ZenFlowPipeline>(new ZenFlowPipeline(
      options, std::move(plan), std::move(params), std::move(source), collectives));
}

ZenFlowPipeline::ZenFlowPipeline(const ZenFlowOptions& options, SubGroupPlan plan,
                                 std::vector<ZenFlowParam> params, PartitionSource source,
                                 Collectives* collectives)
    : OptimizerPipeline(std::move(plan)),
      opt_(options),
      params_(std::move(params)),
      source_(std::move(source)),
      coll_(collectives),
      cpu_adam_(options.adam),
      device_adam_(WithThreads(options.adam, options.device_threads)),
      pass_(options.adam, options.device_threads),
      host_pass_(options.adam, 1),
      host_acc_(options.overlap_step && options.host_accumulation),
      defer_(host_acc_ && options.defer_selective) {
  const size_t n = params_.size();
  sel_ticket_.assign(n, 0);
  sel_args_.resize(n);
  cohort_args_.resize(n);
  sel_state_ = std::make_unique<std::atomic<int>[]>(n);
  for (size_t i = 0; i < n; ++i) sel_state_[i].store(kSelDone);
  selected_.resize(n);
  sel_idx_.resize(n);
  cohorts_.resize(n);
  col_cohort_.resize(n);
  int64_t n2d = 0;
  for (size_t i = 0; i < n; ++i) n2d += is2d(i) ? 1 : 0;
  if (opt_.schedule.update_interval == 0) {
    auto_ = std::make_unique<ZenFlowAutoInterval>(n2d, opt_.topk_ratio, opt_.auto_ratio);
  }
  if (opt_.overlap_step) host_ = std::make_unique<HostWorker>();
}

ZenFlowPipeline::~ZenFlowPipeline() { Quiesce(); }

void ZenFlowPipeline::InitCpuCopies() {
  const size_t n = params_.size();
  cpu_param_.resize(n);
  for (int b = 0; b < 2; ++b) acc_[b].resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (!is2d(i)) continue;
    OptimizerPartition p = source_(i);
    cpu_param_[i] = p.param.clone();
    for (int b = 0; b < 2; ++b) acc_[b][i] = at::zeros_like(p.param);
  }
  initialized_ = true;
}

void ZenFlowPipeline::Publish() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!is2d(i)) continue;
    OptimizerPartition p = source_(i);
    float* master = p.param.data_ptr<float>();
    const float* cpu = cpu_param_[i].data_ptr<float>();
    const std::vector<int64_t>& idx = sel_idx_[i];
    std::vector<float> keep(idx.size());
    for (size_t e = 0; e < idx.size(); ++e) keep[e] = master[idx[e]];
    std::memcpy(master, cpu, sizeof(float) * p.param.numel());
    for (size_t e = 0; e < idx.size(); ++e) master[idx[e]] = keep[e];
    metrics_.bytes_moved += 4 * p.param.numel();
  }
  pending_ = false;
}

void ZenFlowPipeline::RunCpuStep(int64_t t, double lr, int buffer) {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!is2d(i)) continue;
    OptimizerPartition p = source_(i);
    cpu_adam_.Step(t, lr, cpu_param_[i].data_ptr<float>(), acc_[buffer][i].data_ptr<float>(),
                   p.exp_avg.data_ptr<float>(), p.exp_avg_sq.data_ptr<float>(),
                   cpu_param_[i].numel());
  }
}

absl::Status ZenFlowPipeline::Commit(const StepValidation& v) {
  // The last step's deferred selective updates have all been waited for by the forward that
  // read their parameters; one not read since (a parameter this forward did not use) is waited
  // for here, before anything below reads or writes a master.
  for (size_t i = 0; i < sel_ticket_.size(); ++i) AwaitMaster(i);
  metrics_.stall_s = release_wait_s_;
  release_wait_s_ = 0;
  if (!initialized_) InitCpuCopies();
  const size_t n = params_.size();
  const bool warm_up = opt_.schedule.IsWarmUp(step_);
  const bool select = !warm_up && opt_.schedule.IsSelectBoundary(step_);
  // Unscale and clip once, in place, before anything reads the gradient (as the offload
  // pipeline does, so the warm-up and the ZeRO-Offload limits agree bit for bit) where
  // something other than the fused pass reads it: every parameter at warm-up, select and
  // Zen-auto steps, 1-D parameters always. Otherwise the 2-D gradients are scaled on read by
  // the fused pass (zenflow_step_pass.h: the same fp32 product), saving a pass over them.
  const bool in_place = warm_up || select || auto_ != nullptr;
  const bool scale = v.grad_multiplier != 1.0;
  std::vector<OptimizerPartition> parts(n);
  for (size_t i = 0; i < n; ++i) {
    parts[i] = source_(i);
    if (parts[i].grad.defined() && scale && (in_place || !is2d(i))) {
      parts[i].grad.mul_(v.grad_multiplier);
    }
  }
  if (warm_up) {
    // Full offload: every element through the CPU optimizer, synchronously.
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < n; ++i) {
      float* target = is2d(i) ? cpu_param_[i].data_ptr<float>() : parts[i].param.data_ptr<float>();
      cpu_adam_.Step(step_, lr_, target, GradPtr(parts[i]), parts[i].exp_avg.data_ptr<float>(),
                     parts[i].exp_avg_sq.data_ptr<float>(), parts[i].param.numel());
      if (is2d(i)) {
        std::memcpy(parts[i].param.data_ptr<float>(), target, 4 * parts[i].param.numel());
      }
      metrics_.bytes_moved += 8 * parts[i].param.numel();  // gradient down, parameter up
    }
    metrics_.stall_s = Seconds(t0);
    metrics_.update_interval = 1;
    ++metrics_.cpu_updates;
    ++cpu_steps_;
    return absl::OkStatus();
  }
  if (select) {
    absl::Status s = Reselect();
    if (!s.ok()) return s;
  }
  bool boundary = false;
  if (auto_ != nullptr) {
    absl::StatusOr<bool> b = AutoBoundary();
    if (!b.ok()) return b.status();
    boundary = *b;
  } else {
    boundary = opt_.schedule.IsUpdateBoundary(step_);
  }
  // One fused pass per 2-D parameter: host accumulation of the gradient (the interval's sum;
  // at a boundary its mean) and the device-side AdamW of the selected columns. 1-D parameters
  // are updated on the device every step.
  const int b = state_;
  const bool first = acc_steps_[b] == 0;
  const float mean = boundary && acc_steps_[b] + 1 > 1
                         ? static_cast<float>(1.0 / static_cast<double>(acc_steps_[b] + 1))
                         : 1.0f;
  const float mult = in_place ? 1.0f : static_cast<float>(v.grad_multiplier);
  ++acc_steps_[b];
  ++interval_steps_;
  // With the host thread, the accumulation of every 2-D parameter is posted first and runs
  // there while this thread applies the selective update (both only read the gradient).
  const bool async = host_acc_;
  // Per 2-D parameter one pass over all its cohorts (cohort_args_[i], which lives until the
  // next Commit: a deferred update reads it on the host thread).
  std::vector<ZenFlowPassArgs> args(n);
  for (size_t i = 0; i < n; ++i) {
    if (!is2d(i)) continue;
    ZenFlowPassArgs& a = args[i];
    a.grad = GradPtr(parts[i]);
    a.grad_multiplier = mult;
    a.acc = acc_[b][i].data_ptr<float>();
    a.n = acc_[b][i].numel();
    a.first = first;
    a.mean_scale = mean;
    a.master = parts[i].param.data_ptr<float>();
    a.lr = lr_;
    a.accumulate = !async;
    std::vector<ZenFlowCohortArgs>& ca = cohort_args_[i];
    ca.clear();
    for (Cohort& c : cohorts_[i]) {
      ++c.t;
      ++c.t_sq;
      ca.push_back({c.idx.data(), static_cast<int64_t>(c.idx.size()), c.m.data(), c.v.data(),
                    c.t, c.t_sq});
    }
    a.cohorts = ca.data();
    a.num_cohorts = static_cast<int>(ca.size());
    if (parts[i].grad.defined()) metrics_.bytes_moved += 4 * parts[i].grad.numel();
  }
  if (defer_) {
    // The selective updates go to the host thread, in parameter order, ahead of the
    // accumulation; the next forward waits for each at its parameter's first read (AwaitMaster,
    // through the provider's master fence). Publish also writes the masters, so a boundary's
    // publish of interval k-1 happens now, before they are posted; it writes only unselected
    // columns and the selective update only selected ones, so the order changes no bit.
    if (boundary) {
      WaitCpu();  // the boundary code below then finds nothing in flight and nothing pending
      if (pending_) Publish();
    }
    for (size_t i = 0; i < n; ++i) {
      if (cohorts_[i].empty()) continue;  // 1-D, or nothing selected
      sel_args_[i] = args[i];
      sel_state_[i].store(kSelPending, std::memory_order_release);
      sel_ticket_[i] = host_->PostUrgent([this, i] {
        if (!ClaimSelective(i)) return;  // the training thread took it (AwaitMaster)
        host_pass_.Run(sel_args_[i]);
        sel_state_[i].store(kSelDone, std::memory_order_release);
      });
    }
  }
  if (async) {
    std::vector<ZenFlowPassArgs> acc;
    for (size_t i = 0; i < n; ++i) {
      if (is2d(i)) acc.push_back(args[i]);
    }
    if (!acc.empty()) {
      acc_ticket_ = host_->PostUrgent([acc = std::move(acc)] {
        for (const ZenFlowPassArgs& a : acc) ZenFlowStepPass::AccumulateAll(a);
      });
    }
  }
  if (!defer_) {
    for (size_t i = 0; i < n; ++i) {
      if (is2d(i) && (args[i].accumulate || args[i].num_cohorts > 0)) pass_.Run(args[i]);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (is2d(i)) continue;
    device_adam_.Step(step_, lr_, parts[i].param.data_ptr<float>(), GradPtr(parts[i]),
                      parts[i].exp_avg.data_ptr<float>(), parts[i].exp_avg_sq.data_ptr<float>(),
                      parts[i].param.numel());
  }
  if (!boundary) return absl::OkStatus();
  // Update boundary: the interval's mean gradient (acc_[b], scaled above) goes to the CPU
  // optimizer. The buffer's count returns to 0, so its next step overwrites it (no zeroing).
  metrics_.update_interval = interval_steps_;
  interval_steps_ = 0;
  ++metrics_.cpu_updates;
  ++cpu_steps_;
  if (opt_.overlap_step) {
    WaitCpu();  // interval k-1's step: its result lands now, one interval late
    if (pending_) Publish();
    // Behind this step's accumulation into buffer b: a background task starts only when no
    // urgent one is queued (host_worker.h).
    PostCpuStep(step_, lr_, b);
    state_ ^= 1;
    acc_steps_[state_] = 0;
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    RunCpuStep(step_, lr_, b);
    metrics_.stall_s += Seconds(t0);
    Publish();
    acc_steps_[b] = 0;
  }
  return absl::OkStatus();
}

at::Tensor ZenFlowPipeline::accumulator(size_t i) const {
  const at::Tensor& a = acc_[state_][i];
  return acc_steps_[state_] == 0 && a.defined() ? at::zeros_like(a) : a;
}

}  // namespace loom::engine::optim
