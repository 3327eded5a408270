// Gradient communication dtype (ZeroOptions::communication_dtype, DeepSpeed's
// communication_data_type) on a 2-rank Gloo thread gang, tiny Llama with bf16 parameters:
//   * bytes per micro-step: the gradient reduce-scatters move exactly Σ N*p_i * 4 bytes with
//     fp32 communication and Σ N*p_i * 2 with bf16 (the default for bf16 params), stages 1-3
//     (stage 3's all-gathers are the same in both and cancel in the difference);
//   * the reduced gradient went through bf16: after one micro-step every element of the fp32
//     gradient partition is a bf16 value, within 2 bf16 ulps of the fp32-communication mean;
//     with 2 micro-steps (gradient accumulation) the partition is accumulated in fp32 (not
//     every element is a bf16 value any more);
//   * the job key (ParseDeepSpeedConfig -> ZeroOptionsFor, the Trainer's path): bf16 or fp16
//     on an fp32 job halves those bytes and rounds the reduced gradient to that dtype; fp32 on a
//     bf16 job doubles them and equals ZeroOptions::communication_dtype kFloat bit for bit;
//   * 8 SGD steps (an update written in the test: master -= 0.25 * grad): the losses with bf16
//     communication stay within 3% (relative) of the fp32-communication run's losses (at lr
//     0.5 they drifted 2.1% apart by step 5: the difference grows with the step size).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/engine/collectives.h"
#include "spec/ds_config.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/testing/thread_gang.h"
#include "worker/engine/process_groups.h"
#include "worker/engine/testing/tiny_llama.h"
#include "worker/engine/trainer_zero_options.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {
namespace {

using testing::FirstFailure;
using testing::RunGang;
using spec::LlamaConfig;
using spec::LlamaParamSpecs;
using spec::ParamSpec;
using spec::DeepSpeedConfig;
using spec::ParseDeepSpeedConfig;

// Deterministic per rank and micro-step (the ranks are threads: no shared global generator).
at::Tensor Tokens(const spec::LlamaConfig& c, int rank, int micro, int salt) {
  at::Tensor x = at::arange(2 * 9, at::kLong) * (7 + 2 * rank + 3 * micro) + salt + 5 * rank;
  return x.remainder(c.vocab_size).reshape({2, 9});
}

ZeroOptions Bf16Options(int stage, at::ScalarType comm) {
  ZeroOptions o;
  o.stage = stage;
  o.param_dtype = at::kBFloat16;
  o.communication_dtype = comm;
  o.reduce_bucket_size = 600;
  o.param_persistence_threshold = 0;
  return o;
}

std::unique_ptr<ZeroProvider> Make(Collectives& coll, const spec::LlamaConfig& c,
                                   const ZeroOptions& o) {
  auto z = ZeroProvider::Create(spec::LlamaParamSpecs(c), &coll, {31, c.initializer_range}, o);
  EXPECT_TRUE(z.ok()) << z.status();
  return std::move(*z);
}

std::unique_ptr<ZeroProvider> Make(Collectives& coll, const spec::LlamaConfig& c, int stage,
                                   at::ScalarType comm) {
  return Make(coll, c, Bf16Options(stage, comm));
}

struct MicroResult {
  int64_t bytes = 0;  // bytes handed to collectives during the micro-steps (forward+backward)
  std::vector<at::Tensor> grads;
  std::vector<double> losses;
};

// `micros` micro-steps of one optimizer step (no update).
MicroResult Micro(Collectives& coll, const ZeroOptions& o, int micros) {
  const spec::LlamaConfig c = testing::TinyLlamaConfig(false);
  auto zero = Make(coll, c, o);
  auto model = *LlamaModel::Create(c, zero.get());
  MicroResult r;
  const int64_t before = coll.bytes_communicated();
  for (int m = 0; m < micros; ++m) {
    zero->BeginMicroStep(m == micros - 1);
    LossOutput out = model->Loss(Tokens(c, coll.rank(), m, 0), Tokens(c, coll.rank(), m, 1));
    (out.loss / micros).backward();
    zero->FinishMicroStep();
    r.losses.push_back(out.loss.item<double>());
  }
  r.bytes = coll.bytes_communicated() - before;
  for (const ZeroParam& p : zero->params()) r.grads.push_back(p.grad.clone());
  return r;
}

MicroResult Micro(Collectives& coll, int stage, at::ScalarType comm, int micros) {
  return Micro(coll, Bf16Options(stage, comm), micros);
}

int64_t GradElements(int world, const spec::LlamaConfig& c) {
  int64_t total = 0;
  for (const ParamSpec& s : spec::LlamaParamSpecs(c)) {
    total += world * PartitionNumel(s.numel(), world);
  }
  return total;
}

bool AllBf16Values(const at::Tensor& t) {
  return at::equal(t, t.to(at::kBFloat16).to(at::kFloat));
}

void ExpectOk(const absl::Status& s) { EXPECT_TRUE(s.ok()) << s; }

class GradCommDtypeTest : public ::testing::TestWithParam<int> {};

TEST_P(GradCommDtypeTest, Bf16HalvesGradientBytesAndRoundsTheReducedGradientOnce) {
  const int stage = GetParam();
  const int64_t g = GradElements(2, testing::TinyLlamaConfig(false));
  ExpectOk(FirstFailure(RunGang(2, [&](int rank, Collectives& coll) -> absl::Status {
    MicroResult fp32 = Micro(coll, stage, at::kFloat, 1);
    MicroResult bf16 = Micro(coll, stage, at::ScalarType::Undefined, 1);  // default: param dtype
    EXPECT_EQ(fp32.bytes - bf16.bytes, 2 * g) << "stage " << stage;
    if (stage < 3) {  // only the gradient reduce-scatters move data during the micro-step
      EXPECT_EQ(fp32.bytes, 4 * g) << "stage " << stage;
      EXPECT_EQ(bf16.bytes, 2 * g) << "stage " << stage;
    }
    EXPECT_EQ(fp32.losses, bf16.losses);  // the forward is the same
    for (size_t i = 0; i < fp32.grads.size(); ++i) {
      const at::Tensor& want = fp32.grads[i];
      const at::Tensor& got = bf16.grads[i];
      const std::string what = absl::StrCat("stage ", stage, " rank ", rank, " param ", i);
      EXPECT_TRUE(AllBf16Values(got)) << what;
      // Each rank's contribution rounded to bf16 (<= 2^-9 of the contribution, which can be
      // much larger than the mean when the ranks' contributions cancel) and the fp32 sum
      // rounded once (<= 2^-9 of the result): |got - want| <= 2^-8 |want| + 2^-8 max|want|.
      const double floor = 0.00390625 * want.abs().max().item<double>();
      const double worst =
          ((got - want).abs() - 0.00390625 * want.abs()).max().item<double>();
      EXPECT_LE(worst, floor) << what;
    }
    return absl::OkStatus();
  })));
}

TEST_P(GradCommDtypeTest, GradientAccumulationStaysFp32) {
  const int stage = GetParam();
  ExpectOk(FirstFailure(RunGang(2, [&](int rank, Collectives& coll) -> absl::Status {
    MicroResult bf16 = Micro(coll, stage, at::kBFloat16, 2);
    if (stage == 1) {  // stage 1 accumulates locally and reduces once: one bf16 rounding
      for (const at::Tensor& t : bf16.grads) EXPECT_TRUE(AllBf16Values(t));
      return absl::OkStatus();
    }
    // Stages 2/3 reduce each micro-step and add the bf16 partitions in fp32.
    bool some_not_bf16 = false;
    for (const at::Tensor& t : bf16.grads) some_not_bf16 = some_not_bf16 || !AllBf16Values(t);
    EXPECT_TRUE(some_not_bf16) << "stage " << stage << " rank " << rank;
    return absl::OkStatus();
  })));
}

// 8 steps of SGD written here (master -= lr * grad, then RefreshParams), fp32 vs bf16 wire.
std::vector<double> Train(Collectives& coll, int stage, at::ScalarType comm) {
  const spec::LlamaConfig c = testing::TinyLlamaConfig(false);
  auto zero = Make(coll, c, stage, comm);
  auto model = *LlamaModel::Create(c, zero.get());
  std::vector<double> losses;
  for (int step = 0; step < 8; ++step) {
    zero->BeginMicroStep(true);
    LossOutput out = model->Loss(Tokens(c, coll.rank(), 0, 0), Tokens(c, coll.rank(), 0, 1));
    out.loss.backward();
    zero->FinishMicroStep();
    at::Tensor l = at::full({1}, out.loss.item<double>(), at::kDouble);
    EXPECT_TRUE(coll.AllReduce(l, ReduceOp::kSum).ok());
    losses.push_back(l.item<double>() / coll.world_size());
    {
      at::NoGradGuard no_grad;
      for (ZeroParam& p : zero->params()) p.master.add_(p.grad, -0.25);
    }
    zero->RefreshParams();
    zero->ClearGrads();
  }
  return losses;
}

TEST_P(GradCommDtypeTest, LossesWithinThreePercentOfFp32Communication) {
  const int stage = GetParam();
  ExpectOk(FirstFailure(RunGang(2, [&](int rank, Collectives& coll) -> absl::Status {
    std::vector<double> fp32 = Train(coll, stage, at::kFloat);
    std::vector<double> bf16 = Train(coll, stage, at::kBFloat16);
    EXPECT_LT(fp32.back(), 0.95 * fp32.front()) << "the run trains";
    for (size_t s = 0; s < fp32.size(); ++s) {
      EXPECT_NEAR(bf16[s], fp32[s], 0.03 * fp32[s]) << "stage " << stage << " step " << s;
    }
    return absl::OkStatus();
  }, {absl::Seconds(60), absl::Seconds(240)})));
}

// communication_data_type as a job writes it: parsed by ParseDeepSpeedConfig and handed to the
// provider by ZeroOptionsFor (the Trainer's path, trainer_setup.cc), for fp32 and bf16 jobs.
ZeroOptions JobOptions(const ProcessGroups& groups, int stage, const std::string& extra) {
  absl::StatusOr<DeepSpeedConfig> ds = ParseDeepSpeedConfig(
      absl::StrCat(R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW"}, )",
                   R"("zero_optimization": {"stage": )", stage, "}", extra, "}"),
      2);
  EXPECT_TRUE(ds.ok()) << extra << ": " << ds.status();
  ZeroOptions o = ZeroOptionsFor(*ds, groups);
  o.reduce_bucket_size = 600;
  o.param_persistence_threshold = 0;
  return o;
}

bool AllFp16Values(const at::Tensor& t) {
  return at::equal(t, t.to(at::kHalf).to(at::kFloat));
}

// Bytes per micro-step: with stages 1/2 only the gradient reduce-scatters move data (Σ N*p_i
// elements, 4 or 2 bytes each); stage 3 adds all-gathers that are the same for either wire
// dtype, so there the difference is checked.
void ExpectGradientBytes(int stage, int64_t got, int64_t got_fp32, int bytes_per_element,
                         int64_t g, const std::string& what) {
  if (stage < 3) {
    EXPECT_EQ(got, bytes_per_element * g) << what;
  }
  EXPECT_EQ(got_fp32 - got, (4 - bytes_per_element) * g) << what;
}

TEST_P(GradCommDtypeTest, JobKeyBf16OrFp16OnAnFp32JobReducesIn16Bits) {
  const int stage = GetParam();
  const int64_t g = GradElements(2, testing::TinyLlamaConfig(false));
  ExpectOk(FirstFailure(RunGang(2, [&](int rank, Collectives& coll) -> absl::Status {
    absl::StatusOr<std::unique_ptr<ProcessGroups>> groups = ProcessGroups::Create(coll, 1);
    if (!groups.ok()) return groups.status();
    MicroResult fp32 = Micro(coll, JobOptions(**groups, stage, ""), 1);  // default: fp32
    MicroResult bf16 = Micro(
        coll, JobOptions(**groups, stage, R"(, "communication_data_type": "bf16")"), 1);
    MicroResult fp16 = Micro(
        coll, JobOptions(**groups, stage, R"(, "communication_data_type": "fp16")"), 1);
    const std::string what = absl::StrCat("stage ", stage, " rank ", rank);
    ExpectGradientBytes(stage, fp32.bytes, fp32.bytes, 4, g, what + " fp32");
    ExpectGradientBytes(stage, bf16.bytes, fp32.bytes, 2, g, what + " bf16");
    ExpectGradientBytes(stage, fp16.bytes, fp32.bytes, 2, g, what + " fp16");
    EXPECT_EQ(fp32.losses, bf16.losses);  // the forward is the same (fp32 params)
    bool fp32_all_bf16 = true;
    for (size_t i = 0; i < fp32.grads.size(); ++i) {
      const at::Tensor& want = fp32.grads[i];
      fp32_all_bf16 = fp32_all_bf16 && AllBf16Values(want);
      EXPECT_TRUE(AllBf16Values(bf16.grads[i])) << what << " param " << i;
      EXPECT_TRUE(AllFp16Values(fp16.grads[i])) << what << " param " << i;
      // As in Bf16HalvesGradientBytes...: 2^-8 relative plus 2^-8 of the largest element
      // (fp16: 2^-10 and 2^-10, its 11-bit significand; the tiny model's gradients are far
      // from fp16's normal range limits, and below 2^-14 fp16 is subnormal: 2^-24 absolute).
      const double max = want.abs().max().item<double>();
      EXPECT_LE(((bf16.grads[i] - want).abs() - 0.00390625 * want.abs()).max().item<double>(),
                0.00390625 * max)
          << what << " param " << i;
      EXPECT_LE(((fp16.grads[i] - want).abs() - 0.0009765625 * want.abs()).max().item<double>(),
                0.0009765625 * max + 1.2e-7)
          << what << " param " << i;
    }
    EXPECT_FALSE(fp32_all_bf16) << what << ": fp32 communication did not round to bf16";
    return absl::OkStatus();
  })));
}

TEST_P(GradCommDtypeTest, JobKeyFp32OnABf16JobReducesInFp32) {
  const int stage = GetParam();
  const int64_t g = GradElements(2, testing::TinyLlamaConfig(false));
  const std::string bf16_job = R"(, "bf16": {"enabled": true})";
  ExpectOk(FirstFailure(RunGang(2, [&](int rank, Collectives& coll) -> absl::Status {
    absl::StatusOr<std::unique_ptr<ProcessGroups>> groups = ProcessGroups::Create(coll, 1);
    if (!groups.ok()) return groups.status();
    MicroResult deflt = Micro(coll, JobOptions(**groups, stage, bf16_job), 1);  // bf16 wire
    MicroResult fp32 = Micro(
        coll, JobOptions(**groups, stage, bf16_job + R"(, "communication_data_type": "fp32")"),
        1);
    const std::string what = absl::StrCat("stage ", stage, " rank ", rank);
    ExpectGradientBytes(stage, fp32.bytes, fp32.bytes, 4, g, what + " fp32");
    ExpectGradientBytes(stage, deflt.bytes, fp32.bytes, 2, g, what + " default");
    // The same as ZeroOptions::communication_dtype kFloat set directly, bit for bit.
    MicroResult direct = Micro(coll, stage, at::kFloat, 1);
    EXPECT_EQ(fp32.grads.size(), direct.grads.size());
    if (fp32.grads.size() != direct.grads.size()) return absl::InternalError("parameter count");
    bool some_not_bf16 = false;
    for (size_t i = 0; i < fp32.grads.size(); ++i) {
      EXPECT_TRUE(at::equal(fp32.grads[i], direct.grads[i])) << what << " param " << i;
      some_not_bf16 = some_not_bf16 || !AllBf16Values(fp32.grads[i]);
    }
    EXPECT_TRUE(some_not_bf16) << what << ": the fp32 reduction was rounded to bf16";
    return absl::OkStatus();
  })));
}

INSTANTIATE_TEST_SUITE_P(Stages, GradCommDtypeTest, ::testing::Values(1, 2, 3));

TEST(GradCommDtypeOptionsTest, RefusesA16BitDtypeAtStage0) {
  std::unique_ptr<Collectives> coll = CreateLocalCollectives();
  ZeroOptions o;
  o.stage = 0;
  o.communication_dtype = at::kBFloat16;
  auto z = ZeroProvider::Create(spec::LlamaParamSpecs(testing::TinyLlamaConfig(false)), coll.get(),
                                {1, 0.02}, o);
  ASSERT_FALSE(z.ok());
  EXPECT_EQ(z.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(z.status().message().find("stage 0"), std::string::npos) << z.status();
}

TEST(GradCommDtypeOptionsTest, RefusesAnIntegerDtype) {
  std::unique_ptr<Collectives> coll = CreateLocalCollectives();
  ZeroOptions o;
  o.communication_dtype = at::kInt;
  auto z = ZeroProvider::Create(spec::LlamaParamSpecs(testing::TinyLlamaConfig(false)), coll.get(),
                                {1, 0.02}, o);
  ASSERT_FALSE(z.ok());
  EXPECT_EQ(z.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(z.status().message().find("communication_dtype"), std::string::npos);
}

}  // namespace
}  // namespace loom::engine
