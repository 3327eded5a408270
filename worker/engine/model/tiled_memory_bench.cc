// Peak memory of one training micro-step (forward + backward) of a Llama model over
// ZeroProvider stage 3 (world size 1), untiled vs ALST tiled MLP / tiled logits+loss
// (docs/engine.md). One configuration per process, so ru_maxrss is that configuration's peak.
// Usage: tiled_memory_bench <seq> <mlp:0|1> <loss:0|1> [vocab=32000] [hidden=256] [layers=2]
// Prints one line: seq vocab mlp loss loss_value peak_rss_mib provider_peak_mib seconds.
#include <sys/resource.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "worker/engine/collectives.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/model/tiled_ops.h"
#include "worker/engine/zero/zero_provider.h"

int main(int argc, char** argv) {
  using namespace loom::engine;  // NOLINT
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s seq mlp loss [vocab hidden layers]\n", argv[0]);
    return 2;
  }
  const int64_t seq = std::atoll(argv[1]);
  const bool mlp = std::atoi(argv[2]) != 0, loss_tiled = std::atoi(argv[3]) != 0;
  loom::spec::LlamaConfig c;
  c.vocab_size = argc > 4 ? std::atoll(argv[4]) : 32000;
  c.hidden_size = argc > 5 ? std::atoll(argv[5]) : 256;
  c.num_hidden_layers = argc > 6 ? std::atoll(argv[6]) : 2;
  c.intermediate_size = c.hidden_size * 11 / 4;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = seq;
  c.initializer_range = 0.02;
  at::set_num_threads(1);
  std::unique_ptr<Collectives> coll = CreateLocalCollectives();
  ZeroOptions o;
  o.stage = 3;
  o.param_persistence_threshold = 0;
  auto zero =
      *ZeroProvider::Create(loom::spec::LlamaParamSpecs(c), coll.get(), {1, c.initializer_range}, o);
  auto model = *LlamaModel::Create(c, zero.get());
  loom::spec::TiledComputeOptions t;
  t.mlp = mlp;
  t.logits_loss = loss_tiled;
  if (!InstallTiledCompute(t, coll.get(), model.get()).ok()) return 1;
  at::manual_seed(1);
  at::Tensor ids = at::randint(0, c.vocab_size, {1, seq + 1}, at::kLong);
  zero->memory().ResetPeaks();
  const auto t0 = std::chrono::steady_clock::now();
  zero->BeginMicroStep(true);
  LossOutput out = model->Loss(ids.narrow(1, 0, seq), ids.narrow(1, 1, seq));
  out.loss.backward();
  zero->FinishMicroStep();
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  std::printf("seq=%lld vocab=%lld tiled_mlp=%d tiled_loss=%d loss=%.6f peak_rss_mib=%.1f "
              "provider_peak_mib=%.1f seconds=%.2f\n",
              static_cast<long long>(seq), static_cast<long long>(c.vocab_size), mlp ? 1 : 0,
              loss_tiled ? 1 : 0, out.loss.item<double>(), ru.ru_maxrss / 1024.0,
              zero->memory().peak_total() / 1048576.0, secs);
  return 0;
}
