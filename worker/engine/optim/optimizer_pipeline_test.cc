// The optimizer pipeline: its protocol errors, commit bit-identical to the calls the Trainer
// made before the pipeline existed (one ApplyOptimizerStep over every partition; one
// OffloadOptimizer::Step with pre-multiplied gradients), and rollback leaving every tensor
// untouched.
#include <ATen/ATen.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/optim/in_memory_adam.h"
#include "worker/engine/optim/offload_pipeline.h"
#include "worker/engine/optim/step_validation.h"

namespace loom::engine::optim {
namespace {

using ::loom::testing::StatusIs;

const std::vector<int64_t> kNumels = {5, 300, 17, 64, 1000, 3};

struct Model {
  std::vector<OptimizerPartition> parts;
};

Model MakeModel(uint64_t seed, bool moments = true) {
  at::manual_seed(seed);
  Model m;
  for (size_t i = 0; i < kNumels.size(); ++i) {
    OptimizerPartition p;
    p.param = at::randn({kNumels[i]}, at::kFloat) * 0.02;
    if (i != 2) p.grad = at::randn({kNumels[i]}, at::kFloat) * 1e-2;  // 2: no gradient
    if (moments) {
      p.exp_avg = at::zeros({kNumels[i]}, at::kFloat);
      p.exp_avg_sq = at::zeros({kNumels[i]}, at::kFloat);
    }
    m.parts.push_back(p);
  }
  return m;
}

Model Clone(const Model& m) {
  Model c;
  for (const OptimizerPartition& p : m.parts) {
    auto cl = [](const at::Tensor& t) { return t.defined() ? t.clone() : t; };
    c.parts.push_back({cl(p.param), cl(p.grad), cl(p.exp_avg), cl(p.exp_avg_sq)});
  }
  return c;
}

bool BitEqual(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.numel() == b.numel() &&
         std::memcmp(a.data_ptr<float>(), b.data_ptr<float>(), a.numel() * 4) == 0;
}

void ExpectModelEq(const Model& a, const Model& b) {
  for (size_t i = 0; i < a.parts.size(); ++i) {
    EXPECT_TRUE(BitEqual(a.parts[i].param, b.parts[i].param)) << "param " << i;
    EXPECT_TRUE(BitEqual(a.parts[i].grad, b.parts[i].grad)) << "grad " << i;
    EXPECT_TRUE(BitEqual(a.parts[i].exp_avg, b.parts[i].exp_avg)) << "exp_avg " << i;
    EXPECT_TRUE(BitEqual(a.parts[i].exp_avg_sq, b.parts[i].exp_avg_sq)) << "exp_avg_sq " << i;
  }
}

SubGroupPlan Plan(int64_t sub_group_size) {
  absl::StatusOr<SubGroupPlan> p = SubGroupPlan::Create(kNumels, sub_group_size);
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

PartitionSource SourceOf(Model* m) {
  return [m](size_t i) { return m->parts[i]; };
}

// Raises every parameter through the plan, in order, as the Trainer does today.
absl::Status RaiseAll(OptimizerPipeline& pipe) {
  SubGroupPlan plan = pipe.plan();
  plan.ResetReadiness();
  for (size_t i = 0; i < plan.num_params(); ++i) {
    absl::StatusOr<int64_t> k = plan.MarkParamReady(i);
    if (!k.ok()) return k.status();
    if (*k >= 0) {
      if (absl::Status s = pipe.OnSubGroupReady(*k); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

spec::OptimizerConfig AdamW() {
  spec::OptimizerConfig oc;
  oc.weight_decay = 0.1;
  oc.decoupled_weight_decay = true;
  return oc;
}

TEST(OptimizerPipelineTest, ProtocolErrorsNameTheCall) {
  Model m = MakeModel(1);
  const Model before = Clone(m);
  std::unique_ptr<OptimizerPipeline> pipe =
      MakeInMemoryAdamPipeline(AdamW(), Plan(320), SourceOf(&m));
  ASSERT_EQ(pipe->plan().num_sub_groups(), 4);  // {5, 300} {17, 64} {1000} {3}
  EXPECT_THAT(pipe->FinishStep({}), StatusIs(absl::StatusCode::kFailedPrecondition,
                                             "FinishStep without BeginStep"));
  EXPECT_THAT(pipe->OnSubGroupReady(0),
              StatusIs(absl::StatusCode::kFailedPrecondition, "outside a step"));
  EXPECT_THAT(pipe->BeginStep(0, 1e-3), StatusIs(absl::StatusCode::kInvalidArgument, "1-based"));
  ASSERT_TRUE(pipe->BeginStep(1, 1e-3).ok());
  EXPECT_THAT(pipe->BeginStep(1, 1e-3),
              StatusIs(absl::StatusCode::kFailedPrecondition, "still open"));
  EXPECT_THAT(pipe->OnSubGroupReady(4), StatusIs(absl::StatusCode::kOutOfRange, "sub-group 4"));
  ASSERT_TRUE(pipe->OnSubGroupReady(0).ok());
  EXPECT_THAT(pipe->OnSubGroupReady(0),
              StatusIs(absl::StatusCode::kFailedPrecondition, "raised twice"));
  ASSERT_TRUE(pipe->OnSubGroupReady(3).ok());
  ASSERT_TRUE(pipe->OnSubGroupReady(2).ok());
  // Sub-group 1 never became ready: no update is applied and the step is closed.
  EXPECT_THAT(pipe->FinishStep({}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "sub-group 1 (parameters 2..3)"));
  EXPECT_FALSE(pipe->step_open());
  ExpectModelEq(m, before);
}

TEST(OptimizerPipelineTest, InMemoryCommitEqualsOneApplyOptimizerStep) {
  for (int64_t sub_group_size : {int64_t{1000000000}, int64_t{320}, int64_t{1}}) {
    Model m = MakeModel(2), ref = Clone(m);
    std::unique_ptr<OptimizerPipeline> pipe =
        MakeInMemoryAdamPipeline(AdamW(), Plan(sub_group_size), SourceOf(&m));
    for (int64_t t = 1; t <= 3; ++t) {
      const double lr = 1e-3 * t, mult = t == 2 ? 1.0 : 0.25;
      ASSERT_TRUE(pipe->BeginStep(t, lr).ok());
      ASSERT_TRUE(RaiseAll(*pipe).ok());
      StepValidation v;
      v.grad_multiplier = mult;
      ASSERT_TRUE(pipe->FinishStep(v).ok());
      OptimizerStepArgs args;
      args.step = t;
      args.lr = lr;
      args.grad_multiplier = mult;
      ApplyOptimizerStep(AdamW(), args, ref.parts);  // the Trainer's call before the pipeline
    }
    ExpectModelEq(m, ref);
    EXPECT_FALSE(BitEqual(m.parts[0].param, MakeModel(2).parts[0].param));  // it did move
  }
}

TEST(OptimizerPipelineTest, InMemoryRollbackLeavesEverythingAndNextStepRepeatsTheCount) {
  Model m = MakeModel(3), ref = Clone(m);
  std::unique_ptr<OptimizerPipeline> pipe =
      MakeInMemoryAdamPipeline(AdamW(), Plan(320), SourceOf(&m));
  ASSERT_TRUE(pipe->BeginStep(1, 1e-3).ok());
  ASSERT_TRUE(RaiseAll(*pipe).ok());
  StepValidation overflow;
  overflow.overflow = true;
  overflow.grad_multiplier = 0.5;  // must not be applied
  ASSERT_TRUE(pipe->FinishStep(overflow).ok());
  ExpectModelEq(m, ref);
  // A rollback is allowed before every sub-group is ready (overflow found early).
  ASSERT_TRUE(pipe->BeginStep(1, 1e-3).ok());
  ASSERT_TRUE(pipe->FinishStep(overflow).ok());
  ExpectModelEq(m, ref);
  ASSERT_TRUE(pipe->BeginStep(1, 1e-3).ok());
  ASSERT_TRUE(RaiseAll(*pipe).ok());
  ASSERT_TRUE(pipe->FinishStep({}).ok());
  OptimizerStepArgs args;
  args.lr = 1e-3;
  ApplyOptimizerStep(AdamW(), args, ref.parts);
  ExpectModelEq(m, ref);
}

std::string TmpDir(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

std::unique_ptr<offload::OffloadOptimizer> MakeOffload(bool nvme, const std::string& name,
                                                       Model& init) {
  offload::OffloadOptimizerOptions o;
  o.adam.weight_decay = 0.1;
  o.adam.threads = 2;
  o.sub_group_size = 320;
  o.optimizer_nvme = nvme;
  o.optimizer_dir = TmpDir(name);
  o.optimizer_buffer_count = 6;
  o.pipeline_read = o.pipeline_write = true;
  absl::StatusOr<std::unique_ptr<offload::OffloadOptimizer>> opt =
      offload::OffloadOptimizer::Create(o, kNumels);
  EXPECT_TRUE(opt.ok()) << opt.status();
  for (size_t i = 0; i < kNumels.size(); ++i) {
    EXPECT_TRUE((*opt)->InitParam(i, init.parts[i].param.data_ptr<float>()).ok());
  }
  return std::move(*opt);
}

// master, exp_avg, exp_avg_sq as three flat vectors.
std::vector<std::vector<float>> Export(offload::OffloadOptimizer& opt, Model& m) {
  std::vector<float*> masters;
  for (OptimizerPartition& p : m.parts) masters.push_back(p.param.data_ptr<float>());
  int64_t total = 0;
  for (int64_t n : kNumels) total += n;
  std::vector<std::vector<float>> out(3, std::vector<float>(total));
  EXPECT_TRUE(opt.ExportState(masters, out[0].data(), out[1].data(), out[2].data()).ok());
  return out;
}

TEST(OptimizerPipelineTest, OffloadCommitEqualsDirectStepAndRollbackKeepsState) {
  for (bool nvme : {false, true}) {
    SCOPED_TRACE(nvme ? "nvme" : "cpu");
    Model m = MakeModel(4, /*moments=*/false), ref = Clone(m);
    const std::string tag = nvme ? "nvme" : "cpu";
    std::unique_ptr<offload::OffloadOptimizer> opt = MakeOffload(nvme, tag + "_pipe", m);
    std::unique_ptr<offload::OffloadOptimizer> ref_opt = MakeOffload(nvme, tag + "_ref", ref);
    std::unique_ptr<OptimizerPipeline> pipe = MakeOffloadPipeline(opt.get(), SourceOf(&m));
    EXPECT_EQ(pipe->plan().num_sub_groups(), opt->num_sub_groups());
    EXPECT_EQ(pipe->name(), "offload " + tag);
    int64_t t = 0;
    for (int s = 0; s < 4; ++s) {
      const double lr = 1e-3 * (s + 1), mult = s == 1 ? 1.0 : 0.5;
      ASSERT_TRUE(pipe->BeginStep(t + 1, lr).ok());
      ASSERT_TRUE(RaiseAll(*pipe).ok());
      StepValidation v;
      v.overflow = s == 2;  // the third step overflows: skipped, the count does not advance
      v.grad_multiplier = mult;
      const std::vector<std::vector<float>> before = Export(*opt, m);
      ASSERT_TRUE(pipe->FinishStep(v).ok());
      if (v.overflow) {
        EXPECT_EQ(Export(*opt, m), before);
        continue;
      }
      ++t;
      // The Trainer's offload path before the pipeline: multiply, then one Step.
      std::vector<const float*> grads;
      std::vector<float*> masters;
      for (OptimizerPartition& p : ref.parts) {
        if (p.grad.defined() && mult != 1.0) p.grad.mul_(mult);
        grads.push_back(p.grad.defined() ? p.grad.data_ptr<float>() : nullptr);
        masters.push_back(p.param.data_ptr<float>());
      }
      ASSERT_TRUE(ref_opt->Step(t, lr, masters, grads).ok());
    }
    ExpectModelEq(m, ref);
    EXPECT_EQ(Export(*opt, m), Export(*ref_opt, ref));
  }
}

// ValidateStep on one rank (local collectives), against DeepSpeed's formulas evaluated here.
TEST(StepValidationTest, NormClipAndFusedMultiplier) {
  std::unique_ptr<Collectives> coll = CreateLocalCollectives();
  ValidationInputs in;
  in.loss_scale = 1.0;
  int nonfinite_calls = 0;
  auto nonfinite = [&] {
    ++nonfinite_calls;
    return false;
  };
  // bf16/fp32, no clipping: norm of the gradients, multiplier exactly 1 (no multiply).
  absl::StatusOr<StepValidation> v = ValidateStep(*coll, in, nonfinite, [] { return 25.0; });
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->overflow);
  EXPECT_EQ(v->grad_norm, 5.0);
  EXPECT_EQ(v->clip_coef, 1.0);
  EXPECT_EQ(v->grad_multiplier, 1.0);
  EXPECT_EQ(nonfinite_calls, 0);  // no overflow check without fp16
  // fp16 scale 1024, clipping 1.0: norm 5120 scaled = 5 unscaled -> clip (5 + 1e-6) / 1.
  in.check_overflow = true;
  in.loss_scale = 1024;
  in.gradient_clipping = 1.0;
  v = ValidateStep(*coll, in, nonfinite, [] { return 5120.0 * 5120.0; });
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(nonfinite_calls, 1);
  EXPECT_EQ(v->grad_norm, 5.0);
  EXPECT_EQ(v->clip_coef, (5.0 + 1e-6) / 1.0);
  EXPECT_EQ(v->grad_multiplier, 1.0 / ((5.0 + 1e-6) * 1024));
  // Below the clip threshold: only unscaling.
  in.gradient_clipping = 10.0;
  v = ValidateStep(*coll, in, nonfinite, [] { return 5120.0 * 5120.0; });
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->clip_coef, 1.0);
  EXPECT_EQ(v->grad_multiplier, 1.0 / 1024);
}

TEST(StepValidationTest, OverflowSkipsTheNorm) {
  std::unique_ptr<Collectives> coll = CreateLocalCollectives();
  ValidationInputs in;
  in.check_overflow = true;
  in.loss_scale = 65536;
  bool norm_called = false;
  absl::StatusOr<StepValidation> v = ValidateStep(
      *coll, in, [] { return true; },
      [&] {
        norm_called = true;
        return 1.0;
      });
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->overflow);
  EXPECT_EQ(v->grad_norm, 0.0);
  EXPECT_FALSE(norm_called);
}

}  // namespace
}  // namespace loom::engine::optim
