#include "storage/checkpoint/shard_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"

namespace loom::storage {
namespace {

using ::loom::testing::StatusIs;

std::string NewDir(const std::string& name) {
  std::string dir = absl::StrCat(::testing::TempDir(), "/", name, "_", ::getpid());
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

ShardManifest ThreeParams() {
  ShardManifest m;
  m.world_size = 2;
  m.rank = 1;
  m.sections = {"fp32_params", "exp_avg", "exp_avg_sq"};
  m.params = {{"a", {7}, 7, 0, 0}, {"b", {2, 3}, 6, 0, 0}, {"c", {1}, 1, 0, 0}};
  AssignPartitionLayout(m);  // partitions 4, 3, 1: section_numel 8
  return m;
}

float Value(size_t section, int64_t i) { return 1000.0f * section + 0.5f * i; }

// The shard format's checksum is zlib's crc32 (manifests written before the ISA-L switch must
// still verify): Crc32 equals zlib's crc32 byte for byte, for every length 0..300 (the vector
// code's head/tail handling), odd offsets (unaligned starts), a 5 MiB buffer, and chained in
// pieces; and the known CRC-32 check value of "123456789" (0xCBF43926).
TEST(Crc32Test, EqualsZlibCrc32) {
  std::mt19937 gen(7);
  std::vector<unsigned char> data((5 << 20) + 3);
  for (unsigned char& b : data) b = static_cast<unsigned char>(gen());
  EXPECT_EQ(Crc32(0, "123456789", 9), 0xCBF43926u);
  EXPECT_EQ(Crc32(0, nullptr, 0), 0u);
  for (size_t n = 0; n <= 300; ++n) {
    for (size_t start : {0, 1, 3}) {
      ASSERT_EQ(Crc32(0, data.data() + start, n),
                static_cast<uint32_t>(::crc32(0, data.data() + start, static_cast<uInt>(n))))
          << "length " << n << " start " << start;
    }
  }
  const uint32_t whole = static_cast<uint32_t>(::crc32(0, data.data(), static_cast<uInt>(data.size())));
  EXPECT_EQ(Crc32(0, data.data(), data.size()), whole);
  uint32_t chained = 0;
  size_t pos = 0;
  for (size_t piece : {1, 7, 64, 4095, 1 << 20, 333}) {
    chained = Crc32(chained, data.data() + pos, piece);
    pos += piece;
  }
  chained = Crc32(chained, data.data() + pos, data.size() - pos);
  EXPECT_EQ(chained, whole);
}

// Pieces give byte-identical files to the contiguous writer, and the reader hands back every
// element once, in order.
TEST(ShardPiecesTest, WriteAndReadByPiecesMatchTheContiguousFormat) {
  ShardManifest m = ThreeParams();
  ASSERT_EQ(m.section_numel, 8);
  std::vector<std::vector<float>> sec(3, std::vector<float>(8));
  for (size_t s = 0; s < 3; ++s) {
    for (int64_t i = 0; i < 8; ++i) sec[s][i] = Value(s, i);
  }
  const float* ptrs[3] = {sec[0].data(), sec[1].data(), sec[2].data()};
  const std::string a = NewDir("contiguous"), b = NewDir("pieces");
  ASSERT_TRUE(WriteShard(a, m, absl::MakeConstSpan(ptrs, 3)).ok());
  const std::vector<int64_t> ends = {4, 7, 8};  // one piece per parameter partition
  int calls = 0;
  ASSERT_TRUE(WriteShardPieces(b, m, ends,
                               [&](size_t s, size_t k, int64_t off, int64_t n, float* dst) {
                                 EXPECT_EQ(off, k == 0 ? 0 : ends[k - 1]);
                                 for (int64_t i = 0; i < n; ++i) dst[i] = Value(s, off + i);
                                 ++calls;
                                 return absl::OkStatus();
                               })
                  .ok());
  EXPECT_EQ(calls, 9);
  auto fa = ReadFile(a + "/" + ShardFileName(1));
  auto fb = ReadFile(b + "/" + ShardFileName(1));
  ASSERT_TRUE(fa.ok() && fb.ok());
  EXPECT_EQ(*fa, *fb);
  absl::StatusOr<ShardManifest> mb = ReadManifest(b, 1);
  ASSERT_TRUE(mb.ok()) << mb.status();
  EXPECT_EQ(mb->shard_crc32, ReadManifest(a, 1)->shard_crc32);

  std::vector<std::vector<float>> got(3);
  ASSERT_TRUE(ReadShardPieces(b, *mb, ends,
                              [&](size_t s, size_t, int64_t off, int64_t n, const float* src) {
                                EXPECT_EQ(static_cast<int64_t>(got[s].size()), off);
                                got[s].insert(got[s].end(), src, src + n);
                                return absl::OkStatus();
                              })
                  .ok());
  EXPECT_EQ(got, sec);
}

TEST(ShardPiecesTest, CorruptShardIsRejectedBeforeAnythingIsConsumed) {
  ShardManifest m = ThreeParams();
  const std::string dir = NewDir("corrupt");
  const std::vector<int64_t> ends = {8};
  ASSERT_TRUE(WriteShardPieces(dir, m, ends,
                               [](size_t, size_t, int64_t, int64_t n, float* dst) {
                                 for (int64_t i = 0; i < n; ++i) dst[i] = 1.0f;
                                 return absl::OkStatus();
                               })
                  .ok());
  absl::StatusOr<ShardManifest> mm = ReadManifest(dir, 1);
  ASSERT_TRUE(mm.ok());
  {  // flip one byte in the last section
    std::fstream f(dir + "/" + ShardFileName(1), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(80);
    f.put('\x7f');
  }
  int consumed = 0;
  absl::Status s = ReadShardPieces(dir, *mm, ends,
                                   [&](size_t, size_t, int64_t, int64_t, const float*) {
                                     ++consumed;
                                     return absl::OkStatus();
                                   });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("rank_1.shard"), std::string::npos) << s;
  EXPECT_EQ(consumed, 0);
  // A truncated file: DATA_LOSS naming the sizes.
  ASSERT_EQ(::truncate((dir + "/" + ShardFileName(1)).c_str(), 40), 0);
  s = ReadShardPieces(dir, *mm, ends, [&](size_t, size_t, int64_t, int64_t, const float*) {
    return absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

TEST(ShardPiecesTest, BadPiecesAndProducerErrorsCommitNothing) {
  ShardManifest m = ThreeParams();
  const std::string dir = NewDir("bad");
  auto fill = [](size_t, size_t, int64_t, int64_t, float*) { return absl::OkStatus(); };
  for (std::vector<int64_t> ends : {std::vector<int64_t>{4, 4, 8}, std::vector<int64_t>{4, 7},
                                    std::vector<int64_t>{}}) {
    EXPECT_EQ(WriteShardPieces(dir, m, ends, fill).code(), absl::StatusCode::kInvalidArgument);
  }
  absl::Status s = WriteShardPieces(dir, m, std::vector<int64_t>{8},
                                    [](size_t s, size_t, int64_t, int64_t, float*) {
                                      return s == 2 ? absl::UnavailableError("disk gone")
                                                    : absl::OkStatus();
                                    });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(ReadManifest(dir, 1),  // no manifest: nothing committed
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_NE(::access((dir + "/" + ShardFileName(1)).c_str(), F_OK), 0);
}

TEST(ManifestSideFilesTest, RoundTripAbsentWhenEmptyAndPlainNamesOnly) {
  ShardManifest m = ThreeParams();
  m.shard_bytes = 96;
  const std::string without = ManifestToJson(m);
  EXPECT_EQ(without.find("side_files"), std::string::npos);  // old manifests stay byte-identical
  m.side_files = {{"zenflow_rank1.bin", 1234, 0xdeadbeefu}, {"empty.bin", 0, 0}};
  auto back = ManifestFromJson(ManifestToJson(m));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->side_files, m.side_files);
  for (const char* name : {"", ".", "..", "../rank_0.shard", "a/b", "/etc/passwd"}) {
    m.side_files = {{name, 1, 1}};
    EXPECT_THAT(ManifestFromJson(ManifestToJson(m)),
                StatusIs(absl::StatusCode::kInvalidArgument, "not a plain file name"))
        << "'" << name << "'";
  }
  m.side_files = {{"x.bin", -1, 1}};
  EXPECT_THAT(ManifestFromJson(ManifestToJson(m)),
              StatusIs(absl::StatusCode::kInvalidArgument, "negative bytes"));
}

// Regression (break-it pass, 2026-12-05): a truncated manifest was INVALID_ARGUMENT, which the
// trainer reports as a configuration error (exit 78: the job failed at once, never restarted
// from an older checkpoint). A damaged manifest is DATA_LOSS naming the file.
TEST(ReadManifestTest, DamagedManifestIsDataLossNamingTheFile) {
  ShardManifest m = ThreeParams();
  const std::string dir = NewDir("damaged_manifest");
  ASSERT_TRUE(WriteShardPieces(dir, m, std::vector<int64_t>{8},
                               [](size_t, size_t, int64_t, int64_t n, float* dst) {
                                 std::fill(dst, dst + n, 0.5f);
                                 return absl::OkStatus();
                               })
                  .ok());
  const std::string path = dir + "/" + ManifestFileName(1);
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_TRUE(ReadManifest(dir, 1).ok());
  std::ofstream(path, std::ios::trunc) << text.substr(0, text.size() / 2);
  EXPECT_THAT(ReadManifest(dir, 1), StatusIs(absl::StatusCode::kDataLoss, path));
  std::filesystem::rename(dir + "/" + ShardFileName(1), dir + "/" + ShardFileName(0));
  std::ofstream(dir + "/" + ManifestFileName(0), std::ios::trunc) << text;  // says rank 1
  EXPECT_THAT(ReadManifest(dir, 0), StatusIs(absl::StatusCode::kDataLoss, "manifest.rank is 1"));
}

TEST(StepDirNameTest, ParsesExactlyWhatItWrites) {
  EXPECT_EQ(ParseStepDirName(StepDirName(100)), std::optional<int64_t>(100));
  EXPECT_EQ(ParseStepDirName("step_00000000"), std::optional<int64_t>(0));
  EXPECT_EQ(ParseStepDirName(StepDirName(123456789012)), std::optional<int64_t>(123456789012));
  for (const char* other : {"step_100", "step_-0000001", "step_0000010x", "hf", "step_", ""}) {
    EXPECT_EQ(ParseStepDirName(other), std::nullopt) << other;
  }
}

}  // namespace
}  // namespace loom::storage
