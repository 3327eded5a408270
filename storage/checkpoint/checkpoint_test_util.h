// Test helpers for the checkpoint library's tests (consolidate_test, checkpoint_retention_test):
// a small model of bit-pattern-rich parameters and a writer of ZeRO-3 checkpoint shards laid out
// exactly as the trainer writes them (shard_format.h). Test-only; gtest assertions inside.
#ifndef LOOM_STORAGE_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
#define LOOM_STORAGE_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/file_util.h"
#include "storage/checkpoint/shard_format.h"

namespace loom::storage::checkpoint_test {

struct FullParam {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;  // numel = product(shape)
};

inline std::string TmpDir(absl::string_view name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(base != nullptr ? base : "/tmp", "/", name);
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

// Distinct, bit-pattern-rich values: negative zero, a denormal, a NaN with payload, infinities.
inline std::vector<float> Values(int64_t n, float seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = seed + 0.37f * static_cast<float>(i) - 3.0f;
  if (n > 1) v[1] = -0.0f;
  if (n > 2) v[2] = std::numeric_limits<float>::denorm_min();
  if (n > 3) {
    uint32_t bits = 0x7fc01234u;
    std::memcpy(&v[3], &bits, 4);
  }
  if (n > 4) v[4] = -std::numeric_limits<float>::infinity();
  return v;
}

inline std::vector<FullParam> TestModel() {
  return {{"model.embed_tokens.weight", {10}, Values(10, 1.0f)},
          {"model.layers.0.self_attn.q_proj.weight", {7, 3}, Values(21, 2.0f)},
          {"model.layers.0.mlp.up_proj.weight", {5, 5}, Values(25, 3.0f)},
          {"model.norm.weight", {1}, Values(1, 4.0f)}};
}

inline constexpr char kConfig[] =
    R"({"architectures":["LlamaForCausalLM"],"hidden_size":8,"model_type":"llama","tie_word_embeddings":false,"vocab_size":256})";

// Writes ranks `ranks` of a world-size-`n` ZeRO-3 checkpoint of `params` at `step`, exactly as the
// trainer lays them out (shard_format.h): partition r = flat[r*p, min((r+1)*p, numel)) zero-padded.
inline void WriteCheckpoint(const std::string& checkpoint_dir, int64_t step, int32_t n,
                     const std::vector<FullParam>& params, const std::vector<int32_t>& ranks,
                     const std::string& config = kConfig,
                     std::vector<std::string> sections = {"fp32_params", "exp_avg", "exp_avg_sq"},
                     const std::map<std::string, double>& metrics = {}) {
  std::string step_dir = absl::StrCat(checkpoint_dir, "/", StepDirName(step));
  for (int32_t r : ranks) {
    ShardManifest m;
    m.metrics = metrics;
    m.step = step;
    m.rank = r;
    m.world_size = n;
    m.model_config_json = config;
    m.optimizer_step = step;
    m.sections = sections;
    for (const FullParam& fp : params) {
      ShardParam p;
      p.name = fp.name;
      p.shape = fp.shape;
      p.numel = static_cast<int64_t>(fp.values.size());
      m.params.push_back(p);
    }
    AssignPartitionLayout(m);
    std::vector<std::vector<float>> data(sections.size(),
                                         std::vector<float>(m.section_numel, 0.0f));
    for (size_t s = 0; s < sections.size(); ++s) {
      if (sections[s] != "fp32_params") {
        std::fill(data[s].begin(), data[s].end(), -999.0f - static_cast<float>(s));
        continue;
      }
      for (size_t i = 0; i < params.size(); ++i) {
        const ShardParam& p = m.params[i];
        for (int64_t k = 0; k < p.partition_numel; ++k) {
          int64_t flat = r * p.partition_numel + k;
          data[s][p.partition_offset + k] = flat < p.numel ? params[i].values[flat] : 0.0f;
        }
      }
    }
    std::vector<const float*> ptrs;
    for (const auto& d : data) ptrs.push_back(d.data());
    ASSERT_TRUE(WriteShard(step_dir, m, ptrs).ok());
  }
}

inline std::vector<int32_t> AllRanks(int32_t n) {
  std::vector<int32_t> r;
  for (int32_t i = 0; i < n; ++i) r.push_back(i);
  return r;
}

inline void ExpectStatus(const absl::Status& s, absl::StatusCode code, absl::string_view substring) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find(std::string(substring)), absl::string_view::npos)
      << "message: " << s.message() << "\nwanted: " << substring;
}

}  // namespace loom::storage::checkpoint_test

#endif  // LOOM_STORAGE_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
