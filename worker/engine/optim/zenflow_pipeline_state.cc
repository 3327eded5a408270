// ZenFlowPipeline's checkpoint state (zenflow_pipeline.h, ExportState / ImportState): every
// piece of ZenFlow state that the model's master/exp_avg/exp_avg_sq sections do not hold, as
// named CPU tensors, and its validation on import.
#include "worker/engine/optim/zenflow_pipeline.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace loom::engine::optim {

std::vector<std::pair<std::string, at::Tensor>> ZenFlowPipeline::ExportState() {
  Quiesce();
  if (!initialized_) InitCpuCopies();
  std::vector<std::pair<std::string, at::Tensor>> out;
  const std::vector<double> autos = auto_ ? auto_->State() : std::vector<double>{};
  at::Tensor counters = at::tensor(std::vector<int64_t>{acc_steps_[0], acc_steps_[1], state_,
                                                        pending_ ? 1 : 0, interval_steps_,
                                                        cpu_steps_},
                                   at::kLong);
  out.emplace_back("counters", counters);
  out.emplace_back("auto", at::tensor(autos, at::kDouble).reshape({-1}));
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!is2d(i)) continue;
    const std::string p = absl::StrCat("param", i, ".");
    out.emplace_back(p + "cpu_param", cpu_param_[i].clone());
    // A buffer with count 0 holds stale values that its next step overwrites: saved as zeros.
    for (int b = 0; b < 2; ++b) {
      out.emplace_back(absl::StrCat(p, "acc", b),
                       acc_steps_[b] == 0 ? at::zeros_like(acc_[b][i]) : acc_[b][i].clone());
    }
    out.emplace_back(p + "selected",
                     at::tensor(selected_[i], at::kLong).reshape({-1}).clone());
    // The cohort of each selected column (in `selected` order), each cohort's (m, v) update
    // counts ([cohorts, 2] flat), and the moments cohort after cohort, each cohort's elements
    // ascending.
    std::vector<int64_t> of, t;
    std::vector<float> m, v;
    for (int64_t j : selected_[i]) of.push_back(col_cohort_[i][j]);
    for (const Cohort& c : cohorts_[i]) {
      t.push_back(c.t);
      t.push_back(c.t_sq);
      m.insert(m.end(), c.m.begin(), c.m.end());
      v.insert(v.end(), c.v.begin(), c.v.end());
    }
    out.emplace_back(p + "sel_cohort", at::tensor(of, at::kLong).reshape({-1}).clone());
    out.emplace_back(p + "sel_cohort_t", at::tensor(t, at::kLong).reshape({-1}).clone());
    out.emplace_back(p + "sel_exp_avg", at::tensor(m, at::kFloat).reshape({-1}).clone());
    out.emplace_back(p + "sel_exp_avg_sq", at::tensor(v, at::kFloat).reshape({-1}).clone());
  }
  return out;
}

absl::Status ZenFlowPipeline::ImportState(
    const std::vector<std::pair<std::string, at::Tensor>>& state, int64_t max_steps) {
  Quiesce();
  if (!initialized_) InitCpuCopies();
  std::vector<std::pair<std::string, at::Tensor>> want = ExportState();
  if (state.size() != want.size()) {
    return absl::InvalidArgumentError(absl::StrCat("zenflow state: ", state.size(),
                                                   " tensors, expected ", want.size()));
  }
  for (size_t q = 0; q < want.size(); ++q) {
    const auto& [name, t] = state[q];
    if (name != want[q].first || t.scalar_type() != want[q].second.scalar_type() ||
        (name.find(".sel") == std::string::npos && name != "auto" &&
         t.numel() != want[q].second.numel())) {
      return absl::InvalidArgumentError(absl::StrCat("zenflow state: tensor ", q, " \"", name,
                                                     "\" does not match \"", want[q].first,
                                                     "\" of this run"));
    }
  }
  // Everything is checked before anything is applied: a state rejected here leaves the
  // pipeline as it was.
  const int64_t* c = state[0].second.data_ptr<int64_t>();
  auto count_ok = [max_steps](int64_t n) { return n >= 0 && n <= max_steps; };
  if (!count_ok(c[0]) || !count_ok(c[1]) || (c[2] != 0 && c[2] != 1) ||
      (c[3] != 0 && c[3] != 1) || !count_ok(c[4]) || !count_ok(c[5])) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zenflow state: counters [", c[0], ", ", c[1], ", ", c[2], ", ", c[3], ", ", c[4], ", ",
        c[5], "] out of range (step counts in [0, ", max_steps,
        "], buffer and pending 0 or 1)"));
  }
  if (auto_ != nullptr && state[1].second.numel() != want[1].second.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zenflow state: auto: ", state[1].second.numel(), " values, expected ",
        want[1].second.numel(),
        state[1].second.numel() == 0
            ? " (the checkpoint was written with a fixed update_interval and this run's is "
              "\"auto\": Zen-auto cannot resume a fixed-interval run)"
            : ""));
  }
  struct Selection {
    std::vector<int> map;                          // [cols] cohort of each column, -1 unselected
    std::vector<std::pair<int64_t, int64_t>> t;    // per cohort (m, v) update counts
  };
  std::vector<Selection> sel(params_.size());
  for (size_t i = 0, q = 2; i < params_.size(); ++i) {
    if (!is2d(i)) continue;
    const at::Tensor& s = state[q + 3].second;
    const at::Tensor& of = state[q + 4].second;
    const at::Tensor& ts = state[q + 5].second;
    const at::Tensor& m = state[q + 6].second;
    const at::Tensor& v = state[q + 7].second;
    q += 8;
    if (of.numel() != s.numel()) {
      return absl::InvalidArgumentError(absl::StrCat("zenflow state: param", i, ".sel_cohort: ",
                                                     of.numel(), " values for ", s.numel(),
                                                     " selected columns"));
    }
    // [cohorts, 2]: each cohort's (m, v) update counts.
    if (ts.numel() % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "zenflow state: param", i, ".sel_cohort_t: ", ts.numel(), " values, not pairs"));
    }
    const int64_t cohorts = ts.numel() / 2;
    if (cohorts > kMaxCohorts) {
      return absl::InvalidArgumentError(absl::StrCat("zenflow state: param", i,
                                                     ".sel_cohort_t: ", cohorts,
                                                     " cohorts, at most ", kMaxCohorts));
    }
    Selection& out = sel[i];
    for (int64_t h = 0; h < cohorts; ++h) {
      const int64_t tm = ts.data_ptr<int64_t>()[2 * h], tv = ts.data_ptr<int64_t>()[2 * h + 1];
      if (tm < 0 || tv < tm || tv > max_steps) {
        return absl::InvalidArgumentError(absl::StrCat(
            "zenflow state: param", i, ".sel_cohort_t: bad step counts (", tm, ", ", tv, ")"));
      }
      out.t.emplace_back(tm, tv);
    }
    out.map.assign(params_[i].cols, -1);
    const ZenFlowParam& p = params_[i];
    for (int64_t e = 0; e < s.numel(); ++e) {
      const int64_t j = s.data_ptr<int64_t>()[e], h = of.data_ptr<int64_t>()[e];
      if (j < 0 || j >= p.cols || out.map[j] >= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "zenflow state: param", i, ".selected: column ", j, " out of range or repeated"));
      }
      if (h < 0 || h >= cohorts) {
        return absl::InvalidArgumentError(absl::StrCat("zenflow state: param", i,
                                                       ".sel_cohort: cohort ", h, " of ",
                                                       cohorts));
      }
      out.map[j] = static_cast<int>(h);
    }
    // The selected elements in this rank's partition: as many as BuildCohorts will make.
    std::vector<int64_t> cols(s.data_ptr<int64_t>(), s.data_ptr<int64_t>() + s.numel());
    std::sort(cols.begin(), cols.end());
    int64_t k = 0;
    ForEachElementOfColumns(p.begin, p.end, p.cols, cols, [&k](int64_t, int64_t) { ++k; });
    if (m.numel() != k || v.numel() != k) {
      return absl::InvalidArgumentError(absl::StrCat("zenflow state: param", i,
                                                     ".sel_exp_avg: ", m.numel(), " and ",
                                                     v.numel(), " values for ", k,
                                                     " selected elements"));
    }
  }
  // Apply.
  acc_steps_[0] = c[0];
  acc_steps_[1] = c[1];
  state_ = static_cast<int>(c[2]);
  pending_ = c[3] != 0;
  interval_steps_ = c[4];
  cpu_steps_ = c[5];
  if (auto_ != nullptr) {
    const at::Tensor& a = state[1].second;
    absl::Status st =
        auto_->SetState(std::vector<double>(a.data_ptr<double>(), a.data_ptr<double>() + a.numel()));
    if (!st.ok()) return st;  // not reached: its size was checked above
  }
  for (size_t i = 0, q = 2; i < params_.size(); ++i) {
    if (!is2d(i)) continue;
    cpu_param_[i].copy_(state[q].second);
    acc_[0][i].copy_(state[q + 1].second);
    acc_[1][i].copy_(state[q + 2].second);
    const at::Tensor& s = state[q + 3].second;
    const at::Tensor& m = state[q + 6].second;
    const at::Tensor& v = state[q + 7].second;
    q += 8;
    selected_[i].assign(s.data_ptr<int64_t>(), s.data_ptr<int64_t>() + s.numel());
    col_cohort_[i].clear();  // nothing carries over: the moments come from the state
    cohorts_[i].clear();
    BuildCohorts(i, std::move(sel[i].map), std::move(sel[i].t), nullptr);
    const float* pm = m.data_ptr<float>();
    const float* pv = v.data_ptr<float>();
    for (Cohort& h : cohorts_[i]) {
      std::copy(pm, pm + h.idx.size(), h.m.begin());
      std::copy(pv, pv + h.idx.size(), h.v.begin());
      pm += h.idx.size();
      pv += h.idx.size();
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::engine::optim
