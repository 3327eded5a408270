// loom-checkpoint's deletions that fail (issue 42 defect 4), over gRPC: a step whose files
// cannot be removed stays listed with its bytes and the error, an explicit deletion fails naming
// the file, a retry retries the removal, retention fails naming the step (through the
// scheduler's GrpcCheckpointCatalog too), and leftovers are swept by a listing, not only by a
// restart. Files are made undeletable with the immutable attribute where possible (the test may
// run as root), else through the storage layer's remove seam (undeletable_for_test.h).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "proto/checkpoint_service.grpc.pb.h"
#include "services/checkpoint/checkpoint_service.h"
#include "services/scheduler/grpc_checkpoint_catalog.h"
#include "storage/checkpoint/checkpoint_test_util.h"
#include "storage/checkpoint/shard_format.h"
#include "storage/checkpoint/undeletable_for_test.h"

namespace loom {
namespace {

using storage::StepDirName;
using storage::checkpoint_test::AllRanks;
using storage::checkpoint_test::TestModel;
using storage::checkpoint_test::TmpDir;
using storage::checkpoint_test::Undeletable;
using storage::checkpoint_test::WriteCheckpoint;

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

class CheckpointDeletionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = TmpDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    CheckpointServiceOptions options;
    options.checkpoint_root = root_;
    service_ = std::make_unique<CheckpointServiceImpl>(options, registry_);
    int port = 0;
    auto server = StartCheckpointServer("127.0.0.1", 0, service_.get(), &port);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::CheckpointService::NewStub(channel_);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  grpc::Status Delete(const std::string& job, int64_t step, v1::DeleteCheckpointResponse* resp) {
    grpc::ClientContext ctx;
    v1::DeleteCheckpointRequest req;
    req.set_job_id(job);
    req.set_step(step);
    return stub_->DeleteCheckpoint(&ctx, req, resp);
  }
  v1::ListCheckpointsResponse List(const std::string& job) {
    grpc::ClientContext ctx;
    v1::ListCheckpointsRequest req;
    req.set_job_id(job);
    v1::ListCheckpointsResponse resp;
    grpc::Status s = stub_->ListCheckpoints(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }
  grpc::Status Retain(const std::string& job, int32_t keep_last,
                      v1::ApplyRetentionResponse* resp) {
    grpc::ClientContext ctx;
    v1::ApplyRetentionRequest req;
    req.set_job_id(job);
    req.set_keep_last(keep_last);
    return stub_->ApplyRetention(&ctx, req, resp);
  }

  std::string root_;
  prometheus::Registry registry_;
  std::unique_ptr<CheckpointServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::CheckpointService::Stub> stub_;
};

TEST_F(CheckpointDeletionTest, AnUndeletableStepStaysListedWithItsBytesAndDeleteFailsUntilGone) {
  const std::string job_dir = root_ + "/job-a";
  for (int64_t step : {100, 200, 300}) WriteCheckpoint(job_dir, step, 2, TestModel(), AllRanks(2));
  const v1::ListCheckpointsResponse before = List("job-a");
  ASSERT_EQ(before.checkpoints_size(), 3);
  const int64_t all_bytes = before.total_bytes();
  EXPECT_EQ(all_bytes, 3 * before.checkpoints(0).total_bytes());
  EXPECT_EQ(before.deleting_bytes(), 0);
  Undeletable stuck(job_dir, StepDirName(100), "rank_1.shard");
  std::cout << "undeletable through " << (stuck.real() ? "chattr +i" : "the remove seam") << "\n";

  v1::DeleteCheckpointResponse resp;
  grpc::Status s = Delete("job-a", 100, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find("rank_1.shard"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("Operation not permitted"), std::string::npos)
      << s.error_message();

  // Still listed, marked, with the bytes still on disk, and counted in the disk usage.
  v1::ListCheckpointsResponse listed = List("job-a");
  ASSERT_EQ(listed.checkpoints_size(), 3);
  const v1::CheckpointInfo& stuck_step = listed.checkpoints(0);
  EXPECT_EQ(stuck_step.step(), 100);
  EXPECT_EQ(stuck_step.deletion_state(), "delete_failed");
  EXPECT_FALSE(stuck_step.committed());
  EXPECT_NE(stuck_step.deletion_error().find("rank_1.shard"), std::string::npos)
      << stuck_step.deletion_error();
  EXPECT_NE(stuck_step.path().find("/.deleting.step_00000100."), std::string::npos);
  EXPECT_GT(stuck_step.total_bytes(), 0);
  EXPECT_EQ(listed.deleting_bytes(), stuck_step.total_bytes());
  EXPECT_EQ(listed.total_bytes(), stuck_step.total_bytes() + 2 * before.checkpoints(1).total_bytes());
  EXPECT_EQ(listed.checkpoints(1).deletion_state(), "");

  // GetCheckpoint says the same.
  {
    grpc::ClientContext ctx;
    v1::GetCheckpointRequest req;
    req.set_job_id("job-a");
    req.set_step(100);
    v1::CheckpointInfo info;
    ASSERT_TRUE(stub_->GetCheckpoint(&ctx, req, &info).ok());
    EXPECT_EQ(info.deletion_state(), "delete_failed");
  }

  // A retry is not "already gone": it retries and fails again.
  s = Delete("job-a", 100, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();

  stuck.Release();
  s = Delete("job-a", 100, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.deleted());
  listed = List("job-a");
  ASSERT_EQ(listed.checkpoints_size(), 2);
  EXPECT_EQ(listed.checkpoints(0).step(), 200);
  EXPECT_EQ(listed.deleting_bytes(), 0);
  s = Delete("job-a", 100, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(resp.deleted());
}

TEST_F(CheckpointDeletionTest, RetentionFailsNamingTheStuckStepAndDeletesItOnceItCan) {
  const std::string job_dir = root_ + "/job-r";
  for (int64_t step : {10, 20, 30, 40}) WriteCheckpoint(job_dir, step, 2, TestModel(), AllRanks(2));
  Undeletable stuck(job_dir, StepDirName(20), "rank_0.manifest.json");

  v1::ApplyRetentionResponse resp;
  grpc::Status s = Retain("job-r", 1, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  for (const char* part : {"retention of job 'job-r'", "step 20: ", "rank_0.manifest.json",
                           "deleted steps 10, 30"}) {
    EXPECT_NE(s.error_message().find(part), std::string::npos) << part << ": " << s.error_message();
  }
  v1::ListCheckpointsResponse listed = List("job-r");
  ASSERT_EQ(listed.checkpoints_size(), 2);
  EXPECT_EQ(listed.checkpoints(0).step(), 20);
  EXPECT_EQ(listed.checkpoints(0).deletion_state(), "delete_failed");
  EXPECT_EQ(listed.checkpoints(1).step(), 40);
  EXPECT_TRUE(listed.checkpoints(1).committed());

  // The scheduler's catalog sees the failure (and its retention worker retries it).
  GrpcCheckpointCatalog catalog(channel_, absl::Seconds(10));
  loom::v1::CheckpointPolicy policy;
  policy.set_keep_last(1);
  auto via_catalog = catalog.ApplyRetention("job-r", "", policy, {});
  EXPECT_EQ(via_catalog.status().code(), absl::StatusCode::kPermissionDenied)
      << via_catalog.status();

  stuck.Release();
  auto ok = catalog.ApplyRetention("job-r", "", policy, {});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, (std::vector<int64_t>{20}));
  listed = List("job-r");
  ASSERT_EQ(listed.checkpoints_size(), 1);
  EXPECT_EQ(listed.deleting_bytes(), 0);
}

// A deletion left behind by this very service process (it used to be removed only once that
// process was dead, i.e. after a restart) is removed by the next listing.
TEST_F(CheckpointDeletionTest, AListingSweepsLeftoverDeletionsWithoutARestart) {
  const std::string job_dir = root_ + "/job-s";
  for (int64_t step : {10, 20}) WriteCheckpoint(job_dir, step, 1, TestModel(), AllRanks(1));
  const std::string leftover = absl::StrCat(job_dir, "/.deleting.", StepDirName(5), ".", ::getpid());
  ASSERT_TRUE(MakeDirs(leftover + "/hf").ok());
  ASSERT_TRUE(WriteFileAtomically(leftover + "/hf/model.safetensors", std::string(1000, 'x')).ok());
  v1::ListCheckpointsResponse listed = List("job-s");
  EXPECT_FALSE(Exists(leftover));
  ASSERT_EQ(listed.checkpoints_size(), 2);
  EXPECT_EQ(listed.checkpoints(0).step(), 10);
  EXPECT_EQ(listed.deleting_bytes(), 0);
}

}  // namespace
}  // namespace loom
