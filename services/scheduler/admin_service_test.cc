// Integration test: AdminService (nodes, cordon/drain, queues) of a real SchedulerServer on
// loopback port 0 over SQLite, plus queue checks at submission through JobService.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <chrono>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "common/file_util.h"
#include "common/grpc_credentials.h"
#include "gtest/gtest.h"
#include "proto/admin_service.grpc.pb.h"
#include "proto/job_service.grpc.pb.h"
#include "proto/worker_service.grpc.pb.h"
#include "scheduler/test_job_spec.h"
#include "services/scheduler/scheduler_server.h"

namespace loom {
namespace {

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return ctx;
}

TEST(AdminServiceTest, NodesCordonDrainAndQueuesOverGrpc) {
  SchedulerServerOptions options;
  options.db_path = TmpDir() + "/admin_service_test.db";
  options.schedule_interval = absl::Milliseconds(10);
  options.scheduler.checkpoint_root = TmpDir() + "/checkpoints";
  options.scheduler.validation.fortunes_dir = TmpDir() + "/fortunes";
  ASSERT_TRUE(MakeDirs(options.scheduler.validation.fortunes_dir).ok());
  absl::StatusOr<QueuesConfig> queues = ParseQueuesConfig(
      "queues: [{name: default, quota: {cpu: 4}}, {name: private, tenant: someone-else}]");
  ASSERT_TRUE(queues.ok()) << queues.status();
  options.scheduler.queues = *queues;
  absl::StatusOr<std::unique_ptr<SchedulerServer>> server = SchedulerServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel((*server)->grpc_address(), grpc::InsecureChannelCredentials());
  auto admin = loom::v1::AdminService::NewStub(channel);
  auto jobs = loom::v1::JobService::NewStub(channel);
  auto workers = loom::v1::WorkerService::NewStub(channel);

  for (const char* node : {"node-a", "node-b"}) {
    loom::v1::RegisterWorkerRequest req;
    req.set_node_id(node);
    req.mutable_inventory()->set_slots(2);
    req.mutable_inventory()->set_topology_domain("rack-1");
    req.mutable_inventory()->set_cpu_arch("x86_64");
    (*req.mutable_inventory()->mutable_labels())["zone"] = "a";
    loom::v1::RegisterWorkerResponse resp;
    ASSERT_TRUE(workers->RegisterWorker(Ctx().get(), req, &resp).ok());
  }
  loom::v1::NodeInfo info;
  loom::v1::CordonNodeRequest cordon;
  cordon.set_node_id("node-b");
  cordon.set_reason("memory errors");
  ASSERT_TRUE(admin->CordonNode(Ctx().get(), cordon, &info).ok());
  EXPECT_TRUE(info.cordoned());
  cordon.set_node_id("node-x");
  EXPECT_EQ(admin->CordonNode(Ctx().get(), cordon, &info).error_code(), grpc::StatusCode::NOT_FOUND);

  // A 2-rank job lands on node-a (node-b is cordoned).
  loom::v1::SubmitJobRequest submit;
  *submit.mutable_spec() = TestJobSpecWithRanks(2);
  loom::v1::SubmitJobResponse submitted;
  ASSERT_TRUE(jobs->SubmitJob(Ctx().get(), submit, &submitted).ok());
  const std::string job_id = submitted.job().id();
  loom::v1::Job job;
  for (int i = 0; i < 500 && job.phase() != loom::v1::JOB_PHASE_STARTING; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    loom::v1::GetJobRequest get;
    get.set_job_id(job_id);
    ASSERT_TRUE(jobs->GetJob(Ctx().get(), get, &job).ok());
  }
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(job.rank_nodes(0), "node-a");
  EXPECT_EQ(job.rank_nodes(1), "node-a");

  loom::v1::ListNodesResponse nodes;
  ASSERT_TRUE(admin->ListNodes(Ctx().get(), {}, &nodes).ok());
  ASSERT_EQ(nodes.nodes_size(), 2);
  EXPECT_EQ(nodes.nodes(0).node_id(), "node-a");
  EXPECT_EQ(nodes.nodes(0).used_slots(), 2);
  EXPECT_EQ(nodes.nodes(0).inventory().topology_domain(), "rack-1");
  EXPECT_EQ(nodes.nodes(0).inventory().labels().at("zone"), "a");
  EXPECT_TRUE(nodes.nodes(1).cordoned());
  EXPECT_EQ(nodes.nodes(1).admin_reason(), "memory errors");

  loom::v1::ListQueuesResponse q;
  ASSERT_TRUE(admin->ListQueues(Ctx().get(), {}, &q).ok());
  ASSERT_EQ(q.queues_size(), 2);
  EXPECT_EQ(q.queues(0).name(), "default");
  EXPECT_EQ(q.queues(0).nominal_quota().at("cpu"), 4);
  EXPECT_EQ(q.queues(0).usage().at("cpu"), 2);
  EXPECT_EQ(q.queues(0).running_jobs(), 1);
  EXPECT_EQ(q.queues(1).tenant(), "someone-else");

  // Drain node-a: the job goes back to PENDING; uncordoning node-b lets it start there.
  loom::v1::DrainNodeRequest drain;
  drain.set_node_id("node-a");
  loom::v1::DrainNodeResponse drained;
  ASSERT_TRUE(admin->DrainNode(Ctx().get(), drain, &drained).ok());
  ASSERT_EQ(drained.requeued_job_ids_size(), 1);
  EXPECT_EQ(drained.requeued_job_ids(0), job_id);
  EXPECT_TRUE(drained.node().draining());
  loom::v1::UncordonNodeRequest uncordon;
  uncordon.set_node_id("node-b");
  ASSERT_TRUE(admin->UncordonNode(Ctx().get(), uncordon, &info).ok());
  EXPECT_FALSE(info.cordoned());
  // node-a's worker reports nothing: the stopped ranks are gone, their slots free.
  loom::v1::HeartbeatRequest beat;
  beat.set_node_id("node-a");
  loom::v1::HeartbeatResponse beat_resp;
  ASSERT_TRUE(workers->Heartbeat(Ctx().get(), beat, &beat_resp).ok());
  job.Clear();
  for (int i = 0; i < 500 && job.attempt() != 2; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    loom::v1::GetJobRequest get;
    get.set_job_id(job_id);
    ASSERT_TRUE(jobs->GetJob(Ctx().get(), get, &job).ok());
  }
  ASSERT_EQ(job.attempt(), 2);
  EXPECT_EQ(job.rank_nodes(0), "node-b");

  // Queue checks at submission.
  submit.mutable_spec()->set_queue("nope");
  grpc::Status s = jobs->SubmitJob(Ctx().get(), submit, &submitted);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("queue nope does not exist"), std::string::npos) << s.error_message();
  submit.mutable_spec()->set_queue("private");
  s = jobs->SubmitJob(Ctx().get(), submit, &submitted);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(s.error_message().find("queue private belongs to tenant someone-else"), std::string::npos)
      << s.error_message();
  (*server)->Shutdown(absl::Seconds(1));
}

// Hostile inputs over gRPC: each gets its own canonical code, never a crash, a hang or a
// transport error (an echoed huge identifier must not blow the status trailer).
TEST(AdminServiceTest, HostileInputsGetCanonicalCodes) {
  SchedulerServerOptions options;
  options.db_path = TmpDir() + "/admin_hostile.db";
  options.scheduler.checkpoint_root = TmpDir() + "/checkpoints";
  options.scheduler.validation.fortunes_dir = TmpDir() + "/fortunes";
  ASSERT_TRUE(MakeDirs(options.scheduler.validation.fortunes_dir).ok());
  absl::StatusOr<std::unique_ptr<SchedulerServer>> server = SchedulerServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel((*server)->grpc_address(), grpc::InsecureChannelCredentials());
  auto admin = loom::v1::AdminService::NewStub(channel);
  auto jobs = loom::v1::JobService::NewStub(channel);
  const std::string huge(1 << 20, 'x');
  // Odd but valid UTF-8 (proto3 strings must be UTF-8; gRPC itself rejects other bytes).
  const std::string odd("q\n\r\0\x01%/..\xe2\x82\xac \xf0\x9f\x92\xa5", 17);
  loom::v1::NodeInfo info;
  for (const std::string& id : {std::string(), std::string(300, 'n'), huge, odd}) {
    loom::v1::CordonNodeRequest cordon;
    cordon.set_node_id(id);
    const grpc::StatusCode code = admin->CordonNode(Ctx().get(), cordon, &info).error_code();
    EXPECT_TRUE(code == grpc::StatusCode::NOT_FOUND || code == grpc::StatusCode::INVALID_ARGUMENT)
        << id.size() << " -> " << code;
  }
  loom::v1::SubmitJobRequest submit;
  *submit.mutable_spec() = TestJobSpecWithRanks(1);
  loom::v1::SubmitJobResponse submitted;
  for (const std::string& queue : {huge, odd}) {
    submit.mutable_spec()->set_queue(queue);
    grpc::Status s = jobs->SubmitJob(Ctx().get(), submit, &submitted);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << queue.size() << " -> " << s.error_code() << " " << s.error_message().substr(0, 200);
  }
  submit.mutable_spec()->clear_queue();
  submit.mutable_spec()->set_max_infra_restarts(-5);
  EXPECT_EQ(jobs->SubmitJob(Ctx().get(), submit, &submitted).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  submit.mutable_spec()->clear_max_infra_restarts();
  for (int32_t priority : {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()}) {
    submit.mutable_spec()->set_priority(priority);
    grpc::Status s = jobs->SubmitJob(Ctx().get(), submit, &submitted);
    EXPECT_TRUE(s.ok()) << priority << " -> " << s.error_message();
  }
  loom::v1::ListJobsRequest list;
  list.set_tenant(huge);
  list.set_queue(huge);
  list.set_name_prefix(huge);
  loom::v1::ListJobsResponse listed;
  grpc::Status ls = jobs->ListJobs(Ctx().get(), list, &listed);
  EXPECT_TRUE(ls.ok()) << ls.error_code() << " " << ls.error_message().substr(0, 200);
  EXPECT_EQ(listed.jobs_size(), 0);
  list.Clear();
  list.set_page_token(huge);
  ls = jobs->ListJobs(Ctx().get(), list, &listed);
  EXPECT_EQ(ls.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << ls.error_message().substr(0, 200);
  for (int32_t tail : {-1, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()}) {
    loom::v1::StreamLogsRequest logs;
    logs.set_job_id(submitted.job().id());
    logs.set_tail_lines(tail);
    logs.add_ranks(std::numeric_limits<int32_t>::max());
    logs.add_ranks(std::numeric_limits<int32_t>::min());
    auto ctx = Ctx();
    auto reader = jobs->StreamLogs(ctx.get(), logs);
    loom::v1::LogLine line;
    int n = 0;
    while (reader->Read(&line)) ++n;
    grpc::Status s = reader->Finish();
    EXPECT_EQ(n, 0);
    // Ranks the job does not have are refused too (they streamed nothing with OK).
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << tail << " -> " << s.error_message();
  }
  loom::v1::StreamLogsRequest logs;
  logs.set_job_id(huge);
  auto ctx = Ctx();
  auto reader = jobs->StreamLogs(ctx.get(), logs);
  loom::v1::LogLine line;
  while (reader->Read(&line)) {
  }
  grpc::Status s = reader->Finish();
  EXPECT_TRUE(s.error_code() == grpc::StatusCode::NOT_FOUND ||
              s.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
      << s.error_code() << " " << s.error_message().substr(0, 200);
  (*server)->Shutdown(absl::Seconds(1));
}

// With authentication, node administration needs an admin token; ListQueues any valid token.
TEST(AdminServiceTest, AuthenticationAndAdminRole) {
  const std::string tmp = TmpDir();
  ASSERT_TRUE(WriteFileAtomically(tmp + "/admin_tokens.yaml",
                                  "tokens:\n"
                                  "  - {tenant: team-a, role: user, token: user-token-123}\n"
                                  "  - {tenant: ops, role: admin, token: admin-token-123}\n")
                  .ok());
  SchedulerServerOptions options;
  options.db_path = tmp + "/admin_auth.db";
  options.scheduler.checkpoint_root = tmp + "/checkpoints";
  options.scheduler.validation.fortunes_dir = tmp + "/fortunes";
  ASSERT_TRUE(MakeDirs(options.scheduler.validation.fortunes_dir).ok());
  options.auth_tokens_file = tmp + "/admin_tokens.yaml";
  options.worker_token = "worker-token-123";
  absl::StatusOr<std::unique_ptr<SchedulerServer>> server = SchedulerServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto admin = loom::v1::AdminService::NewStub(
      grpc::CreateChannel((*server)->grpc_address(), grpc::InsecureChannelCredentials()));
  auto call = [&](const std::string& token) {
    auto ctx = Ctx();
    if (!token.empty()) AddBearerToken(*ctx, token);
    loom::v1::ListNodesResponse nodes;
    return admin->ListNodes(ctx.get(), {}, &nodes).error_code();
  };
  EXPECT_EQ(call(""), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("user-token-123"), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(call("admin-token-123"), grpc::StatusCode::OK);
  auto ctx = Ctx();
  AddBearerToken(*ctx, "user-token-123");
  loom::v1::ListQueuesResponse queues;
  EXPECT_TRUE(admin->ListQueues(ctx.get(), {}, &queues).ok());
  EXPECT_EQ(queues.queues_size(), 1);
  (*server)->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace loom
