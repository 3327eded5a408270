#include "worker/engine/optim/column_selection.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace loom::engine::optim {

int64_t NumSelectedColumns(int64_t columns, double topk_ratio) {
  if (columns <= 0 || !(topk_ratio > 0.0)) return 0;  // NaN selects nothing (the spec refuses it)
  if (topk_ratio >= 1.0) return columns;
  const int64_t k = static_cast<int64_t>(std::floor(topk_ratio * static_cast<double>(columns)));
  return std::min(columns, std::max<int64_t>(1, k));
}

void AddColumnAbsSums(const float* grad, int64_t begin, int64_t end, int64_t cols,
                      double* sums) {
  if (grad == nullptr || cols <= 0 || end <= begin) return;
  // Row by row, so that the inner loop has no branch and vectorises; each column still adds its
  // elements in row order, so the sums are the same doubles as an element-by-element walk.
  const int64_t j0 = begin % cols;
  int64_t f = begin;
  if (j0 != 0) {  // the partition's leading partial row
    const int64_t stop = std::min(end, begin + (cols - j0));
    for (; f < stop; ++f) sums[j0 + (f - begin)] += std::fabs(static_cast<double>(grad[f - begin]));
  }
  for (; f + cols <= end; f += cols) {
    const float* g = grad + (f - begin);
    for (int64_t j = 0; j < cols; ++j) sums[j] += std::fabs(static_cast<double>(g[j]));
  }
  for (int64_t j = 0; f < end; ++f, ++j) {  // the trailing partial row
    sums[j] += std::fabs(static_cast<double>(grad[f - begin]));
  }
}

std::vector<int64_t> TopKColumns(const double* sums, int64_t cols, int64_t k) {
  std::vector<int64_t> idx(cols);
  std::iota(idx.begin(), idx.end(), 0);
  k = std::max<int64_t>(0, std::min(k, cols));
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [sums](int64_t a, int64_t b) {
    return sums[a] > sums[b] || (sums[a] == sums[b] && a < b);
  });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

absl::StatusOr<ColumnSelection> SelectColumns(Collectives& collectives,
                                              const std::vector<ColumnParam>& params,
                                              double topk_ratio) {
  ColumnSelection out;
  out.selected.resize(params.size());
  out.sums.resize(params.size());
  int64_t total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const ColumnParam& p = params[i];
    if (p.rows < 0 || p.cols < 0 || p.begin < 0 || p.end < p.begin ||
        p.end > p.rows * p.cols) {
      return absl::InvalidArgumentError(absl::StrCat(
          "column selection: parameter ", i, " [", p.rows, ", ", p.cols, "] partition [",
          p.begin, ", ", p.end, ") is outside the weight"));
    }
    total += p.cols;
  }
  if (total == 0) return out;
  at::Tensor sums = at::zeros({total}, at::kDouble);
  double* s = sums.data_ptr<double>();
  int64_t off = 0;
  for (const ColumnParam& p : params) {
    AddColumnAbsSums(p.grad, p.begin, p.end, p.cols, s + off);
    off += p.cols;
  }
  if (collectives.world_size() > 1) {
    absl::Status st = collectives.AllReduce(sums, ReduceOp::kSum);
    if (!st.ok()) return st;
  }
  s = sums.data_ptr<double>();
  off = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t c = params[i].cols;
    out.sums[i].assign(s + off, s + off + c);
    out.selected[i] = TopKColumns(s + off, c, NumSelectedColumns(c, topk_ratio));
    off += c;
  }
  return out;
}

bool ZenFlowSchedule::IsSelectBoundary(int64_t step) const {
  if (step <= warm_up) return false;
  const int64_t s = step - warm_up - 1;
  return s == 0 || (select_interval > 0 && s % select_interval == 0);
}

bool ZenFlowSchedule::IsUpdateBoundary(int64_t step) const {
  if (step <= warm_up) return true;
  return update_interval > 0 && (step - warm_up) % update_interval == 0;
}

int64_t SelectIntervalSteps(const std::string& strategy, int64_t select_interval,
                            int64_t steps_per_epoch) {
  if (strategy == "step") return select_interval;
  const int64_t epochs = strategy == "epoch" ? select_interval : 1;
  const int64_t epoch = std::max<int64_t>(0, steps_per_epoch);
  // Saturates: a product past int64 means "never within any run" (and must not wrap to a
  // negative or zero interval).
  if (epoch > 0 && epochs > std::numeric_limits<int64_t>::max() / epoch) {
    return std::numeric_limits<int64_t>::max();
  }
  return epochs * epoch;
}

ZenFlowAutoInterval::ZenFlowAutoInterval(int64_t num_params, double topk_ratio,
                                         double auto_ratio)
    : topk_(topk_ratio),
      auto_ratio_(auto_ratio),
      avg_critic_(num_params, 0.0),
      non_critic_(num_params, 0.0) {}

bool ZenFlowAutoInterval::Observe(const std::vector<double>& total,
                                  const std::vector<double>& critic) {
  ++u_;
  const size_t n = avg_critic_.size();
  int64_t need = 0;
  for (size_t i = 0; i < n; ++i) {
    double a = ((u_ - 1) * avg_critic_[i] + critic[i]) / static_cast<double>(u_);
    if (topk_ > 0) a /= topk_ * 10.0;
    avg_critic_[i] = a;
    if (topk_ < 1.0) {
      non_critic_[i] += (total[i] - critic[i]) / ((1.0 - topk_) * 10.0);
      if (non_critic_[i] >= avg_critic_[i]) ++need;
    }
  }
  const int64_t threshold = std::max<int64_t>(
      1, static_cast<int64_t>(std::floor(auto_ratio_ * static_cast<double>(n))));
  if (n == 0 || need < threshold) return false;
  u_ = 0;
  std::fill(non_critic_.begin(), non_critic_.end(), 0.0);
  return true;
}

std::vector<double> ZenFlowAutoInterval::State() const {
  std::vector<double> s;
  s.push_back(static_cast<double>(u_));
  s.insert(s.end(), avg_critic_.begin(), avg_critic_.end());
  s.insert(s.end(), non_critic_.begin(), non_critic_.end());
  return s;
}

absl::Status ZenFlowAutoInterval::SetState(const std::vector<double>& state) {
  const size_t n = avg_critic_.size();
  if (state.size() != 1 + 2 * n) {
    return absl::InvalidArgumentError(absl::StrCat("zenflow auto-interval state: ", state.size(),
                                                   " values, expected ", 1 + 2 * n));
  }
  u_ = static_cast<int64_t>(state[0]);
  std::copy(state.begin() + 1, state.begin() + 1 + n, avg_critic_.begin());
  std::copy(state.begin() + 1 + n, state.end(), non_critic_.begin());
  return absl::OkStatus();
}

}  // namespace loom::engine::optim
