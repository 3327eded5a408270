// References: the step events' peaks (max over 2 steps, every rank alike) loom-trainer reported
// for the tiny model (worker/trainer/gang_test_util.h's shapes: Ψ = 119104, 21 tensors,
// n_max = 16384) with this file's inputs (B 2, S 32, GAS 1, default buckets), run 2026-12-07;
// and sums done by hand below from the model's shapes. memory_plan_trainer_test checks a
// larger model against live runs on every test run.
#include "spec/memory_plan.h"

#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::spec {
namespace {

using ::testing::HasSubstr;

LlamaConfig Tiny() {
  LlamaConfig m;
  m.vocab_size = 256;
  m.hidden_size = 64;
  m.intermediate_size = 160;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.max_position_embeddings = 64;
  return m;
}

MemoryPlanInput TinyInput(int stage, int world) {
  MemoryPlanInput in;
  in.model = Tiny();
  in.ds.zero.stage = stage;
  in.ds.train_micro_batch_size_per_gpu = 2;
  in.world_size = world;
  in.sequence_length = 32;
  return in;
}

// The plan of `in`, or an empty one after a test failure naming the status.
RankMemoryPlan Plan(const MemoryPlanInput& in) {
  absl::StatusOr<RankMemoryPlan> p = PlanRankMemory(in);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : RankMemoryPlan{};
}

int64_t Bytes(const RankMemoryPlan& p, const std::string& name) {
  const MemoryTerm* t = p.Find(name);
  return t == nullptr ? 0 : t->bytes;
}

// Peak bytes loom-trainer's step events reported (MemoryTracker peak of the sum) for these runs.
// Stages 2-3 at N = 2 hold states + 4·n_max + one [N·p] bucket (GAS 1: no partition
// temporaries); stage 2 at N = 1 writes gradients in place (no buffers).
TEST(MemoryPlanTest, TrackedTermsMatchTheTrainersReportedPeaks) {
  struct Row {
    int stage, world;
    bool bf16;
    int64_t params, grads, optimizer, peak;
  };
  const Row rows[] = {
      {0, 1, false, 476416, 476416, 952832, 2382080},
      {1, 2, false, 476416, 714624, 714624, 1971200},
      {2, 1, false, 476416, 476416, 952832, 1905664},
      {2, 2, false, 476416, 238208, 714624, 1971200},
      {3, 2, false, 714624, 238208, 476416, 1971200},
      {2, 2, true, 238208, 238208, 714624, 2090304},
      {3, 2, true, 357312, 238208, 714624, 2209408},
      {0, 1, true, 238208, 476416, 1429248, 2620288},
  };
  for (const Row& r : rows) {
    MemoryPlanInput in = TinyInput(r.stage, r.world);
    in.ds.bf16_enabled = r.bf16;
    const RankMemoryPlan p = Plan(in);
    const std::string what = absl::StrCat("stage ", r.stage, " N ", r.world, " bf16 ", r.bf16);
    EXPECT_TRUE(p.cpu_rank);
    EXPECT_TRUE(p.device.empty()) << what;  // CPU rank: device == host
    EXPECT_EQ(Bytes(p, "parameters") + Bytes(p, "persistent parameters"), r.params) << what;
    EXPECT_EQ(Bytes(p, "gradients"), r.grads) << what;
    EXPECT_EQ(Bytes(p, "optimizer states (Adam m, v)") + Bytes(p, "fp32 master weights"),
              r.optimizer)
        << what;
    EXPECT_EQ(p.tracked_bytes(), r.peak) << what;
  }
}

// Hand sum for the tiny model, stage 2, 1 rank, S = 32, B = 2, fp32, blockwise attention:
// T = 64; per layer a·T·(4H + 4q + 4kv + q) + 4·T·Hq + a·4TI with H = 64, q = 64, kv = 32,
// I = 160: 4·64·(256 + 256 + 128 + 64) + 4·64·4 + 4·4·64·160 = 180224 + 1024 + 163840 = 345088.
TEST(MemoryPlanTest, ActivationsPerLayerFromTheEnginesSavedTensors) {
  MemoryPlanInput in = TinyInput(2, 1);
  const RankMemoryPlan p = Plan(in);
  EXPECT_EQ(Bytes(p, "activations (all layers)"), 2 * 345088);
  EXPECT_EQ(Bytes(p, "logits and loss"), 64 * 256 * 12);
  EXPECT_EQ(Bytes(p, "runtime (LibTorch process)"), int64_t{390} << 20);
  // The teardown's rise (110 MiB) overlaps the untracked transients: activations, logits and
  // the one layer's activation gradients a·T·(2H + 2I) = 4·64·(128 + 320) = 114688.
  const int64_t transient = 2 * 345088 + 64 * 256 * 12 + 114688;
  EXPECT_EQ(Bytes(p, "process teardown beyond the step's transients"),
            (int64_t{110} << 20) - transient);
  EXPECT_EQ(Bytes(p, "heap retention (glibc)"), transient / 4);

  // Checkpointing: the layer inputs (L·a·T·H = 2·4·64·64) and one recomputed layer.
  in.exec.activation_checkpointing = true;
  const RankMemoryPlan ck = Plan(in);
  EXPECT_EQ(Bytes(ck, "activations (all layers)"), 0);
  EXPECT_EQ(Bytes(ck, "checkpointed layer inputs"), 32768);
  EXPECT_EQ(Bytes(ck, "recomputed layer activations"), 345088);
  ASSERT_NE(ck.Find("checkpointed layer inputs"), nullptr);
  EXPECT_FALSE(ck.Find("checkpointed layer inputs")->tracked);
  // cpu_checkpointing: the trainer tracks them (activation_offload_bytes 32768 measured).
  in.exec.activation_checkpoint_cpu_offload = true;
  const RankMemoryPlan off = Plan(in);
  ASSERT_NE(off.Find("checkpointed layer inputs"), nullptr);
  EXPECT_TRUE(off.Find("checkpointed layer inputs")->tracked);
  EXPECT_EQ(off.tracked_bytes(), 1905664 + 32768);

  // Eager attention keeps the fp32 [B,Hq,S,S] probabilities and the repeated k, v (Hq/Hkv = 2)
  // in place of k, v, and no separate output: a·T·(4H + 4q + 4kv + 2q - 2kv) + 4·B·Hq·S² + 4TI.
  in = TinyInput(2, 1);
  in.exec.attn_implementation = "eager";
  const RankMemoryPlan eager = Plan(in);
  const int64_t eager_layer = 4 * 64 * (4 * 64 + 4 * 64 + 4 * 32 + 2 * 64 - 2 * 32) +
                              2 * 4 * 32 * 32 * 4 + 4 * 4 * 64 * 160;
  EXPECT_EQ(Bytes(eager, "activations (all layers)"), 2 * eager_layer);
}

// A step whose transients exceed the teardown's rise gets no teardown term: at S = 16384 the
// tiny model's activations are 512 x those at S = 32 (2 x 345088 B), about 337 MiB.
TEST(MemoryPlanTest, TeardownOverlapsLargeTransients) {
  MemoryPlanInput in = TinyInput(2, 1);
  in.sequence_length = 16384;
  const RankMemoryPlan p = Plan(in);
  EXPECT_GT(Bytes(p, "activations (all layers)") + Bytes(p, "logits and loss"),
            int64_t{110} << 20);
  EXPECT_EQ(p.Find("process teardown beyond the step's transients"), nullptr);
}

TEST(MemoryPlanTest, SequenceParallelismAndTilingShrinkActivations) {
  MemoryPlanInput in = TinyInput(2, 4);
  in.sequence_length = 64;
  const RankMemoryPlan full = Plan(in);
  in.ds.sequence_parallel_size = 4;
  const RankMemoryPlan sp = Plan(in);
  EXPECT_EQ(Bytes(sp, "activations (all layers)") * 4, Bytes(full, "activations (all layers)"));
  EXPECT_EQ(Bytes(sp, "logits and loss") * 4, Bytes(full, "logits and loss"));
  EXPECT_GT(Bytes(sp, "Ulysses all-to-all buffers"), 0);
  in.tiled.mlp = true;
  const RankMemoryPlan tiled = Plan(in);
  // T = 2·64/4 = 32 tokens: the SwiGLU's a·4TI = 4·4·32·160 per layer is gone.
  EXPECT_EQ(Bytes(sp, "activations (all layers)") - Bytes(tiled, "activations (all layers)"),
            2 * 4 * 4 * 32 * 160);
}

// Llama-2-7B (Ψ = 6738415616), bf16, stage 3 on 8 accelerators: 2P + 4P + 12P = 18Ψ/N up to
// padding (ZeRO's Figure 1 with fp32 gradients), and offload_optimizer cpu moves the 12P to host.
TEST(MemoryPlanTest, AcceleratorPlacesOffloadedStatesOnTheHost) {
  MemoryPlanInput in;
  in.model.vocab_size = 32000;
  in.model.hidden_size = 4096;
  in.model.intermediate_size = 11008;
  in.model.num_hidden_layers = 32;
  in.model.num_attention_heads = 32;
  in.model.num_key_value_heads = 32;
  in.model.max_position_embeddings = 4096;
  in.ds.bf16_enabled = true;
  in.ds.zero.stage = 3;
  in.ds.train_micro_batch_size_per_gpu = 1;
  in.world_size = 8;
  in.sequence_length = 4096;
  in.cpu_rank = false;
  const RankMemoryPlan p = Plan(in);
  const double psi = 6738415616.0;
  const double states = Bytes(p, "parameters") + Bytes(p, "gradients") +
                        Bytes(p, "optimizer states (Adam m, v)") + Bytes(p, "fp32 master weights");
  EXPECT_NEAR(states, 18 * psi / 8, 18 * 8 * 1000.0);
  EXPECT_EQ(RankMemoryPlan::Sum(p.host), kCpuRuntimeFixedBytes);
  // Offloaded, as DeepSpeed's ZeRO-Offload lays it out: Adam's m and v, the fp32 master and the
  // fp32 gradient partition (16 bytes a parameter of the partition) move to the host.
  in.ds.zero.offload_optimizer.device = "cpu";
  const RankMemoryPlan off = Plan(in);
  EXPECT_NEAR(off.host_bytes() - kCpuRuntimeFixedBytes, 16 * psi / 8, 16 * 8 * 1000.0);
  EXPECT_NEAR(p.device_bytes() - off.device_bytes(), 16 * psi / 8, 16 * 8 * 1000.0);
  in.ds.zero.offload_optimizer.device = "nvme";
  const RankMemoryPlan nvme = Plan(in);
  EXPECT_NEAR(nvme.nvme_bytes(), 12 * psi / 8, 12 * 8 * 1000.0);
}

TEST(MemoryPlanTest, RefusesInputsNoValidatedSpecHas) {
  MemoryPlanInput in = TinyInput(2, 2);
  in.ds.sequence_parallel_size = 3;
  EXPECT_THAT(PlanRankMemory(in).status().message(), HasSubstr("sequence_parallel_size"));
  in = TinyInput(2, 0);
  EXPECT_EQ(PlanRankMemory(in).status().code(), absl::StatusCode::kInvalidArgument);
  in = TinyInput(2, 1);
  in.sequence_length = 0;
  EXPECT_THAT(PlanRankMemory(in).status().message(), HasSubstr("training.sequence_length"));
}

TEST(MemoryPlanTest, FormatsBytes) {
  EXPECT_EQ(FormatBytes(789), "789 B");
  EXPECT_EQ(FormatBytes(int64_t{3} << 29), "1.50 GiB");
  EXPECT_EQ(FormatBytes(int64_t{490} << 20), "490.0 MiB");
}

}  // namespace
}  // namespace loom::spec
