// Consolidation's overlapped F32 path (ConsolidateOptions::overlap_checksums, overlapped_copy.h):
// the same bytes as the one-thread path and as the formula, and a corrupt shard rejected by name.
#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "storage/checkpoint/consolidate.h"
#include "storage/checkpoint/shard_format.h"

namespace loom::storage {
namespace {

using ::loom::testing::StatusIs;

struct Param {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel;
};

// Numels not divisible by 3 ranks (10, 21, 25, 1, 1001), so partitions carry padding.
std::vector<Param> Model() {
  return {{"model.embed_tokens.weight", {10}, 10},
          {"model.layers.0.self_attn.q_proj.weight", {7, 3}, 21},
          {"model.layers.0.mlp.up_proj.weight", {5, 5}, 25},
          {"model.norm.weight", {1}, 1},
          {"lm_head.weight", {7, 143}, 1001}};
}

// Element k of parameter i: exact in fp32 and distinct across parameters.
float Value(size_t i, int64_t k) { return static_cast<float>(i) * 4096.0f + 0.5f * k - 100.0f; }

const char kConfig[] = R"({"model_type":"llama","tie_word_embeddings":false})";

std::string TmpDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/", name);
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

// Writes a world-size-n checkpoint of Model() at step 100, laid out as shard_format.h says:
// partition r of a parameter of numel m is flat[r*p, min((r+1)*p, m)), p = ceil(m / n),
// zero-padded; other sections are filled with -7.
void WriteCheckpoint(const std::string& dir, int32_t n, const std::vector<std::string>& sections) {
  const std::vector<Param> model = Model();
  for (int32_t r = 0; r < n; ++r) {
    ShardManifest m;
    m.step = 100;
    m.rank = r;
    m.world_size = n;
    m.model_config_json = kConfig;
    m.sections = sections;
    for (const Param& p : model) {
      ShardParam sp;
      sp.name = p.name;
      sp.shape = p.shape;
      sp.numel = p.numel;
      m.params.push_back(sp);
    }
    AssignPartitionLayout(m);
    std::vector<std::vector<float>> data(sections.size(), std::vector<float>(m.section_numel, -7.0f));
    for (size_t i = 0; i < model.size(); ++i) {
      const ShardParam& sp = m.params[i];
      for (int64_t k = 0; k < sp.partition_numel; ++k) {
        const int64_t flat = r * sp.partition_numel + k;
        data[0][sp.partition_offset + k] = flat < sp.numel ? Value(i, flat) : 0.0f;
      }
    }
    std::vector<const float*> ptrs;
    for (const auto& d : data) ptrs.push_back(d.data());
    ASSERT_TRUE(WriteShard(dir + "/step_00000100", m, ptrs).ok());
  }
}

// Parses a safetensors file here (8-byte little-endian header length, JSON header, data) and
// checks every tensor against Value(): F32, its shape, its bytes.
void ExpectFormula(const std::string& path) {
  auto bytes = ReadFile(path);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ASSERT_GE(bytes->size(), 8u);
  uint64_t header_len = 0;
  for (int b = 7; b >= 0; --b) header_len = header_len << 8 | static_cast<uint8_t>((*bytes)[b]);
  ASSERT_LE(8 + header_len, bytes->size());
  const nlohmann::json header = nlohmann::json::parse(bytes->substr(8, header_len));
  const char* data = bytes->data() + 8 + header_len;
  const std::vector<Param> model = Model();
  for (size_t i = 0; i < model.size(); ++i) {
    SCOPED_TRACE(model[i].name);
    ASSERT_TRUE(header.contains(model[i].name));
    const nlohmann::json& t = header[model[i].name];
    EXPECT_EQ(t["dtype"], "F32");
    EXPECT_EQ(t["shape"].get<std::vector<int64_t>>(), model[i].shape);
    const int64_t begin = t["data_offsets"][0].get<int64_t>();
    const int64_t end = t["data_offsets"][1].get<int64_t>();
    ASSERT_EQ(end - begin, model[i].numel * 4);
    for (int64_t k = 0; k < model[i].numel; ++k) {
      float f;
      std::memcpy(&f, data + begin + 4 * k, 4);
      ASSERT_EQ(f, Value(i, k)) << "element " << k;
    }
  }
}

bool HasStaging(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return false;
  bool found = false;
  while (struct dirent* e = ::readdir(d)) {
    if (absl::StrContains(e->d_name, ".tmp.")) found = true;
  }
  ::closedir(d);
  return found;
}

// For chunk sizes from 12 bytes (many chunks per rank slice, none page-aligned) to 4 MiB (one
// chunk per slice), in both layouts: the overlapped output equals the one-thread output byte for
// byte, and its tensors equal the formula.
TEST(ConsolidateOverlapTest, OverlappedOutputIsBitIdenticalToOneThreadAndToTheFormula) {
  for (const bool trainer_layout : {false, true}) {
    const std::vector<std::string> sections =
        trainer_layout ? std::vector<std::string>{"fp32_params", "exp_avg", "exp_avg_sq"}
                       : std::vector<std::string>{"fp32_params"};
    const std::string dir = TmpDir(trainer_layout ? "bits_trainer" : "bits_params");
    WriteCheckpoint(dir, 3, sections);
    for (const int64_t chunk : {int64_t{12}, int64_t{4096}, int64_t{4} << 20}) {
      SCOPED_TRACE(absl::StrCat("trainer_layout ", trainer_layout, " chunk ", chunk));
      std::string outputs[2];
      for (const bool overlap : {false, true}) {
        ConsolidateOptions options;
        options.io_buffer_bytes = chunk;
        options.overlap_checksums = overlap;
        const std::string out = absl::StrCat(dir, "/out_", chunk, "_", overlap);
        auto result = Consolidate(dir, 100, out, options);
        ASSERT_TRUE(result.ok()) << result.status();
        auto bytes = ReadFile(result->safetensors_path);
        ASSERT_TRUE(bytes.ok());
        outputs[overlap] = *bytes;
      }
      EXPECT_EQ(outputs[0], outputs[1]);
      ExpectFormula(absl::StrCat(dir, "/out_", chunk, "_1/model.safetensors"));
    }
  }
}

// One flipped byte (the shard keeps its size, so only the CRC-32 can tell) inside a parameter
// that the overlapped copy carries, and, in the trainer layout, inside exp_avg (read after the
// copy): DATA_LOSS naming the shard file and rank, nothing published, no staging left.
TEST(ConsolidateOverlapTest, CorruptShardIsDataLossNamingTheFile) {
  struct Case {
    std::string name;
    std::vector<std::string> sections;
    int32_t rank;
    bool in_exp_avg;
  };
  for (const Case& c : {Case{"corrupt_params", {"fp32_params"}, 2, false},
                        Case{"corrupt_trainer", {"fp32_params", "exp_avg", "exp_avg_sq"}, 1, true}}) {
    SCOPED_TRACE(c.name);
    const std::string dir = TmpDir(c.name);
    WriteCheckpoint(dir, 3, c.sections);
    auto manifest = ReadManifest(dir + "/step_00000100", c.rank);
    ASSERT_TRUE(manifest.ok());
    const std::string shard = absl::StrCat(dir, "/step_00000100/rank_", c.rank, ".shard");
    auto bytes = ReadFile(shard);
    ASSERT_TRUE(bytes.ok());
    // The last parameter (lm_head, 1001 elements) is present in every rank's partition.
    const ShardParam& last = manifest->params.back();
    const int64_t element = (c.in_exp_avg ? manifest->section_numel : 0) + last.partition_offset + 5;
    (*bytes)[static_cast<size_t>(element * 4 + 1)] ^= 0x10;
    ASSERT_TRUE(WriteFileAtomically(shard, *bytes).ok());
    for (const int64_t chunk : {int64_t{12}, int64_t{4} << 20}) {
      ConsolidateOptions options;
      options.io_buffer_bytes = chunk;
      const std::string out = absl::StrCat(dir, "/out_", chunk);
      EXPECT_THAT(Consolidate(dir, 100, out, options),
                  StatusIs(absl::StatusCode::kDataLoss,
                           absl::StrCat(shard, " (rank ", c.rank, "): CRC-32")));
      EXPECT_NE(::access((out + "/model.safetensors").c_str(), F_OK), 0);
      EXPECT_NE(::access((out + "/config.json").c_str(), F_OK), 0);
      EXPECT_FALSE(HasStaging(out));
    }
  }
}

}  // namespace
}  // namespace loom::storage
