// SuperOffloadPipeline: construction, the protocol's steps (BeginStep, a sub-group ready:
// queued for speculation, FinishStep's commit or rollback), the device sub-groups' step, the
// restores from the snapshots and the statistics. The speculation thread and its queue are in
// super_offload_pipeline_speculation.cc, the optimizer state on NVMe in
// super_offload_pipeline_nvme.cc.
#include "worker/engine/optim/super_offload_pipeline.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace loom::engine::optim {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

offload::CpuAdamOptions AdamOptions(const SuperOffloadOptions& o) {
  offload::CpuAdamOptions a;
  a.beta1 = o.optimizer.beta1;
  a.beta2 = o.optimizer.beta2;
  a.eps = o.optimizer.eps;
  a.weight_decay = o.optimizer.weight_decay;
  a.decoupled_weight_decay = o.optimizer.decoupled_weight_decay;
  a.bias_correction = o.optimizer.bias_correction;
  a.threads = std::max(1, o.cpu_threads);
  return a;
}

offload::CpuAdamOptions HelperAdamOptions(const SuperOffloadOptions& o) {
  offload::CpuAdamOptions a = AdamOptions(o);
  a.threads = 1;
  return a;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SuperOffloadPipeline>> SuperOffloadPipeline::Create(
    const SuperOffloadOptions& options, SubGroupPlan plan, PartitionSource source) {
  if (!(options.ratio >= 0.0 && options.ratio <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("deepspeed_config.zero_optimization.offload_optimizer.ratio: ",
                     options.ratio, " is not in [0, 1]"));
  }
  if (options.nvme != nullptr) {
    if (!options.nvme->optimizer_nvme() || options.nvme->params_nvme()) {
      return absl::InvalidArgumentError(
          "SuperOffload on NVMe: the offload optimizer must keep its state on NVMe and the "
          "parameters in memory (offload_optimizer.device \"nvme\", offload_param not nvme)");
    }
    const SubGroupPlan& op = options.nvme->plan();
    if (op.num_sub_groups() != plan.num_sub_groups() || op.num_params() != plan.num_params() ||
        op.total_numel() != plan.total_numel()) {
      return absl::InvalidArgumentError(
          "SuperOffload on NVMe: the pipeline's sub-group plan differs from the offload "
          "optimizer's");
    }
  }
  return std::unique_ptr<SuperOffloadPipeline>(
      new SuperOffloadPipeline(options, std::move(plan), std::move(source)));
}

SuperOffloadPipeline::SuperOffloadPipeline(const SuperOffloadOptions& options, SubGroupPlan plan,
                                           PartitionSource source)
    : OptimizerPipeline(std::move(plan)),
      options_(options),
      source_(std::move(source)),
      adam_(AdamOptions(options)),
      helper_adam_(HelperAdamOptions(options)),
      norms_(this->plan().num_params()) {
  const int64_t n = this->plan().num_sub_groups();
  // DeepSpeed zero/stage3.py: sub-group i on the CPU iff i >= floor((1 - ratio) * n).
  first_cpu_ = std::min<int64_t>(n, static_cast<int64_t>(std::floor((1.0 - options_.ratio) * n)));
  cpu_.resize(n - first_cpu_);
  for (int64_t k = first_cpu_; k < n; ++k) {
    CpuGroup& g = cpu_[k - first_cpu_];
    const size_t numel = static_cast<size_t>(this->plan().sub_group(k).numel);
    if (options_.exact_rollback && options_.nvme == nullptr) {  // NVMe: the files are the copy
      g.param.resize(numel);
      g.exp_avg.resize(numel);
      g.exp_avg_sq.resize(numel);
    }
    if (options_.loss_scaled) g.grad.resize(numel);
    const bool snapshot = options_.exact_rollback && options_.nvme == nullptr;
    copy_bytes_ += static_cast<int64_t>(((snapshot ? 3 : 0) +
                                         (options_.loss_scaled ? 1 : 0)) *
                                        numel * sizeof(float));
  }
  worker_ = std::thread([this] { WorkerLoop(); });
}

SuperOffloadPipeline::~SuperOffloadPipeline() {
  {
    std::lock_guard<std::mutex> l(q_mu_);
    stop_ = true;
  }
  q_cv_.notify_all();
  worker_.join();
}

SuperOffloadStats SuperOffloadPipeline::stats() const {
  std::lock_guard<std::mutex> l(stats_mu_);
  return stats_;
}

absl::Status SuperOffloadPipeline::OnBegin() {
  const double scale = options_.loss_scale ? options_.loss_scale() : 1.0;
  if (!(scale > 0) || !std::isfinite(scale)) {
    return absl::InvalidArgumentError(absl::StrCat(name(), ": loss scale ", scale));
  }
  if (scale != 1.0 && !options_.loss_scaled) {
    return absl::FailedPreconditionError(absl::StrCat(
        name(), ": loss scale ", scale, " but the pipeline was built without gradient slots"));
  }
  unscale_ = scale == 1.0 ? 1.0 : 1.0 / scale;  // as ValidateStep's multiplier without clipping
  // NVMe: every swap buffer free before the speculation thread holds any (InitParam's last).
  if (options_.nvme != nullptr) RETURN_IF_ERROR(options_.nvme->Flush());
  speculate_ = !options_.adaptive_speculation || !last_clip_active_;
  for (CpuGroup& g : cpu_) {
    g.stepped = false;
    g.nonfinite = false;
    g.no_buffer = false;
    g.error = absl::OkStatus();
  }
  ++epoch_;
  return absl::OkStatus();
}

bool SuperOffloadPipeline::ComputedSquaredNorm(size_t i, double* squared_norm) const {
  return norms_.Get(i, epoch_, squared_norm);
}

absl::Status SuperOffloadPipeline::OnReady(int64_t k) {
  if (!on_cpu(k)) return absl::OkStatus();  // device sub-groups step after validation
  if (!speculate_) {  // adaptive: the last step clipped, so this one is stepped in FinishStep
    std::lock_guard<std::mutex> l(stats_mu_);
    ++stats_.not_speculated_paused;
    return absl::OkStatus();
  }
  const SubGroup& sg = plan().sub_group(k);
  Task t{k, step_, lr_, unscale_, {}};
  t.epoch = epoch_;
  for (size_t i = sg.first; i < sg.last; ++i) {
    OptimizerPartition p = source_(i);
    // With the state on NVMe the moments are the optimizer's (undefined here).
    t.slices.push_back({p.param.data_ptr<float>(),
                        p.grad.defined() ? p.grad.data_ptr<float>() : nullptr,
                        p.exp_avg.defined() ? p.exp_avg.data_ptr<float>() : nullptr,
                        p.exp_avg_sq.defined() ? p.exp_avg_sq.data_ptr<float>() : nullptr,
                        p.param.numel(), plan().partition_offset(i) - sg.offset, i});
  }
  {
    std::lock_guard<std::mutex> l(q_mu_);
    queue_.push_back(std::move(t));
  }
  q_cv_.notify_one();
  return absl::OkStatus();
}

void SuperOffloadPipeline::AccountTasks(Clock::time_point finish_entered) {
  std::lock_guard<std::mutex> l(stats_mu_);
  ++stats_.steps;
  for (const CpuGroup& g : cpu_) {
    if (g.no_buffer) ++stats_.not_speculated_no_buffer;
    if (!g.stepped && !g.nonfinite) continue;
    if (g.stepped) ++stats_.speculated;
    if (g.nonfinite) ++stats_.not_speculated_nonfinite;
    stats_.speculative_s += Seconds(g.end - g.start);
    stats_.overlapped_s +=
        std::max(0.0, Seconds(std::min(g.end, finish_entered) - g.start));
  }
}

int64_t SuperOffloadPipeline::RestoreAll() {
  int64_t restored = 0;
  for (int64_t k = first_cpu_; k < plan().num_sub_groups(); ++k) {
    CpuGroup& g = cpu_[k - first_cpu_];
    if (!g.stepped) continue;
    if (options_.nvme != nullptr) {  // the files hold the pre-step state: drop the buffers
      options_.nvme->DropHeldGroup(&g.held);
      g.stepped = false;
      ++restored;
      continue;
    }
    const SubGroup& sg = plan().sub_group(k);
    for (size_t i = sg.first; i < sg.last; ++i) {
      OptimizerPartition p = source_(i);
      const int64_t off = plan().partition_offset(i) - sg.offset;
      const size_t bytes = p.param.numel() * sizeof(float);
      std::memcpy(p.param.data_ptr<float>(), g.param.data() + off, bytes);
      std::memcpy(p.exp_avg.data_ptr<float>(), g.exp_avg.data() + off, bytes);
      std::memcpy(p.exp_avg_sq.data_ptr<float>(), g.exp_avg_sq.data() + off, bytes);
    }
    g.stepped = false;
    ++restored;
  }
  return restored;
}

void SuperOffloadPipeline::StepCpuGroup(int64_t k, double multiplier, offload::CpuAdam& adam) {
  // The synchronous ZeRO-Offload step (offload_pipeline.cc): gradient multiplied in place, then
  // CpuAdam per parameter.
  const SubGroup& sg = plan().sub_group(k);
  for (size_t i = sg.first; i < sg.last; ++i) {
    OptimizerPartition p = source_(i);
    const float* grad = nullptr;
    if (p.grad.defined()) {
      if (multiplier != 1.0) p.grad.mul_(multiplier);
      grad = p.grad.data_ptr<float>();
    }
    adam.Step(step_, lr_, p.param.data_ptr<float>(), grad, p.exp_avg.data_ptr<float>(),
              p.exp_avg_sq.data_ptr<float>(), p.param.numel());
  }
}

void SuperOffloadPipeline::StepDeviceGroups(double multiplier) {
  OptimizerStepArgs args;
  args.step = step_;
  args.lr = lr_;
  args.grad_multiplier = multiplier;
  std::vector<OptimizerPartition> group;
  for (int64_t k = 0; k < first_cpu_; ++k) {
    const SubGroup& sg = plan().sub_group(k);
    group.clear();
    for (size_t i = sg.first; i < sg.last; ++i) group.push_back(source_(i));
    ApplyOptimizerStep(options_.optimizer, args, group);
  }
}

absl::Status SuperOffloadPipeline::Commit(const StepValidation& v) {
  const Clock::time_point entered = Clock::now();
  if (!Drain()) {
    return absl::DeadlineExceededError(absl::StrCat(
        name(), ": step ", step_, ": speculative CPU Adam steps did not finish within ",
        options_.wait_deadline.count(), " ms"));
  }
  AccountTasks(entered);
  if (options_.nvme != nullptr) return CommitNvme(v);
  const Clock::time_point work0 = Clock::now();
  int64_t rolled_back = 0, hits = 0;
  if (v.clip_coef > 1.0 && !options_.exact_rollback) {
    return absl::FailedPreconditionError(absl::StrCat(
        name(), ": step ", step_, ": clipping is active (coefficient ", v.clip_coef,
        ") but the pipeline was built without rollback snapshots (exact_rollback false)"));
  }
  if (v.clip_coef > 1.0) {
    // Clipping is active: the speculative steps used the unclipped gradient. Restore them
    // exactly and replay every CPU sub-group with the clipped one (clip-and-replay).
    rolled_back = RestoreAll();
    std::vector<int64_t> all;
    for (int64_t k = first_cpu_; k < plan().num_sub_groups(); ++k) all.push_back(k);
    if (!StepCpuGroupsInCommit(all, v.grad_multiplier)) return DeadlineInCommit();
  } else {
    std::vector<int64_t> rest;  // not speculated (paused, or non-finite gradient)
    for (int64_t k = first_cpu_; k < plan().num_sub_groups(); ++k) {
      CpuGroup& g = cpu_[k - first_cpu_];
      if (g.stepped) {
        ++hits;  // the speculative step is the step
      } else {
        rest.push_back(k);
      }
      g.stepped = false;
    }
    if (!StepCpuGroupsInCommit(rest, v.grad_multiplier)) return DeadlineInCommit();
  }
  StepDeviceGroups(v.grad_multiplier);
  RecordCommit(v, hits, rolled_back, work0);
  return absl::OkStatus();
}

void SuperOffloadPipeline::RecordCommit(const StepValidation& v, int64_t hits,
                                        int64_t rolled_back, Clock::time_point work0) {
  last_clip_active_ = v.clip_coef > 1.0;
  std::lock_guard<std::mutex> l(stats_mu_);
  stats_.hits += hits;
  stats_.rollbacks_clip += rolled_back;
  stats_.replays += rolled_back;
  if (rolled_back > 0) ++stats_.step_rollbacks;
  stats_.finish_work_s += Seconds(Clock::now() - work0);
}

void SuperOffloadPipeline::RecordRollback(int64_t restored, Clock::time_point work0) {
  std::lock_guard<std::mutex> l(stats_mu_);
  stats_.rollbacks_overflow += restored;
  if (restored > 0) ++stats_.step_rollbacks;
  stats_.finish_work_s += Seconds(Clock::now() - work0);
}

absl::Status SuperOffloadPipeline::Rollback() {
  const Clock::time_point entered = Clock::now();
  if (!Drain()) {
    return absl::DeadlineExceededError(absl::StrCat(
        name(), ": step ", step_, ": speculative CPU Adam steps did not finish within ",
        options_.wait_deadline.count(), " ms (rollback)"));
  }
  AccountTasks(entered);
  if (options_.nvme != nullptr) return RollbackNvme();
  if (!options_.exact_rollback) {
    bool stepped = false;
    for (CpuGroup& g : cpu_) {
      stepped = stepped || g.stepped;
      g.stepped = false;
    }
    if (!stepped) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        name(), ": step ", step_, ": rollback requested but the pipeline was built without "
        "rollback snapshots (exact_rollback false)"));
  }
  const Clock::time_point work0 = Clock::now();
  const int64_t restored = RestoreAll();
  RecordRollback(restored, work0);
  return absl::OkStatus();
}

}  // namespace loom::engine::optim
