#include "worker/engine/offload/nvme_swapper.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::engine::offload {
namespace {

using ::loom::testing::StatusIs;

std::string TmpDir(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

std::vector<char> RandomBytes(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<char> v(n);
  for (char& c : v) c = static_cast<char>(gen());
  return v;
}

NvmeSwapperOptions Options(const std::string& name, bool direct) {
  NvmeSwapperOptions o;
  o.dir = TmpDir(name);
  o.buffer_count = 3;
  o.buffer_bytes = 4 << 20;
  o.direct_io = direct;
  o.queue_depth = 4;
  o.chunk_bytes = 64 << 10;  // small chunks: many submissions per record
  return o;
}

class SwapperRoundTrip : public ::testing::TestWithParam<bool> {};  // O_DIRECT?

TEST_P(SwapperRoundTrip, AsyncWritesThenReadsAreBitExact) {
  auto sw = NvmeSwapper::Create(Options(GetParam() ? "rt_direct" : "rt_buffered", GetParam()));
  ASSERT_TRUE(sw.ok()) << sw.status();
  NvmeSwapper& s = **sw;
  const std::vector<int64_t> sizes = {1, 4095, 4096, 4097, 3 * 1000 * 1000 + 13, 0, 777};
  auto a = s.AddStream("exp_avg", sizes);
  auto b = s.AddStream("exp_avg_sq", sizes);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(s.direct_io(*a), GetParam());
  std::vector<std::vector<char>> want;
  // More writes than buffers: Acquire must wait for in-flight writes and reuse their buffers.
  for (int stream : {*a, *b}) {
    for (size_t r = 0; r < sizes.size(); ++r) {
      want.push_back(RandomBytes(sizes[r], static_cast<uint32_t>(stream * 100 + r)));
      auto buf = s.Acquire();
      ASSERT_TRUE(buf.ok()) << buf.status();
      std::memcpy(s.data(*buf), want.back().data(), sizes[r]);
      ASSERT_TRUE(s.WriteAsync(stream, r, *buf).ok());
    }
  }
  ASSERT_TRUE(s.Flush().ok());
  // Reads in flight two at a time, in reverse order.
  size_t k = want.size();
  for (int stream : {*b, *a}) {
    for (int64_t r = static_cast<int64_t>(sizes.size()) - 1; r >= 0; --r) {
      --k;
      auto buf = s.Acquire();
      ASSERT_TRUE(buf.ok()) << buf.status();
      ASSERT_TRUE(s.ReadAsync(stream, r, *buf).ok());
      ASSERT_TRUE(s.WaitRead(*buf).ok());
      ASSERT_EQ(std::memcmp(s.data(*buf), want[k].data(), sizes[r]), 0)
          << "stream " << stream << " record " << r;
      s.Release(*buf);
    }
  }
  EXPECT_GE(s.bytes_written(), 2 * (3 * 1000 * 1000 + 13));
  EXPECT_EQ(s.bytes_read(), s.bytes_written());
  // Synchronous helpers, and overwriting a record.
  std::vector<char> x = RandomBytes(4097, 9), y(4097);
  ASSERT_TRUE(s.Write(*a, 3, x.data(), x.size()).ok());
  ASSERT_TRUE(s.Read(*a, 3, y.data(), y.size()).ok());
  EXPECT_EQ(x, y);
}

INSTANTIATE_TEST_SUITE_P(Io, SwapperRoundTrip, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Direct" : "Buffered"; });

TEST(NvmeSwapperTest, TwoReadsInFlightWhileComputing) {
  auto sw = NvmeSwapper::Create(Options("inflight", true));
  ASSERT_TRUE(sw.ok());
  NvmeSwapper& s = **sw;
  auto st = s.AddStream("p", {1 << 20, 1 << 20});
  ASSERT_TRUE(st.ok());
  std::vector<char> r0 = RandomBytes(1 << 20, 1), r1 = RandomBytes(1 << 20, 2);
  ASSERT_TRUE(s.Write(*st, 0, r0.data(), r0.size()).ok());
  ASSERT_TRUE(s.Write(*st, 1, r1.data(), r1.size()).ok());
  auto b0 = s.Acquire(), b1 = s.Acquire();
  ASSERT_TRUE(b0.ok() && b1.ok());
  ASSERT_TRUE(s.ReadAsync(*st, 0, *b0).ok());
  ASSERT_TRUE(s.ReadAsync(*st, 1, *b1).ok());
  ASSERT_TRUE(s.WaitRead(*b1).ok());  // completes out of order
  ASSERT_TRUE(s.WaitRead(*b0).ok());
  EXPECT_EQ(std::memcmp(s.data(*b0), r0.data(), r0.size()), 0);
  EXPECT_EQ(std::memcmp(s.data(*b1), r1.data(), r1.size()), 0);
  // Every buffer held by the caller: Acquire cannot wait for anything.
  auto b2 = s.Acquire();
  ASSERT_TRUE(b2.ok());
  auto none = s.Acquire();
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition) << none.status();
}

TEST(NvmeSwapperTest, CorruptRecordIsDetectedAndNamed) {
  auto sw = NvmeSwapper::Create(Options("corrupt", true));
  ASSERT_TRUE(sw.ok());
  NvmeSwapper& s = **sw;
  auto st = s.AddStream("exp_avg", {10000, 10000});
  ASSERT_TRUE(st.ok());
  std::vector<char> d = RandomBytes(10000, 3), out(10000);
  ASSERT_TRUE(s.Write(*st, 0, d.data(), d.size()).ok());
  ASSERT_TRUE(s.Write(*st, 1, d.data(), d.size()).ok());
  // Flip one bit of record 1 behind the swapper's back.
  int fd = ::open(s.path(*st).c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char c;
  const off_t off = 12288 + 5000;  // stride 12288
  ASSERT_EQ(::pread(fd, &c, 1, off), 1);
  c ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &c, 1, off), 1);
  ::fsync(fd);
  ::close(fd);
  EXPECT_TRUE(s.Read(*st, 0, out.data(), out.size()).ok());
  absl::Status bad = s.Read(*st, 1, out.data(), out.size());
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss) << bad;
  EXPECT_NE(bad.message().find(s.path(*st)), std::string::npos) << bad;
  EXPECT_NE(bad.message().find("record 1"), std::string::npos) << bad;
}

TEST(NvmeSwapperTest, ShortFileIsDetectedAndNamed) {
  for (bool direct : {true, false}) {
    auto sw = NvmeSwapper::Create(Options(direct ? "short_d" : "short_b", direct));
    ASSERT_TRUE(sw.ok());
    NvmeSwapper& s = **sw;
    auto st = s.AddStream("fp32_params", {100000, 100000});
    ASSERT_TRUE(st.ok());
    std::vector<char> d = RandomBytes(100000, 4), out(100000);
    ASSERT_TRUE(s.Write(*st, 0, d.data(), d.size()).ok());
    ASSERT_TRUE(s.Write(*st, 1, d.data(), d.size()).ok());
    ASSERT_EQ(::truncate(s.path(*st).c_str(), 102400 + 50000), 0);  // cuts record 1
    EXPECT_TRUE(s.Read(*st, 0, out.data(), out.size()).ok());
    absl::Status bad = s.Read(*st, 1, out.data(), out.size());
    EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss) << bad;
    EXPECT_NE(bad.message().find(s.path(*st)), std::string::npos) << bad;
    EXPECT_NE(bad.message().find("short file"), std::string::npos) << bad;
  }
}

TEST(NvmeSwapperTest, UnwrittenRecordsReadAsZeros) {
  auto sw = NvmeSwapper::Create(Options("zeros", true));
  ASSERT_TRUE(sw.ok());
  auto st = (*sw)->AddStream("m", {5000});
  ASSERT_TRUE(st.ok());
  std::vector<char> out(5000, 1);
  ASSERT_TRUE((*sw)->Read(*st, 0, out.data(), out.size()).ok());
  EXPECT_EQ(out, std::vector<char>(5000, 0));
}

TEST(NvmeSwapperTest, InvalidOptionsAndOversizedRecordsAreRefused) {
  NvmeSwapperOptions o = Options("bad", true);
  o.buffer_bytes = 1000;
  EXPECT_EQ(NvmeSwapper::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options("bad", true);
  o.buffer_count = 0;
  EXPECT_EQ(NvmeSwapper::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  auto sw = NvmeSwapper::Create(Options("bad", true));
  ASSERT_TRUE(sw.ok());
  auto big = (*sw)->AddStream("huge", {(4 << 20) + 1});
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("huge.swp"), std::string::npos) << big.status();
  // A directory that cannot be created is named in the error.
  o = Options("bad", true);
  o.dir = "/proc/loom_no_such_dir/x";
  auto fail = NvmeSwapper::Create(o);
  EXPECT_THAT(fail, StatusIs(absl::StatusCode::kNotFound, "/proc/loom_no_such_dir"));
}

TEST(NvmeSwapperTest, FilesAreRemovedWithTheSwapper) {
  std::string path;
  {
    auto sw = NvmeSwapper::Create(Options("cleanup", true));
    ASSERT_TRUE(sw.ok());
    auto st = (*sw)->AddStream("v", {4096});
    ASSERT_TRUE(st.ok());
    path = (*sw)->path(*st);
    struct stat sb;
    ASSERT_EQ(::stat(path.c_str(), &sb), 0);
    EXPECT_EQ(sb.st_size, 4096);
  }
  struct stat sb;
  EXPECT_NE(::stat(path.c_str(), &sb), 0);
}

TEST(NvmeSwapperTest, ChecksumSeesEveryByteAndTheLength) {
  std::vector<char> d = RandomBytes(1000, 5);
  const uint64_t h = NvmeSwapper::Checksum(d.data(), d.size());
  EXPECT_NE(h, NvmeSwapper::Checksum(d.data(), d.size() - 1));
  for (size_t i : {0, 7, 8, 31, 32, 500, 999}) {
    d[i] ^= 1;
    EXPECT_NE(h, NvmeSwapper::Checksum(d.data(), d.size())) << i;
    d[i] ^= 1;
  }
  EXPECT_EQ(h, NvmeSwapper::Checksum(d.data(), d.size()));
}

}  // namespace
}  // namespace loom::engine::offload
