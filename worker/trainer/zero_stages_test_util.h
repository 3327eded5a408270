// Shared by zero_stages_test.cc and zero_stages_rows_test.cc (ZeRO stages 0-3 with real
// loom-trainer processes): the tiny model's parameter counts, the spec and knob sets, and checks
// on a gang's events and checkpoints. Test-only; not thread-safe.
#ifndef LOOM_WORKER_TRAINER_ZERO_STAGES_TEST_UTIL_H_
#define LOOM_WORKER_TRAINER_ZERO_STAGES_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/trainer/gang_test_util.h"

namespace loom::trainer_test {

inline constexpr int kSteps = 6;
inline constexpr int kGlobalMicro = 4;  // samples per micro-step over all ranks (GAS 2 on top)
inline constexpr double kLossRtol = 1e-5;
inline constexpr double kParamAtol = 2e-5;
inline constexpr double kParamRtol = 1e-4;

inline std::string Dir(const std::string& name) { return TmpDir() + "/ckpt_" + name; }

// Element counts of the tiny model's parameters in checkpoint order (gang_test_util's spec).
inline std::vector<int64_t> ParamNumels() {
  std::vector<int64_t> n = {256 * 64};
  for (int l = 0; l < 2; ++l) {
    for (int64_t v : {64, 64 * 64, 32 * 64, 32 * 64, 64 * 64, 64, 160 * 64, 160 * 64, 64 * 160}) {
      n.push_back(v);
    }
  }
  n.push_back(64);
  n.push_back(256 * 64);
  return n;
}
inline int64_t Psi() {
  int64_t s = 0;
  for (int64_t v : ParamNumels()) s += v;
  return s;
}
// Σ ceil(n_i / N): elements of one rank's partitions.
inline int64_t PartitionElems(int world) {
  int64_t s = 0;
  for (int64_t v : ParamNumels()) s += (v + world - 1) / world;
  return s;
}

// The base spec with this zero_optimization section, extra top-level deepspeed keys and a
// checkpoint interval.
inline std::string Spec(const std::string& name, int world, int steps, const json& zero,
                 const json& top = json::object(), int checkpoint_interval = 3) {
  const std::string path = WriteSpec(name, kGlobalMicro / world, steps);
  json spec = json::parse(*ReadText(path));
  spec["deepspeed_config"]["zero_optimization"] = zero;
  for (auto it = top.begin(); it != top.end(); ++it) spec["deepspeed_config"][it.key()] = *it;
  spec["checkpoint"]["interval_steps"] = std::to_string(checkpoint_interval);
  std::ofstream(path) << spec.dump(2);
  return path;
}

// Knob sets, alternated between runs: results must not depend on them (§1.11 #4).
inline json Knobs(int stage, int variant) {
  if (variant == 0) return {{"stage", stage}};  // DeepSpeed defaults: one bucket, etc.
  return {{"stage", stage},
          {"reduce_bucket_size", 20000},
          {"allgather_bucket_size", 30000},
          {"overlap_comm", stage != 3},
          {"contiguous_gradients", false},
          {"sub_group_size", 30000},
          {"stage3_prefetch_bucket_size", 20000},
          {"stage3_param_persistence_threshold", 100},
          {"stage3_max_live_parameters", 60000},
          {"stage3_max_reuse_distance", 10000}};
}

inline void ExpectSuccess(const GangResult& r, const std::string& name) {
  ASSERT_FALSE(r.timed_out) << name;
  for (size_t rank = 0; rank < r.exit_codes.size(); ++rank) {
    EXPECT_EQ(r.exit_codes[rank], 0)
        << name << " rank " << rank << " (see " << name << ".rank" << rank << ".stderr)";
    EXPECT_EQ(r.Of(rank, "done").size(), 1u) << name << " rank " << rank;
  }
}

inline std::vector<double> Field(const GangResult& r, int rank, const std::string& event,
                          const std::string& field) {
  std::vector<double> out;
  for (const json& e : r.Of(rank, event)) out.push_back(e[field].get<double>());
  return out;
}

inline int64_t MaxField(const GangResult& r, int rank, const std::string& field) {
  int64_t m = 0;
  for (const json& e : r.Of(rank, "step")) m = std::max(m, e[field].get<int64_t>());
  return m;
}

inline void ExpectSameCollectives(const GangResult& r, const std::string& name) {
  for (size_t rank = 1; rank < r.events.size(); ++rank) {
    std::vector<json> a = r.Of(0, "done"), b = r.Of(rank, "done");
    ASSERT_EQ(a.size(), 1u) << name;
    ASSERT_EQ(b.size(), 1u) << name;
    EXPECT_EQ(a[0]["collective_count"], b[0]["collective_count"]) << name << " rank " << rank;
    EXPECT_EQ(a[0]["collective_hash"], b[0]["collective_hash"]) << name << " rank " << rank;
  }
}

// max |a-b| over all parameters; fails when beyond atol + rtol |a|.
inline double CompareParams(const std::map<std::string, std::vector<float>>& a,
                     const std::map<std::string, std::vector<float>>& b, const std::string& what) {
  EXPECT_EQ(a.size(), ParamNumels().size()) << what;
  EXPECT_EQ(b.size(), a.size()) << what;
  double max_diff = 0;
  for (const auto& [name, va] : a) {
    auto it = b.find(name);
    if (it == b.end()) {
      ADD_FAILURE() << what << ": " << name << " missing";
      continue;
    }
    const std::vector<float>& vb = it->second;
    EXPECT_EQ(va.size(), vb.size()) << what << " " << name;
    double worst = -1;
    for (size_t i = 0; i < va.size() && i < vb.size(); ++i) {
      const double d = std::abs(double(va[i]) - vb[i]);
      max_diff = std::max(max_diff, d);
      worst = std::max(worst, d - kParamRtol * std::abs(double(va[i])));
    }
    EXPECT_LE(worst, kParamAtol) << what << " " << name;
  }
  return max_diff;
}

inline std::string RunName(const std::string& prefix, int stage, int world) {
  return absl::StrCat(prefix, "_s", stage, "_w", world);
}

}  // namespace loom::trainer_test

#endif  // LOOM_WORKER_TRAINER_ZERO_STAGES_TEST_UTIL_H_
