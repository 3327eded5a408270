#include "common/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

using ::loom::testing::StatusIs;

std::string TmpDir(const std::string& name) {
  std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

std::vector<std::string> List(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  return names;
}

TEST(FileUtilTest, AtomicWriteRoundTripsAndLeavesNoTemporary) {
  std::string dir = TmpDir("atomic");
  std::string path = dir + "/f.json";
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomically(path, std::string("se\0cond", 7)).ok());
  auto text = ReadFile(path);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, std::string("se\0cond", 7));
  EXPECT_EQ(List(dir), std::vector<std::string>{"f.json"});
}

TEST(FileUtilTest, AbandonedWriterLeavesNothing) {
  std::string dir = TmpDir("abandoned");
  {
    auto w = AtomicFileWriter::Open(dir + "/out.bin");
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(w->Append("abc", 3).ok());
    EXPECT_EQ(w->bytes_written(), 3);
  }
  EXPECT_TRUE(List(dir).empty());
}

TEST(FileUtilTest, CommittedWriterPublishesAllPieces) {
  std::string dir = TmpDir("pieces");
  auto w = AtomicFileWriter::Open(dir + "/out.bin");
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->Append("ab", 2).ok());
  ASSERT_TRUE(w->Append("cd", 2).ok());
  ASSERT_TRUE(w->Commit().ok());
  EXPECT_EQ(w->Commit().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*ReadFile(dir + "/out.bin"), "abcd");
}

TEST(FileUtilTest, WritebackWhileWritingKeepsEveryByte) {
  std::string dir = TmpDir("writeback");
  AtomicFileWriter::Options options;
  options.writeback_bytes = 4096;
  auto w = AtomicFileWriter::Open(dir + "/big.bin", options);
  ASSERT_TRUE(w.ok());
  std::string expected;
  for (int i = 0; i < 100; ++i) {
    std::string chunk(1000, static_cast<char>('a' + i % 26));
    ASSERT_TRUE(w->Append(chunk.data(), chunk.size()).ok());
    expected += chunk;
  }
  ASSERT_TRUE(w->Commit().ok());
  EXPECT_EQ(*ReadFile(dir + "/big.bin"), expected);
}

TEST(FileUtilTest, ErrorsCarryCodesAndPaths) {
  auto missing = ReadFile("/nonexistent/dir/file");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/dir/file"), std::string::npos);
  errno = ENOSPC;
  EXPECT_EQ(ErrnoError("cannot write", "/x").code(), absl::StatusCode::kResourceExhausted);
  errno = EACCES;
  EXPECT_EQ(ErrnoError("cannot open", "/x").code(), absl::StatusCode::kPermissionDenied);
  errno = EIO;
  absl::Status io = ErrnoError("cannot read", "/x");
  EXPECT_EQ(io.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(io.message(), "cannot read /x: Input/output error");
}

TEST(FileUtilTest, ListRegularFilesKeepsSortedRegularFilesTheFilterAccepts) {
  const std::string dir = TmpDir("listing");
  for (const char* name : {"b.bin", "a.bin", "c.txt"}) {
    ASSERT_TRUE(WriteFileAtomically(absl::StrCat(dir, "/", name), "x").ok());
  }
  ASSERT_TRUE(MakeDirs(dir + "/d.bin").ok());                                    // a directory
  ASSERT_EQ(::symlink((dir + "/a.bin").c_str(), (dir + "/e.bin").c_str()), 0);  // a symlink
  absl::StatusOr<std::vector<std::string>> files = ListRegularFiles(
      dir, [](absl::string_view n) { return n.size() > 4 && n.substr(n.size() - 4) == ".bin"; });
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ::testing::ElementsAre(dir + "/a.bin", dir + "/b.bin"));
  EXPECT_THAT(ListRegularFiles(dir + "/missing", [](absl::string_view) { return true; }),
              StatusIs(absl::StatusCode::kNotFound, "missing"));
}

TEST(FileUtilTest, MakeDirsCreatesParentsAndRefusesFiles) {
  std::string dir = TmpDir("mk");
  ASSERT_TRUE(MakeDirs(dir + "/a/b/c").ok());
  ASSERT_TRUE(MakeDirs(dir + "/a/b/c").ok());  // idempotent
  struct stat st;
  ASSERT_EQ(::stat((dir + "/a/b/c").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  ASSERT_TRUE(WriteFileAtomically(dir + "/file", "x").ok());
  EXPECT_THAT(MakeDirs(dir + "/file"),
              StatusIs(absl::StatusCode::kFailedPrecondition, "/file exists and is not a directory"));
}

std::string Tmp(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

TEST(PreadUpToTest, ReadsAtAnOffsetAndStopsAtEndOfFile) {
  const std::string path = TmpDir("pread") + "/f";
  ASSERT_TRUE(WriteFileAtomically(path, "0123456789").ok());
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  char buf[16] = {};
  absl::StatusOr<size_t> got = PreadUpTo(fd, buf, 4, 3, path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, 4u);
  EXPECT_EQ(std::string(buf, 4), "3456");
  got = PreadUpTo(fd, buf, 16, 7, path);  // past the end: what there is
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 3u);
  EXPECT_EQ(std::string(buf, 3), "789");
  ::close(fd);
  got = PreadUpTo(fd, buf, 4, 0, path);  // closed descriptor: an error naming the file
  EXPECT_THAT(got, StatusIs(absl::StatusCode::kInternal, "cannot read " + path));
}

TEST(ReadRegularFileTest, ReadsARegularFile) {
  ASSERT_TRUE(WriteFileAtomically(Tmp("a.txt"), "hello").ok());
  absl::StatusOr<std::string> text = ReadRegularFile(Tmp("a.txt"), 5);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "hello");
}

TEST(ReadRegularFileTest, MissingFileIsNotFound) {
  EXPECT_EQ(ReadRegularFile(Tmp("missing"), 10).status().code(), absl::StatusCode::kNotFound);
}

TEST(ReadRegularFileTest, RefusesADirectory) {
  ASSERT_TRUE(MakeDirs(Tmp("dir")).ok());
  absl::Status s = ReadRegularFile(Tmp("dir"), 10).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("is a directory"), std::string::npos) << s;
}

TEST(ReadRegularFileTest, RefusesAFifoWithoutBlocking) {
  ASSERT_EQ(::mkfifo(Tmp("fifo").c_str(), 0600), 0);
  absl::Status s = ReadRegularFile(Tmp("fifo"), 10).status();  // would block in ReadFile
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("not a regular file"), std::string::npos) << s;
}

TEST(ReadRegularFileTest, RefusesAnEndlessDevice) {
  absl::Status s = ReadRegularFile("/dev/zero", 1 << 20).status();  // ReadFile never returns
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ReadRegularFileTest, RefusesAFileOverTheLimit) {
  ASSERT_TRUE(WriteFileAtomically(Tmp("big.txt"), std::string(100, 'x')).ok());
  absl::Status s = ReadRegularFile(Tmp("big.txt"), 99).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("limit of 99"), std::string::npos) << s;
}

}  // namespace
}  // namespace loom
