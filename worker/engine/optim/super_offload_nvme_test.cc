// SuperOffload with its optimizer state on NVMe (offload_optimizer.device "nvme"): speculative
// steps held in swap buffers until validation, written back on a hit, dropped on an overflow or
// a clip (the files are the rollback copy). Checked against the synchronous ZeRO-Infinity
// pipeline on its own files (bit for bit: the same CpuAdam kernels on the same gradients) and
// against AdamW written here in double-precision LibTorch ops from the formulas (within fp32
// tolerance), which shares no code with either. Files live under TEST_TMPDIR.
#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/offload/offload_optimizer.h"
#include "worker/engine/optim/offload_pipeline.h"
#include "worker/engine/optim/super_offload_pipeline.h"

namespace loom::engine::optim {
namespace {

using ::loom::testing::IsOk;
using ::loom::testing::StatusIs;

// 1389 elements; with 250 per sub-group: {5} {300} {17 64} {1000} {3}, sizes that divide
// neither the total nor the partitions.
const std::vector<int64_t> kNumels = {5, 300, 17, 64, 1000, 3};
constexpr int64_t kSubGroup = 250;
constexpr double kLr = 1e-3, kWd = 0.01;

std::string TmpDir(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

// A rank's partitions as the trainer hands them to an NVMe pipeline: fp32 master (the model's
// parameter, written at commit) and gradient; the moments are the optimizer's files.
struct Model {
  std::vector<at::Tensor> param, grad;
};

Model MakeModel(uint64_t seed) {
  at::manual_seed(seed);
  Model m;
  for (int64_t n : kNumels) {
    m.param.push_back(at::randn({n}, at::kFloat) * 0.02);
    m.grad.push_back(at::zeros({n}, at::kFloat));
  }
  return m;
}

Model Clone(const Model& m) {
  Model c;
  for (size_t i = 0; i < m.param.size(); ++i) {
    c.param.push_back(m.param[i].clone());
    c.grad.push_back(m.grad[i].clone());
  }
  return c;
}

// Step t's gradients times `scale`, the same for every model.
void SetGrads(Model& m, int64_t t, double scale) {
  at::manual_seed(1000 + t);
  for (at::Tensor& g : m.grad) g.copy_(at::randn({g.numel()}, at::kFloat) * (1e-2 * scale));
}

PartitionSource SourceOf(Model* m) {
  return [m](size_t i) { return OptimizerPartition{m->param[i], m->grad[i], {}, {}}; };
}

std::vector<float*> Masters(Model& m) {
  std::vector<float*> out;
  for (at::Tensor& p : m.param) out.push_back(p.data_ptr<float>());
  return out;
}

std::unique_ptr<offload::OffloadOptimizer> MakeNvmeOptimizer(const std::string& dir,
                                                             int64_t buffer_count, Model& m) {
  offload::OffloadOptimizerOptions o;
  o.adam.weight_decay = kWd;
  o.adam.threads = 2;
  o.sub_group_size = kSubGroup;
  o.optimizer_nvme = true;
  o.optimizer_dir = TmpDir(dir);
  o.optimizer_buffer_count = buffer_count;
  o.pipeline_read = o.pipeline_write = true;
  absl::StatusOr<std::unique_ptr<offload::OffloadOptimizer>> opt =
      offload::OffloadOptimizer::Create(o, kNumels);
  EXPECT_TRUE(opt.ok()) << opt.status();
  for (size_t i = 0; i < kNumels.size(); ++i) {
    EXPECT_TRUE((*opt)->InitParam(i, m.param[i].data_ptr<float>()).ok());
  }
  return std::move(*opt);
}

std::unique_ptr<SuperOffloadPipeline> MakeSuper(Model* m, offload::OffloadOptimizer* nvme,
                                                double ratio, bool loss_scaled,
                                                const double* scale = nullptr) {
  SuperOffloadOptions o;
  o.optimizer.weight_decay = kWd;
  o.optimizer.decoupled_weight_decay = true;
  o.ratio = ratio;
  o.cpu_threads = 1;  // a different thread count from the optimizer's 2: same bits
  o.nvme = nvme;
  o.loss_scaled = loss_scaled;
  if (scale != nullptr) o.loss_scale = [scale] { return *scale; };
  absl::StatusOr<std::unique_ptr<SuperOffloadPipeline>> p =
      SuperOffloadPipeline::Create(o, nvme->plan(), SourceOf(m));
  EXPECT_TRUE(p.ok()) << p.status();
  return std::move(*p);
}

// master, exp_avg, exp_avg_sq of every sub-group, concatenated, as a checkpoint reads them.
std::vector<float> Export(offload::OffloadOptimizer& opt, Model& m) {
  const int64_t total = opt.plan().total_numel();
  std::vector<float> s(3 * total);
  EXPECT_TRUE(
      opt.ExportState(Masters(m), s.data(), s.data() + total, s.data() + 2 * total).ok());
  return s;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

bool ParamsBitEqual(const Model& a, const Model& b) {
  for (size_t i = 0; i < a.param.size(); ++i) {
    if (std::memcmp(a.param[i].data_ptr<float>(), b.param[i].data_ptr<float>(),
                    a.param[i].numel() * 4) != 0) {
      return false;
    }
  }
  return true;
}

// One step t: every sub-group raised in backward's order (last first), then FinishStep(v).
absl::Status RunStep(OptimizerPipeline& pipe, int64_t t, const StepValidation& v) {
  if (absl::Status s = pipe.BeginStep(t, kLr); !s.ok()) return s;
  for (int64_t k = pipe.plan().num_sub_groups() - 1; k >= 0; --k) {
    if (absl::Status s = pipe.OnSubGroupReady(k); !s.ok()) return s;
  }
  return pipe.FinishStep(v);
}

StepValidation Validation(double clip_coef, double loss_scale) {
  StepValidation v;
  v.clip_coef = clip_coef;
  const double mul = 1.0 / (clip_coef * loss_scale);
  v.grad_multiplier = mul == 1.0 ? 1.0 : mul;
  return v;
}

// AdamW in double precision from the formulas (torch.optim.AdamW), over the flat state.
struct Reference {
  std::vector<double> p, m, v;
  explicit Reference(const Model& model) {
    for (const at::Tensor& q : model.param) {
      for (int64_t j = 0; j < q.numel(); ++j) p.push_back(q.data_ptr<float>()[j]);
    }
    m.assign(p.size(), 0.0);
    v.assign(p.size(), 0.0);
  }
  void Step(const Model& grads, int64_t t, double multiplier) {
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    size_t e = 0;
    for (const at::Tensor& gt : grads.grad) {
      for (int64_t j = 0; j < gt.numel(); ++j, ++e) {
        const double g = static_cast<double>(gt.data_ptr<float>()[j]) * multiplier;
        p[e] *= 1 - kLr * kWd;
        m[e] = b1 * m[e] + (1 - b1) * g;
        v[e] = b2 * v[e] + (1 - b2) * g * g;
        p[e] -= (kLr / bc1) * m[e] / (std::sqrt(v[e]) / std::sqrt(bc2) + eps);
      }
    }
  }
  // `state`: Export()'s layout.
  void ExpectNear(const std::vector<float>& state, const std::string& what) const {
    const size_t n = p.size();
    double dp = 0, dm = 0, dv = 0;
    for (size_t e = 0; e < n; ++e) {
      dp = std::max(dp, std::abs(state[e] - p[e]) / (1e-7 + 1e-5 * std::abs(p[e])));
      dm = std::max(dm, std::abs(state[n + e] - m[e]) / (1e-9 + 1e-5 * std::abs(m[e])));
      dv = std::max(dv, std::abs(state[2 * n + e] - v[e]) / (1e-12 + 1e-5 * std::abs(v[e])));
    }
    EXPECT_LE(dp, 1.0) << what << ": params (error over atol + rtol |ref|)";
    EXPECT_LE(dm, 1.0) << what << ": exp_avg";
    EXPECT_LE(dv, 1.0) << what << ": exp_avg_sq";
  }
};

// Six steps, step 3 clipped (coefficient 2: every held sub-group dropped and replayed from the
// files). For ratio 1 and 0.5 and for buffer_count 3 (one sub-group held at a time; the rest
// step after validation) and 15 (all five held): after every step the model's parameters and
// the files equal synchronous ZeRO-Infinity's bit for bit, no swap buffer is left held, and at
// the end the state matches the double-precision AdamW.
TEST(SuperOffloadNvmeTest, HeldStepsEqualSynchronousNvmeOffloadWithClipReplay) {
  for (double ratio : {1.0, 0.5}) {
    for (int64_t buffers : {3, 15}) {
      const std::string what = "ratio " + std::to_string(ratio) + " buffer_count " +
                                std::to_string(buffers);
      const std::string tag = std::to_string(static_cast<int>(ratio * 10)) + "_" +
                              std::to_string(buffers);
      const Model init = MakeModel(7);
      Model sm = Clone(init), om = Clone(init), gm = Clone(init);
      auto sopt = MakeNvmeOptimizer("super_" + tag, buffers, sm);
      auto oopt = MakeNvmeOptimizer("sync_" + tag, buffers, om);
      auto super = MakeSuper(&sm, sopt.get(), ratio, /*loss_scaled=*/false);
      auto sync = MakeOffloadPipeline(oopt.get(), SourceOf(&om));
      ASSERT_EQ(super->plan().num_sub_groups(), 5);
      const int64_t cpu = 5 - super->first_cpu_sub_group();
      const int64_t held = std::min<int64_t>(cpu, buffers / 3);
      Reference ref(init);
      for (int64_t t = 1; t <= 6; ++t) {
        const StepValidation v = Validation(t == 3 ? 2.0 : 1.0, 1.0);
        SetGrads(sm, t, 1.0);
        SetGrads(om, t, 1.0);
        SetGrads(gm, t, 1.0);
        ASSERT_THAT(RunStep(*super, t, v), IsOk()) << what;
        ASSERT_THAT(RunStep(*sync, t, v), IsOk()) << what;
        ref.Step(gm, t, v.grad_multiplier);
        EXPECT_TRUE(ParamsBitEqual(sm, om)) << what << ": params after step " << t;
        EXPECT_TRUE(BitEqual(Export(*sopt, sm), Export(*oopt, om)))
            << what << ": files after step " << t;
        EXPECT_EQ(sopt->holdable_groups(), buffers / 3) << what << ": buffers left held";
      }
      ref.ExpectNear(Export(*sopt, sm), what);
      const SuperOffloadStats st = super->stats();
      EXPECT_EQ(st.speculated, 6 * held) << what;
      EXPECT_EQ(st.hits, 5 * held) << what;
      EXPECT_EQ(st.rollbacks_clip, held) << what;
      EXPECT_EQ(st.replays, held) << what;
      EXPECT_EQ(st.not_speculated_no_buffer, 6 * (cpu - held)) << what;
      EXPECT_EQ(super->copy_bytes(), 0) << what << ": no snapshot with the state on NVMe";
    }
  }
}

// fp16: an inf in sub-group 3 (raised second) overflows the step. The sub-groups held before and
// after it are dropped unwritten: the files and the model's parameters are bit for bit as
// before the step, and every buffer is free again. The step taken again at the halved scale
// equals a synchronous run that never saw the overflowed one.
TEST(SuperOffloadNvmeTest, OverflowDropsTheHeldStepsAndLeavesTheFilesBitForBit) {
  const Model init = MakeModel(11);
  Model sm = Clone(init), om = Clone(init);
  auto sopt = MakeNvmeOptimizer("overflow_super", 15, sm);
  auto oopt = MakeNvmeOptimizer("overflow_sync", 15, om);
  double scale = 1024;
  auto super = MakeSuper(&sm, sopt.get(), 1.0, /*loss_scaled=*/true, &scale);
  auto sync = MakeOffloadPipeline(oopt.get(), SourceOf(&om));
  for (int64_t t : {1, 2}) {
    SetGrads(sm, t, scale);
    SetGrads(om, t, scale);
    ASSERT_THAT(RunStep(*super, t, Validation(1.0, scale)), IsOk());
    ASSERT_THAT(RunStep(*sync, t, Validation(1.0, scale)), IsOk());
  }
  ASSERT_TRUE(ParamsBitEqual(sm, om));
  const std::vector<float> before = Export(*sopt, sm);
  const Model params_before = Clone(sm);
  SetGrads(sm, 3, scale);
  sm.grad[4][10].fill_(std::numeric_limits<float>::infinity());  // parameter 4: sub-group 3
  StepValidation overflow;
  overflow.overflow = true;
  ASSERT_THAT(RunStep(*super, 3, overflow), IsOk());
  EXPECT_TRUE(ParamsBitEqual(sm, params_before));
  EXPECT_TRUE(BitEqual(Export(*sopt, sm), before));
  EXPECT_EQ(sopt->holdable_groups(), 5);
  SuperOffloadStats st = super->stats();
  EXPECT_EQ(st.not_speculated_nonfinite, 1);
  EXPECT_EQ(st.rollbacks_overflow, 4);
  EXPECT_EQ(st.hits, 10);
  scale = 512;  // the caller's loss scaler halved it
  SetGrads(sm, 3, scale);
  SetGrads(om, 3, scale);
  ASSERT_THAT(RunStep(*super, 3, Validation(1.0, scale)), IsOk());
  ASSERT_THAT(RunStep(*sync, 3, Validation(1.0, scale)), IsOk());
  EXPECT_TRUE(ParamsBitEqual(sm, om));
  EXPECT_TRUE(BitEqual(Export(*sopt, sm), Export(*oopt, om)));
}

// A corrupt record read by the speculation thread fails the step with DATA_LOSS naming the file;
// nothing stays held.
TEST(SuperOffloadNvmeTest, CorruptRecordFailsTheStepNamingTheFile) {
  Model m = MakeModel(5);
  auto opt = MakeNvmeOptimizer("corrupt", 15, m);
  auto super = MakeSuper(&m, opt.get(), 1.0, false);
  SetGrads(m, 1, 1.0);
  ASSERT_THAT(RunStep(*super, 1, Validation(1.0, 1.0)), IsOk());
  const std::string path = TmpDir("corrupt") + "/exp_avg.swp";
  std::FILE* f = std::fopen(path.c_str(), "r+b");
  ASSERT_NE(f, nullptr) << path;
  const std::vector<char> junk(64, 0x5a);
  ASSERT_EQ(std::fwrite(junk.data(), 1, junk.size(), f), junk.size());  // record 0
  std::fclose(f);
  SetGrads(m, 2, 1.0);
  absl::Status s = RunStep(*super, 2, Validation(1.0, 1.0));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("exp_avg.swp"));
  EXPECT_EQ(opt->holdable_groups(), 5);
}

TEST(SuperOffloadNvmeTest, CreateRefusesAnOptimizerWithoutNvmeState) {
  offload::OffloadOptimizerOptions o;
  o.sub_group_size = kSubGroup;
  absl::StatusOr<std::unique_ptr<offload::OffloadOptimizer>> opt =
      offload::OffloadOptimizer::Create(o, kNumels);
  ASSERT_TRUE(opt.ok());
  Model m = MakeModel(1);
  SuperOffloadOptions so;
  so.nvme = opt->get();
  EXPECT_THAT(SuperOffloadPipeline::Create(so, (*opt)->plan(), SourceOf(&m)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace loom::engine::optim
