#include "services/checkpoint/checkpoint_service.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/daemon.h"
#include "common/file_util.h"
#include "proto/checkpoint_service.grpc.pb.h"
#include "services/scheduler/grpc_checkpoint_catalog.h"
#include "storage/checkpoint/shard_format.h"
#include "storage/safetensors/safetensors.h"
#include "tests/testing/subprocess.h"

namespace loom {
namespace {

std::string TmpDir(absl::string_view name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(base != nullptr ? base : "/tmp", "/", name);
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

// A tiny model: "w" [3, 3] (9 elements, not divisible by 2) and "b" [1].
const std::vector<float> kW = {1.5f, -2.0f, 3.25f, 0.0f, -0.5f, 6.0f, 7.0f, 8.125f, -9.0f};
const std::vector<float> kB = {42.0f};

void WriteTinyCheckpoint(const std::string& job_dir, int64_t step, int32_t n,
                         const std::vector<int32_t>& ranks) {
  const std::vector<std::pair<std::string, const std::vector<float>*>> params = {{"w", &kW},
                                                                                 {"b", &kB}};
  for (int32_t r : ranks) {
    storage::ShardManifest m;
    m.step = step;
    m.rank = r;
    m.world_size = n;
    m.model_config_json = R"({"model_type":"llama","tie_word_embeddings":false})";
    m.params.push_back({"w", {3, 3}, 9});
    m.params.push_back({"b", {1}, 1});
    storage::AssignPartitionLayout(m);
    std::vector<float> section(m.section_numel, 0.0f);
    for (size_t i = 0; i < params.size(); ++i) {
      const storage::ShardParam& p = m.params[i];
      for (int64_t k = 0; k < p.partition_numel; ++k) {
        int64_t flat = r * p.partition_numel + k;
        if (flat < p.numel) section[p.partition_offset + k] = (*params[i].second)[flat];
      }
    }
    const float* ptr = section.data();
    ASSERT_TRUE(storage::WriteShard(absl::StrCat(job_dir, "/", storage::StepDirName(step)), m,
                                    absl::MakeConstSpan(&ptr, 1))
                    .ok());
  }
}

std::vector<float> ReadFloats(const safetensors::Reader& r, const std::string& name) {
  auto bytes = r.ReadTensor(name);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  std::vector<float> out(bytes.ok() ? bytes->size() / 4 : 0);
  if (bytes.ok()) std::memcpy(out.data(), bytes->data(), bytes->size());
  return out;
}

double MetricValue(prometheus::Registry& registry, const std::string& family,
                   const std::string& label_value) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != family) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      bool match = label_value.empty();
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.value == label_value) match = true;
      }
      if (!match) continue;
      if (f.type == prometheus::MetricType::Histogram) return m.histogram.sample_count;
      return m.counter.value;
    }
  }
  return -1;
}

class CheckpointServiceTest : public ::testing::Test {
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
    ASSERT_GT(port, 0);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::CheckpointService::NewStub(channel_);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  std::string root_;
  prometheus::Registry registry_;
  std::unique_ptr<CheckpointServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::CheckpointService::Stub> stub_;
};

TEST_F(CheckpointServiceTest, ListAndConsolidateOverGrpc) {
  const std::string job_dir = root_ + "/job-1";
  WriteTinyCheckpoint(job_dir, 100, 2, {0, 1});  // committed
  WriteTinyCheckpoint(job_dir, 200, 3, {0, 2});  // partial: rank 1 missing

  grpc::ClientContext list_ctx;
  v1::ListCheckpointsRequest list_req;
  list_req.set_job_id("job-1");
  v1::ListCheckpointsResponse list_resp;
  grpc::Status s = stub_->ListCheckpoints(&list_ctx, list_req, &list_resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(list_resp.checkpoints_size(), 2);
  const v1::CheckpointInfo& a = list_resp.checkpoints(0);
  EXPECT_EQ(a.step(), 100);
  EXPECT_EQ(a.world_size(), 2);
  EXPECT_TRUE(a.committed());
  EXPECT_EQ(a.ranks_reported(), 2);
  EXPECT_EQ(a.path(), job_dir + "/step_00000100");
  EXPECT_GT(a.total_bytes(), 0);
  const v1::CheckpointInfo& b = list_resp.checkpoints(1);
  EXPECT_EQ(b.step(), 200);
  EXPECT_EQ(b.world_size(), 3);
  EXPECT_FALSE(b.committed());
  EXPECT_EQ(b.ranks_reported(), 2);

  // Step 0 = newest committed = 100, default output directory.
  grpc::ClientContext ctx;
  v1::ConsolidateCheckpointRequest req;
  req.set_job_id("job-1");
  v1::ConsolidateCheckpointResponse resp;
  s = stub_->ConsolidateCheckpoint(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.step(), 100);
  EXPECT_EQ(resp.safetensors_path(), job_dir + "/step_00000100/hf/model.safetensors");
  EXPECT_EQ(resp.config_path(), job_dir + "/step_00000100/hf/config.json");
  EXPECT_EQ(resp.num_tensors(), 2);
  auto reader = safetensors::Reader::Open(resp.safetensors_path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(resp.total_bytes(), (*reader)->file_bytes());
  EXPECT_EQ((*reader)->Find("w")->shape, (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(ReadFloats(**reader, "w"), kW);
  EXPECT_EQ(ReadFloats(**reader, "b"), kB);
  auto config = ReadFile(resp.config_path());
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(*config,
            "{\n  \"model_type\": \"llama\",\n  \"tie_word_embeddings\": false,\n"
            "  \"torch_dtype\": \"float32\"\n}\n");

  // Explicit step and absolute output directory.
  grpc::ClientContext ctx2;
  req.set_step(100);
  req.set_output_dir(root_ + "/exports/job-1");
  s = stub_->ConsolidateCheckpoint(&ctx2, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.safetensors_path(), root_ + "/exports/job-1/model.safetensors");

  EXPECT_EQ(MetricValue(registry_, "loom_checkpoint_consolidations_total", "ok"), 2);
  EXPECT_EQ(MetricValue(registry_, "loom_checkpoint_consolidation_seconds", ""), 2);
  EXPECT_EQ(MetricValue(registry_, "loom_checkpoint_consolidated_bytes_total", ""),
            2.0 * static_cast<double>(resp.total_bytes()));
}

TEST_F(CheckpointServiceTest, ErrorCodes) {
  const std::string job_dir = root_ + "/job-2";
  WriteTinyCheckpoint(job_dir, 200, 3, {0, 2});

  {  // Unknown job.
    grpc::ClientContext ctx;
    v1::ListCheckpointsRequest req;
    req.set_job_id("no-such-job");
    v1::ListCheckpointsResponse resp;
    grpc::Status s = stub_->ListCheckpoints(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_NE(s.error_message().find("job 'no-such-job' has no checkpoint directory"),
              std::string::npos)
        << s.error_message();
  }
  {
    grpc::ClientContext ctx;
    v1::ConsolidateCheckpointRequest req;
    req.set_job_id("no-such-job");
    v1::ConsolidateCheckpointResponse resp;
    EXPECT_EQ(stub_->ConsolidateCheckpoint(&ctx, req, &resp).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {  // Partial checkpoint.
    grpc::ClientContext ctx;
    v1::ConsolidateCheckpointRequest req;
    req.set_job_id("job-2");
    req.set_step(200);
    v1::ConsolidateCheckpointResponse resp;
    grpc::Status s = stub_->ConsolidateCheckpoint(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(s.error_message().find("missing ranks 1"), std::string::npos) << s.error_message();
  }
  {  // Path escapes.
    for (const char* bad : {"../job-2", "a/b", "..", ""}) {
      grpc::ClientContext ctx;
      v1::ListCheckpointsRequest req;
      req.set_job_id(bad);
      v1::ListCheckpointsResponse resp;
      EXPECT_EQ(stub_->ListCheckpoints(&ctx, req, &resp).error_code(),
                grpc::StatusCode::INVALID_ARGUMENT)
          << bad;
    }
    for (const char* bad : {"relative/out", "/tmp/../etc"}) {
      grpc::ClientContext ctx;
      v1::ConsolidateCheckpointRequest req;
      req.set_job_id("job-2");
      req.set_output_dir(bad);
      v1::ConsolidateCheckpointResponse resp;
      EXPECT_EQ(stub_->ConsolidateCheckpoint(&ctx, req, &resp).error_code(),
                grpc::StatusCode::INVALID_ARGUMENT)
          << bad;
    }
  }
  EXPECT_EQ(MetricValue(registry_, "loom_checkpoint_consolidations_total", "not_found"), 1);
  EXPECT_EQ(MetricValue(registry_, "loom_checkpoint_consolidations_total", "failed_precondition"),
            1);
  EXPECT_EQ(MetricValue(registry_, "loom_checkpoint_consolidations_total", "invalid_argument"), 2);
  EXPECT_EQ(MetricValue(registry_, "loom_checkpoint_consolidations_total", "ok"), 0);
}

TEST_F(CheckpointServiceTest, ShardedBf16ConsolidationDeleteAndRetentionOverGrpc) {
  const std::string job_dir = root_ + "/job-3";
  for (int64_t step : {10, 20, 30}) WriteTinyCheckpoint(job_dir, step, 2, {0, 1});
  {
    grpc::ClientContext ctx;
    v1::ConsolidateCheckpointRequest req;
    req.set_job_id("job-3");
    req.set_max_shard_size("10B");  // w: 18 bytes (own shard), b: 2 bytes
    req.set_dtype("bf16");
    req.set_output_dir(job_dir + "/export");
    v1::ConsolidateCheckpointResponse resp;
    grpc::Status s = stub_->ConsolidateCheckpoint(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.step(), 30);
    EXPECT_EQ(resp.dtype(), "BF16");
    ASSERT_EQ(resp.files_size(), 2);
    EXPECT_EQ(resp.files(0), job_dir + "/export/model-00001-of-00002.safetensors");
    EXPECT_EQ(resp.index_path(), job_dir + "/export/model.safetensors.index.json");
    auto reader = safetensors::Reader::Open(resp.files(0));
    ASSERT_TRUE(reader.ok()) << reader.status();
    ASSERT_NE((*reader)->Find("w"), nullptr);
    EXPECT_EQ((*reader)->Find("w")->dtype, "BF16");
    auto w = (*reader)->ReadTensor("w");
    ASSERT_TRUE(w.ok());
    EXPECT_EQ(w->substr(0, 2), std::string("\xc0\x3f", 2));  // 1.5f = 0x3fc00000 -> 0x3fc0
  }
  // Regression (break-it pass, 2026-12-05): an export into another step's directory replaced
  // files there, and verifying that step then checked the export instead of its shards.
  ASSERT_TRUE(MakeDirs(root_ + "/elsewhere").ok());
  ASSERT_TRUE(WriteFileAtomically(root_ + "/elsewhere/rank_0.shard", "x").ok());
  for (const std::string& bad : {job_dir + "/step_00000010", job_dir + "/step_00000010/",
                                 root_ + "/job-9/step_00000001", root_ + "/elsewhere"}) {
    grpc::ClientContext ctx;
    v1::ConsolidateCheckpointRequest req;
    req.set_job_id("job-3");
    req.set_step(30);
    req.set_output_dir(bad);
    v1::ConsolidateCheckpointResponse resp;
    grpc::Status s = stub_->ConsolidateCheckpoint(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad;
    EXPECT_NE(s.error_message().find("output_dir: '" + bad + "'"), std::string::npos)
        << s.error_message();
  }
  EXPECT_NE(::access((job_dir + "/step_00000010/rank_0.manifest.json").c_str(), F_OK), -1);
  EXPECT_EQ(::access((job_dir + "/step_00000010/model.safetensors").c_str(), F_OK), -1);
  for (const char* field : {"max_shard_size", "dtype"}) {
    grpc::ClientContext ctx;
    v1::ConsolidateCheckpointRequest req;
    req.set_job_id("job-3");
    if (std::string(field) == "dtype") req.set_dtype("int4"); else req.set_max_shard_size("5XB");
    v1::ConsolidateCheckpointResponse resp;
    grpc::Status s = stub_->ConsolidateCheckpoint(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find(field), std::string::npos) << s.error_message();
  }
  auto del = [&](int64_t step, v1::DeleteCheckpointResponse* resp) {
    grpc::ClientContext ctx;
    v1::DeleteCheckpointRequest req;
    req.set_job_id("job-3");
    req.set_step(step);
    return stub_->DeleteCheckpoint(&ctx, req, resp);
  };
  v1::DeleteCheckpointResponse d;
  ASSERT_TRUE(del(10, &d).ok());
  EXPECT_TRUE(d.deleted());
  ASSERT_TRUE(del(10, &d).ok());
  EXPECT_FALSE(d.deleted());
  EXPECT_EQ(del(30, &d).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  {
    grpc::ClientContext ctx;
    v1::ApplyRetentionRequest req;
    req.set_job_id("job-3");
    req.set_keep_last(1);
    v1::ApplyRetentionResponse resp;
    ASSERT_TRUE(stub_->ApplyRetention(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.deleted_steps_size(), 1);
    EXPECT_EQ(resp.deleted_steps(0), 20);
    ASSERT_EQ(resp.kept_steps_size(), 1);
    EXPECT_EQ(resp.kept_steps(0), 30);
  }
  {
    grpc::ClientContext ctx;
    v1::ApplyRetentionRequest req;
    req.set_job_id("no-such-job");
    req.set_keep_last(1);
    v1::ApplyRetentionResponse resp;
    EXPECT_EQ(stub_->ApplyRetention(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  }
}

// grpc.health.v1.Health/Check with an empty request (service ""), sent as raw bytes because the
// health proto's generated code is not part of the build: SERVING is the response bytes 08 01.
TEST_F(CheckpointServiceTest, GetAndVerifyOverGrpc) {
  const std::string job_dir = root_ + "/job-v";
  WriteTinyCheckpoint(job_dir, 100, 2, {0, 1});
  WriteTinyCheckpoint(job_dir, 200, 3, {0, 2});  // partial
  {
    grpc::ClientContext ctx;
    v1::GetCheckpointRequest req;
    req.set_job_id("job-v");
    req.set_step(100);
    v1::CheckpointInfo info;
    ASSERT_TRUE(stub_->GetCheckpoint(&ctx, req, &info).ok());
    EXPECT_EQ(info.step(), 100);
    EXPECT_TRUE(info.committed());
    EXPECT_EQ(info.world_size(), 2);
  }
  {
    grpc::ClientContext ctx;
    v1::GetCheckpointRequest req;
    req.set_job_id("job-v");
    req.set_step(150);
    v1::CheckpointInfo info;
    EXPECT_EQ(stub_->GetCheckpoint(&ctx, req, &info).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    v1::VerifyCheckpointRequest req;
    req.set_job_id("job-v");
    req.set_step(100);
    v1::VerifyCheckpointResponse resp;
    grpc::Status s = stub_->VerifyCheckpoint(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.files_size(), 2);  // both rank shards, checked against their manifests
    EXPECT_EQ(resp.kind(), "loom checkpoint") << resp.kind();
  }
  // A flipped byte in a shard is DATA_LOSS naming the file and rank.
  const std::string shard = job_dir + "/step_00000100/rank_1.shard";
  std::string bytes = *ReadFile(shard);
  bytes[bytes.size() / 2] ^= 0x40;
  ASSERT_TRUE(WriteFileAtomically(shard, bytes).ok());
  {
    grpc::ClientContext ctx;
    v1::VerifyCheckpointRequest req;
    req.set_job_id("job-v");
    req.set_step(100);
    v1::VerifyCheckpointResponse resp;
    grpc::Status s = stub_->VerifyCheckpoint(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << s.error_message();
    EXPECT_NE(s.error_message().find("rank_1.shard"), std::string::npos) << s.error_message();
  }
  {
    grpc::ClientContext ctx;
    v1::VerifyCheckpointRequest req;
    req.set_path("/etc/passwd");
    v1::VerifyCheckpointResponse resp;
    EXPECT_EQ(stub_->VerifyCheckpoint(&ctx, req, &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
}

// A committed step damaged on disk: VerifyCheckpoint marks it corrupt, ListCheckpoints shows it
// so (not committed, with the reason), and the scheduler's resume choice over this API
// (GrpcCheckpointCatalog::NewestIntact) skips it for the intact step before it.
TEST_F(CheckpointServiceTest, CorruptStepIsMarkedListedAndSkippedAsResumePoint) {
  const std::string job_dir = root_ + "/job-c";
  WriteTinyCheckpoint(job_dir, 4, 2, {0, 1});
  WriteTinyCheckpoint(job_dir, 8, 2, {0, 1});
  GrpcCheckpointCatalog catalog(channel_, absl::Seconds(30));
  auto before = catalog.NewestIntact("job-c", "");
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->step, 8);
  EXPECT_EQ(before->skipped, "");

  const std::string shard = job_dir + "/step_00000008/rank_1.shard";
  std::string bytes = *ReadFile(shard);
  bytes[bytes.size() / 2] ^= 0x01;
  ASSERT_TRUE(WriteFileAtomically(shard, bytes).ok());
  auto list = [&] {
    grpc::ClientContext ctx;
    v1::ListCheckpointsRequest req;
    req.set_job_id("job-c");
    v1::ListCheckpointsResponse resp;
    EXPECT_TRUE(stub_->ListCheckpoints(&ctx, req, &resp).ok());
    return resp;
  };
  // Listing reads no shard contents: until something verifies it, step 8 looks committed.
  ASSERT_EQ(list().checkpoints_size(), 2);
  EXPECT_TRUE(list().checkpoints(1).committed());

  auto chosen = catalog.NewestIntact("job-c", "");
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ(chosen->step, 4);
  EXPECT_EQ(chosen->path, job_dir + "/step_00000004");
  EXPECT_NE(chosen->skipped.find("skipped step 8 ("), std::string::npos) << chosen->skipped;
  EXPECT_NE(chosen->skipped.find("rank_1.shard"), std::string::npos) << chosen->skipped;

  v1::ListCheckpointsResponse after = list();
  ASSERT_EQ(after.checkpoints_size(), 2);
  EXPECT_TRUE(after.checkpoints(0).committed());
  EXPECT_FALSE(after.checkpoints(0).corrupt());
  EXPECT_FALSE(after.checkpoints(1).committed());
  EXPECT_TRUE(after.checkpoints(1).corrupt());
  EXPECT_NE(after.checkpoints(1).corrupt_reason().find("CRC-32"), std::string::npos)
      << after.checkpoints(1).corrupt_reason();
  // The newest committed (consolidation's default) is now step 4, and a verify of step 8 still
  // answers DATA_LOSS.
  {
    grpc::ClientContext ctx;
    v1::VerifyCheckpointRequest req;
    req.set_job_id("job-c");
    req.set_step(8);
    v1::VerifyCheckpointResponse resp;
    EXPECT_EQ(stub_->VerifyCheckpoint(&ctx, req, &resp).error_code(),
              grpc::StatusCode::DATA_LOSS);
  }
  auto newest = catalog.NewestCommitted("job-c", "");
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->step, 4);

  // Both corrupt: no intact resume point (NOT_FOUND naming the skipped steps).
  const std::string shard4 = job_dir + "/step_00000004/rank_0.shard";
  bytes = *ReadFile(shard4);
  bytes[0] ^= 0x01;
  ASSERT_TRUE(WriteFileAtomically(shard4, bytes).ok());
  auto none = catalog.NewestIntact("job-c", "");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound) << none.status();
  EXPECT_NE(none.status().message().find("skipped step 8"), absl::string_view::npos);
  EXPECT_NE(none.status().message().find("skipped step 4"), absl::string_view::npos);
}

// Regression (break-it pass, 2026-12-05): VerifyCheckpoint refused step 0, which
// ConsolidateCheckpoint takes as "the newest committed step"; now both do.
TEST_F(CheckpointServiceTest, VerifyStepZeroIsTheNewestCommittedStep) {
  const std::string job_dir = root_ + "/job-v";
  WriteTinyCheckpoint(job_dir, 4, 2, {0, 1});
  WriteTinyCheckpoint(job_dir, 8, 2, {0, 1});
  WriteTinyCheckpoint(job_dir, 12, 2, {0});  // partial: not committed
  auto verify = [&](int64_t step, v1::VerifyCheckpointResponse* resp) {
    grpc::ClientContext ctx;
    v1::VerifyCheckpointRequest req;
    req.set_job_id("job-v");
    req.set_step(step);
    return stub_->VerifyCheckpoint(&ctx, req, resp);
  };
  v1::VerifyCheckpointResponse resp;
  grpc::Status s = verify(0, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_GT(resp.files_size(), 0);
  EXPECT_NE(resp.files(0).find(job_dir + "/step_00000008/"), std::string::npos) << resp.files(0);
  s = verify(-3, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("step: -3 is negative"), std::string::npos) << s.error_message();
}

// Regression (break-it pass, 2026-12-05): a step with a truncated manifest was passed over like
// a partial one, and the job restarted from an older step with no word about why.
TEST_F(CheckpointServiceTest, StepWithAnUnreadableManifestIsListedDamagedAndNamedAsSkipped) {
  const std::string job_dir = root_ + "/job-m";
  WriteTinyCheckpoint(job_dir, 4, 2, {0, 1});
  WriteTinyCheckpoint(job_dir, 8, 2, {0, 1});
  ASSERT_TRUE(WriteFileAtomically(job_dir + "/step_00000008/rank_1.manifest.json", "{\"fo").ok());
  grpc::ClientContext ctx;
  v1::ListCheckpointsRequest req;
  req.set_job_id("job-m");
  v1::ListCheckpointsResponse resp;
  ASSERT_TRUE(stub_->ListCheckpoints(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.checkpoints_size(), 2);
  EXPECT_FALSE(resp.checkpoints(1).committed());
  EXPECT_NE(resp.checkpoints(1).damaged_reason().find("unreadable manifest of rank 1"),
            std::string::npos)
      << resp.checkpoints(1).damaged_reason();
  EXPECT_EQ(resp.checkpoints(0).damaged_reason(), "");
  GrpcCheckpointCatalog catalog(channel_, absl::Seconds(30));
  auto chosen = catalog.NewestIntact("job-m", "");
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ(chosen->step, 4);
  EXPECT_NE(chosen->skipped.find("skipped step 8 ("), std::string::npos) << chosen->skipped;
  EXPECT_NE(chosen->skipped.find("rank_1.manifest.json"), std::string::npos) << chosen->skipped;
}

// The same for a side file (a technique's state, e.g. ZenFlow's) that a rank's manifest lists.
// Regression: such a file with a flipped byte verified OK, so every restart resumed from that
// step and failed with DATA_LOSS until the job ran out of restarts.
TEST_F(CheckpointServiceTest, CorruptSideFileMakesTheStepCorruptForResume) {
  const std::string job_dir = root_ + "/job-s";
  WriteTinyCheckpoint(job_dir, 4, 2, {0, 1});
  WriteTinyCheckpoint(job_dir, 8, 2, {0, 1});
  const std::string step8 = job_dir + "/step_00000008";
  const std::string state = "ZenFlow state of rank 0 at step 8";
  ASSERT_TRUE(WriteFileAtomically(step8 + "/zenflow_rank0.bin", state).ok());
  auto m = storage::ReadManifest(step8, 0);
  ASSERT_TRUE(m.ok()) << m.status();
  m->side_files.push_back({"zenflow_rank0.bin", static_cast<int64_t>(state.size()),
                           storage::Crc32(0, state.data(), state.size())});
  ASSERT_TRUE(
      WriteFileAtomically(step8 + "/" + storage::ManifestFileName(0), ManifestToJson(*m)).ok());
  GrpcCheckpointCatalog catalog(channel_, absl::Seconds(30));
  auto before = catalog.NewestIntact("job-s", "");
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->step, 8);

  std::string bad = state;
  bad[3] ^= 0x01;
  ASSERT_TRUE(WriteFileAtomically(step8 + "/zenflow_rank0.bin", bad).ok());
  auto chosen = catalog.NewestIntact("job-s", "");
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ(chosen->step, 4);
  EXPECT_NE(chosen->skipped.find("zenflow_rank0.bin (rank 0): CRC-32"), std::string::npos)
      << chosen->skipped;
}

TEST_F(CheckpointServiceTest, DefaultHealthServiceReportsServing) {
  grpc::GenericStub generic(channel_);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  grpc::Slice no_bytes{std::string()};
  grpc::ByteBuffer request(&no_bytes, 1);  // an empty HealthCheckRequest (a valid, 0-byte message)
  auto call = generic.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  ASSERT_TRUE(ok);
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST(CheckpointServiceHelpersTest, JobDir) {
  EXPECT_EQ(*JobCheckpointDir("/root", "job-7"), "/root/job-7");
  EXPECT_EQ(JobCheckpointDir("/root", "a..b").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(JobCheckpointDir("/root", ".").status().code(), absl::StatusCode::kInvalidArgument);
}

// The real binary: flags, LOOM_READY/ready file, gRPC, /metrics, graceful SIGTERM.
TEST(LoomCheckpointBinaryTest, ServesAndShutsDownOnSigterm) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  std::string binary = "services/checkpoint/loom-checkpoint";
  if (srcdir != nullptr && ::access(absl::StrCat(srcdir, "/loom/", binary).c_str(), X_OK) == 0) {
    binary = absl::StrCat(srcdir, "/loom/", binary);
  }
  ASSERT_EQ(::access(binary.c_str(), X_OK), 0) << binary;
  const std::string root = TmpDir("binary_root");
  const std::string ready = root + "/ready.json";
  WriteTinyCheckpoint(root + "/job-b", 5, 2, {0, 1});
  const std::string log = root + "/stdout.log";

  auto proc = testing::Subprocess::Start({binary, "--checkpoint_root=" + root,
                                          "--ready_file=" + ready, "--port=0", "--metrics_port=0"},
                                         log);
  ASSERT_TRUE(proc.ok()) << proc.status();
  absl::StatusOr<ReadyInfo> info = testing::WaitReady(*proc, ready);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->name, "loom-checkpoint");

  v1::ConsolidateCheckpointResponse resp;
  {  // Scoped: the channel (held by stub and context) closes before SIGTERM.
    auto stub = v1::CheckpointService::NewStub(
        grpc::CreateChannel(info->grpc_address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::ConsolidateCheckpointRequest req;
    req.set_job_id("job-b");
    grpc::Status s = stub->ConsolidateCheckpoint(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.step(), 5);
    EXPECT_EQ(resp.num_tensors(), 2);
  }

  absl::StatusOr<std::string> scraped = testing::HttpGet(info->metrics_url);
  ASSERT_TRUE(scraped.ok()) << scraped.status();
  const std::string& metrics = *scraped;
  EXPECT_NE(metrics.find("loom_checkpoint_consolidations_total{result=\"ok\"} 1"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("loom_checkpoint_consolidation_seconds_count 1"), std::string::npos);
  EXPECT_NE(metrics.find(absl::StrCat("loom_checkpoint_consolidated_bytes_total ",
                                      resp.total_bytes())),
            std::string::npos);

  EXPECT_EQ(testing::ExitCode(proc->Stop(absl::Seconds(10))), 0);
  auto out = ReadFile(log);
  ASSERT_TRUE(out.ok());
  EXPECT_NE(out->find("LOOM_READY loom-checkpoint grpc=" + info->grpc_address +
                      " metrics=" + info->metrics_url),
            std::string::npos)
      << *out;
}

}  // namespace
}  // namespace loom
