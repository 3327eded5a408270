#include "common/file_util.h"

#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace loom {
namespace {

std::string Tmp(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
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
