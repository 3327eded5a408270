#include "worker/engine/offload/cpu_adam.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace loom::engine::offload {

// ---- ThreadPool ----

ThreadPool::ThreadPool(int threads) {
  const int n = std::max(1, threads);
  ranges_.resize(n);
  for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::WorkerLoop(int index) {
  int64_t seen = 0;
  while (true) {
    const std::function<void(int64_t, int64_t)>* job;
    std::pair<int64_t, int64_t> range;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      range = ranges_[index];
    }
    if (range.first < range.second) (*job)(range.first, range.second);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  const int64_t parts = std::min<int64_t>(threads(), units);
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  // Contiguous ranges of whole grains; the caller takes range 0.
  std::vector<std::pair<int64_t, int64_t>> ranges(threads(), {0, 0});
  for (int64_t i = 0; i < parts; ++i) {
    const int64_t b = std::min(n, (units * i / parts) * grain);
    const int64_t e = std::min(n, (units * (i + 1) / parts) * grain);
    ranges[i] = {b, e};
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ranges_ = ranges;
    job_ = &fn;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  start_cv_.notify_all();
  fn(ranges[0].first, ranges[0].second);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
}

// ---- Kernels ----

namespace {

// fp32 coefficients of one step, rounded once (as LibTorch rounds a double Scalar to the
// tensor's dtype).
struct Coeffs {
  float decay;        // 1 - lr*wd (decoupled), else 1
  float l2;           // wd (L2 mode), else 0
  float b1, omb1, b2, omb2;
  float bc2_sqrt, eps, neg_step;
  bool decoupled, use_l2;
};

// The element loop. Inlined into one wrapper per instruction set, where the auto-vectoriser
// widens it (no FMA contraction: -ffp-contract=off in the BUILD copts).
template <bool kHasGrad>
__attribute__((always_inline)) inline void AdamLoop(const Coeffs& c, float* __restrict p,
                                                    const float* __restrict g,
                                                    float* __restrict m, float* __restrict v,
                                                    int64_t n) {
  const float decay = c.decay, l2 = c.l2, b1 = c.b1, omb1 = c.omb1, b2 = c.b2, omb2 = c.omb2,
              bc2_sqrt = c.bc2_sqrt, eps = c.eps, neg_step = c.neg_step;
  const bool decoupled = c.decoupled, use_l2 = c.use_l2;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float pi = p[i];
    float gi = kHasGrad ? g[i] : 0.0f;
    if (decoupled) pi = pi * decay;
    if (use_l2) gi = gi + l2 * pi;
    const float mi = m[i] * b1 + omb1 * gi;              // exp_avg.mul_(b1).add_(g, 1-b1)
    const float vi = v[i] * b2 + omb2 * gi * gi;         // exp_avg_sq.mul_(b2).addcmul_(g,g,1-b2)
    const float d = __builtin_sqrtf(vi) / bc2_sqrt + eps;  // (sqrt(v) / sqrt(bc2)).add_(eps)
    p[i] = pi + neg_step * mi / d;                       // p.addcdiv_(m, d, -step)
    m[i] = mi;
    v[i] = vi;
  }
}

using KernelFn = void (*)(const Coeffs&, float*, const float*, float*, float*, int64_t);

// The reference: one element at a time (vectorisation disabled for this function).
__attribute__((optimize("no-tree-vectorize"))) void KernelScalar(const Coeffs& c, float* p,
                                                                 const float* g, float* m,
                                                                 float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float pi = p[i];
    float gi = g != nullptr ? g[i] : 0.0f;
    if (c.decoupled) pi = pi * c.decay;
    if (c.use_l2) gi = gi + c.l2 * pi;
    const float mi = m[i] * c.b1 + c.omb1 * gi;
    const float vi = v[i] * c.b2 + c.omb2 * gi * gi;
    const float d = std::sqrt(vi) / c.bc2_sqrt + c.eps;
    p[i] = pi + c.neg_step * mi / d;
    m[i] = mi;
    v[i] = vi;
  }
}

__attribute__((target("avx2"))) void KernelAvx2(const Coeffs& c, float* p, const float* g,
                                                 float* m, float* v, int64_t n) {
  if (g != nullptr) {
    AdamLoop<true>(c, p, g, m, v, n);
  } else {
    AdamLoop<false>(c, p, g, m, v, n);
  }
}

__attribute__((target("avx512f,prefer-vector-width=512"))) void KernelAvx512(
    const Coeffs& c, float* p, const float* g, float* m, float* v, int64_t n) {
  if (g != nullptr) {
    AdamLoop<true>(c, p, g, m, v, n);
  } else {
    AdamLoop<false>(c, p, g, m, v, n);
  }
}

KernelFn KernelFor(CpuAdam::Isa isa) {
  switch (isa) {
    case CpuAdam::Isa::kAvx512:
      return KernelAvx512;
    case CpuAdam::Isa::kAvx2:
      return KernelAvx2;
    case CpuAdam::Isa::kScalar:
      break;
  }
  return KernelScalar;
}

}  // namespace

bool CpuAdam::Supported(Isa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f");
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2");
    case Isa::kScalar:
      return true;
  }
  return false;
}

std::string CpuAdam::IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kScalar:
      return "scalar";
  }
  return "?";
}

CpuAdam::CpuAdam(const CpuAdamOptions& options)
    : options_(options),
      isa_(Supported(Isa::kAvx512) ? Isa::kAvx512
                                   : (Supported(Isa::kAvx2) ? Isa::kAvx2 : Isa::kScalar)),
      pool_(options.threads) {}

bool CpuAdam::ForceIsa(Isa isa) {
  if (!Supported(isa)) return false;
  isa_ = isa;
  return true;
}

namespace {

// t: exp_avg's update count, t2: exp_avg_sq's.
Coeffs MakeCoeffs(const CpuAdamOptions& o, int64_t t, int64_t t2, double lr) {
  const double bc1 = o.bias_correction ? 1.0 - std::pow(o.beta1, static_cast<double>(t)) : 1.0;
  const double bc2 = o.bias_correction ? 1.0 - std::pow(o.beta2, static_cast<double>(t2)) : 1.0;
  Coeffs c;
  c.decoupled = o.weight_decay != 0 && o.decoupled_weight_decay;
  c.use_l2 = o.weight_decay != 0 && !o.decoupled_weight_decay;
  c.decay = static_cast<float>(1.0 - lr * o.weight_decay);
  c.l2 = static_cast<float>(o.weight_decay);
  c.b1 = static_cast<float>(o.beta1);
  c.omb1 = static_cast<float>(1.0 - o.beta1);
  c.b2 = static_cast<float>(o.beta2);
  c.omb2 = static_cast<float>(1.0 - o.beta2);
  c.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  c.eps = static_cast<float>(o.eps);
  c.neg_step = static_cast<float>(-(lr / bc1));
  return c;
}

}  // namespace

CpuAdam::~CpuAdam() { Drain(); }

void CpuAdam::Drain() {
  if (async_.joinable()) async_.join();
}

void CpuAdam::Step(int64_t t, double lr, float* param, const float* grad, float* exp_avg,
                   float* exp_avg_sq, int64_t n) {
  Drain();
  RunKernel(t, t, lr, param, grad, exp_avg, exp_avg_sq, n);
}

void CpuAdam::StepWithMomentCounts(int64_t t_exp_avg, int64_t t_exp_avg_sq, double lr,
                                   float* param, const float* grad, float* exp_avg,
                                   float* exp_avg_sq, int64_t n) {
  Drain();
  RunKernel(t_exp_avg, t_exp_avg_sq, lr, param, grad, exp_avg, exp_avg_sq, n);
}

void CpuAdam::RunKernel(int64_t t, int64_t t_exp_avg_sq, double lr, float* param,
                        const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n) {
  const Coeffs c = MakeCoeffs(options_, t, t_exp_avg_sq, lr);
  const KernelFn kernel = KernelFor(isa_);
  // Chunks of whole 64-byte lines (16 floats), at least 16K elements so that a thread's share
  // outweighs waking it.
  constexpr int64_t kGrain = 16 * 1024;
  pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
    kernel(c, param + b, grad != nullptr ? grad + b : nullptr, exp_avg + b, exp_avg_sq + b,
           e - b);
  });
}

void CpuAdam::StepRange(int64_t t, double lr, float* param, const float* grad, float* exp_avg,
                        float* exp_avg_sq, int64_t begin, int64_t end) {
  if (end <= begin) return;
  Step(t, lr, param + begin, grad != nullptr ? grad + begin : nullptr, exp_avg + begin,
       exp_avg_sq + begin, end - begin);
}

namespace {

absl::Status CheckIndices(const char* what, const std::vector<int64_t>& indices, int64_t limit,
                          int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CpuAdam: shape [", rows, ", ", cols, "] is negative"));
  }
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] < 0 || indices[i] >= limit) {
      return absl::InvalidArgumentError(absl::StrCat("CpuAdam: ", what, " index ", indices[i],
                                                     " (entry ", i, ") is outside [0, ", limit,
                                                     ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CpuAdam::StepRows(int64_t t, double lr, float* param, const float* grad,
                               float* exp_avg, float* exp_avg_sq, int64_t rows, int64_t cols,
                               const std::vector<int64_t>& row_indices) {
  if (absl::Status s = CheckIndices("row", row_indices, rows, rows, cols); !s.ok()) return s;
  for (int64_t r : row_indices) StepRange(t, lr, param, grad, exp_avg, exp_avg_sq, r * cols,
                                          (r + 1) * cols);
  return absl::OkStatus();
}

absl::Status CpuAdam::StepColumns(int64_t t, double lr, float* param, const float* grad,
                                  float* exp_avg, float* exp_avg_sq, int64_t rows, int64_t cols,
                                  const std::vector<int64_t>& column_indices) {
  if (absl::Status s = CheckIndices("column", column_indices, cols, rows, cols); !s.ok()) {
    return s;
  }
  const int64_t k = static_cast<int64_t>(column_indices.size());
  const int64_t n = rows * k;
  if (n == 0) return absl::OkStatus();
  // Gathered [rows, k] copies of the selected elements; the kernel is element-wise, so the
  // layout does not change the result.
  std::vector<float> p(n), g(grad != nullptr ? n : 0), m(n), v(n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t src = r * cols + column_indices[j], dst = r * k + j;
      p[dst] = param[src];
      if (grad != nullptr) g[dst] = grad[src];
      m[dst] = exp_avg[src];
      v[dst] = exp_avg_sq[src];
    }
  }
  Step(t, lr, p.data(), grad != nullptr ? g.data() : nullptr, m.data(), v.data(), n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t dst = r * cols + column_indices[j], src = r * k + j;
      param[dst] = p[src];
      exp_avg[dst] = m[src];
      exp_avg_sq[dst] = v[src];
    }
  }
  return absl::OkStatus();
}

absl::Status CpuAdam::StartStepAsync(int64_t t, double lr, float* param, const float* grad,
                                     float* exp_avg, float* exp_avg_sq, int64_t n) {
  if (async_.joinable()) {
    return absl::FailedPreconditionError(
        "CpuAdam::StartStepAsync: a step is already in flight (Wait for it first)");
  }
  if (n < 0 || (n > 0 && (param == nullptr || exp_avg == nullptr || exp_avg_sq == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CpuAdam::StartStepAsync: n = ", n, " with a null param, exp_avg or exp_avg_sq"));
  }
  async_ = std::thread(
      [this, t, lr, param, grad, exp_avg, exp_avg_sq, n] {
        RunKernel(t, t, lr, param, grad, exp_avg, exp_avg_sq, n);
      });
  return absl::OkStatus();
}

absl::Status CpuAdam::Wait() {
  if (!async_.joinable()) {
    return absl::FailedPreconditionError("CpuAdam::Wait: no asynchronous step in flight");
  }
  async_.join();
  return absl::OkStatus();
}

}  // namespace loom::engine::offload
