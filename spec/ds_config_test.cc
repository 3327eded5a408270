#include "spec/ds_config.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::spec {
namespace {

using ::loom::testing::StatusIs;

constexpr char kGood[] = R"({
  "train_batch_size": 24, "train_micro_batch_size_per_gpu": 3,
  "gradient_accumulation_steps": 2, "gradient_clipping": 1.0, "steps_per_print": 5,
  "wall_clock_breakdown": false,
  "optimizer": {"type": "adamw", "params": {"lr": 3e-4, "betas": [0.8, 0.95],
                "eps": 1e-6, "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-4,
                "warmup_num_steps": 10, "total_num_steps": 100, "warmup_type": "linear"}},
  "zero_optimization": {"stage": 3, "overlap_comm": true, "contiguous_gradients": true,
                        "reduce_bucket_size": 1e6, "stage3_prefetch_bucket_size": 5e5,
                        "stage3_param_persistence_threshold": 0,
                        "offload_optimizer": {"device": "none"}},
  "bf16": {"enabled": false}, "fp16": {"enabled": false}
})";

TEST(ParseDeepSpeedConfigTest, ParsesAGoodConfig) {
  absl::StatusOr<DeepSpeedConfig> c = ParseDeepSpeedConfig(kGood, 4);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train_batch_size, 24);
  EXPECT_EQ(c->train_micro_batch_size_per_gpu, 3);
  EXPECT_EQ(c->gradient_accumulation_steps, 2);
  EXPECT_DOUBLE_EQ(c->gradient_clipping, 1.0);
  EXPECT_EQ(c->steps_per_print, 5);
  EXPECT_EQ(c->optimizer.type, OptimizerConfig::Type::kAdamW);
  EXPECT_EQ(c->optimizer.name(), "adamw");
  EXPECT_DOUBLE_EQ(c->optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c->optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c->optimizer.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c->optimizer.eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->optimizer.weight_decay, 0.1);
  EXPECT_TRUE(c->optimizer.decoupled_weight_decay);
  EXPECT_EQ(c->scheduler.type, SchedulerConfig::Type::kWarmupDecayLR);
  EXPECT_EQ(c->scheduler.total_num_steps, 100);
  EXPECT_FALSE(c->scheduler.warmup_log);
  EXPECT_EQ(c->zero.stage, 3);
  EXPECT_EQ(c->zero.reduce_bucket_size, 1000000);
  EXPECT_EQ(c->zero.stage3_prefetch_bucket_size, 500000);
  EXPECT_EQ(c->zero.stage3_param_persistence_threshold, 0);
  // Untouched keys keep DeepSpeed's code defaults (docs/design/TECHNIQUES.md §1.9).
  EXPECT_EQ(c->zero.sub_group_size, 1000000000);
  EXPECT_EQ(c->zero.stage3_max_live_parameters, 1000000000);
  EXPECT_EQ(c->zero.allgather_bucket_size, 500000000);
  EXPECT_EQ(c->zero.offload_param.buffer_count, 5);
  EXPECT_EQ(c->zero.offload_optimizer.buffer_count, 4);
}

TEST(ParseDeepSpeedConfigTest, DefaultsAndBatchArithmetic) {
  // Only micro batch: GAS 1, train_batch_size derived; Adam weight decay default 0.
  absl::StatusOr<DeepSpeedConfig> c = ParseDeepSpeedConfig(
      R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "Adam"},
          "zero_optimization": {"stage": 3}})", 3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gradient_accumulation_steps, 1);
  EXPECT_EQ(c->train_batch_size, 6);
  EXPECT_EQ(c->optimizer.type, OptimizerConfig::Type::kAdam);
  EXPECT_DOUBLE_EQ(c->optimizer.weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(c->optimizer.eps, 1e-8);
  EXPECT_DOUBLE_EQ(c->optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c->gradient_clipping, 0.0);
  EXPECT_TRUE(c->zero.overlap_comm_effective());  // null -> true in stage 3

  // train_batch_size + micro -> GAS; AdamW weight decay default 0 (DeepSpeed's FusedAdam).
  c = ParseDeepSpeedConfig(R"({"train_batch_size": 12, "train_micro_batch_size_per_gpu": 3,
      "optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 3}})", 2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gradient_accumulation_steps, 2);
  EXPECT_DOUBLE_EQ(c->optimizer.weight_decay, 0.0);

  // train_batch_size + GAS -> micro.
  c = ParseDeepSpeedConfig(R"({"train_batch_size": 12, "gradient_accumulation_steps": 3,
      "optimizer": {"type": "adam", "params": {"adam_w_mode": false}},
      "zero_optimization": {"stage": 3}})", 2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train_micro_batch_size_per_gpu, 2);
  EXPECT_FALSE(c->optimizer.decoupled_weight_decay);

  // Stage 0 with one rank is plain (unsharded) training.
  c = ParseDeepSpeedConfig(R"({"train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "adamw"}})", 1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->zero.stage, 0);
}

void ExpectError(const std::string& json, int world, const std::string& needle) {
  absl::StatusOr<DeepSpeedConfig> c = ParseDeepSpeedConfig(json, world);
  EXPECT_THAT(c, StatusIs(absl::StatusCode::kInvalidArgument, needle)) << json;
}

// Regression: micro * gas * world overflowed int64 (undefined behaviour), and a micro-batch or
// accumulation count of 1e12 was accepted.
TEST(ParseDeepSpeedConfigTest, AbsurdBatchSizesAreRefused) {
  const std::string rest = R"(, "optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 3})";
  ExpectError(R"({"train_micro_batch_size_per_gpu": 1000000000000)" + rest + "}", 2,
              "deepspeed_config.train_micro_batch_size_per_gpu: 1000000000000 is larger than "
              "2147483647");
  ExpectError(R"({"train_micro_batch_size_per_gpu": 8,
      "gradient_accumulation_steps": 1000000000000)" + rest + "}", 2,
              "deepspeed_config.gradient_accumulation_steps: 1000000000000 is larger than");
  ExpectError(R"({"train_micro_batch_size_per_gpu": 2147483647,
      "gradient_accumulation_steps": 2147483647)" + rest + "}", 4,
              "deepspeed_config.train_micro_batch_size_per_gpu: train_micro_batch_size_per_gpu "
              "2147483647 * gradient_accumulation_steps 2147483647 * world size 4 is larger");
  // Under sequence parallelism the batch divides by the data-parallel size, and the message says
  // so (it used to call world / P the "world size").
  ExpectError(R"({"train_batch_size": 3, "train_micro_batch_size_per_gpu": 2,
      "sequence_parallel_size": 2)" + rest + "}", 2,
              "deepspeed_config.train_batch_size: 3 is not divisible by micro batch 2 x "
              "data-parallel size 1 (world size 2 / sequence_parallel_size 2)");
  ExpectError(R"({"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2147483647,
      "gradient_accumulation_steps": 2147483647)" + rest + "}", 2147483647,
              "deepspeed_config.train_batch_size: 2 != train_micro_batch_size_per_gpu");
}

TEST(ParseDeepSpeedConfigTest, ErrorsNameTheKey) {
  const std::string ok = R"("train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW"})";
  ExpectError("{" + ok + R"(, "zero_optimization": {"stage": 3, "foo": 1}})", 2,
              "deepspeed_config.zero_optimization.foo: unknown key");
  // A top-level key near one Loom reads is a misspelling (DeepSpeed would ignore it and train
  // without clipping); every such problem of the top level comes in one answer.
  ExpectError("{" + ok + R"(, "gradient_clippping": 1, "zero_optimizaton": {"stage": 3}})", 2,
              "2 problems:\n"
              "  deepspeed_config.gradient_clippping: unknown key (did you mean gradient_clipping?)\n"
              "  deepspeed_config.zero_optimizaton: unknown key (did you mean zero_optimization?)");
  ExpectError("{" + ok + R"(, "zero_optimization": {"stage": 3, "reduce_bucket_sise": 1}})", 2,
              "deepspeed_config.zero_optimization.reduce_bucket_sise: unknown key (did you mean "
              "reduce_bucket_size?)");
  ExpectError("{" + ok + R"(, "fp16": {"enabled": true}, "bf16": {"enabled": true}})", 2,
              "deepspeed_config.bf16.enabled: fp16 and bf16 cannot both be enabled");
  ExpectError("{" + ok + R"(, "fp16": {"enabled": true, "auto_cast": true}})", 2,
              "deepspeed_config.fp16.auto_cast: fp16 auto_cast is not supported yet");
  ExpectError("{" + ok + R"(, "fp16": {"enabled": true, "hysteresis": 0}})", 2,
              "deepspeed_config.fp16.hysteresis: must be > 0");
  ExpectError("{" + ok + R"(, "zero_optimization": {"stage": 2,
      "offload_param": {"device": "cpu"}}})", 2,
              "deepspeed_config.zero_optimization.offload_param.device: parameter offload needs "
              "stage 3, not stage 2");
  ExpectError("{" + ok + R"(, "zero_optimization": {"stage": 3,
      "offload_param": {"device": "nvme"}}})", 2,
              "deepspeed_config.zero_optimization.offload_param.nvme_path: required");
  ExpectError("{" + ok + R"(, "zero_optimization": {"stage": 4}})", 2,
              "deepspeed_config.zero_optimization.stage: 4 is not one of 0, 1, 2, 3");
  ExpectError("{" + ok + R"(, "zero_optimization": {"stage": 2, "reduce_bucket_size": 0}})", 2,
              "deepspeed_config.zero_optimization.reduce_bucket_size: must be > 0");
  ExpectError("{" + ok + R"(, "gradient_predivide_factor": 2.0})", 2,
              "deepspeed_config.gradient_predivide_factor");
  ExpectError("{" + ok + R"(, "zero_optimization": {"stage": 3, "zenflow": {}}})", 2,
              "deepspeed_config.zero_optimization.zenflow: requires "
              "zero_optimization.offload_optimizer.device \"cpu\"");
  ExpectError(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 2, "optimizer": {"type": "AdamW"},
      "zero_optimization": {"stage": 3}})", 2,
              "deepspeed_config.train_batch_size: 10 != train_micro_batch_size_per_gpu 2");
  ExpectError(R"({"optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 3}})", 2,
              "deepspeed_config.train_micro_batch_size_per_gpu: required");
  ExpectError(R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD"},
      "zero_optimization": {"stage": 3}})", 2,
              "deepspeed_config.optimizer.type: optimizer \"SGD\" is not supported yet");
  ExpectError(R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}})", 2,
              "deepspeed_config.optimizer: required");
  ExpectError("{" + ok + R"(, "zero_optimization": {"stage": 3},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 5}}})", 2,
              "deepspeed_config.scheduler.params.total_num_steps: required");
  // Each scheduler type has its own params keys (DeepSpeed's lr_schedules.py).
  ExpectError("{" + ok + R"(, "zero_optimization": {"stage": 3},
      "scheduler": {"type": "WarmupLR", "params": {"total_num_steps": 5}}})", 2,
              "deepspeed_config.scheduler.params.total_num_steps: unknown key");
  ExpectError("{" + ok + R"(, "zero_optimization": {"stage": 3},
      "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 5,
                                                         "warmup_max_lr": 1}}})", 2,
              "deepspeed_config.scheduler.params.warmup_max_lr: unknown key");
  EXPECT_TRUE(ParseDeepSpeedConfig("{" + ok + R"(, "zero_optimization": {"stage": 3},
      "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 5,
                                                        "warmup_max_lr": 1}}})", 2).ok());
  EXPECT_TRUE(ParseDeepSpeedConfig("{" + ok + R"(, "zero_optimization": {"stage": 3},
      "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 100,
                                                         "warmup_num_steps": 10,
                                                         "cos_min_ratio": 0.1}}})", 2).ok());
  ExpectError("{" + ok + R"(, "zero_optimization": {"stage": 3},
      "scheduler": {"type": "OneCycle"}})", 2,
              "deepspeed_config.scheduler.type: scheduler \"OneCycle\" is not supported yet");
  ExpectError(R"({"train_micro_batch_size_per_gpu": "auto", "optimizer": {"type": "AdamW"},
      "zero_optimization": {"stage": 3}})", 2,
              "deepspeed_config.train_micro_batch_size_per_gpu: expected an integer");
  ExpectError("{" + ok + R"(, "zero_optimization": {"stage": 3}, "gradient_clipping": -1})", 2,
              "deepspeed_config.gradient_clipping: must be >= 0");
  // Regression (break-it pass, 2026-12-05): "inf" passed every `v < lo` check (an lr of "inf"
  // trained to NaN and exited 0).
  const std::string rest = R"(, "zero_optimization": {"stage": 3}})";
  ExpectError(R"({"train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": "inf"}})" + rest, 2,
              "deepspeed_config.optimizer.params.lr: expected a finite number, got \"inf\"");
  ExpectError("{" + ok + R"(, "zero_optimization": {"stage": 3}, "gradient_clipping": "-Infinity"})",
              2, "deepspeed_config.gradient_clipping: expected a finite number");
}

// Regression (break-it pass, 2026-12-05): these combinations were accepted at submission and
// refused only when the ranks started (the job then failed as a configuration error).
TEST(ParseDeepSpeedConfigTest, OffloadCombinationsAreRefusedAtParse) {
  const std::string head = R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW"},
      "zero_optimization": )";
  const std::string z = "deepspeed_config.zero_optimization.";
  ExpectError(head + R"({"stage": 0, "offload_optimizer": {"device": "cpu",
      "super_offload": true}}})", 2,
              z + "offload_optimizer.super_offload: needs ZeRO stage 1, 2 or 3 (stage is 0)");
  ExpectError(head + R"({"stage": 0, "offload_optimizer": {"device": "cpu"}}})", 2,
              z + "offload_optimizer.device: offload needs ZeRO stage 1, 2 or 3 (stage is 0)");
  ExpectError(head + R"({"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/tmp"}}})",
              2, z + "offload_param.device: parameter offload to nvme needs offload_optimizer");
  ExpectError(head + R"({"stage": 3, "offload_optimizer": {"device": "cpu", "super_offload": true},
      "offload_param": {"device": "nvme", "nvme_path": "/tmp"}}})", 2,
              z + "offload_param.device: SuperOffload keeps the parameters in memory");
  for (const char* ok : {R"({"stage": 1, "offload_optimizer": {"device": "cpu",
                              "super_offload": true}}})",
                         R"({"stage": 3, "offload_optimizer": {"device": "cpu",
                              "super_offload": true}, "offload_param": {"device": "cpu"}}})",
                         R"({"stage": 3, "offload_optimizer": {"device": "cpu"},
                              "offload_param": {"device": "nvme", "nvme_path": "/tmp"}}})"}) {
    EXPECT_TRUE(ParseDeepSpeedConfig(head + ok, 2).ok()) << ok;
  }
}

// Stages 0-2, fp16/bf16 and offload sections are accepted; keys that cannot change results are
// warnings naming the key.
TEST(ParseDeepSpeedConfigTest, StagesPrecisionOffloadAndWarnings) {
  for (int stage = 0; stage <= 3; ++stage) {
    absl::StatusOr<DeepSpeedConfig> c = ParseDeepSpeedConfig(
        absl::StrCat(R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW"},
            "zero_optimization": {"stage": )", stage, "}}"), 4);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->zero.stage, stage);
    EXPECT_EQ(c->zero.overlap_comm_effective(), stage == 3);
    EXPECT_TRUE(c->warnings.empty());
  }
  absl::StatusOr<DeepSpeedConfig> c = ParseDeepSpeedConfig(
      R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW"},
          "wall_clock_breakdown": true, "tensorboard": {"enabled": false},
          "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 8,
                   "loss_scale_window": 3, "hysteresis": 1, "consecutive_hysteresis": true,
                   "min_loss_scale": 0.5},
          "zero_optimization": {"stage": 2, "round_robin_gradients": true,
            "offload_optimizer": {"device": "cpu", "pin_memory": false}}})", 2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->fp16.enabled);
  EXPECT_EQ(c->fp16.initial_scale_power, 8);
  EXPECT_EQ(c->fp16.loss_scale_window, 3);
  EXPECT_EQ(c->fp16.hysteresis, 1);
  EXPECT_TRUE(c->fp16.consecutive_hysteresis);
  EXPECT_DOUBLE_EQ(c->fp16.min_loss_scale, 0.5);
  EXPECT_FALSE(c->bf16_enabled);
  EXPECT_EQ(c->zero.offload_optimizer.device, "cpu");
  EXPECT_FALSE(c->zero.offload_optimizer.pin_memory);
  ASSERT_EQ(c->warnings.size(), 3u);
  std::string all;
  for (const std::string& w : c->warnings) all += w + "\n";
  EXPECT_NE(all.find("deepspeed_config.zero_optimization.round_robin_gradients: ignored"),
            std::string::npos) << all;
  EXPECT_NE(all.find("deepspeed_config.wall_clock_breakdown: ignored"), std::string::npos);
  EXPECT_EQ(all.find("deepspeed_config.tensorboard"), std::string::npos) << "it acts now";
  EXPECT_NE(all.find("deepspeed_config.zero_optimization.offload_optimizer.pin_memory: ignored"),
            std::string::npos);
  c = ParseDeepSpeedConfig(R"({"train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "AdamW"}, "bf16": {"enabled": true},
      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                            "offload_param": {"device": "nvme", "nvme_path": "/tmp/x"}}})", 2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->bf16_enabled);
  EXPECT_EQ(c->zero.offload_param.device, "nvme");
}

TEST(LearningRateAtStepTest, NoSchedulerIsConstant) {
  DeepSpeedConfig c;
  c.optimizer.lr = 0.5;
  EXPECT_DOUBLE_EQ(LearningRateAtStep(c, 0), 0.5);
  EXPECT_DOUBLE_EQ(LearningRateAtStep(c, 99), 0.5);
}

TEST(LearningRateAtStepTest, WarmupLRLogMatchesDeepSpeed) {
  DeepSpeedConfig c;
  c.scheduler.type = SchedulerConfig::Type::kWarmupLR;
  c.scheduler.warmup_min_lr = 0.1;
  c.scheduler.warmup_max_lr = 1.1;
  c.scheduler.warmup_num_steps = 4;
  // Step 0 runs with last_batch_iteration -1 -> min; step s with it = s-1.
  EXPECT_DOUBLE_EQ(LearningRateAtStep(c, 0), 0.1);
  EXPECT_DOUBLE_EQ(LearningRateAtStep(c, 1), 0.1);  // log(1) = 0
  EXPECT_NEAR(LearningRateAtStep(c, 2), 0.1 + std::log(2.0) / std::log(4.0), 1e-15);
  EXPECT_NEAR(LearningRateAtStep(c, 4), 0.1 + std::log(4.0) / std::log(4.0), 1e-15);
  EXPECT_DOUBLE_EQ(LearningRateAtStep(c, 5), 1.1);
  EXPECT_DOUBLE_EQ(LearningRateAtStep(c, 50), 1.1);
}

TEST(LearningRateAtStepTest, WarmupDecayLRLinear) {
  DeepSpeedConfig c;
  c.scheduler.type = SchedulerConfig::Type::kWarmupDecayLR;
  c.scheduler.warmup_min_lr = 0.0;
  c.scheduler.warmup_max_lr = 1.0;
  c.scheduler.warmup_num_steps = 4;
  c.scheduler.warmup_log = false;
  c.scheduler.total_num_steps = 12;
  EXPECT_DOUBLE_EQ(LearningRateAtStep(c, 0), 0.0);
  EXPECT_DOUBLE_EQ(LearningRateAtStep(c, 3), 0.5);    // it 2: 2/4
  EXPECT_DOUBLE_EQ(LearningRateAtStep(c, 5), 1.0);    // it 4: (12-4)/(12-4)
  EXPECT_DOUBLE_EQ(LearningRateAtStep(c, 9), 0.5);    // it 8: 4/8
  EXPECT_DOUBLE_EQ(LearningRateAtStep(c, 13), 0.0);   // it 12
  EXPECT_DOUBLE_EQ(LearningRateAtStep(c, 20), 0.0);   // clamped at 0
}

TEST(LearningRateAtStepTest, WarmupCosineLR) {
  DeepSpeedConfig c;
  c.optimizer.lr = 2.0;
  c.scheduler.type = SchedulerConfig::Type::kWarmupCosineLR;
  c.scheduler.warmup_num_steps = 2;
  c.scheduler.warmup_log = false;
  c.scheduler.total_num_steps = 6;
  c.scheduler.cos_min_ratio = 0.0;
  EXPECT_DOUBLE_EQ(LearningRateAtStep(c, 0), 0.0);
  EXPECT_DOUBLE_EQ(LearningRateAtStep(c, 2), 1.0);  // it 1: ratio 1/2
  // it 3: real_last 2, real_total 4 -> (1 + cos(pi/2))/2 = 0.5.
  EXPECT_NEAR(LearningRateAtStep(c, 4), 1.0, 1e-12);
}

TEST(ParseDeepSpeedConfigTest, AioSection) {
  const std::string ok = R"("train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW"})";
  absl::StatusOr<DeepSpeedConfig> c = ParseDeepSpeedConfig("{" + ok + "}", 1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->aio.block_size, 1048576);
  EXPECT_EQ(c->aio.queue_depth, 8);
  c = ParseDeepSpeedConfig("{" + ok + R"(, "aio": {"block_size": 262144, "queue_depth": 32,
      "thread_count": 1, "single_submit": false, "overlap_events": true}})", 1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->aio.block_size, 262144);
  EXPECT_EQ(c->aio.queue_depth, 32);
  c = ParseDeepSpeedConfig("{" + ok + R"(, "aio": {"block_size": 1000}})", 1);
  EXPECT_THAT(c, StatusIs(absl::StatusCode::kInvalidArgument, "deepspeed_config.aio.block_size"));
  c = ParseDeepSpeedConfig("{" + ok + R"(, "aio": {"depth": 3}})", 1);
  EXPECT_THAT(c, StatusIs(absl::StatusCode::kInvalidArgument,
                          "deepspeed_config.aio.depth: unknown key"));
}

// Every offload and aio key Loom accepts without acting on it gets exactly one warning naming
// its full path; the keys Loom implements get none.
TEST(ParseDeepSpeedConfigTest, IgnoredOffloadAndAioKeysEachWarn) {
  const std::string head = R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW"},
      "zero_optimization": {"stage": 3, )";
  struct Case {
    std::string json_tail;  // appended after head
    std::string path;       // the warning's key path
  };
  const std::string z = "deepspeed_config.zero_optimization.";
  const std::vector<Case> cases = {
      {R"("offload_optimizer": {"device": "cpu", "pin_memory": true}}})",
       z + "offload_optimizer.pin_memory"},
      {R"("offload_param": {"device": "cpu", "pin_memory": false}}})",
       z + "offload_param.pin_memory"},
      {R"("offload_param": {"device": "cpu", "max_in_cpu": 1e9}}})",
       z + "offload_param.max_in_cpu"},
      {R"("offload_optimizer": {"device": "cpu", "max_in_cpu": 1e9}}})",
       z + "offload_optimizer.max_in_cpu"},
      {R"("offload_optimizer": {"device": "cpu", "fast_init": true}}})",
       z + "offload_optimizer.fast_init"},
      {R"("offload_param": {"device": "cpu", "fast_init": false}}})",
       z + "offload_param.fast_init"},
      {R"("offload_optimizer": {"device": "cpu", "cpuadam_cores_perc": 0.8}}})",
       z + "offload_optimizer.cpuadam_cores_perc"},
      {R"("offload_optimizer": {"device": "cpu", "pipeline": true}}})",
       z + "offload_optimizer.pipeline"},
      {R"("offload_param": {"device": "cpu", "pipeline": false}}})", z + "offload_param.pipeline"},
      {R"("offload_param": {"device": "cpu", "pipeline_read": true}}})",
       z + "offload_param.pipeline_read"},
      {R"("offload_param": {"device": "cpu", "pipeline_write": true}}})",
       z + "offload_param.pipeline_write"},
      {R"("offload_param": {"device": "cpu", "ratio": 0.5}}})", z + "offload_param.ratio"},
      // Regression: with device "none" any ratio (7, -3) was accepted without a word.
      {R"("offload_optimizer": {"device": "none", "ratio": 0.5}}})",
       z + "offload_optimizer.ratio"},
      {R"("offload_optimizer": {"device": "cpu", "buffer_size": 1000}}})",
       z + "offload_optimizer.buffer_size"},
      {R"("offload_optimizer": {"device": "none"}}, "aio": {"thread_count": 2}})",
       "deepspeed_config.aio.thread_count"},
      {R"("offload_optimizer": {"device": "none"}}, "aio": {"single_submit": true}})",
       "deepspeed_config.aio.single_submit"},
      {R"("offload_optimizer": {"device": "none"}}, "aio": {"overlap_events": false}})",
       "deepspeed_config.aio.overlap_events"},
      {R"("offload_optimizer": {"device": "none"}}, "aio": {"use_gds": false}})",
       "deepspeed_config.aio.use_gds"},
      {R"("offload_optimizer": {"device": "none"}}, "aio": {"intra_op_parallelism": 1}})",
       "deepspeed_config.aio.intra_op_parallelism"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<DeepSpeedConfig> r = ParseDeepSpeedConfig(head + c.json_tail, 2);
    ASSERT_TRUE(r.ok()) << c.path << ": " << r.status();
    ASSERT_EQ(r->warnings.size(), 1u) << c.path;
    EXPECT_EQ(r->warnings[0].rfind(c.path + ": ignored (", 0), 0u) << r->warnings[0];
  }
  // The implemented keys are silent.
  absl::StatusOr<DeepSpeedConfig> r = ParseDeepSpeedConfig(
      head + R"("offload_optimizer": {"device": "nvme", "nvme_path": "/tmp/x", "buffer_count": 6,
          "pipeline_read": true, "pipeline_write": true, "ratio": 1.0},
        "offload_param": {"device": "nvme", "nvme_path": "/tmp/x", "buffer_count": 5,
          "buffer_size": 1000}}, "aio": {"block_size": 8192, "queue_depth": 4}})",
      2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->warnings.empty()) << r->warnings[0];
  EXPECT_TRUE(r->zero.offload_optimizer.pipeline_read);
  EXPECT_EQ(r->zero.offload_param.buffer_size, 1000);
  // Ignored keys are still type-checked, naming the key.
  for (const auto& [tail, path] : std::vector<std::pair<std::string, std::string>>{
           {R"("offload_optimizer": {"device": "cpu", "pipeline": "yes"}}})",
            z + "offload_optimizer.pipeline"},
           {R"("offload_optimizer": {"device": "cpu", "cpuadam_cores_perc": "most"}}})",
            z + "offload_optimizer.cpuadam_cores_perc"},
           {R"("offload_optimizer": {"device": "none"}}, "aio": {"use_gds": 1.5}})",
            "deepspeed_config.aio.use_gds"},
           {R"("offload_optimizer": {"device": "none"}}, "aio": {"thread_count": "x"}})",
            "deepspeed_config.aio.thread_count"}}) {
    r = ParseDeepSpeedConfig(head + tail, 2);
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument, path + ": expected"));
  }
}

// SuperOffload's keys as DeepSpeed spells them (docs/design/TECHNIQUES.md §4.2): accepted without
// warnings, with DeepSpeed's defaults; bad values are INVALID_ARGUMENT naming the key.
TEST(ParseDeepSpeedConfigTest, SuperOffloadKeys) {
  const std::string head = R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW"},
      "zero_optimization": {"stage": 3, "offload_optimizer": )";
  const std::string z = "deepspeed_config.zero_optimization.offload_optimizer.";
  absl::StatusOr<DeepSpeedConfig> r = ParseDeepSpeedConfig(
      head + R"({"device": "cpu", "super_offload": true, "ratio": 0.9,
                 "cpuadam_cores_perc": 0.5}}})",
      2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->warnings.empty()) << r->warnings[0];
  EXPECT_TRUE(r->zero.offload_optimizer.super_offload);
  EXPECT_EQ(r->zero.offload_optimizer.ratio, 0.9);
  EXPECT_EQ(r->zero.offload_optimizer.cpuadam_cores_perc, 0.5);
  r = ParseDeepSpeedConfig(head + R"({"device": "cpu", "super_offload": true}}})", 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->zero.offload_optimizer.ratio, 1.0);
  EXPECT_EQ(r->zero.offload_optimizer.cpuadam_cores_perc, 0.8);
  EXPECT_FALSE(r->zero.offload_optimizer.speculate_always);  // Loom's default: adaptive
  r = ParseDeepSpeedConfig(
      head + R"({"device": "cpu", "super_offload": true, "speculation": "always"}}})", 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->zero.offload_optimizer.speculate_always);
  r = ParseDeepSpeedConfig(head + R"({"device": "cpu"}}})", 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->zero.offload_optimizer.super_offload);
  // Optimizer state on NVMe: held swap buffers instead of copies (super_offload_pipeline.h).
  r = ParseDeepSpeedConfig(
      head + R"({"device": "nvme", "nvme_path": "/tmp/x", "super_offload": true}}})", 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->zero.offload_optimizer.super_offload);
  EXPECT_EQ(r->zero.offload_optimizer.device, "nvme");
  for (const auto& [tail, message] : std::vector<std::pair<std::string, std::string>>{
           {R"({"device": "cpu", "super_offload": "yes"}}})", z + "super_offload: expected"},
           {R"({"device": "cpu", "super_offload": true, "ratio": 1.5}}})",
            z + "ratio: 1.5 is not in [0, 1]"},
           {R"({"device": "cpu", "super_offload": true, "ratio": -0.1}}})",
            z + "ratio: -0.1 is not in [0, 1]"},
           {R"({"device": "cpu", "super_offload": true, "cpuadam_cores_perc": 0}}})",
            z + "cpuadam_cores_perc: 0 is not in (0, 1]"},
           {R"({"device": "cpu", "super_offload": true, "cpuadam_cores_perc": 1.2}}})",
            z + "cpuadam_cores_perc: 1.2 is not in (0, 1]"},
           {R"({"device": "none", "super_offload": true}}})",
            z + "super_offload: needs device \"cpu\" or \"nvme\" (device is \"none\")"},
           {R"({"device": "cpu", "super_offload": true, "speculation": "never"}}})",
            z + "speculation: \"never\" is not one of adaptive, always"},
           {R"({"device": "cpu", "super_offload": true, "speculation": 1}}})",
            z + "speculation: expected"},
           {R"({"device": "cpu", "speculation": "always"}}})",
            z + "speculation: needs super_offload: true"}}) {
    r = ParseDeepSpeedConfig(head + tail, 2);
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument, message))
        << tail;
  }
  r = ParseDeepSpeedConfig(
      R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW"},
          "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu",
          "super_offload": true}}})",
      2);
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument,
                          "offload_param.super_offload: belongs to"));
  // ZenFlow and SuperOffload each replace the offload optimizer's step: one at a time.
  r = ParseDeepSpeedConfig(
      R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW"},
          "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu",
          "super_offload": true}, "zenflow": {}}})",
      2);
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument,
                          "zero_optimization.zenflow: cannot be combined with "
                          "offload_optimizer.super_offload"));
}

// activation_checkpointing (issue 13): present = per-layer checkpointing; cpu_checkpointing
// acts; partition_activations refused; the tuning keys warn; unknown keys refused.
TEST(ParseDeepSpeedConfigTest, ActivationCheckpointingSection) {
  const std::string head = R"({"train_micro_batch_size_per_gpu": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}, )";
  absl::StatusOr<DeepSpeedConfig> r = ParseDeepSpeedConfig(head + R"("zero_optimization": {}})", 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->activation_checkpointing.enabled);
  r = ParseDeepSpeedConfig(head + R"("activation_checkpointing": {}})", 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->activation_checkpointing.enabled);
  EXPECT_FALSE(r->activation_checkpointing.cpu_checkpointing);
  EXPECT_TRUE(r->warnings.empty());
  r = ParseDeepSpeedConfig(head + R"("activation_checkpointing": {"cpu_checkpointing": true,
      "partition_activations": false, "number_checkpoints": null, "profile": false}})", 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->activation_checkpointing.cpu_checkpointing);
  ASSERT_EQ(r->warnings.size(), 2u);  // number_checkpoints, profile
  EXPECT_EQ(r->warnings[0].rfind("deepspeed_config.activation_checkpointing.", 0), 0u);
  r = ParseDeepSpeedConfig(head + R"("activation_checkpointing": {"partition_activations": true}})",
                           2);
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument,
                          "deepspeed_config.activation_checkpointing.partition_activations"));
  r = ParseDeepSpeedConfig(head + R"("activation_checkpointing": {"cpu_checkpoint": true}})", 2);
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument,
                          "deepspeed_config.activation_checkpointing.cpu_checkpoint: unknown key"));
  r = ParseDeepSpeedConfig(head + R"("activation_checkpointing": {"cpu_checkpointing": "yes"}})",
                           2);
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument,
                          "deepspeed_config.activation_checkpointing.cpu_checkpointing: expected"));
  r = ParseDeepSpeedConfig(head + R"("activation_checkpointing": 3})", 2);
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument,
                          "deepspeed_config.activation_checkpointing: expected a JSON object"));
}

// communication_data_type (ds_config_communication.cc): DeepSpeed's values and spellings are
// stored by canonical name for ZeroOptionsFor (absent: "", the provider's default); any of them
// with any param dtype at stages 1-3; a 16-bit value at stage 0 (fp32 all-reduce) is refused
// naming the key, as are other values.
TEST(ParseDeepSpeedConfigTest, CommunicationDataType) {
  const std::string ok = R"("train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW"})";
  auto parse = [&](const std::string& extra) {
    return ParseDeepSpeedConfig("{" + ok + extra + "}", 2);
  };
  const std::string z1 = R"(, "zero_optimization": {"stage": 1})";
  const std::string z3 = R"(, "zero_optimization": {"stage": 3})";
  const std::string bf16 = R"(, "bf16": {"enabled": true})";
  const std::string fp16 = R"(, "fp16": {"enabled": true})";
  const std::vector<std::pair<std::string, std::string>> accepted = {
      {"", ""},
      {R"(, "communication_data_type": "fp32")", "fp32"},
      {fp16 + R"(, "communication_data_type": "fp32")", "fp32"},
      {bf16 + R"(, "communication_data_type": "float32")", "fp32"},
      {bf16 + z3 + R"(, "communication_data_type": "fp32")", "fp32"},
      {bf16 + z1 + R"(, "communication_data_type": "bf16")", "bf16"},
      {bf16 + z3 + R"(, "communication_data_type": "bfloat16")", "bf16"},
      {z1 + R"(, "communication_data_type": "bf16")", "bf16"},
      {z3 + R"(, "communication_data_type": "fp16")", "fp16"},
      {fp16 + z3 + R"(, "communication_data_type": "float16")", "fp16"},
      {bf16 + z3 + R"(, "communication_data_type": "fp16")", "fp16"}};
  for (const auto& [extra, want] : accepted) {
    absl::StatusOr<DeepSpeedConfig> c = parse(extra);
    ASSERT_TRUE(c.ok()) << extra << ": " << c.status();
    EXPECT_EQ(c->communication_data_type, want) << extra;
  }
  EXPECT_THAT(parse(R"(, "communication_data_type": "bf16")").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "deepspeed_config.communication_data_type: \"bf16\" with "
                       "zero_optimization.stage 0"));
  EXPECT_THAT(parse(bf16 + R"(, "communication_data_type": "bf16")").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "deepspeed_config.communication_data_type: \"bf16\" with "
                       "zero_optimization.stage 0"));
  EXPECT_THAT(parse(z1 + R"(, "communication_data_type": "int8")").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "deepspeed_config.communication_data_type: \"int8\" is not one of fp32, "
                       "bf16, fp16"));
  EXPECT_THAT(parse(R"(, "communication_data_type": 16)").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "deepspeed_config.communication_data_type"));
}

// Issue 47: DeepSpeed's own leniency. Keys DeepSpeed does not read are warned about, not refused;
// DeepSpeed features Loom lacks are named as such (refused when they would act, warned about when
// switched off); ZeRO's alias spellings are DeepSpeed's.
TEST(ParseDeepSpeedConfigTest, KeysAreJudgedAsDeepSpeedJudgesThem) {
  const std::string ok = R"("train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW"})";
  absl::StatusOr<DeepSpeedConfig> c = ParseDeepSpeedConfig(
      "{" + ok + R"(, "_comment": "x", "comms_config": {"verbose": false},
      "tensor_parallel": {"autotp_size": 1}, "autotuning": {"enabled": false}})", 2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->warnings,
            (std::vector<std::string>{
                "deepspeed_config._comment: ignored (not a DeepSpeed key: DeepSpeed's config "
                "reader does not read it either)",
                "deepspeed_config.autotuning: ignored (a DeepSpeed setting that cannot change "
                "what Loom computes)",
                "deepspeed_config.comms_config: ignored (not a DeepSpeed key: DeepSpeed's config "
                "reader does not read it either)",
                "deepspeed_config.tensor_parallel: ignored (tensor parallelism (AutoTP) is "
                "switched off here, and not implemented in Loom)"}));
  ExpectError("{" + ok + R"(, "tensor_parallel": {"autotp_size": 2},
      "hybrid_engine": {"enabled": true}})", 2,
              "2 problems:\n"
              "  deepspeed_config.hybrid_engine: the RLHF hybrid engine is not implemented in Loom\n"
              "  deepspeed_config.tensor_parallel: tensor parallelism (AutoTP) is not implemented "
              "in Loom");
  // axolotl's spellings: DeepSpeed's pydantic aliases.
  c = ParseDeepSpeedConfig("{" + ok + R"(, "zero_optimization": {"stage": 3,
      "prefetch_bucket_size": 1000, "param_persistence_threshold": 7, "max_live_parameters": 5,
      "gather_16bit_weights_on_model_save": true}})", 2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->zero.stage3_prefetch_bucket_size, 1000);
  EXPECT_EQ(c->zero.stage3_param_persistence_threshold, 7);
  EXPECT_EQ(c->zero.stage3_max_live_parameters, 5);
  EXPECT_TRUE(c->zero.stage3_gather_16bit_weights_on_model_save);
  ExpectError("{" + ok + R"(, "zero_optimization": {"stage": 3, "prefetch_bucket_size": 1,
      "stage3_prefetch_bucket_size": 2}})", 2,
              "deepspeed_config.zero_optimization.prefetch_bucket_size: and "
              "stage3_prefetch_bucket_size are the same setting with different values");
}

}  // namespace
// The monitor blocks DeepSpeed's own configs carry (its monitor tutorial's example): tensorboard
// and csv_monitor act, wandb is a warning; an output_path outside the job's directory is refused.
TEST(DsConfigTest, MonitorBlocks) {
  const std::string head = R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW"},
      "zero_optimization": {"stage": 2}, )";
  absl::StatusOr<DeepSpeedConfig> c = ParseDeepSpeedConfig(
      head + R"("tensorboard": {"enabled": true, "output_path": "output/ds_logs/",
        "job_name": "train_bert"},
      "csv_monitor": {"enabled": true},
      "wandb": {"enabled": true, "team": "my_team", "group": "my_group", "project": "p"}})",
      2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->monitor.tensorboard.enabled);
  EXPECT_EQ(c->monitor.tensorboard.output_path, "output/ds_logs/");
  EXPECT_EQ(c->monitor.tensorboard.job_name, "train_bert");
  EXPECT_TRUE(c->monitor.csv_monitor.enabled);
  EXPECT_EQ(c->monitor.csv_monitor.output_path, "");
  EXPECT_EQ(c->monitor.csv_monitor.job_name, "DeepSpeedJobName");
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_EQ(c->warnings[0].rfind("deepspeed_config.wandb: ignored", 0), 0u) << c->warnings[0];

  ExpectError(head + R"("tensorboard": {"enabled": true, "output_path": "/var/log"}})", 2,
              "deepspeed_config.tensorboard.output_path: '/var/log' leaves the job's directory");
  ExpectError(head + R"("csv_monitor": {"enabled": true, "output_path": "a/../../b"}})", 2,
              "deepspeed_config.csv_monitor.output_path: 'a/../../b' leaves");
  ExpectError(head + R"("csv_monitor": {"enabled": true, "job_name": ".."}})", 2,
              "deepspeed_config.csv_monitor.job_name: '..' is not a directory name");
  ExpectError(head + R"("csv_monitor": {"enabled": true, "jobname": "x"}})", 2,
              "deepspeed_config.csv_monitor.jobname");
}

}  // namespace loom::spec
