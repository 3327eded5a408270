// Process-level tests of the loom-worker binary's startup and exit paths.
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace loom {
namespace {

// Regression: an unwritable --ready_file made loom-worker return from main while its
// signal-handling std::thread was still joinable, so std::terminate aborted the process (SIGABRT)
// instead of exiting with an error naming the file.
TEST(WorkerMainTest, UnwritableReadyFileExitsWithErrorInsteadOfAborting) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::string bad_ready = dir + "/no/such/dir/ready.json";
  absl::StatusOr<testing::Subprocess> worker = testing::Subprocess::Start(
      {testing::RunfilePath("services/worker/loom-worker"), "--scheduler=127.0.0.1:1",
       "--node_id=n1", "--trainer=/bin/true", "--work_dir=" + dir + "/work",
       "--ready_file=" + bad_ready},
      dir + "/worker.log");
  ASSERT_TRUE(worker.ok()) << worker.status();
  const int status = worker->Wait(absl::Seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status) << ": "
                                 << testing::Tail(worker->log_path());
  EXPECT_EQ(WEXITSTATUS(status), 1) << testing::Tail(worker->log_path());
  EXPECT_NE(testing::Tail(worker->log_path()).find("ready.json"), std::string::npos)
      << testing::Tail(worker->log_path());
}

}  // namespace
}  // namespace loom
