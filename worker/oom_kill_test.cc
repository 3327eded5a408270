#include "worker/oom_kill.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"

namespace loom::worker {
namespace {

class OomKillTest : public ::testing::Test {
 protected:
  void Write(const std::string& rel, const std::string& text) {
    const std::filesystem::path p = root_ / rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::string Path(const std::string& rel) { return (root_ / rel).string(); }
  std::filesystem::path root_ = std::filesystem::path(std::getenv("TEST_TMPDIR")) /
                                ::testing::UnitTest::GetInstance()->current_test_info()->name();
};

// cgroup v2 (a systemd service's or a pod's cgroup): memory.events' oom_kill line.
TEST_F(OomKillTest, CgroupV2MemoryEvents) {
  Write("proc_cgroup", "0::/kubepods/pod1/worker\n");
  Write("cg/kubepods/pod1/worker/memory.events",
        "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n");
  EXPECT_EQ(ReadOomKillCount(Path("proc_cgroup"), Path("cg")), 2);
}

// cgroup v1 or hybrid (this development machine's kind): the memory controller's
// memory.oom_control, found by the "memory" entry among several controllers.
TEST_F(OomKillTest, CgroupV1MemoryOomControl) {
  Write("proc_cgroup",
        "9:name=systemd:/\n5:devices:/\n4:cpu,memory:/process_api/abc\n1:cpu:/\n0::/\n");
  Write("cg/memory/process_api/abc/memory.oom_control",
        "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n");
  // Hybrid: the v2 entry "0::/" has no memory.events, so the v1 controller answers.
  EXPECT_EQ(ReadOomKillCount(Path("proc_cgroup"), Path("cg")), 7);
}

TEST_F(OomKillTest, RootCgroupV1) {
  Write("proc_cgroup", "4:memory:/\n");
  Write("cg/memory/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n");
  EXPECT_EQ(ReadOomKillCount(Path("proc_cgroup"), Path("cg")), 0);
}

TEST_F(OomKillTest, UnreadableIsUnknown) {
  EXPECT_EQ(ReadOomKillCount(Path("missing"), Path("cg")), std::nullopt);
  Write("proc_cgroup", "0::/a\n");
  EXPECT_EQ(ReadOomKillCount(Path("proc_cgroup"), Path("cg")), std::nullopt);  // no file
  Write("cg/a/memory.events", "oom 1\n");                                      // no oom_kill line
  EXPECT_EQ(ReadOomKillCount(Path("proc_cgroup"), Path("cg")), std::nullopt);
  Write("proc_cgroup", "garbage\n");
  EXPECT_EQ(ReadOomKillCount(Path("proc_cgroup"), Path("cg")), std::nullopt);
}

}  // namespace
}  // namespace loom::worker
