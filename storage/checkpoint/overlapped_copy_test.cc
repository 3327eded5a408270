#include "storage/checkpoint/overlapped_copy.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

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

// The independent reference: zlib's crc32 (the code under test uses ISA-L through Crc32).
uint32_t ZlibCrc(const std::string& bytes) {
  return static_cast<uint32_t>(
      ::crc32(::crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()),
              static_cast<uInt>(bytes.size())));
}

std::string ReadAll(const std::string& path) {
  auto text = ReadFile(path);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

class OverlappedCopyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/overlapped_copy_", ::getpid());
    ASSERT_TRUE(MakeDirs(dir_).ok());
    std::mt19937 gen(11);
    for (int f = 0; f < 2; ++f) {
      std::string bytes(5 * 4096 + 321 * (f + 1), '\0');  // not whole pages
      for (char& c : bytes) c = static_cast<char>(gen());
      paths_.push_back(absl::StrCat(dir_, "/in_", f));
      ASSERT_TRUE(WriteFileAtomically(paths_.back(), bytes).ok());
      contents_.push_back(bytes);
      fds_.push_back(::open(paths_.back().c_str(), O_RDONLY | O_CLOEXEC));
      ASSERT_GE(fds_.back(), 0);
    }
    out_path_ = dir_ + "/out";
  }
  void TearDown() override {
    for (int fd : fds_) ::close(fd);
  }
  int OpenOut(int flags = O_WRONLY | O_CREAT | O_TRUNC) {
    return ::open(out_path_.c_str(), flags | O_CLOEXEC, 0644);
  }
  CopySpan Span(int f, int64_t offset, int64_t size) {
    return {fds_[f], &paths_[f], offset, size};
  }

  std::string dir_;
  std::string out_path_;
  std::vector<std::string> paths_;
  std::vector<std::string> contents_;
  std::vector<int> fds_;
};

// Spans alternating between two files, starting inside and across pages, with empty ones, copied
// after a header: the output is the header and the spans' bytes in order, and each CRC-32 equals
// zlib's of that span, for chunks below, at and above the page size and windows of 1..3 chunks.
TEST_F(OverlappedCopyTest, OutputIsTheSpansInOrderAndEachCrcIsZlibs) {
  const std::vector<CopySpan> spans = {Span(0, 0, 4096),   Span(1, 17, 9000), Span(0, 4096, 0),
                                       Span(0, 5000, 12345), Span(1, 1, 1),   Span(1, 9017, 11000)};
  std::string want = "HEADER";
  for (const CopySpan& s : spans) {
    want += contents_[s.fd == fds_[0] ? 0 : 1].substr(static_cast<size_t>(s.offset),
                                                    static_cast<size_t>(s.size));
  }
  for (size_t chunk : {size_t{7}, size_t{4096}, size_t{6000}, size_t{1} << 20}) {
    for (int lookahead : {1, 2, 3}) {
      SCOPED_TRACE(absl::StrCat("chunk ", chunk, " lookahead ", lookahead));
      const int out = OpenOut();
      ASSERT_GE(out, 0);
      ASSERT_EQ(::pwrite(out, "HEADER", 6, 0), 6);
      int64_t pos = 6;
      OverlappedCopyOptions options;
      options.chunk_bytes = chunk;
      options.lookahead_chunks = lookahead;
      size_t reported = 0;
      options.after_chunk = [&](size_t n) { reported += n; };
      std::vector<uint32_t> crcs;
      ASSERT_THAT(CopySpansOverlapped(spans, out, &pos, out_path_, options, &crcs), IsOk());
      ::close(out);
      EXPECT_EQ(pos, static_cast<int64_t>(want.size()));
      EXPECT_EQ(reported, want.size() - 6);
      EXPECT_EQ(ReadAll(out_path_), want);
      ASSERT_EQ(crcs.size(), spans.size());
      for (size_t i = 0; i < spans.size(); ++i) {
        const std::string& c = contents_[spans[i].fd == fds_[0] ? 0 : 1];
        EXPECT_EQ(crcs[i], ZlibCrc(c.substr(static_cast<size_t>(spans[i].offset),
                                            static_cast<size_t>(spans[i].size))))
            << "span " << i;
      }
    }
  }
}

// checksum = false: the same bytes, no checker, crcs untouched.
TEST_F(OverlappedCopyTest, WithoutChecksumOnlyCopies) {
  const int out = OpenOut();
  ASSERT_GE(out, 0);
  int64_t pos = 0;
  OverlappedCopyOptions options;
  options.chunk_bytes = 4096;
  options.checksum = false;
  std::vector<uint32_t> crcs = {42};
  ASSERT_THAT(CopySpansOverlapped({Span(1, 3, 10000)}, out, &pos, out_path_, options, &crcs),
              IsOk());
  ::close(out);
  EXPECT_EQ(ReadAll(out_path_), contents_[1].substr(3, 10000));
  EXPECT_EQ(crcs, std::vector<uint32_t>{42});
}

// A span past the end of its file: DATA_LOSS naming the file, before anything is written.
TEST_F(OverlappedCopyTest, ShortInputIsDataLossNamingTheFileAndNothingIsWritten) {
  const int out = OpenOut();
  ASSERT_GE(out, 0);
  int64_t pos = 0;
  std::vector<uint32_t> crcs;
  const int64_t size1 = static_cast<int64_t>(contents_[1].size());
  EXPECT_THAT(CopySpansOverlapped({Span(0, 0, 100), Span(1, size1 - 10, 11)}, out, &pos,
                                  out_path_, OverlappedCopyOptions(), &crcs),
              StatusIs(absl::StatusCode::kDataLoss,
                       absl::StrCat(paths_[1], ": ends at byte ", size1, ", expected at least ",
                                    size1 + 1)));
  ::close(out);
  EXPECT_EQ(pos, 0);
  EXPECT_EQ(ReadAll(out_path_), "");
}

// An output that cannot be written (opened read-only): the copy's error names the output, and
// the checker thread, blocked on its window, is stopped and joined (the call returns).
TEST_F(OverlappedCopyTest, OutputErrorNamesTheOutputAndStopsTheChecker) {
  ASSERT_TRUE(WriteFileAtomically(out_path_, "").ok());
  const int out = OpenOut(O_RDONLY);
  ASSERT_GE(out, 0);
  int64_t pos = 0;
  OverlappedCopyOptions options;
  options.chunk_bytes = 7;  // thousands of chunks, window of one
  options.lookahead_chunks = 1;
  std::vector<uint32_t> crcs;
  EXPECT_THAT(CopySpansOverlapped({Span(0, 0, 20000)}, out, &pos, out_path_, options, &crcs),
              StatusIs(absl::StatusCode::kInternal, out_path_));
  ::close(out);
}

TEST_F(OverlappedCopyTest, BadOptionsAndSpansAreInvalidArgument) {
  const int out = OpenOut();
  ASSERT_GE(out, 0);
  int64_t pos = 0;
  std::vector<uint32_t> crcs;
  OverlappedCopyOptions zero_chunk;
  zero_chunk.chunk_bytes = 0;
  EXPECT_THAT(CopySpansOverlapped({Span(0, 0, 1)}, out, &pos, out_path_, zero_chunk, &crcs),
              StatusIs(absl::StatusCode::kInvalidArgument, "chunk_bytes 0"));
  OverlappedCopyOptions zero_window;
  zero_window.lookahead_chunks = 0;
  EXPECT_THAT(CopySpansOverlapped({Span(0, 0, 1)}, out, &pos, out_path_, zero_window, &crcs),
              StatusIs(absl::StatusCode::kInvalidArgument, "lookahead_chunks 0"));
  EXPECT_THAT(CopySpansOverlapped({Span(0, -1, 1)}, out, &pos, out_path_,
                                  OverlappedCopyOptions(), &crcs),
              StatusIs(absl::StatusCode::kInvalidArgument, "span 0: offset -1"));
  ::close(out);
}

}  // namespace
}  // namespace loom::storage
