// `loomctl checkpoint delete` and `loomctl checkpoints` against a loom-checkpoint service (in
// this process) whose step has a file that cannot be deleted (issue 42 defect 4): the deletion
// exits non-zero with the error naming the file, a rerun retries it (it used to print "step N
// was already gone" and exit 0), the listing keeps the step, marked DELETE_FAILED with the error,
// and counts its bytes in the disk usage; once the file is deletable the rerun deletes it.
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "services/checkpoint/checkpoint_service.h"
#include "storage/checkpoint/checkpoint_test_util.h"
#include "storage/checkpoint/shard_format.h"
#include "storage/checkpoint/undeletable_for_test.h"
#include "tests/testing/subprocess.h"

namespace loom {
namespace {

using storage::checkpoint_test::AllRanks;
using storage::checkpoint_test::TestModel;
using storage::checkpoint_test::Undeletable;
using storage::checkpoint_test::WriteCheckpoint;

struct CliRun {
  int code;
  std::string output;
};

class LoomctlCheckpointDeleteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/ckpt");
    ASSERT_TRUE(MakeDirs(root_).ok());
    CheckpointServiceOptions options;
    options.checkpoint_root = root_;
    service_ = std::make_unique<CheckpointServiceImpl>(options, registry_);
    auto server = StartCheckpointServer("127.0.0.1", 0, service_.get(), &port_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }
  CliRun Loomctl(const std::vector<std::string>& args) {
    static int n = 0;
    const std::string log = absl::StrCat(std::getenv("TEST_TMPDIR"), "/loomctl_", n++, ".log");
    std::vector<std::string> argv = {testing::RunfilePath("services/cli/loomctl")};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back(absl::StrCat("--checkpoint=127.0.0.1:", port_));
    argv.push_back("--cluster_dir=/nonexistent");
    auto p = testing::Subprocess::Start(argv, log);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return {-1, ""};
    int status = p->Wait(absl::Seconds(60));
    return {testing::ExitCode(status), *ReadFile(log)};
  }
  static void ExpectHas(const CliRun& run, const std::string& part) {
    EXPECT_NE(run.output.find(part), std::string::npos) << "wanted: " << part << "\n" << run.output;
  }

  std::string root_;
  prometheus::Registry registry_;
  std::unique_ptr<CheckpointServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(LoomctlCheckpointDeleteTest, AFailedDeletionExitsNonZeroStaysListedAndARerunRetriesIt) {
  const std::string job_dir = root_ + "/job-a";
  for (int64_t step : {100, 200, 300}) WriteCheckpoint(job_dir, step, 2, TestModel(), AllRanks(2));
  Undeletable stuck(job_dir, storage::StepDirName(100), "rank_1.shard");

  CliRun del = Loomctl({"checkpoint", "delete", "job-a", "--step=100"});
  EXPECT_EQ(del.code, 7) << del.output;  // PERMISSION_DENIED
  ExpectHas(del, "rank_1.shard");
  ExpectHas(del, "Operation not permitted");
  EXPECT_EQ(del.output.find("already gone"), std::string::npos) << del.output;

  CliRun again = Loomctl({"checkpoint", "delete", "job-a", "--step=100"});
  EXPECT_EQ(again.code, 7) << again.output;
  EXPECT_EQ(again.output.find("already gone"), std::string::npos) << again.output;

  CliRun list = Loomctl({"checkpoints", "job-a"});
  EXPECT_EQ(list.code, 0) << list.output;
  ExpectHas(list, "DELETE_FAILED");
  ExpectHas(list, "delete failed: ");
  ExpectHas(list, "/.deleting.step_00000100.");
  ExpectHas(list, "of them in steps being deleted)");

  stuck.Release();
  CliRun done = Loomctl({"checkpoint", "delete", "job-a", "--step=100"});
  EXPECT_EQ(done.code, 0) << done.output;
  ExpectHas(done, "step 100 deleted");
  CliRun after = Loomctl({"checkpoints", "job-a"});
  EXPECT_EQ(after.code, 0) << after.output;
  EXPECT_EQ(after.output.find("DELETE_FAILED"), std::string::npos) << after.output;
  EXPECT_EQ(after.output.find("being deleted"), std::string::npos) << after.output;
}

}  // namespace
}  // namespace loom
