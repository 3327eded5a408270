// Materialised vs blockwise (FlashAttention-2) attention core, forward + backward, on the CPU.
// Defaults are the fortunes-llama example job's attention (examples/fortunes-llama: micro-batch
// 8, 6 query heads, 2 KV heads, head_dim 64, sequence 128, 1 intra-op thread).
//   bazel run //worker/engine/model:attention_bench -- [--seq=128] [--batch=8]
//       [--heads=6] [--kv_heads=2] [--head_dim=64] [--block=128] [--iters=20] [--threads=1]
// Prints per core the median over 5 alternating rounds of the mean milliseconds of one
// forward + backward over --iters iterations for the materialised core, the blockwise core as
// jobs run it (one tile as the dense computation) and the tiled function alone; the last line
// is the ratio blockwise core / materialised (< 1: blockwise is faster).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "worker/engine/model/blockwise_attention.h"
#include "worker/engine/model/llama_model.h"

namespace {

int64_t Flag(int argc, char** argv, const char* name, int64_t def) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      return std::atoll(argv[i] + prefix.size());
    }
  }
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  using loom::engine::AttentionCore;
  const int64_t s = Flag(argc, argv, "seq", 128), b = Flag(argc, argv, "batch", 8);
  const int64_t hq = Flag(argc, argv, "heads", 6), hkv = Flag(argc, argv, "kv_heads", 2);
  const int64_t d = Flag(argc, argv, "head_dim", 64), block = Flag(argc, argv, "block", 128);
  const int64_t iters = Flag(argc, argv, "iters", 20);
  at::set_num_threads(static_cast<int>(Flag(argc, argv, "threads", 1)));
  at::manual_seed(1);
  const at::Tensor q0 = at::randn({b, hq, s, d}), k0 = at::randn({b, hkv, s, d});
  const at::Tensor v0 = at::randn({b, hkv, s, d}), w = at::randn({b, hq, s, d});
  loom::engine::AttentionMask mask;
  mask.positions = at::arange(s, at::kLong);
  loom::engine::MaterializedCausalAttention materialized;
  loom::engine::BlockwiseCausalAttention blockwise(block);  // as jobs run it
  // The tiled function at every length (the core runs one tile as the dense computation).
  struct TiledKernel : AttentionCore {
    int64_t block = 0;
    at::Tensor Forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const loom::engine::AttentionMask& m, at::ScalarType act) override {
      return loom::engine::BlockwiseAttention(q, k, v, m.positions, m.document_ids, block, act);
    }
  } kernel;
  kernel.block = block;
  // Mean milliseconds of one forward + backward over --iters iterations.
  auto time_once = [&](AttentionCore& core) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i) {
      at::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true);
      at::Tensor v = v0.clone().requires_grad_(true);
      loom::engine::AttentionMask m = mask;  // each step builds its mask, as the model does
      (core.Forward(q, k, v, m, at::kFloat) * w).sum().backward();
    }
    const std::chrono::duration<double, std::milli> dt = std::chrono::steady_clock::now() - t0;
    return dt.count() / static_cast<double>(iters);
  };
  time_once(materialized);  // warm-up (allocator, thread pool)
  // Five rounds, the three cores alternating within each (a slow spell of the shared machine
  // hits all three alike), then the median per core.
  std::vector<double> mats, blks, tileds;
  for (int r = 0; r < 5; ++r) {
    mats.push_back(time_once(materialized));
    blks.push_back(time_once(blockwise));
    tileds.push_back(time_once(kernel));
  }
  auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  const double mat = median(mats), blk = median(blks), tiled = median(tileds);
  std::printf("attention fwd+bwd B=%lld Hq=%lld Hkv=%lld S=%lld d=%lld block=%lld threads=%d\n",
              static_cast<long long>(b), static_cast<long long>(hq),
              static_cast<long long>(hkv), static_cast<long long>(s),
              static_cast<long long>(d), static_cast<long long>(block), at::get_num_threads());
  std::printf("materialized_ms=%.3f (median of 5, mean of %lld)\n", mat,
              static_cast<long long>(iters));
  std::printf("blockwise_ms=%.3f (median of 5, mean of %lld)\n", blk,
              static_cast<long long>(iters));
  std::printf("tiled_kernel_ms=%.3f (median of 5, mean of %lld; the tiled function even "
              "within one block)\n", tiled, static_cast<long long>(iters));
  std::printf("tiled_kernel/materialized=%.3f\n", tiled / mat);
  std::printf("blockwise/materialized=%.3f\n", blk / mat);
  return 0;
}
