// ZenFlowPipeline's selection side (zenflow_pipeline.h): a select boundary's re-selection of
// the top-k columns (one fp64 all-reduce of the column sums, column_selection.h), the cohorts
// that carry the selected columns' moments and update counts across re-selections, and
// Zen-auto's per-step boundary test (one all-reduce of the selected and total gradient mass).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "worker/engine/optim/zenflow_pipeline.h"
#include "worker/engine/optim/zenflow_pipeline_internal.h"

namespace loom::engine::optim {

using zenflow_internal::GradPtr;

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

}  // namespace loom::engine::optim
