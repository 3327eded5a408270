// Integration test: tenant isolation, worker tokens and TLS of the real SchedulerServer over real
// gRPC on loopback (port 0), plus its /healthz and /readyz.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <httplib.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/auth.h"
#include "common/file_util.h"
#include "common/grpc_credentials.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/job_service.grpc.pb.h"
#include "proto/worker_service.grpc.pb.h"
#include "scheduler/test_job_spec.h"
#include "services/scheduler/scheduler_server.h"

namespace loom {
namespace {

using ::loom::testing::StatusIs;

using loom::v1::Job;

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

constexpr char kTokenA[] = "token-team-a-0001";
constexpr char kTokenB[] = "token-team-b-0002";
constexpr char kTokenAdmin[] = "token-admin-0003";
constexpr char kWorkerToken[] = "worker-token-0004";

SchedulerServerOptions BaseOptions(const std::string& name) {
  SchedulerServerOptions o;
  o.db_path = absl::StrCat(TmpDir(), "/", name, ".db");
  std::remove(o.db_path.c_str());
  o.schedule_interval = absl::Milliseconds(10);
  o.scheduler.checkpoint_root = TmpDir() + "/checkpoints";
  o.scheduler.validation.fortunes_dir = TmpDir() + "/fortunes";
  EXPECT_TRUE(MakeDirs(o.scheduler.validation.fortunes_dir).ok());
  return o;
}

std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  AddBearerToken(*ctx, token);
  return ctx;
}

class AuthServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string tokens = TmpDir() + "/tokens.yaml";
    ASSERT_TRUE(WriteFileAtomically(
                    tokens, absl::StrCat("tokens:\n"
                                         "  - {tenant: team-a, role: user, token: ", kTokenA, "}\n",
                                         "  - {tenant: team-b, token_sha256: ", Sha256Hex(kTokenB),
                                         "}\n", "  - {tenant: ops, role: admin, token: ",
                                         kTokenAdmin, "}\n"))
                    .ok());
    SchedulerServerOptions o = BaseOptions("auth_service_test");
    o.auth_tokens_file = tokens;
    o.worker_token = kWorkerToken;
    auto server = SchedulerServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto channel = grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials());
    jobs_ = loom::v1::JobService::NewStub(channel);
    workers_ = loom::v1::WorkerService::NewStub(channel);
  }

  grpc::Status Submit(const std::string& token, Job* job, const std::string& name = "job") {
    loom::v1::SubmitJobRequest req;
    *req.mutable_spec() = ValidTestJobSpec();
    req.mutable_spec()->set_name(name);
    loom::v1::SubmitJobResponse resp;
    grpc::Status s = jobs_->SubmitJob(Ctx(token).get(), req, &resp);
    *job = resp.job();
    return s;
  }

  std::vector<std::string> List(const std::string& token, const std::string& tenant = "") {
    loom::v1::ListJobsRequest req;
    req.set_tenant(tenant);
    loom::v1::ListJobsResponse resp;
    grpc::Status s = jobs_->ListJobs(Ctx(token).get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::vector<std::string> ids;
    for (const Job& j : resp.jobs()) ids.push_back(j.id());
    return ids;
  }

  std::unique_ptr<SchedulerServer> server_;
  std::unique_ptr<loom::v1::JobService::Stub> jobs_;
  std::unique_ptr<loom::v1::WorkerService::Stub> workers_;
};

TEST_F(AuthServiceTest, MissingOrUnknownTokenIsUnauthenticated) {
  Job job;
  EXPECT_EQ(Submit("", &job).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Submit("not-a-known-token", &job).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Submit(kWorkerToken, &job).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  loom::v1::ListJobsResponse list;
  EXPECT_EQ(jobs_->ListJobs(Ctx("").get(), {}, &list).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  loom::v1::GetJobRequest get;
  get.set_job_id("nope");
  EXPECT_EQ(jobs_->GetJob(Ctx("").get(), get, &job).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(AuthServiceTest, TenantsSeeOnlyTheirOwnJobs) {
  Job a, b;
  ASSERT_TRUE(Submit(kTokenA, &a, "job-a").ok());
  ASSERT_TRUE(Submit(kTokenB, &b, "job-b").ok());
  EXPECT_EQ(a.tenant(), "team-a");
  EXPECT_EQ(b.tenant(), "team-b");

  // Another tenant's job answers exactly like a job that does not exist.
  loom::v1::GetJobRequest get;
  get.set_job_id(a.id());
  Job out;
  grpc::Status cross = jobs_->GetJob(Ctx(kTokenB).get(), get, &out);
  EXPECT_EQ(cross.error_code(), grpc::StatusCode::NOT_FOUND);
  get.set_job_id("j-does-not-exist");
  grpc::Status missing = jobs_->GetJob(Ctx(kTokenB).get(), get, &out);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(cross.error_message(),
            absl::StrCat("job ", a.id(), " not found"));
  get.set_job_id(a.id());
  ASSERT_TRUE(jobs_->GetJob(Ctx(kTokenA).get(), get, &out).ok());
  EXPECT_EQ(out.id(), a.id());

  loom::v1::ExplainPendingRequest explain;
  explain.set_job_id(a.id());
  loom::v1::ExplainPendingResponse why;
  EXPECT_EQ(jobs_->ExplainPending(Ctx(kTokenB).get(), explain, &why).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(jobs_->ExplainPending(Ctx(kTokenA).get(), explain, &why).ok());

  loom::v1::KillJobRequest kill;
  kill.set_job_id(a.id());
  EXPECT_EQ(jobs_->KillJob(Ctx(kTokenB).get(), kill, &out).error_code(),
            grpc::StatusCode::NOT_FOUND);

  loom::v1::WatchJobRequest watch;
  watch.set_job_id(a.id());
  auto wctx = Ctx(kTokenB);
  auto reader = jobs_->WatchJob(wctx.get(), watch);
  loom::v1::JobEvent ev;
  EXPECT_FALSE(reader->Read(&ev));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);

  loom::v1::StreamLogsRequest logs;
  logs.set_job_id(a.id());
  auto lctx = Ctx(kTokenB);
  auto log_reader = jobs_->StreamLogs(lctx.get(), logs);
  loom::v1::LogLine line;
  EXPECT_FALSE(log_reader->Read(&line));
  EXPECT_EQ(log_reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);

  loom::v1::CancelJobRequest cancel;
  cancel.set_job_id(a.id());
  EXPECT_EQ(jobs_->CancelJob(Ctx(kTokenB).get(), cancel, &out).error_code(),
            grpc::StatusCode::NOT_FOUND);
  // ResumeJob is authorized as CancelJob: another tenant's job does not exist for the caller
  // (its own job answers the scheduler's FAILED_PRECONDITION: it has not ended).
  loom::v1::ResumeJobRequest resume;
  resume.set_job_id(a.id());
  EXPECT_EQ(jobs_->ResumeJob(Ctx(kTokenB).get(), resume, &out).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(jobs_->ResumeJob(Ctx(kTokenA).get(), resume, &out).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  get.set_job_id(a.id());
  ASSERT_TRUE(jobs_->GetJob(Ctx(kTokenA).get(), get, &out).ok());
  EXPECT_EQ(out.phase(), loom::v1::JOB_PHASE_PENDING);  // the cross-tenant cancel did nothing

  EXPECT_EQ(List(kTokenA), std::vector<std::string>{a.id()});
  EXPECT_EQ(List(kTokenB), std::vector<std::string>{b.id()});
  // A user cannot widen its view by naming another tenant.
  EXPECT_EQ(List(kTokenA, "team-b"), std::vector<std::string>{a.id()});
  // Admins see all tenants, or filter by one; and may act on any job.
  EXPECT_EQ(List(kTokenAdmin), (std::vector<std::string>{a.id(), b.id()}));
  EXPECT_EQ(List(kTokenAdmin, "team-b"), std::vector<std::string>{b.id()});
  ASSERT_TRUE(jobs_->CancelJob(Ctx(kTokenAdmin).get(), cancel, &out).ok());
  EXPECT_EQ(out.id(), a.id());

  // The scheduler's gauges count jobs per tenant (after a scheduling cycle).
  std::string text;
  for (int i = 0; i < 200; ++i) {
    text = prometheus::TextSerializer().Serialize(server_->registry().Collect());
    if (text.find("loom_tenant_jobs{phase=\"CANCELLED\",queue=\"default\",tenant=\"team-a\"} 1") !=
        std::string::npos) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_NE(text.find("loom_tenant_jobs{phase=\"CANCELLED\",queue=\"default\",tenant=\"team-a\"} 1"),
            std::string::npos) << text;
  EXPECT_NE(text.find("loom_tenant_jobs{phase=\"PENDING\",queue=\"default\",tenant=\"team-b\"} 1"),
            std::string::npos) << text;
}

TEST_F(AuthServiceTest, WorkerServiceNeedsTheWorkerToken) {
  loom::v1::RegisterWorkerRequest req;
  req.set_node_id("node-1");
  req.mutable_inventory()->set_slots(1);
  req.mutable_inventory()->set_accelerator(loom::v1::ACCELERATOR_KIND_CPU);
  loom::v1::RegisterWorkerResponse resp;
  EXPECT_EQ(workers_->RegisterWorker(Ctx("").get(), req, &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(workers_->RegisterWorker(Ctx(kTokenAdmin).get(), req, &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  grpc::Status ok = workers_->RegisterWorker(Ctx(kWorkerToken).get(), req, &resp);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
}

TEST(AuthOffTest, EveryCallerIsTheDefaultTenant) {
  auto server = SchedulerServer::Start(BaseOptions("auth_off_test"));
  ASSERT_TRUE(server.ok()) << server.status();
  auto jobs = loom::v1::JobService::NewStub(
      grpc::CreateChannel((*server)->grpc_address(), grpc::InsecureChannelCredentials()));
  loom::v1::SubmitJobRequest req;
  *req.mutable_spec() = ValidTestJobSpec();
  loom::v1::SubmitJobResponse resp;
  grpc::Status s = jobs->SubmitJob(Ctx("").get(), req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.job().tenant(), "default");
  loom::v1::ListJobsRequest list_req;
  list_req.set_tenant("default");
  loom::v1::ListJobsResponse list;
  ASSERT_TRUE(jobs->ListJobs(Ctx("").get(), list_req, &list).ok());
  EXPECT_EQ(list.jobs_size(), 1);
  list_req.set_tenant("someone-else");
  ASSERT_TRUE(jobs->ListJobs(Ctx("").get(), list_req, &list).ok());
  EXPECT_EQ(list.jobs_size(), 0);
}

TEST(AuthOffTest, AuthWithoutWorkerTokenIsRejected) {
  SchedulerServerOptions o = BaseOptions("no_worker_token");
  o.auth_tokens_file = TmpDir() + "/whatever.yaml";
  auto server = SchedulerServer::Start(o);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("worker_token"), std::string::npos);
}

TEST(SchedulerTlsTest, TlsCallWorksAndPlaintextCallFails) {
  const std::string dir = TmpDir() + "/tls";
  ASSERT_TRUE(MakeDirs(dir).ok());
  const std::string cmd = absl::StrCat(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout ", dir, "/key.pem -out ", dir,
      "/cert.pem 2>", dir, "/openssl.log");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  SchedulerServerOptions o = BaseOptions("tls_test");
  o.tls_cert = dir + "/cert.pem";
  o.tls_key = dir + "/key.pem";
  auto server = SchedulerServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();

  auto creds = MakeChannelCredentials(dir + "/cert.pem");
  ASSERT_TRUE(creds.ok()) << creds.status();
  auto tls_jobs = loom::v1::JobService::NewStub(
      grpc::CreateChannel((*server)->grpc_address(), *creds));
  loom::v1::ListJobsResponse list;
  grpc::Status s = tls_jobs->ListJobs(Ctx("").get(), {}, &list);
  EXPECT_TRUE(s.ok()) << s.error_message();

  auto plain_jobs = loom::v1::JobService::NewStub(
      grpc::CreateChannel((*server)->grpc_address(), grpc::InsecureChannelCredentials()));
  auto ctx = Ctx("");
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  s = plain_jobs->ListJobs(ctx.get(), {}, &list);
  EXPECT_THAT(s, StatusIs(grpc::StatusCode::UNAVAILABLE));

  // A client that does not trust the server's certificate fails too.
  const std::string other = absl::StrCat(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=other -keyout ", dir,
      "/other-key.pem -out ", dir, "/other.pem 2>>", dir, "/openssl.log");
  ASSERT_EQ(std::system(other.c_str()), 0);
  auto wrong = MakeChannelCredentials(dir + "/other.pem");
  ASSERT_TRUE(wrong.ok());
  auto wrong_jobs = loom::v1::JobService::NewStub(
      grpc::CreateChannel((*server)->grpc_address(), *wrong));
  ctx = Ctx("");
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  EXPECT_THAT(wrong_jobs->ListJobs(ctx.get(), {}, &list),
              StatusIs(grpc::StatusCode::UNAVAILABLE));

  EXPECT_EQ(MakeServerCredentials(dir + "/cert.pem", "").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SchedulerHealthTest, HealthzAndReadyz) {
  auto server = SchedulerServer::Start(BaseOptions("health_test"));
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client c("127.0.0.1", std::stoi((*server)->metrics_url().substr(
                                     (*server)->metrics_url().rfind(':') + 1)));
  auto h = c.Get("/healthz");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  int status = 0;
  for (int i = 0; i < 200 && status != 200; ++i) {
    auto r = c.Get("/readyz");
    ASSERT_TRUE(r);
    status = r->status;
    if (status != 200) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(status, 200);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("loom_jobs{"), std::string::npos);
  EXPECT_EQ((*server)->ready_url(),
            (*server)->metrics_url().substr(0, (*server)->metrics_url().size() - 8) + "/readyz");
  (*server)->Shutdown(absl::Seconds(1));
  auto r = c.Get("/readyz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
}

}  // namespace
}  // namespace loom
