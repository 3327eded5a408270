// DeepSpeed configs written for Hugging Face's Trainer (spec/hf_trainer_config.h): "auto",
// no optimizer, no scheduler, and contradictions. Expected values are transformers 5.25's
// (HfTrainerDeepSpeedConfig and optimization.py), worked out by hand here;
// tests/python/hf_trainer_config_test.py checks the same resolution against the real
// transformers and DeepSpeed.
#include "spec/hf_trainer_config.h"

#include <google/protobuf/util/json_util.h>

#include <nlohmann/json.hpp>
#include <string>

#include "gtest/gtest.h"

namespace loom::spec {
namespace {

using nlohmann::json;

// A job of `steps` steps with `ds` as its deepspeed_config and `training` merged into its
// training section (JSON, proto field names).
loom::v1::JobSpec Job(const json& ds, const json& training = json::object(), int steps = 20) {
  json t = training;
  t["steps"] = steps;
  t["sequence_length"] = 16;
  const json spec = {{"deepspeed_config", ds}, {"training", t}};
  loom::v1::JobSpec out;
  google::protobuf::util::JsonParseOptions options;
  auto status = google::protobuf::util::JsonStringToMessage(spec.dump(), &out, options);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return out;
}

// HF's zero3 template (transformers docs, "ZeRO-3 example"), every value "auto".
json ZeroThreeAuto() {
  return json::parse(R"({
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
             "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                              "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto",
        "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "overlap_comm": true, "contiguous_gradients": true,
        "sub_group_size": 1e9, "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": true},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "steps_per_print": 2000, "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": false})");
}

TEST(HfTrainerConfigTest, AutoValuesResolveAsTheTrainerResolvesThem) {
  json resolved;
  absl::StatusOr<DeepSpeedConfig> c = ParseJobDeepSpeedConfig(
      Job(ZeroThreeAuto(), {{"learning_rate", 3e-4}, {"per_device_train_batch_size", 2},
                            {"gradient_accumulation_steps", 3}, {"warmup_steps", 0.1},
                            {"bf16", true}}),
      /*hidden_size=*/64, /*world_size=*/2, &resolved);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train_micro_batch_size_per_gpu, 2);
  EXPECT_EQ(c->gradient_accumulation_steps, 3);
  EXPECT_EQ(c->train_batch_size, 12);  // 2 ranks * 2 * 3
  EXPECT_DOUBLE_EQ(c->gradient_clipping, 1.0);
  EXPECT_DOUBLE_EQ(c->optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c->optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c->optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(c->optimizer.eps, 1e-8);
  EXPECT_DOUBLE_EQ(c->optimizer.weight_decay, 0.0);
  EXPECT_TRUE(c->bf16_enabled);
  EXPECT_FALSE(c->fp16.enabled);
  EXPECT_EQ(c->scheduler.type, SchedulerConfig::Type::kWarmupDecayLR);
  EXPECT_DOUBLE_EQ(c->scheduler.warmup_min_lr, 0.0);
  EXPECT_DOUBLE_EQ(c->scheduler.warmup_max_lr, 3e-4);
  EXPECT_EQ(c->scheduler.warmup_num_steps, 2);  // ceil(0.1 * 20)
  EXPECT_EQ(c->scheduler.total_num_steps, 20);
  EXPECT_EQ(c->zero.reduce_bucket_size, 4096);                 // 64^2
  EXPECT_EQ(c->zero.stage3_prefetch_bucket_size, 3686);        // int(0.9 * 4096)
  EXPECT_EQ(c->zero.stage3_param_persistence_threshold, 640);  // 10 * 64
  EXPECT_EQ(resolved["optimizer"]["params"]["betas"], json::array({0.9, 0.999}));
  // Every filled value is said, with where it came from.
  ASSERT_FALSE(c->resolved.empty());
  bool said_lr = false, said_eps = false;
  for (const std::string& note : c->resolved) {
    said_lr |= note == "deepspeed_config.optimizer.params.lr: \"auto\" -> 0.0003 "
                       "(training.learning_rate)";
    said_eps |= note == "deepspeed_config.optimizer.params.eps: \"auto\" -> 1e-08 "
                        "(training.adam_epsilon unset: the Trainer's default)";
  }
  EXPECT_TRUE(said_lr && said_eps) << json(c->resolved).dump(1);
}

TEST(HfTrainerConfigTest, NoOptimizerGetsTheTrainersAdamWAndLinearSchedule) {
  json ds = {{"train_micro_batch_size_per_gpu", 4}, {"zero_optimization", {{"stage", 2}}}};
  absl::StatusOr<DeepSpeedConfig> c =
      ParseJobDeepSpeedConfig(Job(ds, {{"warmup_steps", 4}}), 64, 1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->optimizer.type, OptimizerConfig::Type::kAdamW);
  EXPECT_DOUBLE_EQ(c->optimizer.lr, 5e-5);
  EXPECT_TRUE(c->optimizer.decoupled_weight_decay);
  EXPECT_EQ(c->scheduler.type, SchedulerConfig::Type::kHfLinear);
  // transformers' linear lambda: s / 4 during warm-up, then (20 - s) / 16.
  const double lr = 5e-5;
  EXPECT_DOUBLE_EQ(LearningRateAtStep(*c, 0), 0.0);
  EXPECT_DOUBLE_EQ(LearningRateAtStep(*c, 2), lr * 0.5);
  EXPECT_DOUBLE_EQ(LearningRateAtStep(*c, 4), lr);
  EXPECT_DOUBLE_EQ(LearningRateAtStep(*c, 12), lr * 0.5);
  EXPECT_DOUBLE_EQ(LearningRateAtStep(*c, 20), 0.0);
  // Cosine: half a cosine period after warm-up.
  c = ParseJobDeepSpeedConfig(Job(ds, {{"warmup_steps", 4}, {"lr_scheduler_type", "cosine"}}), 64, 1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(LearningRateAtStep(*c, 12), lr * 0.5);
  EXPECT_NEAR(LearningRateAtStep(*c, 8), lr * (1 + std::cos(M_PI / 4)) / 2, 1e-18);
  // weight decay with the Trainer's optimizer is said to reach every parameter.
  c = ParseJobDeepSpeedConfig(Job(ds, {{"weight_decay", 0.1}}), 64, 1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->optimizer.weight_decay, 0.1);
  EXPECT_NE(json(c->resolved).dump().find("exempts biases and norm weights"), std::string::npos);
}

TEST(HfTrainerConfigTest, PlainDeepSpeedConfigsKeepDeepSpeedsBehaviour) {
  // An optimizer, no "auto", no Trainer argument: constant lr, as DeepSpeed without a scheduler.
  json ds = {{"train_micro_batch_size_per_gpu", 4},
             {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 1e-3}}}}}};
  absl::StatusOr<DeepSpeedConfig> c = ParseJobDeepSpeedConfig(Job(ds), 64, 1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->scheduler.type, SchedulerConfig::Type::kNone);
  EXPECT_TRUE(c->resolved.empty());
  EXPECT_DOUBLE_EQ(LearningRateAtStep(*c, 7), 1e-3);
}

// A newcomer's pass (issue 49): a copied config decaying over 300 steps in a job of 20 trained
// with no word; now a warning names both (allowed: DeepSpeed takes the horizon as written).
TEST(HfTrainerConfigTest, DecayHorizonOtherThanTheStepCountIsWarnedAbout) {
  json ds = {{"train_micro_batch_size_per_gpu", 4},
             {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
             {"scheduler",
              {{"type", "WarmupDecayLR"},
               {"params", {{"warmup_num_steps", 2}, {"total_num_steps", 300}}}}}};
  absl::StatusOr<DeepSpeedConfig> c = ParseJobDeepSpeedConfig(Job(ds), 64, 1);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->warnings.size(), 2u);  // and gradient_clipping's
  EXPECT_EQ(c->warnings[1],
            "deepspeed_config.scheduler.params.total_num_steps: 300, but training.steps is 20: "
            "the learning rate schedule runs over 300 steps (\"auto\" follows training.steps)");
  ds["scheduler"]["params"]["total_num_steps"] = 20;
  c = ParseJobDeepSpeedConfig(Job(ds), 64, 1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->warnings.size(), 1u);
  ds["scheduler"]["params"]["total_num_steps"] = "auto";  // a Trainer config: clipping filled
  c = ParseJobDeepSpeedConfig(Job(ds), 64, 1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->warnings.empty()) << c->warnings[0];
  EXPECT_EQ(c->scheduler.total_num_steps, 20);
}

TEST(HfTrainerConfigTest, ContradictionsAndUnresolvableAutosAreRefusedNamingBoth) {
  json ds = {{"train_micro_batch_size_per_gpu", 4},
             {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}}};
  absl::StatusOr<DeepSpeedConfig> c =
      ParseJobDeepSpeedConfig(Job(ds, {{"learning_rate", 3e-4}}), 64, 1);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(),
            "deepspeed_config.optimizer.params.lr: 0.0001 contradicts training.learning_rate "
            "0.0003 (give the value once, or write \"auto\" in the DeepSpeed config)");
  // The same value twice is fine, 4 and 4.0 alike.
  EXPECT_TRUE(ParseJobDeepSpeedConfig(Job(ds, {{"learning_rate", 1e-4},
                                               {"per_device_train_batch_size", 4}}), 64, 1).ok());
  // "auto" the Trainer leaves under zero_optimization is DeepSpeed's default (its pydantic
  // models drop it), the alias spellings included; elsewhere it is refused naming it.
  ds["zero_optimization"] = {{"stage", 3}, {"stage3_max_live_parameters", "auto"},
                             {"prefetch_bucket_size", "auto"}};
  c = ParseJobDeepSpeedConfig(Job(ds), 64, 1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->zero.stage3_max_live_parameters, 1000000000);
  EXPECT_EQ(c->zero.stage3_prefetch_bucket_size, 50000000);
  ds["steps_per_print"] = "auto";
  c = ParseJobDeepSpeedConfig(Job(ds), 64, 1);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().rfind(
                "deepspeed_config.steps_per_print: \"auto\" is resolved only where Hugging "
                "Face's Trainer resolves it", 0),
            0u)
      << c.status();
  ds.erase("steps_per_print");
  c = ParseJobDeepSpeedConfig(
      Job({{"train_micro_batch_size_per_gpu", 4}}, {{"lr_scheduler_type", "polynomial"}}), 64, 1);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().rfind("training.lr_scheduler_type: \"polynomial\"", 0), 0u);
  c = ParseJobDeepSpeedConfig(Job({{"train_micro_batch_size_per_gpu", 4}}, {{"warmup_ratio", 1.5}}),
                              64, 1);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "training.warmup_ratio: 1.5 is not in [0, 1)");
}

}  // namespace
}  // namespace loom::spec
