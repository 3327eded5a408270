// ZenFlow's column selection (arXiv 2505.12242 §3; docs/design/TECHNIQUES.md §2.2-§2.3,
// docs/design/TECHNIQUES-TESTS.md §2.1.2): which input features of each 2-D weight are "important"
// enough to be updated at once, and when the choice is refreshed.
//
// A column of a 2-D weight W [out, in] (row-major, as nn.Linear stores it) is input feature j,
// the `out` values W[:, j]. Its importance is the L1 norm of the reduced (data-parallel mean)
// gradient over the column, Σ_r |g[r, j]| (DeepSpeed's code uses this abs-sum; the blog calls it
// a norm proxy). Loom partitions every parameter's flat row-major elements (rank r owns
// [r*p, min((r+1)*p, n)), partition.h), so a rank's partial sums cover whole and partial rows and
// one all-reduce (SUM) of an [in] vector per parameter gives the exact global sums on every rank.
// Gloo's all-reduce hands every rank the same bits, so the top-k, taken with a deterministic tie
// order, is identical on every rank with no broadcast: unlike DeepSpeed stage 1/2, a column that
// straddles two partitions can be selected, and no transposed copy of the weights is needed.
//
// The count rule (DeepSpeed's newer _num_selected_columns, ZF-U1): k = max(1, floor(ratio * in))
// for in > 0 and ratio > 0; k = 0 for in == 0 and, in Loom, for ratio == 0 exactly (only the 1-D
// parameters are then updated at once: ZenFlow degenerates to ZeRO-Offload,
// docs/design/TECHNIQUES.md §2.8.3).
//
// Thread-safety: the pure functions are thread-safe; SelectColumns runs one collective and must
// be called by every rank in the same order (the training thread).
#ifndef LOOM_WORKER_ENGINE_OPTIM_COLUMN_SELECTION_H_
#define LOOM_WORKER_ENGINE_OPTIM_COLUMN_SELECTION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/collectives.h"

namespace loom::engine::optim {

// max(1, floor(ratio * columns)) for columns > 0 and ratio > 0, else 0. ratio in [0, 1].
int64_t NumSelectedColumns(int64_t columns, double topk_ratio);

// Adds |grad| of a partition into per-column sums: the partition holds the flat elements
// [begin, end) of a row-major [rows, cols] weight, grad[0 .. end-begin) (fp32). sums: [cols].
void AddColumnAbsSums(const float* grad, int64_t begin, int64_t end, int64_t cols,
                      double* sums);

// Calls fn(e, j) for every local element e (0-based in the partition) of the flat elements
// [begin, end) of a row-major [rows, cols] weight that lies in one of the columns `columns`
// (ascending), in ascending order of e: row by row, the columns in order within a row. Takes
// rows x |columns| steps, not end - begin.
template <typename Fn>
void ForEachElementOfColumns(int64_t begin, int64_t end, int64_t cols,
                             const std::vector<int64_t>& columns, Fn fn) {
  if (columns.empty() || cols <= 0) return;
  for (int64_t row = begin / cols; row * cols < end; ++row) {
    for (int64_t j : columns) {
      const int64_t f = row * cols + j;
      if (f < begin) continue;
      if (f >= end) break;
      fn(f - begin, j);
    }
  }
}

// The k largest of sums[0 .. cols), returned sorted ascending by column index. Ties: the lower
// index wins (deterministic, so identical inputs give identical selections). 0 <= k <= cols.
std::vector<int64_t> TopKColumns(const double* sums, int64_t cols, int64_t k);

// One 2-D parameter as this rank holds it.
struct ColumnParam {
  int64_t rows = 0, cols = 0;    // W [rows, cols] = [out, in]
  int64_t begin = 0, end = 0;    // this rank's flat elements [begin, end) (partition.h)
  const float* grad = nullptr;   // [end - begin] reduced gradient of the partition; null = zero
};

struct ColumnSelection {
  std::vector<std::vector<int64_t>> selected;  // per parameter: sorted column indices
  std::vector<std::vector<double>> sums;       // per parameter: the global column L1 sums [cols]
};

// Global column L1 sums of every parameter (one all-reduce SUM of their concatenated [cols]
// vectors, fp64) and the top-k of each with the count rule. Every rank gets the same result.
// With no parameters (or no columns) no collective is issued and the selection is empty, on
// every rank alike (the parameter list is the same on every rank). Errors: the collective's
// (DEADLINE_EXCEEDED / UNAVAILABLE); INVALID_ARGUMENT for a parameter whose [begin, end) is not
// inside rows * cols.
absl::StatusOr<ColumnSelection> SelectColumns(Collectives& collectives,
                                              const std::vector<ColumnParam>& params,
                                              double topk_ratio);

// When selections are refreshed and CPU updates happen, in optimizer steps (1-based `step`, the
// count the step has when committed). Steps 1..warm_up are full-offload steps: each is an
// update boundary and none selects. After warm-up (docs/design/TECHNIQUES-TESTS.md §2.1.2):
//   select boundary: step == warm_up + 1, or (select_interval > 0 and
//                    (step - warm_up - 1) % select_interval == 0); select_interval 0 = once.
//   update boundary: update_interval U > 0: (step - warm_up) % U == 0 (intervals counted from
//                    the end of warm-up, so every interval has U steps; DeepSpeed counts from step
//                    0). U == 0 is Zen-auto: the caller decides (ZenFlowAutoInterval).
struct ZenFlowSchedule {
  int64_t warm_up = 0;
  int64_t select_interval = 0;  // steps; 0 = select once
  int64_t update_interval = 1;  // steps; 0 = auto
  bool IsWarmUp(int64_t step) const { return step <= warm_up; }
  bool IsSelectBoundary(int64_t step) const;
  // Fixed interval only (update_interval > 0).
  bool IsUpdateBoundary(int64_t step) const;
};

// select_interval in steps from the config: strategy "step": the integer; "epoch": interval *
// steps_per_epoch; "auto": steps_per_epoch. steps_per_epoch 0 (unknown) gives 0 = select once.
// A product past int64 saturates at INT64_MAX (never re-selected in any run).
int64_t SelectIntervalSteps(const std::string& strategy, int64_t select_interval,
                            int64_t steps_per_epoch);

// The Zen-auto rule (docs/design/TECHNIQUES-TESTS.md §2.1.5, DeepSpeed
// _process_selected_fp32_groups_grad), per 2-D parameter, fed every step after warm-up with the
// global L1 of the parameter's gradient (total) and of its selected columns (critic):
//   u += 1; avg_critic = ((u-1) * avg_critic + critic) / u / (topk * 10)  (topk > 0)
//   non_critic += (total - critic) / ((1 - topk) * 10)
//   the parameter "needs an update" when non_critic >= avg_critic.
// The step is an update boundary when at least floor(auto_ratio * #params) parameters need one
// (at least 1); then u and every non_critic reset (avg_critic carries on, as in DeepSpeed).
// Unlike DeepSpeed this decides the boundary in the same step (DeepSpeed's flag takes effect the
// next micro-step), and topk == 1 (no unselected mass) never needs an update.
class ZenFlowAutoInterval {
 public:
  ZenFlowAutoInterval(int64_t num_params, double topk_ratio, double auto_ratio);
  // total[i], critic[i] of this step. Returns true when this step is an update boundary.
  bool Observe(const std::vector<double>& total, const std::vector<double>& critic);
  int64_t steps_since_update() const { return u_; }
  // Checkpoint state: u, then avg_critic[i], non_critic[i].
  std::vector<double> State() const;
  absl::Status SetState(const std::vector<double>& state);

 private:
  double topk_, auto_ratio_;
  int64_t u_ = 0;
  std::vector<double> avg_critic_, non_critic_;
};

}  // namespace loom::engine::optim

#endif  // LOOM_WORKER_ENGINE_OPTIM_COLUMN_SELECTION_H_
