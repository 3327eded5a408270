// The four placements of OffloadOptimizer (optimizer cpu/nvme x params memory/nvme), with and
// without read/write pipelining, give bit-identical parameters and optimizer state; checkpoint
// export/import round-trips between placements; bad buffer settings are refused by name.
#include "worker/engine/offload/offload_optimizer.h"

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace loom::engine::offload {
namespace {

const std::vector<int64_t> kNumels = {1000, 17, 4096, 33333, 5, 70000, 64};

std::string TmpDir(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

struct Mode {
  std::string name;
  bool opt_nvme, params_nvme, pipeline;
};

OffloadOptimizerOptions OptionsFor(const Mode& m) {
  OffloadOptimizerOptions o;
  o.adam.weight_decay = 0.1;
  o.adam.threads = 2;
  o.sub_group_size = 40000;  // groups: {0..3}, {4, 5}, {6}
  o.optimizer_nvme = m.opt_nvme;
  o.optimizer_dir = TmpDir(m.name + "/opt");
  o.optimizer_buffer_count = m.pipeline ? 9 : 3;
  o.pipeline_read = o.pipeline_write = m.pipeline;
  o.params_nvme = m.params_nvme;
  o.param_dir = TmpDir(m.name + "/param");
  o.param_buffer_count = 2;
  o.param_buffer_elements = 70000;
  return o;
}

// A model's partitions (used when params are in memory) and what the run produced.
struct Result {
  std::vector<std::vector<float>> params;  // final parameter partitions
  std::vector<float> master, m, v;         // exported state
};

std::vector<std::vector<float>> Initial() {
  std::mt19937 gen(11);
  std::normal_distribution<float> d(0.f, 0.02f);
  std::vector<std::vector<float>> p;
  for (int64_t n : kNumels) {
    p.emplace_back(n);
    for (float& x : p.back()) x = d(gen);
  }
  return p;
}

std::vector<std::vector<float>> Grads(int64_t step) {
  std::mt19937 gen(static_cast<uint32_t>(100 + step));
  std::normal_distribution<float> d(0.f, 0.01f);
  std::vector<std::vector<float>> g;
  for (int64_t n : kNumels) {
    g.emplace_back(n);
    for (float& x : g.back()) x = d(gen);
  }
  return g;
}

void Train(OffloadOptimizer& opt, std::vector<std::vector<float>>& model, int64_t from,
           int64_t to) {
  for (int64_t t = from; t <= to; ++t) {
    std::vector<std::vector<float>> g = Grads(t);
    std::vector<float*> params;
    std::vector<const float*> grads;
    for (size_t i = 0; i < kNumels.size(); ++i) {
      params.push_back(opt.params_nvme() ? nullptr : model[i].data());
      grads.push_back(i == 1 ? nullptr : g[i].data());  // parameter 1 never gets a gradient
    }
    ASSERT_TRUE(opt.Step(t, 1e-2, params, grads).ok());
  }
}

Result Finish(OffloadOptimizer& opt, std::vector<std::vector<float>>& model) {
  Result r;
  int64_t total = 0;
  std::vector<float*> params;
  for (size_t i = 0; i < kNumels.size(); ++i) {
    total += kNumels[i];
    params.push_back(opt.params_nvme() ? nullptr : model[i].data());
    if (opt.params_nvme()) {
      model[i].assign(kNumels[i], -1.f);
      EXPECT_TRUE(opt.FetchParam(i, model[i].data()).ok());
    }
  }
  r.params = model;
  r.master.resize(total);
  r.m.resize(total);
  r.v.resize(total);
  EXPECT_TRUE(opt.ExportState(params, r.master.data(), r.m.data(), r.v.data()).ok());
  return r;
}

std::unique_ptr<OffloadOptimizer> Make(const Mode& mode,
                                       const std::vector<std::vector<float>>& init) {
  auto opt = OffloadOptimizer::Create(OptionsFor(mode), kNumels);
  EXPECT_TRUE(opt.ok()) << opt.status();
  if (!opt.ok()) return nullptr;
  EXPECT_EQ((*opt)->num_sub_groups(), 3);
  for (size_t i = 0; i < init.size(); ++i) EXPECT_TRUE((*opt)->InitParam(i, init[i].data()).ok());
  return std::move(*opt);
}

void ExpectBitEqual(const Result& a, const Result& b, const std::string& what) {
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(a.params[i].data(), b.params[i].data(), a.params[i].size() * 4))
        << what << " param " << i;
  }
  EXPECT_EQ(a.master, b.master) << what;
  EXPECT_EQ(a.m, b.m) << what;
  EXPECT_EQ(a.v, b.v) << what;
}

const Mode kModes[] = {
    {"cpu", false, false, false},
    {"cpu_param_nvme", false, true, false},
    {"nvme", true, false, false},
    {"nvme_pipelined", true, false, true},
    {"nvme_param_nvme", true, true, true},
};

TEST(OffloadOptimizerTest, AllPlacementsAreBitIdentical) {
  std::vector<Result> runs;
  for (const Mode& mode : kModes) {
    std::vector<std::vector<float>> model = Initial();
    auto opt = Make(mode, model);
    ASSERT_NE(opt, nullptr);
    Train(*opt, model, 1, 4);
    runs.push_back(Finish(*opt, model));
    if (mode.opt_nvme) {
      EXPECT_GT(opt->nvme_bytes_read(), 4 * 3 * 108515);
      EXPECT_GT(opt->nvme_bytes_written(), 4 * 3 * 108515);
    }
  }
  // The reference: CpuAdam over each partition directly.
  std::vector<std::vector<float>> want = Initial();
  CpuAdam adam(OptionsFor(kModes[0]).adam);
  std::vector<std::vector<float>> m, v;
  for (int64_t n : kNumels) {
    m.emplace_back(n, 0.f);
    v.emplace_back(n, 0.f);
  }
  for (int64_t t = 1; t <= 4; ++t) {
    std::vector<std::vector<float>> g = Grads(t);
    for (size_t i = 0; i < kNumels.size(); ++i) {
      adam.Step(t, 1e-2, want[i].data(), i == 1 ? nullptr : g[i].data(), m[i].data(),
                v[i].data(), kNumels[i]);
    }
  }
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(runs[0].params[i], want[i]) << i;
  EXPECT_NE(runs[0].params[1], Initial()[1]);  // weight decay moved the gradient-less one
  for (size_t k = 1; k < runs.size(); ++k) ExpectBitEqual(runs[0], runs[k], kModes[k].name);
}

TEST(OffloadOptimizerTest, ExportImportAcrossPlacementsContinuesBitExactly) {
  // Uninterrupted: 4 steps on cpu. Interrupted: 2 steps on nvme, export, import into a fresh
  // nvme+param-nvme optimizer, 2 more steps.
  std::vector<std::vector<float>> a_model = Initial();
  auto a = Make({"ei_a", false, false, false}, a_model);
  Train(*a, a_model, 1, 4);
  Result want = Finish(*a, a_model);

  std::vector<std::vector<float>> b_model = Initial();
  auto b = Make({"ei_b", true, false, true}, b_model);
  Train(*b, b_model, 1, 2);
  Result mid = Finish(*b, b_model);
  std::vector<std::vector<float>> c_model(kNumels.size());
  auto c = OffloadOptimizer::Create(OptionsFor({"ei_c", true, true, true}), kNumels);
  ASSERT_TRUE(c.ok());
  std::vector<float*> none(kNumels.size(), nullptr);
  ASSERT_TRUE((*c)->ImportState(none, mid.master.data(), mid.m.data(), mid.v.data()).ok());
  Train(**c, c_model, 3, 4);
  ExpectBitEqual(want, Finish(**c, c_model), "resumed");
}

TEST(OffloadOptimizerTest, InitialValuesInAnyOrderReachTheFiles) {
  const std::vector<std::vector<float>> init = Initial();
  std::vector<Result> runs;
  for (bool reverse : {false, true}) {
    auto opt = OffloadOptimizer::Create(
        OptionsFor({reverse ? "order_rev" : "order_fwd", true, true, false}), kNumels);
    ASSERT_TRUE(opt.ok()) << opt.status();
    for (size_t k = 0; k < init.size(); ++k) {
      const size_t i = reverse ? init.size() - 1 - k : k;
      ASSERT_TRUE((*opt)->InitParam(i, init[i].data()).ok());
    }
    std::vector<std::vector<float>> model(kNumels.size());
    runs.push_back(Finish(**opt, model));
  }
  EXPECT_EQ(runs[0].params, init);
  ExpectBitEqual(runs[0], runs[1], "reverse init order");
  std::vector<float> flat;
  for (const auto& v : init) flat.insert(flat.end(), v.begin(), v.end());
  EXPECT_EQ(runs[1].master, flat);
}

TEST(OffloadOptimizerTest, BadBufferSettingsAreRefusedByName) {
  OffloadOptimizerOptions o = OptionsFor({"bad", true, false, false});
  o.optimizer_buffer_count = 2;
  auto a = OffloadOptimizer::Create(o, kNumels);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("offload_optimizer.buffer_count"), std::string::npos);
  o = OptionsFor({"bad", false, true, false});
  o.param_buffer_elements = 1000;
  auto b = OffloadOptimizer::Create(o, kNumels);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("offload_param.buffer_size"), std::string::npos);
}

}  // namespace
}  // namespace loom::engine::offload
