#include "storage/checkpoint/verify.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/file_util.h"
#include "storage/checkpoint/consolidate.h"
#include "storage/checkpoint/shard_format.h"
#include "storage/safetensors/safetensors.h"

namespace loom::storage {
namespace {

std::string TmpDir(absl::string_view name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(base != nullptr ? base : "/tmp", "/", name);
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

// 8-byte little-endian length + `header` + `data`.
std::string Raw(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

// The compact JSON padded with spaces to a multiple of 8.
std::string Padded(std::string json) {
  while (json.size() % 8 != 0) json += ' ';
  return json;
}

void Write(const std::string& path, const std::string& bytes) {
  ASSERT_TRUE(WriteFileAtomically(path, bytes).ok());
}

void ExpectProblem(const std::string& path, absl::StatusCode code, absl::string_view what) {
  auto r = VerifyPath(path);
  EXPECT_EQ(r.status().code(), code) << r.status();
  EXPECT_NE(r.status().message().find(std::string(what)), absl::string_view::npos)
      << "message: " << r.status().message() << "\nwanted: " << what;
}

const char kTwo[] =
    R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[3],"data_offsets":[8,14]}})";

TEST(VerifySafetensorsTest, ValidFileFromTheWriterAndByHand) {
  std::string dir = TmpDir("valid");
  Write(dir + "/hand.safetensors", Raw(Padded(kTwo), std::string(14, 'x')));
  auto r = VerifyPath(dir + "/hand.safetensors");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, "safetensors");
  EXPECT_EQ(r->num_tensors, 2);
  EXPECT_EQ(r->tensor_bytes, 14);

  std::vector<safetensors::TensorData> t = {{{"w", "F32", {2, 2}}, std::string(16, '\1')}};
  ASSERT_TRUE(safetensors::WriteFile(dir + "/model.safetensors", t).ok());
  auto d = VerifyPath(dir);  // a directory with model.safetensors
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->files, (std::vector<std::string>{dir + "/model.safetensors"}));
  EXPECT_EQ(d->tensor_bytes, 16);
}

TEST(VerifySafetensorsTest, NamesTheFirstProblem) {
  std::string dir = TmpDir("bad");
  auto file = [&](const std::string& name, const std::string& bytes) {
    std::string path = absl::StrCat(dir, "/", name, ".safetensors");
    Write(path, bytes);
    return path;
  };
  ExpectProblem(file("trailing", Raw(Padded(kTwo), std::string(15, 'x'))),
                absl::StatusCode::kInvalidArgument, "1 trailing bytes");
  ExpectProblem(file("short", Raw(Padded(kTwo), std::string(13, 'x'))),
                absl::StatusCode::kDataLoss, "");
  ExpectProblem(
      file("gap", Raw(Padded(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})"),
                      std::string(16, 'x'))),
      absl::StatusCode::kInvalidArgument, "'b'");
  ExpectProblem(
      file("notzero", Raw(Padded(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})"),
                          std::string(12, 'x'))),
      absl::StatusCode::kInvalidArgument, "'a'");
  ExpectProblem(
      file("size", Raw(Padded(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})"),
                       std::string(8, 'x'))),
      absl::StatusCode::kInvalidArgument, "'a'");
  std::string json = kTwo;
  ExpectProblem(file("newline_pad", Raw(json + "\n\n\n\n\n\n\n", std::string(14, 'x'))),
                absl::StatusCode::kInvalidArgument, "byte 0x0a at header offset");
  ExpectProblem(file("unaligned", Raw(json, std::string(14, 'x'))),  // 137 bytes, no padding
                absl::StatusCode::kInvalidArgument, "not a multiple of 8");
  ExpectProblem(file("first", Raw(Padded(" " + json), std::string(14, 'x'))),
                absl::StatusCode::kInvalidArgument, "does not start with '{' (first byte 0x20)");
  ExpectProblem(file("tiny", "abc"), absl::StatusCode::kDataLoss, "too short");
  std::string huge_len = Raw(Padded(kTwo), "");
  huge_len[5] = 1;  // length 2^40
  ExpectProblem(file("huge", huge_len), absl::StatusCode::kInvalidArgument, "exceeds");
  ExpectProblem(dir + "/absent.safetensors", absl::StatusCode::kNotFound, "absent");
  std::string verify_file = file("named", Raw(Padded(kTwo), std::string(15, 'x')));
  EXPECT_NE(VerifyPath(verify_file).status().message().find("named.safetensors"),
            absl::string_view::npos);
}

// A sharded export written by Consolidate, then broken one rule at a time.
class VerifyShardedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = TmpDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::string step_dir = root_ + "/ckpt/step_00000001";
    for (int32_t r = 0; r < 2; ++r) {
      ShardManifest m;
      m.step = 1;
      m.rank = r;
      m.world_size = 2;
      m.model_config_json = R"({"model_type":"llama"})";
      m.params = {{"a", {4, 4}, 16}, {"b", {8}, 8}, {"c", {5}, 5}};
      AssignPartitionLayout(m);
      std::vector<float> data(m.section_numel, 0.25f * r);
      const float* p = data.data();
      ASSERT_TRUE(WriteShard(step_dir, m, absl::MakeConstSpan(&p, 1)).ok());
    }
    ConsolidateOptions options;
    options.max_shard_size_bytes = 64;  // a: 64, b: 32, c: 20 -> [a], [b, c]
    out_ = root_ + "/out";
    auto result = Consolidate(root_ + "/ckpt", 1, out_, options);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->files.size(), 2u);
    index_ = out_ + "/model.safetensors.index.json";
  }
  void SetIndex(const std::string& text) { Write(index_, text); }

  std::string root_, out_, index_;
};

TEST_F(VerifyShardedTest, ValidExportPasses) {
  auto r = VerifyPath(out_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, "sharded safetensors");
  EXPECT_EQ(r->num_tensors, 3);
  EXPECT_EQ(r->tensor_bytes, 116);
  EXPECT_EQ(r->files.size(), 3u);
  auto ckpt = VerifyPath(root_ + "/ckpt/step_00000001");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->kind, "loom checkpoint");
  EXPECT_EQ(ckpt->files.size(), 2u);
}

TEST_F(VerifyShardedTest, TensorMissingFromIndex) {
  SetIndex(R"({"metadata":{"total_size":116},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}})");
  ExpectProblem(out_, absl::StatusCode::kInvalidArgument,
                "model-00002-of-00002.safetensors: tensor 'c' is not in the weight_map");
}

TEST_F(VerifyShardedTest, IndexNamesTheWrongFile) {
  SetIndex(R"({"metadata":{"total_size":116},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}})");
  ExpectProblem(out_, absl::StatusCode::kInvalidArgument,
                "model-00002-of-00002.safetensors: tensor 'b' is in "
                "model-00002-of-00002.safetensors but weight_map says "
                "model-00001-of-00002.safetensors");
  SetIndex(R"({"metadata":{"total_size":116},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors","c":"model-00002-of-00002.safetensors","z":"model-00001-of-00002.safetensors"}})");
  ExpectProblem(out_, absl::StatusCode::kInvalidArgument,
                "weight_map says tensor 'z' is in model-00001-of-00002.safetensors, which has no "
                "such tensor");
}

TEST_F(VerifyShardedTest, TensorStoredTwice) {
  std::vector<safetensors::TensorData> t = {{{"a", "F32", {1}}, std::string(4, '\0')}};
  ASSERT_TRUE(safetensors::WriteFile(out_ + "/extra.safetensors", t).ok());
  SetIndex(R"({"metadata":{"total_size":120},"weight_map":{"a":"extra.safetensors","b":"model-00002-of-00002.safetensors","c":"model-00002-of-00002.safetensors","x":"model-00001-of-00002.safetensors"}})");
  ExpectProblem(out_, absl::StatusCode::kInvalidArgument,
                "tensor 'a' is stored twice: in extra.safetensors and in "
                "model-00001-of-00002.safetensors");
}

TEST_F(VerifyShardedTest, TotalSizeMismatch) {
  SetIndex(R"({"metadata":{"total_size":117},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}})");
  ExpectProblem(out_, absl::StatusCode::kInvalidArgument,
                "metadata.total_size is 117 but the shards hold 116 bytes");
}

TEST_F(VerifyShardedTest, MissingShardFileAndOrphanShard) {
  ASSERT_EQ(::rename((out_ + "/model-00002-of-00002.safetensors").c_str(),
                     (out_ + "/model-00002-of-00003.safetensors").c_str()),
            0);
  ExpectProblem(out_, absl::StatusCode::kDataLoss,
                "weight_map names model-00002-of-00002.safetensors, which does not exist");
  SetIndex(R"({"metadata":{"total_size":64},"weight_map":{"a":"model-00001-of-00002.safetensors"}})");
  ExpectProblem(out_, absl::StatusCode::kInvalidArgument,
                "shard file model-00002-of-00003.safetensors in the directory is not in the "
                "weight_map");
}

TEST_F(VerifyShardedTest, MalformedIndexAndBadShard) {
  SetIndex(R"({"weight_map":{}})");
  ExpectProblem(out_, absl::StatusCode::kInvalidArgument, "no \"metadata\" object");
  SetIndex(R"({"metadata":{"total_size":1},"weight_map":{"a":"../x"}})");
  ExpectProblem(out_, absl::StatusCode::kInvalidArgument, "not a plain file name");
  SetIndex("[");
  ExpectProblem(out_, absl::StatusCode::kInvalidArgument, "not a JSON object");
  // A shard with one byte appended: the shard's own rule names it.
  SetIndex(R"({"metadata":{"total_size":116},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}})");
  std::string shard = out_ + "/model-00001-of-00002.safetensors";
  Write(shard, *ReadFile(shard) + "z");
  ExpectProblem(out_, absl::StatusCode::kInvalidArgument,
                "model-00001-of-00002.safetensors: invalid safetensors header");
}

TEST_F(VerifyShardedTest, CorruptLoomCheckpointNamesFileAndRank) {
  std::string shard = root_ + "/ckpt/step_00000001/rank_0.shard";
  std::string bytes = *ReadFile(shard);
  bytes[3] ^= 1;
  Write(shard, bytes);
  ExpectProblem(root_ + "/ckpt/step_00000001", absl::StatusCode::kDataLoss,
                "rank_0.shard (rank 0): CRC-32");
  Write(shard, bytes.substr(0, 10));
  ExpectProblem(root_ + "/ckpt/step_00000001", absl::StatusCode::kDataLoss,
                "rank_0.shard (rank 0): 10 bytes, manifest says");
  ExpectProblem(root_, absl::StatusCode::kNotFound, "nothing to verify");
}

// A side file (e.g. ZenFlow's state) that rank 1's manifest lists is checked like its shard.
// Regression: a ZenFlow state file with a flipped byte verified OK, so the scheduler resumed
// from that step on every restart (each failing with DATA_LOSS) instead of an older one.
TEST_F(VerifyShardedTest, CorruptSideFileNamesFileAndRank) {
  const std::string step = root_ + "/ckpt/step_00000001";
  const std::string side = step + "/zenflow_rank1.bin";
  const std::string content = "technique state of rank 1, any bytes \x01\x02";
  Write(side, content);
  auto m = ReadManifest(step, 1);
  ASSERT_TRUE(m.ok()) << m.status();
  // The reference CRC is zlib's, not the code under test's.
  m->side_files.push_back(
      {"zenflow_rank1.bin", static_cast<int64_t>(content.size()),
       static_cast<uint32_t>(::crc32(0, reinterpret_cast<const Bytef*>(content.data()),
                                     static_cast<uInt>(content.size())))});
  Write(step + "/rank_1.manifest.json", ManifestToJson(*m));
  auto ok = VerifyPath(step);
  ASSERT_TRUE(ok.ok()) << ok.status();
  std::string bad = content;
  bad[5] ^= 0x20;
  Write(side, bad);
  ExpectProblem(step, absl::StatusCode::kDataLoss, "zenflow_rank1.bin (rank 1): CRC-32");
  Write(side, content.substr(0, 7));
  ExpectProblem(step, absl::StatusCode::kDataLoss,
                absl::StrCat("zenflow_rank1.bin (rank 1): 7 bytes, manifest says ",
                             content.size()));
  ASSERT_EQ(::unlink(side.c_str()), 0);
  ExpectProblem(step, absl::StatusCode::kDataLoss, "zenflow_rank1.bin (rank 1): missing");
  // CheckSideFileData (for a reader holding the whole file) applies the same rule.
  EXPECT_TRUE(CheckSideFileData(side, 1, m->side_files[0], content).ok());
  EXPECT_EQ(CheckSideFileData(side, 1, m->side_files[0], bad).code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace loom::storage
