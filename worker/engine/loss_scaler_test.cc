#include "worker/engine/loss_scaler.h"

#include "gtest/gtest.h"

namespace loom::engine {
namespace {

spec::Fp16Config Dynamic(int64_t power, int64_t window, int64_t hysteresis, bool consecutive) {
  spec::Fp16Config c;
  c.enabled = true;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.consecutive_hysteresis = consecutive;
  return c;
}

TEST(LossScalerTest, DisabledAndStaticNeverChange) {
  LossScaler off;
  off.Update(true);
  EXPECT_EQ(off.scale(), 1.0);
  spec::Fp16Config c;
  c.enabled = true;
  c.loss_scale = 128;
  LossScaler fixed(c);
  fixed.Update(true);
  fixed.Update(false);
  EXPECT_EQ(fixed.scale(), 128.0);
}

// DeepSpeed defaults (power 16, hysteresis 2): the first overflow only uses up hysteresis, the
// second halves; window 3 clean iterations after the last overflow double it.
TEST(LossScalerTest, HysteresisThenHalvingThenGrowthAfterWindow) {
  LossScaler s(Dynamic(16, 3, 2, false));
  EXPECT_EQ(s.scale(), 65536.0);
  s.Update(true);  // iter 0: hysteresis 2 -> 1
  EXPECT_EQ(s.scale(), 65536.0);
  s.Update(true);  // iter 1: halve
  EXPECT_EQ(s.scale(), 32768.0);
  s.Update(true);  // iter 2: cur_hysteresis still 1 (not restored yet): halve again
  EXPECT_EQ(s.scale(), 16384.0);
  s.Update(false);  // iter 3: 3-2 = 1
  s.Update(false);  // iter 4: 2
  EXPECT_EQ(s.scale(), 16384.0);
  s.Update(false);  // iter 5: 3 % 3 == 0 -> double, hysteresis restored to 2
  EXPECT_EQ(s.scale(), 32768.0);
  s.Update(true);  // hysteresis 2 -> 1, no change
  EXPECT_EQ(s.scale(), 32768.0);
}

TEST(LossScalerTest, ConsecutiveHysteresisResetsOnEveryCleanStep) {
  LossScaler s(Dynamic(4, 100, 2, true));
  s.Update(true);   // 2 -> 1
  s.Update(false);  // restored to 2
  s.Update(true);   // 2 -> 1 again: no halving
  EXPECT_EQ(s.scale(), 16.0);
  s.Update(true);   // halve
  EXPECT_EQ(s.scale(), 8.0);
}

TEST(LossScalerTest, MinLossScaleBounds) {
  spec::Fp16Config c = Dynamic(1, 1000, 1, false);
  c.min_loss_scale = 1.0;
  LossScaler s(c);
  s.Update(true);
  EXPECT_EQ(s.scale(), 1.0);
  s.Update(true);
  EXPECT_EQ(s.scale(), 1.0);
}

}  // namespace
}  // namespace loom::engine
