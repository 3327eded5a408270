// Per-tenant limits against the real loom-scheduler (SchedulerServer on loopback, real SQLite
// file, bearer tokens for two tenants): the caps on open WatchJob/StreamLogs streams
// (stream_limits.h) and on a tenant's unfinished jobs (SchedulerOptions::
// max_unfinished_jobs_per_tenant, queues tenants.<t>.max_unfinished_jobs). Regression (H2): one
// tenant grew the scheduler's memory without bound with 40,000 WatchJob streams (1.25 GB) or
// 1,200 never-schedulable 60 KB submissions.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/grpc_credentials.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/job_service.grpc.pb.h"
#include "scheduler/queues.h"
#include "scheduler/test_job_spec.h"
#include "services/scheduler/scheduler_server.h"

namespace loom {
namespace {

using ::testing::HasSubstr;
using loom::v1::Job;
using loom::v1::JobEvent;

constexpr char kTokenA[] = "token-team-a-0001";
constexpr char kTokenB[] = "token-team-b-0002";
constexpr char kWorkerToken[] = "worker-token-0004";

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token, int deadline_s = 30) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(deadline_s));
  AddBearerToken(*ctx, token);
  return ctx;
}

// One open server stream on the client side.
template <typename Message>
struct OpenStream {
  std::unique_ptr<grpc::ClientContext> ctx;
  std::unique_ptr<grpc::ClientReader<Message>> reader;
};

class TenantLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string tokens = TmpDir() + "/tokens.yaml";
    ASSERT_TRUE(WriteFileAtomically(tokens, absl::StrCat("tokens:\n"
                                                         "  - {tenant: team-a, role: user, token: ",
                                                         kTokenA, "}\n",
                                                         "  - {tenant: team-b, role: user, token: ",
                                                         kTokenB, "}\n"))
                    .ok());
    SchedulerServerOptions o;
    o.db_path = TmpDir() + "/tenant_limits_test.db";
    std::remove(o.db_path.c_str());
    o.auth_tokens_file = tokens;
    o.worker_token = kWorkerToken;
    o.scheduler.checkpoint_root = TmpDir() + "/checkpoints";
    o.scheduler.validation.fortunes_dir = TmpDir() + "/fortunes";
    ASSERT_TRUE(MakeDirs(o.scheduler.validation.fortunes_dir).ok());
    // Small caps: 2 streams per tenant, 3 in all; 2 unfinished jobs per tenant, 3 for team-b.
    o.streams.max_streams_per_tenant = 2;
    o.streams.max_streams = 3;
    o.scheduler.max_unfinished_jobs_per_tenant = 2;
    absl::StatusOr<QueuesConfig> queues = ParseQueuesConfig(
        "tenants: {team-b: {max_unfinished_jobs: 3}}\n"
        "queues: [{name: default}]\n");
    ASSERT_TRUE(queues.ok()) << queues.status();
    o.scheduler.queues = *queues;
    auto server = SchedulerServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    jobs_ = loom::v1::JobService::NewStub(
        grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials()));
  }

  // No worker registers, so a submitted job stays PENDING (unfinished) until cancelled.
  grpc::Status Submit(const std::string& token, Job* job, const std::string& request_id = "",
                      bool validate_only = false) {
    loom::v1::SubmitJobRequest req;
    *req.mutable_spec() = ValidTestJobSpec();
    req.set_request_id(request_id);
    req.set_validate_only(validate_only);
    loom::v1::SubmitJobResponse resp;
    grpc::Status s = jobs_->SubmitJob(Ctx(token).get(), req, &resp);
    if (job != nullptr) *job = resp.job();
    return s;
  }

  // `deadline_s`: short for a stream expected to be refused (at once), so that a stream accepted
  // by mistake fails the test instead of hanging it.
  OpenStream<JobEvent> Watch(const std::string& token, const std::string& job_id,
                             int deadline_s = 30) {
    OpenStream<JobEvent> s;
    s.ctx = Ctx(token, deadline_s);
    loom::v1::WatchJobRequest req;
    req.set_job_id(job_id);
    s.reader = jobs_->WatchJob(s.ctx.get(), req);
    return s;
  }

  // A stream the server accepted writes its "Snapshot" first.
  static void ExpectAccepted(OpenStream<JobEvent>& s) {
    JobEvent event;
    ASSERT_TRUE(s.reader->Read(&event)) << "stream refused: " << s.reader->Finish().error_message();
    EXPECT_EQ(event.type(), "Snapshot");
  }

  // A refused stream ends at once, writing nothing.
  template <typename Message>
  static grpc::Status Refusal(OpenStream<Message>& s) {
    Message m;
    while (s.reader->Read(&m)) ADD_FAILURE() << "a stream over the cap was accepted";
    return s.reader->Finish();
  }

  static void Close(OpenStream<JobEvent>& s) {
    s.ctx->TryCancel();
    JobEvent event;
    while (s.reader->Read(&event)) {
    }
    EXPECT_EQ(s.reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }

  std::unique_ptr<SchedulerServer> server_;
  std::unique_ptr<loom::v1::JobService::Stub> jobs_;
};

TEST_F(TenantLimitsTest, StreamCapPerTenantAndServerWide) {
  Job a, b;
  ASSERT_TRUE(Submit(kTokenA, &a).ok());
  ASSERT_TRUE(Submit(kTokenB, &b).ok());

  std::vector<OpenStream<JobEvent>> a_streams;
  for (int i = 0; i < 2; ++i) {
    a_streams.push_back(Watch(kTokenA, a.id()));
    ExpectAccepted(a_streams.back());
  }
  // team-a's third stream, a log follower this time: refused at once, naming the limit.
  OpenStream<loom::v1::LogLine> logs;
  logs.ctx = Ctx(kTokenA, 5);
  loom::v1::StreamLogsRequest logs_req;
  logs_req.set_job_id(a.id());
  logs_req.set_follow(true);
  logs.reader = jobs_->StreamLogs(logs.ctx.get(), logs_req);
  grpc::Status refused = Refusal(logs);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("tenant team-a has 2 open"));
  EXPECT_THAT(refused.error_message(), HasSubstr("--max_streams_per_tenant) is 2"));
  OpenStream<JobEvent> a_third = Watch(kTokenA, a.id(), 5);
  EXPECT_EQ(Refusal(a_third).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  // Another tenant is not held back by team-a's streams...
  OpenStream<JobEvent> b_stream = Watch(kTokenB, b.id());
  ExpectAccepted(b_stream);
  // ...until the server-wide cap (3) is reached.
  OpenStream<JobEvent> b_second = Watch(kTokenB, b.id(), 5);
  refused = Refusal(b_second);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("(--max_streams) is 3"));
  EXPECT_EQ(server_->stream_limiter().TotalStreams(), 3);

  // A cancelled stream gives its slot back (once the server saw the cancel: it reaches the
  // server asynchronously, so wait for it there), and team-a may open a new one.
  Close(a_streams[0]);
  ASSERT_TRUE(server_->stream_limiter().AwaitStreamsAtMost("team-a", 1, absl::Seconds(30)));
  OpenStream<JobEvent> a_again = Watch(kTokenA, a.id());
  ExpectAccepted(a_again);

  // A stream the job's end finished gives its slot back too.
  Job cancelled;
  ASSERT_TRUE(jobs_->CancelJob(Ctx(kTokenB).get(), [&] {
                     loom::v1::CancelJobRequest r;
                     r.set_job_id(b.id());
                     return r;
                   }(), &cancelled)
                  .ok());
  JobEvent event;
  while (b_stream.reader->Read(&event)) {
  }
  EXPECT_TRUE(b_stream.reader->Finish().ok());
  ASSERT_TRUE(server_->stream_limiter().AwaitStreamsAtMost("team-b", 0, absl::Seconds(30)));

  Close(a_streams[1]);
  Close(a_again);
  ASSERT_TRUE(server_->stream_limiter().AwaitStreamsAtMost("team-a", 0, absl::Seconds(30)));
  EXPECT_EQ(server_->stream_limiter().TotalStreams(), 0);
}

TEST_F(TenantLimitsTest, UnfinishedJobCapPerTenant) {
  Job a1, a2;
  ASSERT_TRUE(Submit(kTokenA, &a1, "req-a1").ok());
  ASSERT_TRUE(Submit(kTokenA, &a2).ok());
  // The third unfinished job of team-a is refused, naming the limit and the count.
  grpc::Status refused = Submit(kTokenA, nullptr);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("tenant team-a has 2 unfinished jobs"));
  EXPECT_THAT(refused.error_message(), HasSubstr("--max_unfinished_jobs_per_tenant) is 2"));
  // A dry run stores nothing and is not counted; a retry of a stored submission is answered.
  EXPECT_TRUE(Submit(kTokenA, nullptr, "", /*validate_only=*/true).ok());
  Job retried;
  EXPECT_TRUE(Submit(kTokenA, &retried, "req-a1").ok());
  EXPECT_EQ(retried.id(), a1.id());

  // Another tenant may still submit, up to its own limit from the queues config (3).
  for (int i = 0; i < 3; ++i) {
    grpc::Status s = Submit(kTokenB, nullptr);
    ASSERT_TRUE(s.ok()) << i << ": " << s.error_message();
  }
  refused = Submit(kTokenB, nullptr);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("tenants.<tenant>.max_unfinished_jobs) is 3"));

  // Once one of team-a's jobs ended (cancelled while pending: at once), it may submit again.
  loom::v1::CancelJobRequest cancel;
  cancel.set_job_id(a1.id());
  Job cancelled;
  ASSERT_TRUE(jobs_->CancelJob(Ctx(kTokenA).get(), cancel, &cancelled).ok());
  ASSERT_EQ(cancelled.phase(), loom::v1::JOB_PHASE_CANCELLED);
  grpc::Status again = Submit(kTokenA, nullptr);
  EXPECT_TRUE(again.ok()) << again.error_message();
  EXPECT_EQ(Submit(kTokenA, nullptr).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

}  // namespace
}  // namespace loom
