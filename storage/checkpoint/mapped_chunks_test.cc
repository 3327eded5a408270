#include "storage/checkpoint/mapped_chunks.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"

namespace loom::storage {
namespace {

using ::loom::testing::IsOk;
using ::loom::testing::StatusIs;

class MappedChunksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = absl::StrCat(::testing::TempDir(), "/mapped_chunks_", ::getpid());
    std::mt19937 gen(3);
    bytes_.resize(3 * 4096 + 123);  // not a whole number of pages
    for (char& c : bytes_) c = static_cast<char>(gen());
    ASSERT_TRUE(WriteFileAtomically(path_, bytes_).ok());
    fd_ = ::open(path_.c_str(), O_RDONLY);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  std::string path_;
  std::string bytes_;
  int fd_ = -1;
};

// The chunks cover exactly [offset, offset + size), in order, each at most chunk_bytes, with the
// file's bytes (reference: the bytes written), for starts inside and across pages and chunk sizes
// below, at and above the page size.
TEST_F(MappedChunksTest, ChunksCoverTheRangeInOrderWithTheFilesBytes) {
  const int64_t total = static_cast<int64_t>(bytes_.size());
  for (int64_t offset : {int64_t{0}, int64_t{1}, int64_t{4095}, int64_t{4096}, int64_t{5000}}) {
    for (size_t chunk : {size_t{1}, size_t{7}, size_t{4096}, size_t{10000}, size_t{1} << 20}) {
      const int64_t size = total - offset - 17;
      std::string seen;
      size_t calls = 0;
      ASSERT_THAT(ForEachMappedChunk(fd_, offset, size, chunk, path_,
                                   [&](const char* data, size_t n) {
                                     EXPECT_LE(n, chunk);
                                     EXPECT_GT(n, 0u);
                                     seen.append(data, n);
                                     ++calls;
                                     return absl::OkStatus();
                                   }),
                  IsOk());
      ASSERT_EQ(seen, bytes_.substr(static_cast<size_t>(offset), static_cast<size_t>(size)))
          << "offset " << offset << " chunk " << chunk;
      EXPECT_EQ(calls, (static_cast<size_t>(size) + chunk - 1) / chunk);
    }
  }
}

TEST_F(MappedChunksTest, EmptyRangeCallsNothing) {
  bool called = false;
  ASSERT_THAT(ForEachMappedChunk(fd_, 10, 0, 4, path_, [&](const char*, size_t) {
    called = true;
    return absl::OkStatus();
  }),
              IsOk());
  EXPECT_FALSE(called);
}

// A range past the end of the file is DATA_LOSS naming the file, before any chunk is handed out
// (a map past EOF would fault with SIGBUS).
TEST_F(MappedChunksTest, RangePastTheEndIsDataLossBeforeAnyChunk) {
  bool called = false;
  absl::Status s = ForEachMappedChunk(fd_, 100, static_cast<int64_t>(bytes_.size()), 64, path_,
                                      [&](const char*, size_t) {
                                        called = true;
                                        return absl::OkStatus();
                                      });
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss, path_ + ": ends at byte"));
  EXPECT_FALSE(called);
}

TEST_F(MappedChunksTest, CallbackErrorStopsAndIsReturned) {
  int calls = 0;
  absl::Status s = ForEachMappedChunk(fd_, 0, 1000, 100, path_, [&](const char*, size_t) {
    return ++calls == 3 ? absl::ResourceExhaustedError("disk full") : absl::OkStatus();
  });
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted, "disk full"));
  EXPECT_EQ(calls, 3);
}

TEST_F(MappedChunksTest, BadArgumentsAreInvalidArgument) {
  auto fn = [](const char*, size_t) { return absl::OkStatus(); };
  EXPECT_THAT(ForEachMappedChunk(fd_, -1, 10, 4, path_, fn),
              StatusIs(absl::StatusCode::kInvalidArgument, "offset -1"));
  EXPECT_THAT(ForEachMappedChunk(fd_, 0, -5, 4, path_, fn),
              StatusIs(absl::StatusCode::kInvalidArgument, "size -5"));
  EXPECT_THAT(ForEachMappedChunk(fd_, 0, 10, 0, path_, fn),
              StatusIs(absl::StatusCode::kInvalidArgument, "chunk_bytes 0"));
}

// CopyRangeMapped puts exactly the range at the output offset (after 5 header bytes written
// first), advances the offset, and hands the checksum callback the same bytes, chunk by chunk.
TEST_F(MappedChunksTest, CopyRangeMappedCopiesTheRangeAfterShowingIt) {
  const std::string out_path = path_ + ".out";
  const int out = ::open(out_path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(out, 0);
  ASSERT_EQ(::pwrite(out, "HEAD!", 5, 0), 5);
  int64_t pos = 5;
  std::string shown;
  const int64_t offset = 4095, size = static_cast<int64_t>(bytes_.size()) - 4095 - 3;
  ASSERT_THAT(CopyRangeMapped(fd_, offset, size, 1000, path_, out, &pos, out_path,
                              [&](const char* data, size_t n) {
                                shown.append(data, n);
                                return absl::OkStatus();
                              }),
              IsOk());
  ::close(out);
  EXPECT_EQ(pos, 5 + size);
  const std::string want = bytes_.substr(static_cast<size_t>(offset), static_cast<size_t>(size));
  EXPECT_EQ(shown, want);
  auto written = ReadFile(out_path);
  ASSERT_TRUE(written.ok());
  EXPECT_EQ(*written, "HEAD!" + want);
  ::unlink(out_path.c_str());
}

// A callback error stops the copy before that chunk is copied.
TEST_F(MappedChunksTest, CopyRangeMappedStopsOnCallbackError) {
  const std::string out_path = path_ + ".out2";
  const int out = ::open(out_path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(out, 0);
  int64_t pos = 0;
  int calls = 0;
  absl::Status s = CopyRangeMapped(fd_, 0, 1000, 100, path_, out, &pos, out_path,
                                   [&](const char*, size_t) {
                                     return ++calls == 4 ? absl::DataLossError("bad crc")
                                                         : absl::OkStatus();
                                   });
  ::close(out);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss, "bad crc"));
  EXPECT_EQ(pos, 300);
  ::unlink(out_path.c_str());
}

}  // namespace
}  // namespace loom::storage
