// The training-sample order (train_samples.h): every split of one step's train_batch_size over
// data-parallel ranks, micro-steps and micro-batches reads the same set of windows, and the
// sequence-parallel layouts read the windows of the plain jobs with the same batch. The expected
// indices are written out by hand here, not computed with GlobalTrainSample.
#include "worker/engine/train_samples.h"

#include <algorithm>
#include <array>
#include <vector>

#include "gtest/gtest.h"
#include "data/corpus.h"

namespace loom::engine {
namespace {

constexpr uint64_t kSeed = 1234;
constexpr int64_t kLen = 1 << 20, kWindow = 33;

// The windows of step `step` in the order (micro-step, data rank, i) of a job with `ranks`
// data-parallel ranks, `gas` micro-steps and `micro` samples per micro-step.
std::vector<int64_t> StepWindows(int64_t step, int64_t ranks, int64_t gas, int64_t micro) {
  std::vector<int64_t> out;
  for (int64_t m = 0; m < gas; ++m) {
    for (int64_t d = 0; d < ranks; ++d) {
      std::vector<int64_t> s = TrainMicroStepStarts(kSeed, step, m, d, ranks, micro, kLen, kWindow);
      EXPECT_EQ(s.size(), static_cast<size_t>(micro));
      out.insert(out.end(), s.begin(), s.end());
    }
  }
  return out;
}

std::vector<int64_t> Sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(TrainSamplesTest, GlobalIndexIsMicroStepMajorThenRankThenSample) {
  // D = 2, micro = 3: micro-step 1 of rank 1 holds samples 9, 10, 11 of the step.
  EXPECT_EQ(GlobalTrainSample(0, 0, 2, 3, 0), 0);
  EXPECT_EQ(GlobalTrainSample(0, 1, 2, 3, 2), 5);
  EXPECT_EQ(GlobalTrainSample(1, 0, 2, 3, 0), 6);
  EXPECT_EQ(GlobalTrainSample(1, 1, 2, 3, 2), 11);
}

TEST(TrainSamplesTest, WindowsAreTheStepsGlobalSamplesKeyedByStepOnly) {
  // The reference: sample g of step s is data::TrainWindowStart(seed, s, 0, g) (data/corpus.h).
  for (int64_t step : {0, 5}) {
    std::vector<int64_t> want;
    for (int64_t g = 0; g < 4; ++g) {
      want.push_back(data::TrainWindowStart(kSeed, step, 0, g, kLen, kWindow));
    }
    EXPECT_EQ(StepWindows(step, 1, 4, 1), want);  // 1 rank, GAS 4
    EXPECT_EQ(StepWindows(step, 4, 1, 1), want);  // 4 ranks, GAS 1
    EXPECT_EQ(StepWindows(step, 2, 2, 1), want);  // 2 ranks, GAS 2: m=0 -> {0,1}, m=1 -> {2,3}
    EXPECT_EQ(StepWindows(step, 1, 1, 4), want);  // 1 rank, micro 4
  }
}

TEST(TrainSamplesTest, EverySplitOfTheBatchReadsTheSameSamples) {
  // B = 8 = micro · GAS · D in every way; the set of windows per step is the same.
  const std::vector<int64_t> ref = Sorted(StepWindows(3, 1, 8, 1));
  for (auto [d, gas, micro] : std::vector<std::array<int64_t, 3>>{
           {1, 1, 8}, {2, 4, 1}, {2, 2, 2}, {4, 2, 1}, {8, 1, 1}, {1, 2, 4}, {2, 1, 4}}) {
    EXPECT_EQ(Sorted(StepWindows(3, d, gas, micro)), ref)
        << "D=" << d << " GAS=" << gas << " micro=" << micro;
  }
  // Distinct steps read distinct windows (the step is in the key).
  EXPECT_NE(StepWindows(3, 1, 8, 1), StepWindows(4, 1, 8, 1));
}

TEST(TrainSamplesTest, SequenceParallelGroupsReadThePlainJobsSamples) {
  // World 4, SP = 2: D = 2 data-parallel ranks, each SP pair reads its data rank's windows. With
  // GAS 2 that is the 2-rank GAS-2 job's samples and the 4-rank GAS-1 job's (issue 13).
  std::vector<int64_t> sp;
  for (int64_t m = 0; m < 2; ++m) {
    for (int64_t world_rank = 0; world_rank < 4; world_rank += 2) {  // one rank per SP group
      const int64_t d = world_rank / 2;  // the group's data-parallel rank (ProcessGroups)
      std::vector<int64_t> s = TrainMicroStepStarts(kSeed, 0, m, d, 2, 1, kLen, kWindow);
      sp.insert(sp.end(), s.begin(), s.end());
    }
  }
  EXPECT_EQ(sp, StepWindows(0, 2, 2, 1));
  EXPECT_EQ(Sorted(sp), Sorted(StepWindows(0, 4, 1, 1)));
  // The old plain-path key (micro-step, index within the micro-step) reads another sample at
  // micro-step 1: the cause of the SP=2 vs 1-rank GAS-2 mismatch.
  EXPECT_NE(data::TrainWindowStart(kSeed, 0, 1, 0, kLen, kWindow),
            TrainMicroStepStarts(kSeed, 0, 1, 0, 1, 1, kLen, kWindow)[0]);
}

}  // namespace
}  // namespace loom::engine
