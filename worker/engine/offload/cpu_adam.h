// CPU Adam / AdamW over flat fp32 arrays: the optimizer hot loop of ZeRO-Offload.
//
// Algorithm source: Kingma & Ba, "Adam" (ICLR'15) with bias correction; decoupled weight decay
// from Loshchilov & Hutter, "Decoupled Weight Decay Regularization" (ICLR'19); the offload
// design (one fused, vectorised, multi-threaded pass over param/grad/exp_avg/exp_avg_sq in
// host memory) follows ZeRO-Offload (Ren et al., USENIX ATC'21, §4.1 "CPU optimizer") and
// DeepSpeed's csrc/adam/cpu_adam_impl.cpp (docs/design/TECHNIQUES.md §1.7). The per-element math is
// the single-tensor torch.optim.Adam/AdamW step (PyTorch 1.13) that Loom's engine runs op by op:
//
//   decoupled (AdamW):  p  = p * (1 - lr*wd)
//   L2 (Adam):          g  = g + wd * p
//                       m  = m * b1 + (1 - b1) * g
//                       v  = v * b2 + (1 - b2) * g * g
//                       d  = sqrt(v) / sqrt(bc2) + eps          bc2 = 1 - b2^t (1 if off)
//                       p  = p - (lr / bc1) * (m / d)           bc1 = 1 - b1^t (1 if off)
//
// All arithmetic is fp32 with the scalar coefficients rounded to fp32 once per step, with no
// fused multiply-add (the library is compiled with -ffp-contract=off). Every operation above is
// correctly rounded by IEEE 754 (add, mul, div, sqrt), so the AVX-512, AVX2 and scalar kernels
// produce bit-identical results, whatever the thread count or split. Against LibTorch's
// op-by-op update the results differ by at most a few ulp per step (LibTorch's vectorised
// add/addcmul use FMA on AVX2); see cpu_adam_test.cc for the measured bound.
//
// Partial and asynchronous updates (for ZenFlow, docs/design/TECHNIQUES.md §2.4, and SuperOffload,
// §4.1): StepRange updates a contiguous range of a partition, StepRows / StepColumns the selected
// rows or columns of a row-major [rows, cols] partition, and StartStepAsync / Wait run a full Step
// on a worker thread. Every one applies exactly the per-element math of Step, so an update of
// some elements is bit-identical to the same elements of a full Step on the same data
// (cpu_adam_partial_test.cc checks each against a scalar reference loop and against Step).
//
// Thread-safety: one caller at a time (Step, StepRange, StepRows, StepColumns, StartStepAsync,
// Wait); they use the object's own worker threads. An asynchronous step runs on one more
// thread; a synchronous call made while it is in flight first waits for it (so updates apply in
// call order), which is why overlapping work should use a second CpuAdam or wait explicitly.
#ifndef LOOM_WORKER_ENGINE_OFFLOAD_CPU_ADAM_H_
#define LOOM_WORKER_ENGINE_OFFLOAD_CPU_ADAM_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace loom::engine::offload {

// A fixed pool of worker threads that splits [0, n) into contiguous chunks. The calling thread
// runs the first chunk itself. Not thread-safe: one ParallelFor at a time.
// Hand-written rather than LibTorch's at::parallel_for so that CPU Adam stays a LibTorch-free
// translation unit (fast to build and test) with its own thread count, independent of the
// rank's intra-op thread setting.
class ThreadPool {
 public:
  // threads >= 1 (total, including the caller); threads == 1 runs everything inline.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  // Calls fn(begin, end) on disjoint ranges covering [0, n), each a multiple of `grain`
  // elements except the last; returns when all have finished.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  std::vector<std::pair<int64_t, int64_t>> ranges_;  // one per worker (index 0 = caller)
  int64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

struct CpuAdamOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled_weight_decay = true;  // AdamW; false: L2 added to the gradient (Adam)
  bool bias_correction = true;
  int threads = 1;                     // worker threads including the caller
};

class CpuAdam {
 public:
  enum class Isa { kScalar, kAvx2, kAvx512 };

  // Picks the widest kernel this CPU supports (AVX-512F, then AVX2, else scalar).
  explicit CpuAdam(const CpuAdamOptions& options);

  // One step t (1-based, as torch counts) with learning rate lr over n elements:
  // param, exp_avg, exp_avg_sq updated in place; grad is read only. Arrays need no alignment.
  // `grad` == nullptr means a zero gradient.
  void Step(int64_t t, double lr, float* param, const float* grad, float* exp_avg,
            float* exp_avg_sq, int64_t n);
  // Step with separate counts for the two bias corrections: exp_avg has had t_exp_avg updates
  // (1 - beta1^t_exp_avg) and exp_avg_sq t_exp_avg_sq (1 - beta2^t_exp_avg_sq), for moments that
  // started at different times (ZenFlow's newly selected columns, zenflow_pipeline.h).
  // Step(t, ...) is StepWithMomentCounts(t, t, ...).
  void StepWithMomentCounts(int64_t t_exp_avg, int64_t t_exp_avg_sq, double lr, float* param,
                            const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n);

  // Step of the elements [begin, end) only (0 <= begin <= end <= the arrays' length); the
  // arrays are the whole partition (not offset by begin). The rest is left untouched.
  void StepRange(int64_t t, double lr, float* param, const float* grad, float* exp_avg,
                 float* exp_avg_sq, int64_t begin, int64_t end);

  // The arrays are a row-major [rows, cols] fp32 matrix (rows * cols elements). StepRows
  // updates the listed rows (each a contiguous run of cols elements); StepColumns the listed
  // columns (gathered into a contiguous buffer, stepped, scattered back: 4 extra copies of the
  // selected elements). Indices must be distinct and in [0, rows) resp. [0, cols); duplicates
  // would apply the step twice. ZenFlow flattens W[out, in] transposed, so its "columns" are
  // rows here. Errors: INVALID_ARGUMENT naming the bad index or shape; nothing is updated then.
  absl::Status StepRows(int64_t t, double lr, float* param, const float* grad, float* exp_avg,
                        float* exp_avg_sq, int64_t rows, int64_t cols,
                        const std::vector<int64_t>& row_indices);
  absl::Status StepColumns(int64_t t, double lr, float* param, const float* grad,
                           float* exp_avg, float* exp_avg_sq, int64_t rows, int64_t cols,
                           const std::vector<int64_t>& column_indices);

  // Asynchronous Step: starts Step(t, lr, ...) on a worker thread and returns at once. Until
  // Wait() returns, param / exp_avg / exp_avg_sq belong to the step and `grad` must not change:
  // the caller accumulates the next gradients into a second buffer meanwhile (double
  // buffering, as ZenFlow's overlap_grad[state] and SuperOffload's per-sub-group fp32 grad
  // slots). Errors: FAILED_PRECONDITION when a step is already in flight; INVALID_ARGUMENT for
  // n < 0 or a null param/exp_avg/exp_avg_sq.
  absl::Status StartStepAsync(int64_t t, double lr, float* param, const float* grad,
                              float* exp_avg, float* exp_avg_sq, int64_t n);
  // Blocks until the asynchronous step has finished; OK once it has, FAILED_PRECONDITION when
  // none was started since the last Wait.
  absl::Status Wait();
  bool step_in_flight() const { return async_.joinable(); }
  ~CpuAdam();
  CpuAdam(const CpuAdam&) = delete;
  CpuAdam& operator=(const CpuAdam&) = delete;

  // Forces a kernel (tests, benchmarks). Returns false (and keeps the current one) if the CPU
  // lacks the instruction set.
  bool ForceIsa(Isa isa);
  Isa isa() const { return isa_; }
  static std::string IsaName(Isa isa);
  static bool Supported(Isa isa);
  const CpuAdamOptions& options() const { return options_; }

 private:
  // Waits for an asynchronous step, if any (before a synchronous update).
  void Drain();
  // The fused update over n elements on the pool (StepWithMomentCounts without the Drain).
  void RunKernel(int64_t t, int64_t t_exp_avg_sq, double lr, float* param, const float* grad,
                 float* exp_avg, float* exp_avg_sq, int64_t n);

  CpuAdamOptions options_;
  Isa isa_;
  ThreadPool pool_;
  std::thread async_;  // the asynchronous step in flight, if joinable
};

}  // namespace loom::engine::offload

#endif  // LOOM_WORKER_ENGINE_OFFLOAD_CPU_ADAM_H_
