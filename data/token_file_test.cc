#include "data/token_file.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::data {
namespace {

using ::loom::testing::StatusIs;

std::string TmpDir(const std::string& name) {
  std::string d = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  ::mkdir(d.c_str(), 0755);
  return d;
}

// Little-endian bytes written one by one (independent of TokenStream's decoder).
void WriteTokens(const std::string& path, const std::vector<uint32_t>& ids, int width) {
  std::ofstream f(path, std::ios::binary);
  for (uint32_t id : ids) {
    for (int b = 0; b < width; ++b) f.put(static_cast<char>((id >> (8 * b)) & 0xff));
  }
}

TEST(TokenFileTest, Uint16DirectoryIsConcatenatedInNameOrder) {
  const std::string dir = TmpDir("u16");
  WriteTokens(dir + "/b.bin", {7, 65535, 2}, 2);
  WriteTokens(dir + "/a.bin", {300, 1, 2}, 2);
  std::ofstream(dir + "/notes.txt") << "not a token file";
  absl::StatusOr<TokenStream> s = MapTokenFiles(dir, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 6);
  EXPECT_EQ(s->Slice(0, 6), (std::vector<int64_t>{300, 1, 2, 7, 65535, 2}));
  // A window across the file boundary.
  EXPECT_EQ(s->Slice(2, 3), (std::vector<int64_t>{2, 7, 65535}));
  EXPECT_EQ(s->Locate(4), dir + "/b.bin byte offset 2");
  TokenStream tail = s->Sub(4, 6);
  EXPECT_EQ(tail.Slice(0, 2), (std::vector<int64_t>{65535, 2}));
  EXPECT_EQ(tail.Locate(1), dir + "/b.bin byte offset 4");
}

TEST(TokenFileTest, Uint32ValuesAboveSixteenBits) {
  const std::string dir = TmpDir("u32");
  WriteTokens(dir + "/t.bin", {70000, 0, 4294967295u}, 4);
  absl::StatusOr<TokenStream> s = MapTokenFiles(dir + "/t.bin", 4);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->Slice(0, 3), (std::vector<int64_t>{70000, 0, 4294967295LL}));
}

TEST(TokenFileTest, SizeNotAMultipleOfTheWidthNamesFileAndOffset) {
  const std::string dir = TmpDir("odd");
  const std::string path = dir + "/t.bin";
  {
    std::ofstream f(path, std::ios::binary);
    f.write("\x01\x00\x02\x00\x03", 5);
  }
  EXPECT_THAT(MapTokenFiles(path, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       path + ": size 5 bytes is not a multiple of the token width 2"));
  EXPECT_THAT(MapTokenFiles(path, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, "starts at byte offset 4"));
}

TEST(TokenFileTest, TokenIdAtOrAboveVocabSizeNamesFileAndByteOffset) {
  const std::string dir = TmpDir("vocab");
  const std::string path = dir + "/t.bin";
  WriteTokens(path, {5, 9, 999, 1000, 3}, 2);
  absl::StatusOr<TokenStream> s = MapTokenFiles(path, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(ValidateTokenIds(*s, 0, 3, 1000).ok());
  EXPECT_THAT(ValidateTokenIds(*s, 0, 5, 1000),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "dataset.path: " + path + " byte offset 6: token id 1000 >= vocab_size 1000"));
}

TEST(TokenFileTest, MissingPathAndDirectoryWithoutBinFiles) {
  EXPECT_THAT(MapTokenFiles("/nonexistent/tokens.bin", 2),
              StatusIs(absl::StatusCode::kNotFound, "/nonexistent/tokens.bin"));
  EXPECT_THAT(MapTokenFiles(TmpDir("nobin"), 2),
              StatusIs(absl::StatusCode::kFailedPrecondition, "no .bin token files"));
  EXPECT_THAT(TokenWidthFromDtype("int8"),
              StatusIs(absl::StatusCode::kInvalidArgument, "dataset.token_dtype"));
}

TEST(TokenFileTest, HoldoutCutFallsAfterAnEos) {
  const std::string path = TmpDir("cut") + "/t.bin";
  // Documents [10 11 2] [12 13 14 2] [15 2], eos = 2. 9 tokens with 0.3 held out: position 6;
  // the last EOS among tokens 0..5 is token 2, so the held-out side starts at token 3.
  WriteTokens(path, {10, 11, 2, 12, 13, 14, 2, 15, 2}, 2);
  absl::StatusOr<TokenStream> s = MapTokenFiles(path, 2);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(TokenHoldoutCut(*s, 0.3, 2), 3);
  EXPECT_EQ(TokenHoldoutCut(*s, 0.3, -1), 6);
}

}  // namespace
}  // namespace loom::data
