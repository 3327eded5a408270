// ListJobs pagination against the real loom-scheduler (SchedulerServer on loopback port 0, real
// SQLite file): jobs whose specs are at the admission limits (scheduler/job_spec_validation_limits.h)
// are listed completely, in submission order, in pages that gRPC's default 4 MB client limit
// accepts. Regression (issue 18): two jobs with 3 MB names made ListJobs fail for every user with
// "Received message larger than max", permanently.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "proto/job_service.grpc.pb.h"
#include "scheduler/job_spec_validation_limits.h"
#include "scheduler/test_job_spec.h"
#include "services/scheduler/scheduler_server.h"

namespace loom {
namespace {

using loom::v1::Job;
using loom::v1::JobSpec;

constexpr size_t kGrpcDefaultMaxMessage = 4 * 1024 * 1024;

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return ctx;
}

class ListJobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SchedulerServerOptions options;
    options.db_path = TmpDir() + "/list_jobs_test.db";
    std::remove(options.db_path.c_str());
    options.scheduler.checkpoint_root = TmpDir() + "/checkpoints";
    options.scheduler.validation.fortunes_dir = TmpDir() + "/fortunes";
    ASSERT_TRUE(MakeDirs(options.scheduler.validation.fortunes_dir).ok());
    absl::StatusOr<std::unique_ptr<SchedulerServer>> server = SchedulerServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    // A client with gRPC's default limits, as loomctl and the gateway have.
    jobs_ = loom::v1::JobService::NewStub(
        grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials()));
  }

  // A spec with every bounded field at its limit: a 63-byte name, a ~4000-byte dataset.path
  // (an existing corpus reached through "./" components) and model.config padded with a string
  // key until the serialized spec is exactly kMaxJobSpecBytes.
  JobSpec MaxSizeSpec(int i) {
    const std::string corpus_dir = TmpDir() + "/corpus";
    EXPECT_TRUE(MakeDirs(corpus_dir).ok());
    std::string text;
    for (int k = 0; k < 300; ++k) absl::StrAppend(&text, "fortune ", k, " with some words\n%\n");
    EXPECT_TRUE(WriteFileAtomically(corpus_dir + "/f.txt", text).ok());
    std::string path = corpus_dir + "/";
    while (path.size() < 4000) path += "./";
    path += "f.txt";

    JobSpec spec = ValidTestJobSpec();
    std::string name = absl::StrCat("job-", i, "-");
    name += std::string(kMaxJobNameBytes - name.size(), 'x');
    spec.set_name(name);
    spec.mutable_dataset()->set_name("");
    spec.mutable_dataset()->set_path(path);
    // The filler: a key transformers writes and Loom accepts unread (an unknown one is refused).
    auto& notes = (*spec.mutable_model()->mutable_config()->mutable_fields())["_name_or_path"];
    notes.set_string_value(std::string(kMaxJobSpecBytes - spec.ByteSizeLong() - 16, 'n'));
    while (spec.ByteSizeLong() < kMaxJobSpecBytes) notes.mutable_string_value()->push_back('n');
    while (spec.ByteSizeLong() > kMaxJobSpecBytes) notes.mutable_string_value()->pop_back();
    EXPECT_GE(spec.ByteSizeLong(), kMaxJobSpecBytes - 2);
    EXPECT_LE(spec.ByteSizeLong(), kMaxJobSpecBytes);
    return spec;
  }

  std::unique_ptr<SchedulerServer> server_;
  std::unique_ptr<loom::v1::JobService::Stub> jobs_;
};

TEST_F(ListJobsTest, ManyMaximumSizeJobsAreListedInPagesUnderTheGrpcLimit) {
  constexpr int kJobs = 100;  // 100 x 64 KiB = 6.4 MB: more than one 4 MB message
  std::vector<std::string> submitted;
  for (int i = 0; i < kJobs; ++i) {
    loom::v1::SubmitJobRequest req;
    *req.mutable_spec() = MaxSizeSpec(i);
    loom::v1::SubmitJobResponse resp;
    grpc::Status s = jobs_->SubmitJob(Ctx().get(), req, &resp);
    ASSERT_TRUE(s.ok()) << i << ": " << s.error_message();
    submitted.push_back(resp.job().id());
  }
  for (int page_size : {0, 1000, 7}) {
    SCOPED_TRACE(absl::StrCat("page_size ", page_size));
    loom::v1::ListJobsRequest req;
    req.set_page_size(page_size);
    std::vector<std::string> listed;
    int pages = 0;
    while (true) {
      loom::v1::ListJobsResponse resp;
      grpc::Status s = jobs_->ListJobs(Ctx().get(), req, &resp);
      ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
      ++pages;
      EXPECT_LT(resp.ByteSizeLong(), kGrpcDefaultMaxMessage / 2 + 64 * 1024);
      EXPECT_GE(resp.jobs_size(), 1);
      if (page_size > 0) {
        EXPECT_LE(resp.jobs_size(), page_size);
      }
      for (const Job& j : resp.jobs()) listed.push_back(j.id());
      if (resp.next_page_token().empty()) break;
      req.set_page_token(resp.next_page_token());
      ASSERT_LT(pages, 1000) << "pagination does not end";
    }
    EXPECT_EQ(listed, submitted);  // every job once, in submission order
    EXPECT_GE(pages, page_size == 7 ? (kJobs + 6) / 7 : 4);
  }
}

TEST_F(ListJobsTest, BadPageArgumentsAreInvalidArgumentNamingTheField) {
  loom::v1::ListJobsRequest req;
  loom::v1::ListJobsResponse resp;
  // Over the maximum: capped (Google AIP-158), not refused (issue 52 finding 6).
  req.set_page_size(1001);
  grpc::Status s = jobs_->ListJobs(Ctx().get(), req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  req.set_page_size(-1);
  s = jobs_->ListJobs(Ctx().get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("page_size: ", 0), 0u) << s.error_message();
  req.set_page_size(0);
  req.set_page_token("not a token");
  s = jobs_->ListJobs(Ctx().get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("page_token: ", 0), 0u) << s.error_message();
}

// Issue 42 defect 2: a model.config nested 30 levels was admitted, and then listing as JSON
// (what GET /v1/jobs does) failed with "Message too deep" for every tenant. Now it is refused at
// submission naming the field, a config at the limit lists as JSON, and an unknown phase number
// is refused naming the field instead of listing nothing.
TEST_F(ListJobsTest, DeepConfigsAreRefusedAndListingStaysEncodable) {
  auto nested = [](int levels) {
    google::protobuf::Value v;
    v.set_string_value("leaf");
    for (int i = 0; i < levels; ++i) {
      google::protobuf::Value outer;
      (*outer.mutable_struct_value()->mutable_fields())["k"] = std::move(v);
      v = std::move(outer);
    }
    return v;
  };
  loom::v1::SubmitJobRequest req;
  *req.mutable_spec() = ValidTestJobSpec();
  // Under a key transformers writes (a dict) and Loom accepts unread: an unknown key would be
  // refused for itself.
  auto& config = *req.mutable_spec()->mutable_model()->mutable_config()->mutable_fields();
  config["task_specific_params"] = nested(30);
  loom::v1::SubmitJobResponse resp;
  grpc::Status s = jobs_->SubmitJob(Ctx().get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message().rfind("model.config.task_specific_params.k.k", 0), 0u)
      << s.error_message();
  EXPECT_NE(s.error_message().find("16 levels"), std::string::npos) << s.error_message();

  // The deepest config admitted still lists, and encodes as JSON as the gateway does.
  config["task_specific_params"] = nested(kMaxConfigDepth - 1);
  s = jobs_->SubmitJob(Ctx().get(), req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  loom::v1::ListJobsResponse list;
  s = jobs_->ListJobs(Ctx().get(), loom::v1::ListJobsRequest(), &list);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(list.jobs_size(), 1);
  std::string json;
  const auto encoded = google::protobuf::util::MessageToJsonString(list, &json);
  EXPECT_TRUE(encoded.ok()) << encoded.message();

  loom::v1::ListJobsRequest bad;
  bad.set_phase(static_cast<loom::v1::JobPhase>(77));
  s = jobs_->ListJobs(Ctx().get(), bad, &list);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message(), "phase: 77 is not a known loom.v1.JobPhase");
}

// Issue 42 defect 2: a model.config nested 35+ levels deep was answered UNIMPLEMENTED with an
// empty message (gRPC 1.51's callback server when protobuf's 100-message parse limit stops the
// request). It now reaches validation, which names the field; deeper still is refused saying why.
TEST_F(ListJobsTest, DeeplyNestedSpecsAreRefusedNamingTheProblem) {
  auto nested = [](int levels) {
    google::protobuf::Value v;
    v.set_number_value(1);
    for (int i = 0; i < levels; ++i) {
      google::protobuf::Value outer;
      (*outer.mutable_struct_value()->mutable_fields())["x"] = std::move(v);
      v = std::move(outer);
    }
    return v;
  };
  for (int levels : {40, 100}) {
    loom::v1::SubmitJobRequest req;
    *req.mutable_spec() = ValidTestJobSpec();
    (*req.mutable_spec()->mutable_model()->mutable_config()->mutable_fields())["deep"] =
        nested(levels);
    loom::v1::SubmitJobResponse resp;
    grpc::Status s = jobs_->SubmitJob(Ctx().get(), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << levels << ": " << s.error_message();
    EXPECT_EQ(s.error_message().rfind("model.config.deep.x.x", 0), 0u) << s.error_message();
    EXPECT_NE(s.error_message().find("nested deeper than 16 levels"), std::string::npos)
        << s.error_message();
  }
  loom::v1::SubmitJobRequest req;
  *req.mutable_spec() = ValidTestJobSpec();
  (*req.mutable_spec()->mutable_model()->mutable_config()->mutable_fields())["deep"] = nested(200);
  loom::v1::SubmitJobResponse resp;
  grpc::Status s = jobs_->SubmitJob(Ctx().get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message().rfind("SubmitJobRequest: cannot be parsed", 0), 0u)
      << s.error_message();
  // The server is unharmed: a valid spec is still admitted.
  *req.mutable_spec() = ValidTestJobSpec();
  s = jobs_->SubmitJob(Ctx().get(), req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(resp.job().id().empty());
}

// Issue 47: a dry run (validate_only) runs the admission checks and says what Loom would use,
// without creating a job.
TEST_F(ListJobsTest, DryRunSaysWhatLoomWouldUseAndCreatesNothing) {
  loom::v1::SubmitJobRequest req;
  *req.mutable_spec() = ValidTestJobSpec();
  auto& ds = *req.mutable_spec()->mutable_deepspeed_config()->mutable_fields();
  ds["train_micro_batch_size_per_gpu"].set_string_value("auto");
  ds.erase("optimizer");
  req.mutable_spec()->mutable_training()->set_learning_rate(3e-4);
  req.set_validate_only(true);
  req.set_request_id("dry-1");
  loom::v1::SubmitJobResponse resp;
  grpc::Status s = jobs_->SubmitJob(Ctx().get(), req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.validated_only());
  EXPECT_TRUE(resp.job().id().empty());
  ASSERT_GE(resp.notes_size(), 2);
  EXPECT_EQ(resp.notes(0),
            "deepspeed_config.train_micro_batch_size_per_gpu: \"auto\" -> 8 "
            "(training.per_device_train_batch_size unset: the Trainer's default)");
  const auto& resolved = resp.resolved_deepspeed_config().fields();
  EXPECT_EQ(resolved.at("train_micro_batch_size_per_gpu").number_value(), 8);
  EXPECT_DOUBLE_EQ(resolved.at("optimizer").struct_value().fields().at("params").struct_value()
                       .fields().at("lr").number_value(),
                   3e-4);
  // Nothing was created, and the request id was not taken: a real submission with it works.
  loom::v1::ListJobsRequest list;
  loom::v1::ListJobsResponse listed;
  ASSERT_TRUE(jobs_->ListJobs(Ctx().get(), list, &listed).ok());
  EXPECT_EQ(listed.jobs_size(), 0);
  req.set_validate_only(false);
  s = jobs_->SubmitJob(Ctx().get(), req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(resp.validated_only());
  EXPECT_FALSE(resp.job().id().empty());
  // A refused spec is refused the same way.
  req.set_validate_only(true);
  req.mutable_spec()->mutable_training()->set_steps(0);
  s = jobs_->SubmitJob(Ctx().get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("training.steps", 0), 0u) << s.error_message();
}

}  // namespace
}  // namespace loom
