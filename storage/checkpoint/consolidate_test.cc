#include "storage/checkpoint/consolidate.h"

#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "storage/checkpoint/checkpoint_test_util.h"
#include "storage/checkpoint/shard_format.h"
#include "storage/safetensors/safetensors.h"

namespace loom::storage {
namespace {

using ::loom::testing::StatusIs;

using namespace checkpoint_test;  // NOLINT: test helpers

bool HasTmpFiles(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return false;
  bool found = false;
  while (struct dirent* e = ::readdir(d)) {
    if (std::string(e->d_name).find(".tmp.") != std::string::npos) found = true;
  }
  ::closedir(d);
  return found;
}

void ExpectModelEquals(const std::string& safetensors_path, const std::vector<FullParam>& params) {
  auto reader = safetensors::Reader::Open(safetensors_path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ((*reader)->tensors().size(), params.size());
  for (const FullParam& p : params) {
    const safetensors::TensorEntry* e = (*reader)->Find(p.name);
    ASSERT_NE(e, nullptr) << p.name;
    EXPECT_EQ(e->dtype, "F32");
    EXPECT_EQ(e->shape, p.shape);
    auto bytes = (*reader)->ReadTensor(p.name);
    ASSERT_TRUE(bytes.ok());
    ASSERT_EQ(bytes->size(), p.values.size() * 4) << p.name;
    EXPECT_EQ(std::memcmp(bytes->data(), p.values.data(), bytes->size()), 0)
        << p.name << " differs bitwise";
  }
}

class ConsolidateWorldSizeTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(ConsolidateWorldSizeTest, BitExactReconstruction) {
  const int32_t n = GetParam();
  std::string dir = TmpDir(absl::StrCat("ws", n));
  std::vector<FullParam> model = TestModel();
  WriteCheckpoint(dir, 100, n, model, AllRanks(n));
  std::string out = absl::StrCat(dir, "/export");
  auto result = Consolidate(dir, 100, out);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->step, 100);
  EXPECT_EQ(result->output_dir, out);
  EXPECT_EQ(result->safetensors_path, out + "/model.safetensors");
  EXPECT_EQ(result->config_path, out + "/config.json");
  EXPECT_EQ(result->num_tensors, 4);
  EXPECT_EQ(result->tensor_bytes, (10 + 21 + 25 + 1) * 4);
  ExpectModelEquals(result->safetensors_path, model);
  struct stat st;
  ASSERT_EQ(::stat(result->safetensors_path.c_str(), &st), 0);
  EXPECT_EQ(result->safetensors_bytes, st.st_size);
  EXPECT_TRUE(result->skipped_tensors.empty());
  EXPECT_GE(result->seconds, 0.0);
  auto config = ReadFile(result->config_path);
  ASSERT_TRUE(config.ok());
  // The manifest's model config, with the dtype of the tensors written.
  nlohmann::json expected = nlohmann::json::parse(kConfig);
  expected["torch_dtype"] = "float32";
  EXPECT_EQ(*config, expected.dump(2) + "\n");
  EXPECT_NE(config->find("\n  \"hidden_size\": 8,\n"), std::string::npos);
  EXPECT_FALSE(HasTmpFiles(out));
}

TEST_P(ConsolidateWorldSizeTest, TinyIoBufferAndParamsSectionNotFirst) {
  const int32_t n = GetParam();
  std::string dir = TmpDir(absl::StrCat("tinybuf", n));
  std::vector<FullParam> model = TestModel();
  WriteCheckpoint(dir, 7, n, model, AllRanks(n), kConfig, {"exp_avg", "fp32_params", "exp_avg_sq"});
  ConsolidateOptions options;
  options.io_buffer_bytes = 4;  // one float per read: every chunk boundary is exercised
  options.writeback_bytes = 8;  // writeback started every other read
  auto result = Consolidate(dir, 0, "", options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->step, 7);
  EXPECT_EQ(result->output_dir, dir + "/step_00000007/hf");
  ExpectModelEquals(result->safetensors_path, model);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ConsolidateWorldSizeTest, ::testing::Values(1, 2, 3, 4));

TEST(ConsolidateTest, LargeTensorSpansManyBufferChunks) {
  std::string dir = TmpDir("large");
  std::vector<FullParam> model = {{"w", {1000, 3}, Values(3000, 0.5f)}, {"b", {3}, Values(3, 1.0f)}};
  WriteCheckpoint(dir, 1, 3, model, AllRanks(3));
  ConsolidateOptions options;
  options.io_buffer_bytes = 4096;  // 3000 floats = 12000 bytes: several chunks per rank
  auto result = Consolidate(dir, 1, dir + "/out", options);
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectModelEquals(result->safetensors_path, model);
}

TEST(ConsolidateTest, MissingRankIsFailedPrecondition) {
  std::string dir = TmpDir("missing");
  WriteCheckpoint(dir, 100, 3, TestModel(), {0, 2});
  auto result = Consolidate(dir, 100, dir + "/out");
  ASSERT_FALSE(result.ok());
  ExpectStatus(result.status(), absl::StatusCode::kFailedPrecondition,
               "not committed: world_size 3, missing ranks 1 (reported: 0, 2)");
  // Step 0 (newest committed) finds none.
  ExpectStatus(Consolidate(dir, 0, dir + "/out").status(), absl::StatusCode::kFailedPrecondition,
               "no committed checkpoint");
  struct stat st;
  EXPECT_NE(::stat((dir + "/out/model.safetensors").c_str(), &st), 0);
}

TEST(ConsolidateTest, FlippedByteIsDataLossNamingFileAndRank) {
  std::string dir = TmpDir("flipped");
  WriteCheckpoint(dir, 100, 2, TestModel(), AllRanks(2));
  std::string shard = dir + "/step_00000100/rank_1.shard";
  std::string bytes = *ReadFile(shard);
  bytes[5] ^= 0x01;
  ASSERT_TRUE(WriteFileAtomically(shard, bytes).ok());
  auto result = Consolidate(dir, 100, dir + "/out");
  ASSERT_FALSE(result.ok());
  ExpectStatus(result.status(), absl::StatusCode::kDataLoss, shard + " (rank 1): CRC-32");
  struct stat st;
  EXPECT_NE(::stat((dir + "/out/model.safetensors").c_str(), &st), 0);
  EXPECT_FALSE(HasTmpFiles(dir + "/out"));
}

// Both checksum modes: fused with the copy (default, tested elsewhere too) and a pass first.
TEST(ConsolidateTest, ChecksumModesPublishNothingOnMismatch) {
  for (bool before : {false, true}) {
  std::string dir = TmpDir(before ? "crc_before" : "crc_fused");
  std::vector<FullParam> model = TestModel();
  WriteCheckpoint(dir, 100, 2, model, AllRanks(2));
  ConsolidateOptions options;
  options.checksum_before_writing = before;
  options.io_buffer_bytes = 8;
  auto good = Consolidate(dir, 100, dir + "/good", options);
  ASSERT_TRUE(good.ok()) << good.status();
  ExpectModelEquals(good->safetensors_path, model);
  EXPECT_FALSE(HasTmpFiles(dir + "/good"));

  std::string shard = dir + "/step_00000100/rank_0.shard";
  std::string bytes = *ReadFile(shard);
  bytes[bytes.size() - 1] ^= 0x01;
  ASSERT_TRUE(WriteFileAtomically(shard, bytes).ok());
  auto result = Consolidate(dir, 100, dir + "/out", options);
  ExpectStatus(result.status(), absl::StatusCode::kDataLoss, shard + " (rank 0): CRC-32");
  EXPECT_NE(::access((dir + "/out/model.safetensors").c_str(), F_OK), 0);
  EXPECT_NE(::access((dir + "/out/config.json").c_str(), F_OK), 0);
  EXPECT_FALSE(HasTmpFiles(dir + "/out"));
  }
}

// The fused checksum covers every byte: copied parameter bytes, zero padding of the last rank,
// optimizer sections and the skipped tied lm_head are all caught.
TEST(ConsolidateTest, FusedChecksumCatchesAFlipAnywhereInTheShard) {
  std::string dir = TmpDir("fused_every_byte");
  std::vector<FullParam> model = TestModel();
  model.push_back({"lm_head.weight", {10}, Values(10, 1.0f)});
  const std::string tied =
      R"({"hidden_size":8,"model_type":"llama","tie_word_embeddings":true,"vocab_size":256})";
  WriteCheckpoint(dir, 1, 3, model, AllRanks(3), tied);
  const std::string shard = dir + "/step_00000001/rank_2.shard";
  const std::string good = *ReadFile(shard);
  ConsolidateOptions options;
  options.io_buffer_bytes = 12;
  int checked = 0;
  for (size_t i = 0; i < good.size(); i += 5) {
    std::string bad = good;
    bad[i] ^= 0x20;
    ASSERT_TRUE(WriteFileAtomically(shard, bad).ok());
    auto result = Consolidate(dir, 1, dir + "/out", options);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss) << "byte " << i;
    ++checked;
  }
  EXPECT_GT(checked, 40);
  ASSERT_TRUE(WriteFileAtomically(shard, good).ok());
  EXPECT_TRUE(Consolidate(dir, 1, dir + "/out", options).ok());
  EXPECT_FALSE(HasTmpFiles(dir + "/out"));
}

TEST(ConsolidateTest, TruncatedShardIsDataLoss) {
  std::string dir = TmpDir("truncated");
  WriteCheckpoint(dir, 100, 2, TestModel(), AllRanks(2));
  std::string shard = dir + "/step_00000100/rank_0.shard";
  std::string bytes = *ReadFile(shard);
  ASSERT_TRUE(WriteFileAtomically(shard, bytes.substr(0, bytes.size() - 4)).ok());
  auto result = Consolidate(dir, 100, dir + "/out");
  ASSERT_FALSE(result.ok());
  ExpectStatus(result.status(), absl::StatusCode::kDataLoss,
               absl::StrCat(shard, " (rank 0): ", bytes.size() - 4, " bytes, manifest says ",
                            bytes.size()));
  auto list = ListCheckpoints(dir);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_FALSE((*list)[0].committed);
  EXPECT_EQ((*list)[0].commit_status.code(), absl::StatusCode::kDataLoss);
}

TEST(ConsolidateTest, ManifestsDisagreeingOnWorldSize) {
  std::string dir = TmpDir("disagree");
  // Ranks 0-1 of a world of 2, plus a stale rank 2 of an earlier world of 3.
  WriteCheckpoint(dir, 100, 2, TestModel(), AllRanks(2));
  WriteCheckpoint(dir, 100, 3, TestModel(), {2});
  auto list = ListCheckpoints(dir);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_FALSE((*list)[0].committed);
  ExpectStatus((*list)[0].commit_status, absl::StatusCode::kFailedPrecondition,
               "manifests disagree: rank 0 says world_size 2, rank 2 says 3");
  ExpectStatus(Consolidate(dir, 100, dir + "/out").status(), absl::StatusCode::kFailedPrecondition,
               "manifests disagree");
}

TEST(ConsolidateTest, ListShowsCommittedAndPartialAndIgnoresTemporaries) {
  std::string dir = TmpDir("list");
  WriteCheckpoint(dir, 200, 2, TestModel(), {0});      // partial
  WriteCheckpoint(dir, 100, 2, TestModel(), AllRanks(2));  // committed
  WriteCheckpoint(dir, 300, 4, TestModel(), AllRanks(4));  // committed
  // Leftovers a crash could leave: a temporary manifest, a temporary step directory, stray files.
  ASSERT_TRUE(WriteFileAtomically(dir + "/step_00000200/rank_1.manifest.json.tmp.4242", "{").ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/step_00000200/rank_1.shard.tmp.4242", "xx").ok());
  ASSERT_TRUE(MakeDirs(dir + "/step_00000400.tmp.17").ok());
  ASSERT_TRUE(MakeDirs(dir + "/step_500").ok());  // not the canonical 8-digit name
  ASSERT_TRUE(WriteFileAtomically(dir + "/latest", "300").ok());

  auto list = ListCheckpoints(dir);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 3u);
  const CheckpointInfo& a = (*list)[0];
  const CheckpointInfo& b = (*list)[1];
  const CheckpointInfo& c = (*list)[2];
  EXPECT_EQ(a.step, 100);
  EXPECT_TRUE(a.committed);
  EXPECT_TRUE(a.commit_status.ok());
  EXPECT_EQ(a.world_size, 2);
  EXPECT_EQ(a.ranks_reported, (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(a.missing_ranks.empty());
  EXPECT_EQ(a.path, dir + "/step_00000100");
  int64_t expected_bytes = 0;
  for (int r = 0; r < 2; ++r) {
    struct stat st;
    ASSERT_EQ(::stat(absl::StrCat(a.path, "/", ShardFileName(r)).c_str(), &st), 0);
    expected_bytes += st.st_size;
    ASSERT_EQ(::stat(absl::StrCat(a.path, "/", ManifestFileName(r)).c_str(), &st), 0);
    expected_bytes += st.st_size;
  }
  EXPECT_EQ(a.total_bytes, expected_bytes);

  EXPECT_EQ(b.step, 200);
  EXPECT_FALSE(b.committed);
  EXPECT_EQ(b.world_size, 2);
  EXPECT_EQ(b.ranks_reported, (std::vector<int32_t>{0}));
  EXPECT_EQ(b.missing_ranks, (std::vector<int32_t>{1}));
  ExpectStatus(b.commit_status, absl::StatusCode::kFailedPrecondition, "missing ranks 1");

  EXPECT_EQ(c.step, 300);
  EXPECT_TRUE(c.committed);
  EXPECT_EQ(c.world_size, 4);

  auto newest = NewestCommittedCheckpoint(dir);
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(newest->step, 300);
  auto consolidated = Consolidate(dir, 0, "");
  ASSERT_TRUE(consolidated.ok()) << consolidated.status();
  EXPECT_EQ(consolidated->step, 300);
  // The default output lives inside the step directory and does not disturb listing.
  auto again = ListCheckpoints(dir);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[2].total_bytes, c.total_bytes);
  EXPECT_TRUE((*again)[2].committed);
}

TEST(ConsolidateTest, NotFoundCases) {
  std::string dir = TmpDir("notfound");
  ExpectStatus(ListCheckpoints(dir + "/nope").status(), absl::StatusCode::kNotFound, "nope");
  ExpectStatus(Consolidate(dir + "/nope", 0, "").status(), absl::StatusCode::kNotFound, "nope");
  ExpectStatus(Consolidate(dir, 0, "").status(), absl::StatusCode::kNotFound, "no checkpoints");
  WriteCheckpoint(dir, 100, 1, TestModel(), {0});
  ExpectStatus(Consolidate(dir, 99, "").status(), absl::StatusCode::kNotFound,
               "no checkpoint of step 99");
  EXPECT_TRUE(Consolidate(dir, 100, "").ok());
}

TEST(ConsolidateTest, TiedEmbeddingsStoreTheTensorOnce) {
  std::string dir = TmpDir("tied");
  std::vector<FullParam> model = TestModel();
  model.push_back({"lm_head.weight", {10}, Values(10, 1.0f)});
  const std::string tied =
      R"({"hidden_size":8,"model_type":"llama","tie_word_embeddings":true,"vocab_size":256})";
  WriteCheckpoint(dir, 5, 2, model, AllRanks(2), tied);
  auto result = Consolidate(dir, 5, dir + "/out");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->num_tensors, 4);
  EXPECT_EQ(result->skipped_tensors, (std::vector<std::string>{"lm_head.weight"}));
  model.pop_back();
  ExpectModelEquals(result->safetensors_path, model);

  // Untied: lm_head.weight is its own tensor and is written.
  std::string dir2 = TmpDir("untied");
  std::vector<FullParam> model2 = TestModel();
  model2.push_back({"lm_head.weight", {10}, Values(10, 9.0f)});
  WriteCheckpoint(dir2, 5, 2, model2, AllRanks(2));
  auto result2 = Consolidate(dir2, 5, dir2 + "/out");
  ASSERT_TRUE(result2.ok()) << result2.status();
  EXPECT_EQ(result2->num_tensors, 5);
  ExpectModelEquals(result2->safetensors_path, model2);
}

TEST(ConsolidateTest, RerunAfterPartialOutputLeavesCorrectFile) {
  std::string dir = TmpDir("rerun");
  std::vector<FullParam> model = TestModel();
  WriteCheckpoint(dir, 100, 3, model, AllRanks(3));
  std::string out = dir + "/out";
  ASSERT_TRUE(MakeDirs(out).ok());
  // What a killed run could have left: a temporary of a dead process, and an older, different
  // output at the final name.
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  const std::string stale = absl::StrCat(out, "/model.safetensors.tmp.", child);
  ASSERT_TRUE(WriteFileAtomically(stale, std::string(1000, 'z')).ok());
  ASSERT_TRUE(WriteFileAtomically(out + "/model.safetensors", "garbage").ok());
  ASSERT_TRUE(WriteFileAtomically(out + "/config.json", "{").ok());

  auto result = Consolidate(dir, 100, out);
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectModelEquals(result->safetensors_path, model);
  nlohmann::json expected = nlohmann::json::parse(kConfig);
  expected["torch_dtype"] = "float32";
  EXPECT_EQ(*ReadFile(result->config_path), expected.dump(2) + "\n");
  EXPECT_FALSE(HasTmpFiles(out));

  // A second run over a good output gives the same bytes.
  std::string first = *ReadFile(result->safetensors_path);
  ASSERT_TRUE(Consolidate(dir, 100, out).ok());
  EXPECT_EQ(*ReadFile(result->safetensors_path), first);
}

// A manifest as JSON with the layout fields consistent for `world_size` and one param of `shape`
// (numel and offsets computed without overflow checks: tests pass hostile values on purpose).
nlohmann::json GarbageManifest(int64_t world_size, std::vector<int64_t> shape, int64_t rank = 0) {
  __int128 numel = 1;
  for (int64_t d : shape) numel *= d;
  nlohmann::json p = {{"name", "w"},
                      {"shape", shape},
                      {"numel", static_cast<int64_t>(numel)},
                      {"partition_numel", static_cast<int64_t>((numel + world_size - 1) / world_size)},
                      {"partition_offset", 0}};
  const int64_t section_numel = static_cast<int64_t>((numel + world_size - 1) / world_size);
  return {{"format", kShardFormatVersion}, {"step", 1}, {"rank", rank},
          {"world_size", world_size}, {"zero_stage", 3}, {"model_config", nlohmann::json::object()},
          {"tokenizer", "byte"}, {"optimizer", {{"type", "adamw"}, {"step", 1}}},
          {"sections", {"fp32_params"}}, {"section_numel", section_numel},
          {"shard_file", "rank_0.shard"},
          {"shard_bytes", static_cast<int64_t>(static_cast<uint64_t>(section_numel) * 4u)},
          {"shard_crc32", 0}, {"params", nlohmann::json::array({p})}};
}

void PlantStep(const std::string& dir, const nlohmann::json& manifest, const std::string& shard) {
  std::string step_dir = absl::StrCat(dir, "/", StepDirName(1));
  ASSERT_TRUE(MakeDirs(step_dir).ok());
  ASSERT_TRUE(WriteFileAtomically(absl::StrCat(step_dir, "/rank_0.manifest.json"),
                                  manifest.dump()).ok());
  ASSERT_TRUE(WriteFileAtomically(absl::StrCat(step_dir, "/rank_0.shard"), shard).ok());
}

// Regression: a manifest claiming world_size 1e9 made listing build a vector of ~1e9 missing
// ranks and a multi-GB message (bad_alloc: the RPC answered UNKNOWN).
TEST(ConsolidateGarbageTest, HugeWorldSizeIsRefusedWithoutAllocating) {
  std::string dir = TmpDir("garbage_world");
  nlohmann::json m = GarbageManifest(1000000000, {4});
  PlantStep(dir, m, "");
  auto list = ListCheckpoints(dir);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_FALSE((*list)[0].committed);
  EXPECT_EQ((*list)[0].commit_status.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE((*list)[0].commit_status.message().find("manifest.world_size: 1000000000 is not in"),
            std::string::npos)
      << (*list)[0].commit_status;
  EXPECT_TRUE((*list)[0].missing_ranks.empty());
}

// A large but allowed world size with one rank present lists few ranks in the message.
TEST(ConsolidateGarbageTest, ManyMissingRanksKeepTheMessageShort) {
  std::string dir = TmpDir("garbage_many_missing");
  nlohmann::json m = GarbageManifest(kMaxManifestWorldSize, {4});
  PlantStep(dir, m, std::string(4, '\0'));
  auto c = Consolidate(dir, 1, "", ConsolidateOptions());
  ASSERT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
  EXPECT_LT(c.status().message().size(), 1000u);
  EXPECT_NE(c.status().message().find("1, 2, 3"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("(1048575 in total)"), std::string::npos) << c.status();
}

// Regression: a 2^62-element tensor made sections * section_numel * 4 wrap to 0, so a manifest
// with shard_bytes 0 and an empty shard was listed as committed.
TEST(ConsolidateGarbageTest, ShardSizeOverflowIsNotCommitted) {
  std::string dir = TmpDir("garbage_wrap");
  nlohmann::json m = GarbageManifest(1, {int64_t{1} << 62});
  m["shard_bytes"] = 0;
  PlantStep(dir, m, "");
  auto list = ListCheckpoints(dir);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_FALSE((*list)[0].committed);
  EXPECT_NE((*list)[0].commit_status.message().find("shard size overflows"), std::string::npos)
      << (*list)[0].commit_status;
  EXPECT_THAT(Consolidate(dir, 0, "", ConsolidateOptions()),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

// Regression: the shape product overflowed silently (undefined behaviour).
TEST(ConsolidateGarbageTest, ShapeProductOverflowIsNamed) {
  nlohmann::json m = GarbageManifest(1, {4});
  m["params"][0]["shape"] = {int64_t{1} << 31, int64_t{1} << 31, int64_t{1} << 31, 4};
  auto parsed = ManifestFromJson(m.dump());
  ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("manifest.params[w].shape: element count overflows"),
            std::string::npos)
      << parsed.status();
}

// Regression: integers were read with get<int64_t>(), which converts 1e30 or 2^64 silently.
TEST(ConsolidateGarbageTest, NonIntegerOrOutOfRangeNumbersAreRefused) {
  for (const char* field : {"shard_bytes", "section_numel", "step"}) {
    for (nlohmann::json bad : {nlohmann::json(1e30), nlohmann::json(18446744073709551615ull),
                               nlohmann::json(2.5), nlohmann::json("4")}) {
      nlohmann::json m = GarbageManifest(1, {4});
      m[field] = bad;
      auto parsed = ManifestFromJson(m.dump());
      EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
          << field << "=" << bad.dump();
    }
  }
  nlohmann::json m = GarbageManifest(1, {4});
  m["world_size"] = 4294967297;  // 2^32 + 1: was truncated to world_size 1
  EXPECT_EQ(ManifestFromJson(m.dump()).status().code(), absl::StatusCode::kInvalidArgument);
  m = GarbageManifest(1, {4});
  m["shard_crc32"] = -1;
  EXPECT_EQ(ManifestFromJson(m.dump()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ManifestFromJson(GarbageManifest(1, {4}).dump()).ok());
}

// Regression: a FIFO as manifest blocked ListCheckpoints forever, /dev/zero read until out of
// memory. Both are now reported as unreadable manifests (DATA_LOSS), at once.
TEST(ConsolidateGarbageTest, FifoOrDeviceManifestIsDataLossNotAHang) {
  std::string dir = TmpDir("garbage_fifo");
  std::string step_dir = absl::StrCat(dir, "/", StepDirName(1));
  ASSERT_TRUE(MakeDirs(step_dir).ok());
  ASSERT_EQ(::mkfifo(absl::StrCat(step_dir, "/rank_0.manifest.json").c_str(), 0600), 0);
  ASSERT_EQ(::symlink("/dev/zero", absl::StrCat(step_dir, "/rank_1.manifest.json").c_str()), 0);
  auto list = ListCheckpoints(dir);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  const absl::Status& st = (*list)[0].commit_status;
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("rank_0.manifest.json is not a regular file"), std::string::npos)
      << st;
  EXPECT_NE(st.message().find("rank_1.manifest.json is not a regular file"), std::string::npos)
      << st;
}

// A shard that is a FIFO (with a manifest claiming an empty shard) must not block Consolidate.
TEST(ConsolidateGarbageTest, FifoShardIsDataLossNotAHang) {
  std::string dir = TmpDir("garbage_fifo_shard");
  nlohmann::json m = GarbageManifest(1, {0});
  m["shard_crc32"] = 0;
  PlantStep(dir, m, "");
  std::string shard = absl::StrCat(dir, "/", StepDirName(1), "/rank_0.shard");
  ASSERT_EQ(::unlink(shard.c_str()), 0);
  ASSERT_EQ(::mkfifo(shard.c_str(), 0600), 0);
  auto c = Consolidate(dir, 1, "", ConsolidateOptions());
  ASSERT_EQ(c.status().code(), absl::StatusCode::kDataLoss) << c.status();
  EXPECT_NE(c.status().message().find("not a regular file"), std::string::npos) << c.status();
}

TEST(Bf16Test, RoundToNearestEvenKnownBitPatterns) {
  auto bf = [](uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, 4);
    return Fp32ToBf16(f);
  };
  EXPECT_EQ(bf(0x3f800000u), 0x3f80);  // 1.0
  EXPECT_EQ(bf(0xbf800000u), 0xbf80);  // -1.0
  EXPECT_EQ(bf(0x3f808000u), 0x3f80);  // exactly halfway, even below: stays
  EXPECT_EQ(bf(0x3f818000u), 0x3f82);  // exactly halfway, odd below: rounds up to even
  EXPECT_EQ(bf(0x3f808001u), 0x3f81);  // just above halfway: up
  EXPECT_EQ(bf(0x3f807fffu), 0x3f80);  // just below halfway: down
  EXPECT_EQ(bf(0x40490fdbu), 0x4049);  // pi -> 3.140625
  EXPECT_EQ(bf(0x00000000u), 0x0000);  // +0
  EXPECT_EQ(bf(0x80000000u), 0x8000);  // -0
  EXPECT_EQ(bf(0x00000001u), 0x0000);  // smallest denormal rounds to 0
  EXPECT_EQ(bf(0x00018000u), 0x0002);  // denormal tie to even
  EXPECT_EQ(bf(0x7f800000u), 0x7f80);  // +inf
  EXPECT_EQ(bf(0xff800000u), 0xff80);  // -inf
  EXPECT_EQ(bf(0x7f7fffffu), 0x7f80);  // FLT_MAX overflows to +inf
  EXPECT_EQ(bf(0x7f7f7fffu), 0x7f7f);  // largest value that stays finite
  EXPECT_EQ(bf(0x7fc01234u), 0x7fc0);  // NaN -> canonical quiet NaN
  EXPECT_EQ(bf(0xffc00001u), 0x7fc0);
  EXPECT_EQ(bf(0x7f800001u), 0x7fc0);  // signalling NaN (would round to inf) stays NaN
}

TEST(ShardSizeTest, ParsesDecimalAndBinaryUnits) {
  EXPECT_EQ(*ParseShardSize("5GB"), 5'000'000'000);
  EXPECT_EQ(*ParseShardSize("500MB"), 500'000'000);
  EXPECT_EQ(*ParseShardSize("1.5gb"), 1'500'000'000);
  EXPECT_EQ(*ParseShardSize("10KB"), 10'000);
  EXPECT_EQ(*ParseShardSize("2TB"), 2'000'000'000'000);
  EXPECT_EQ(*ParseShardSize("1GiB"), 1073741824);
  EXPECT_EQ(*ParseShardSize("123"), 123);
  EXPECT_EQ(*ParseShardSize("123B"), 123);
  EXPECT_EQ(*ParseShardSize(" 7 MB "), 7'000'000);
  EXPECT_EQ(*ParseShardSize(""), 0);
  for (const char* bad : {"GB", "5XB", "-5GB", "1.2.3GB", "abc", "0.1B", "99999999999TB"}) {
    auto s = ParseShardSize(bad);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.status().message().find("max_shard_size"), absl::string_view::npos) << bad;
  }
}

TEST(ShardSizeTest, OutputDtypeNames) {
  EXPECT_EQ(*NormalizeOutputDtype("bf16"), "BF16");
  EXPECT_EQ(*NormalizeOutputDtype("BF16"), "BF16");
  EXPECT_EQ(*NormalizeOutputDtype("bfloat16"), "BF16");
  EXPECT_EQ(*NormalizeOutputDtype("fp32"), "F32");
  EXPECT_EQ(*NormalizeOutputDtype(""), "F32");
  EXPECT_EQ(NormalizeOutputDtype("fp16").status().code(), absl::StatusCode::kInvalidArgument);
}

// huggingface_hub.split_torch_state_dict_into_shards on the same sizes (computed by hand from its
// algorithm): limit 10; a=4, b=5 fit (9); c=3 tips over -> new shard; big=12 > 10 is appended on
// its own at once, before the current shard is closed; d=7 joins c (10, not over).
TEST(PlanShardsTest, MatchesHuggingFaceSplit) {
  std::vector<std::pair<std::string, int64_t>> t = {{"a", 4}, {"b", 5}, {"c", 3}, {"big", 12},
                                                    {"d", 7}, {"e", 1}};
  std::vector<ShardPlanFile> plan = PlanShards(t, 10);
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan[0].tensors, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(plan[1].tensors, (std::vector<std::string>{"big"}));
  EXPECT_EQ(plan[2].tensors, (std::vector<std::string>{"c", "d"}));
  EXPECT_EQ(plan[3].tensors, (std::vector<std::string>{"e"}));
  EXPECT_EQ(plan[0].file_name, "model-00001-of-00004.safetensors");
  EXPECT_EQ(plan[3].file_name, "model-00004-of-00004.safetensors");
  EXPECT_EQ(plan[2].tensor_bytes, 10);

  std::vector<ShardPlanFile> one = PlanShards(t, 1000);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].file_name, "model.safetensors");
  EXPECT_EQ(one[0].tensor_bytes, 32);
  EXPECT_EQ(PlanShards(t, 0).size(), 1u);
  ASSERT_EQ(PlanShards({}, 10).size(), 1u);
}

TEST(ConsolidateTest, ShardedOutputWithIndex) {
  std::string dir = TmpDir("sharded");
  std::vector<FullParam> model = TestModel();  // 40, 84, 100, 4 bytes
  model.push_back({"lm_head.weight", {10}, Values(10, 5.0f)});
  const std::string tied =
      R"({"hidden_size":8,"model_type":"llama","tie_word_embeddings":true,"vocab_size":256})";
  WriteCheckpoint(dir, 3, 2, model, AllRanks(2), tied);
  model.pop_back();
  ConsolidateOptions options;
  options.max_shard_size_bytes = 90;
  std::string out = dir + "/out";
  // A previous single-file export in the same directory is replaced.
  ASSERT_TRUE(Consolidate(dir, 3, out).ok());
  ASSERT_EQ(::access((out + "/model.safetensors").c_str(), F_OK), 0);
  auto result = Consolidate(dir, 3, out, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(::access((out + "/model.safetensors").c_str(), F_OK), -1);
  // embed 40 + q 84 > 90 -> [embed] closed; up 100 > 90 -> a shard of its own at once; q 84 +
  // norm 4 = 88 <= 90 -> [q, norm] last.
  ASSERT_EQ(result->files.size(), 3u);
  EXPECT_EQ(result->files[0], out + "/model-00001-of-00003.safetensors");
  EXPECT_EQ(result->index_path, out + "/model.safetensors.index.json");
  EXPECT_EQ(result->safetensors_path, result->index_path);
  EXPECT_EQ(result->skipped_tensors, (std::vector<std::string>{"lm_head.weight"}));
  auto index_text = ReadFile(result->index_path);
  ASSERT_TRUE(index_text.ok());
  const std::string expected_index = R"({
  "metadata": {
    "total_size": 228
  },
  "weight_map": {
    "model.embed_tokens.weight": "model-00001-of-00003.safetensors",
    "model.layers.0.mlp.up_proj.weight": "model-00002-of-00003.safetensors",
    "model.layers.0.self_attn.q_proj.weight": "model-00003-of-00003.safetensors",
    "model.norm.weight": "model-00003-of-00003.safetensors"
  }
}
)";
  EXPECT_EQ(*index_text, expected_index);
  // Every tensor, bit-exact, in the file the index names.
  nlohmann::json index = nlohmann::json::parse(*index_text);
  for (const FullParam& p : model) {
    std::string file = out + "/" + index["weight_map"][p.name].get<std::string>();
    auto reader = safetensors::Reader::Open(file);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ((*reader)->metadata().at("format"), "pt");
    auto bytes = (*reader)->ReadTensor(p.name);
    ASSERT_TRUE(bytes.ok()) << p.name;
    EXPECT_EQ(std::memcmp(bytes->data(), p.values.data(), bytes->size()), 0) << p.name;
  }
  EXPECT_FALSE(HasTmpFiles(out));

  // Back to a single file: the shards and the index of the sharded export go.
  ASSERT_TRUE(Consolidate(dir, 3, out).ok());
  EXPECT_EQ(::access(result->index_path.c_str(), F_OK), -1);
  EXPECT_EQ(::access(result->files[0].c_str(), F_OK), -1);
  ExpectModelEquals(out + "/model.safetensors", model);
}

TEST(ConsolidateTest, Bf16OutputIsRoundedMasterWeights) {
  std::string dir = TmpDir("bf16");
  std::vector<FullParam> model = TestModel();
  WriteCheckpoint(dir, 9, 3, model, AllRanks(3));
  ConsolidateOptions options;
  options.dtype = "bf16";
  options.io_buffer_bytes = 6;  // rounded to 8: two floats per read
  auto result = Consolidate(dir, 9, dir + "/out", options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->dtype, "BF16");
  EXPECT_EQ(result->tensor_bytes, (10 + 21 + 25 + 1) * 2);
  auto reader = safetensors::Reader::Open(result->safetensors_path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (const FullParam& p : model) {
    const safetensors::TensorEntry* e = (*reader)->Find(p.name);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->dtype, "BF16");
    EXPECT_EQ(e->shape, p.shape);
    auto bytes = (*reader)->ReadTensor(p.name);
    ASSERT_TRUE(bytes.ok());
    ASSERT_EQ(bytes->size(), p.values.size() * 2);
    for (size_t i = 0; i < p.values.size(); ++i) {
      uint16_t got;
      std::memcpy(&got, bytes->data() + 2 * i, 2);
      EXPECT_EQ(got, Fp32ToBf16(p.values[i])) << p.name << "[" << i << "]";
    }
  }
  // A concrete value: model.norm.weight = {4.0 + 0 - 3.0} = 1.0 -> 0x3f80.
  auto norm = (*reader)->ReadTensor("model.norm.weight");
  ASSERT_TRUE(norm.ok());
  EXPECT_EQ(static_cast<unsigned char>((*norm)[0]), 0x80);
  EXPECT_EQ(static_cast<unsigned char>((*norm)[1]), 0x3f);
}

// Issue 49: a bf16 export of a step went to the fp32 export's folder (<step>/hf), replacing it,
// and its config.json said "torch_dtype": "float32". Each dtype has its own default folder, and
// config.json names the dtype written (under transformers 5's "dtype" too when the config has it).
TEST(ConsolidateTest, Bf16AndFp32ExportsOfAStepLiveSideBySideWithTheirOwnDtype) {
  std::string dir = TmpDir("bf16_beside_fp32");
  std::vector<FullParam> model = TestModel();
  nlohmann::json config = nlohmann::json::parse(kConfig);
  config["dtype"] = "float32";  // transformers 5 writes this key
  WriteCheckpoint(dir, 9, 2, model, AllRanks(2), config.dump());
  auto fp32 = Consolidate(dir, 9, "");
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  ConsolidateOptions options;
  options.dtype = "bf16";
  auto bf16 = Consolidate(dir, 9, "", options);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(fp32->output_dir, dir + "/step_00000009/hf");
  EXPECT_EQ(bf16->output_dir, dir + "/step_00000009/hf-bf16");
  ExpectModelEquals(fp32->safetensors_path, model);  // the fp32 export is still whole
  for (const auto& [result, want] : {std::pair{&*fp32, "float32"}, std::pair{&*bf16, "bfloat16"}}) {
    auto text = ReadFile(result->config_path);
    ASSERT_TRUE(text.ok()) << text.status();
    nlohmann::json written = nlohmann::json::parse(*text);
    EXPECT_EQ(written["torch_dtype"], want) << result->config_path;
    EXPECT_EQ(written["dtype"], want) << result->config_path;
  }
}

TEST(ConsolidateTest, UnknownOutputDtypeIsInvalidArgument) {
  std::string dir = TmpDir("bad_dtype");
  WriteCheckpoint(dir, 9, 1, TestModel(), AllRanks(1));
  ConsolidateOptions bad;
  bad.dtype = "int8";
  EXPECT_EQ(Consolidate(dir, 9, dir + "/out2", bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(VerifyCheckpointDirTest, CommittedPartialAndCorrupt) {
  std::string dir = TmpDir("verifydir");
  WriteCheckpoint(dir, 10, 2, TestModel(), AllRanks(2));
  auto ok = VerifyCheckpointDir(dir + "/step_00000010/");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->world_size, 2);
  WriteCheckpoint(dir, 20, 2, TestModel(), {1});
  ExpectStatus(VerifyCheckpointDir(dir + "/step_00000020").status(),
               absl::StatusCode::kFailedPrecondition, "missing ranks 0");
  // Flip one byte of rank 1's shard (same size): only the CRC catches it.
  std::string shard = dir + "/step_00000010/rank_1.shard";
  std::string bytes = *ReadFile(shard);
  bytes[bytes.size() / 2] ^= 0x10;
  ASSERT_TRUE(WriteFileAtomically(shard, bytes).ok());
  ExpectStatus(VerifyCheckpointDir(dir + "/step_00000010").status(), absl::StatusCode::kDataLoss,
               "rank_1.shard (rank 1): CRC-32");
  ExpectStatus(VerifyCheckpointDir(dir + "/step_00000099").status(), absl::StatusCode::kNotFound,
               "step_00000099");
  EXPECT_EQ(VerifyCheckpointDir(dir).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::storage
