#include "worker/engine/optim/zenflow_pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace loom::engine::optim {
namespace {

offload::CpuAdamOptions WithThreads(offload::CpuAdamOptions o, int threads) {
  o.threads = std::max(1, threads);
  return o;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

const float* GradPtr(const OptimizerPartition& p) {
  return p.grad.defined() ? p.grad.data_ptr<float>() : nullptr;
}

}  // namespace

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

void ZenFlowPipeline::BuildCohorts(size_t i, std::vector<int> col_cohort,
                                   std::vector<std::pair<int64_t, int64_t>> t,
                                   const float* init_v) {
  const ZenFlowParam& p = params_[i];
  std::vector<Cohort> old = std::move(cohorts_[i]);
  const std::vector<int> old_map = std::move(col_cohort_[i]);
  std::vector<size_t> cursor(old.size(), 0);
  std::vector<Cohort> now(t.size());
  for (size_t c = 0; c < t.size(); ++c) std::tie(now[c].t, now[c].t_sq) = t[c];
  std::vector<int64_t>& all = sel_idx_[i];
  all.clear();
  // Each cohort's elements come out ascending (ForEachElementOfColumns), and an old cohort's
  // elements are met in its own (ascending) order, so one cursor per old cohort finds an
  // element's moments.
  std::vector<int64_t> cols, per_cohort(now.size(), 0);
  for (int64_t j = 0; j < p.cols; ++j) {
    if (col_cohort[j] >= 0) {
      cols.push_back(j);
      ++per_cohort[col_cohort[j]];
    }
  }
  const int64_t rows = (p.end - p.begin + p.cols - 1) / p.cols + 1;  // rows the partition spans
  for (size_t c = 0; c < now.size(); ++c) {
    now[c].idx.reserve(rows * per_cohort[c]);
    now[c].m.reserve(rows * per_cohort[c]);
    now[c].v.reserve(rows * per_cohort[c]);
  }
  all.reserve(rows * static_cast<int64_t>(cols.size()));
  ForEachElementOfColumns(p.begin, p.end, p.cols, cols, [&](int64_t e, int64_t j) {
    const int c = col_cohort[j];
    Cohort& to = now[c];
    to.idx.push_back(e);
    all.push_back(e);
    const int o = old_map.empty() ? -1 : old_map[j];
    float m = 0.0f;
    float v = init_v != nullptr ? init_v[e] : 0.0f;
    if (o >= 0) {
      const Cohort& from = old[o];
      size_t& q = cursor[o];
      while (q < from.idx.size() && from.idx[q] != e) ++q;
      if (q < from.idx.size()) {
        m = from.m[q];
        v = from.v[q];
        ++q;
      }
    }
    to.m.push_back(m);
    to.v.push_back(v);
  });
  cohorts_[i] = std::move(now);
  col_cohort_[i] = std::move(col_cohort);
}

int64_t ZenFlowPipeline::selective_steps(size_t i, int64_t column) const {
  if (i >= col_cohort_.size() || column < 0 ||
      column >= static_cast<int64_t>(col_cohort_[i].size())) {
    return 0;
  }
  const int c = col_cohort_[i][column];
  return c < 0 ? 0 : cohorts_[i][c].t;
}

absl::Status ZenFlowPipeline::Reselect() {
  // A CPU result in flight or pending goes in with the old selection first.
  WaitCpu();
  if (pending_) Publish();
  std::vector<size_t> ids;
  std::vector<ColumnParam> cp;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!is2d(i)) continue;
    OptimizerPartition p = source_(i);
    ids.push_back(i);
    cp.push_back({params_[i].rows, params_[i].cols, params_[i].begin, params_[i].end,
                  GradPtr(p)});
  }
  absl::StatusOr<ColumnSelection> sel = SelectColumns(*coll_, cp, opt_.topk_ratio);
  if (!sel.ok()) return sel.status();
  double all = 0, chosen = 0;
  for (size_t q = 0; q < ids.size(); ++q) {
    const size_t i = ids[q];
    selected_[i] = sel->selected[q];
    for (double s : sel->sums[q]) all += s;
    for (int64_t j : selected_[i]) chosen += sel->sums[q][j];
    // Columns still selected stay in their cohorts. The new ones form a cohort whose first
    // moment starts at zero and whose second moment starts from the CPU optimizer's, with
    // cpu_steps_ updates (each bias correction matches its moment's history; the CPU step
    // itself uses the optimizer step as t, as DeepSpeed's does). Every rank sees the same
    // selections and CPU steps, so the cohorts agree across ranks.
    const std::vector<int>& old_map = col_cohort_[i];
    std::vector<std::pair<int64_t, int64_t>> t;
    for (const Cohort& c : cohorts_[i]) t.emplace_back(c.t, c.t_sq);
    const int fresh = static_cast<int>(t.size());
    t.emplace_back(0, cpu_steps_);
    std::vector<int> map(params_[i].cols, -1);
    std::vector<int64_t> members(t.size(), 0);
    for (int64_t j : selected_[i]) {
      map[j] = old_map.empty() || old_map[j] < 0 ? fresh : old_map[j];
      ++members[map[j]];
    }
    // The CPU copy of the columns leaving the device takes the device's values. A staying
    // column's CPU copy is never published (Publish keeps the selected elements), so it is left.
    std::vector<int64_t> leaving;
    for (size_t j = 0; j < old_map.size(); ++j) {
      if (old_map[j] >= 0 && map[j] < 0) leaving.push_back(static_cast<int64_t>(j));
    }
    OptimizerPartition part = source_(i);
    float* cpu = cpu_param_[i].data_ptr<float>();
    const float* master = part.param.data_ptr<float>();
    ForEachElementOfColumns(params_[i].begin, params_[i].end, params_[i].cols, leaving,
                            [cpu, master](int64_t e, int64_t) { cpu[e] = master[e]; });
    // Drop the empty cohorts; past kMaxCohorts merge the two oldest at the younger's t.
    std::vector<int> order;  // surviving cohorts, oldest first
    for (size_t c = 0; c < t.size(); ++c) {
      if (members[c] > 0) order.push_back(static_cast<int>(c));
    }
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return t[a] > t[b]; });
    std::vector<int> renum(t.size(), -1);
    size_t skip = order.size() > kMaxCohorts ? order.size() - kMaxCohorts : 0;
    std::vector<std::pair<int64_t, int64_t>> new_t;
    for (size_t r = 0; r < order.size(); ++r) {
      if (r < skip) continue;  // merged into the first kept cohort below
      renum[order[r]] = static_cast<int>(new_t.size());
      new_t.push_back(t[order[r]]);
    }
    for (size_t r = 0; r < skip; ++r) renum[order[r]] = 0;
    for (int& c : map) c = c < 0 ? -1 : renum[c];
    BuildCohorts(i, std::move(map), std::move(new_t), part.exp_avg_sq.data_ptr<float>());
    metrics_.bytes_moved += 8 * params_[i].cols;  // the column sums
  }
  metrics_.selected_mass_fraction = all > 0 ? chosen / all : 0.0;
  return absl::OkStatus();
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

void ZenFlowPipeline::RunCpuStep(int64_t t, double lr, int buffer) {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!is2d(i)) continue;
    OptimizerPartition p = source_(i);
    cpu_adam_.Step(t, lr, cpu_param_[i].data_ptr<float>(), acc_[buffer][i].data_ptr<float>(),
                   p.exp_avg.data_ptr<float>(), p.exp_avg_sq.data_ptr<float>(),
                   cpu_param_[i].numel());
  }
}

absl::StatusOr<bool> ZenFlowPipeline::AutoBoundary() {
  std::vector<size_t> ids;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (is2d(i)) ids.push_back(i);
  }
  const int64_t n = static_cast<int64_t>(ids.size());
  at::Tensor stats = at::zeros({2 * n}, at::kDouble);
  double* s = stats.data_ptr<double>();
  for (int64_t q = 0; q < n; ++q) {
    OptimizerPartition p = source_(ids[q]);
    const float* g = GradPtr(p);
    if (g == nullptr) continue;
    const int64_t valid = params_[ids[q]].end - params_[ids[q]].begin;
    double total = 0, critic = 0;
    for (int64_t e = 0; e < valid; ++e) total += std::fabs(static_cast<double>(g[e]));
    for (int64_t e : sel_idx_[ids[q]]) critic += std::fabs(static_cast<double>(g[e]));
    s[q] = total;
    s[n + q] = critic;
  }
  if (n > 0 && coll_->world_size() > 1) {
    absl::Status st = coll_->AllReduce(stats, ReduceOp::kSum);
    if (!st.ok()) return st;
  }
  s = stats.data_ptr<double>();
  std::vector<double> total(s, s + n), critic(s + n, s + 2 * n);
  double all = 0, chosen = 0;
  for (int64_t q = 0; q < n; ++q) {
    all += total[q];
    chosen += critic[q];
  }
  metrics_.selected_mass_fraction = all > 0 ? chosen / all : 0.0;
  return auto_->Observe(total, critic);
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
