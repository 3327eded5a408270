// A "secure" local cluster of real binaries on loopback: loom-scheduler with bearer-token
// authentication, a worker token and TLS; loom-checkpoint with TLS (the scheduler reaches it over
// TLS); loom-worker authenticating with the worker token over TLS; loom-gateway forwarding the
// HTTP Authorization header over TLS. Checks tenant isolation over real HTTP (401 without a
// token, 404 for another tenant's job, lists scoped to the tenant, admins see all) and every
// daemon's /healthz and /readyz.
#include <httplib.h>

#include <sys/wait.h>

#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/daemon.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tiny_job.h"

namespace loom {
namespace {

using ::loom::testing::Subprocess;
using json = nlohmann::json;

// 4 ranks on the cluster's one 1-slot worker: it stays queued (asked to wait for capacity, as a
// gang larger than the nodes is otherwise refused at submission).
const std::string kSubmit = absl::StrCat(
    R"json({"waitForCapacity": true, "spec": )json",
    testing::TinyJobSpecJson("secure-tiny", 4), "}");

// "http://127.0.0.1:PORT/metrics" -> PORT
int PortOf(const std::string& url) {
  size_t colon = url.rfind(':');
  return std::atoi(url.substr(colon + 1).c_str());
}

// HTTP status of GET `path` on the daemon's metrics port (0 if unreachable).
int Status(const ReadyInfo& info, const std::string& path) {
  httplib::Client c("127.0.0.1", PortOf(info.metrics_url));
  c.set_read_timeout(5);
  auto r = c.Get(path.c_str());
  return r ? r->status : 0;
}

// Polls /readyz until it answers `want` (up to 20 s); returns the last status.
int WaitReadyz(const ReadyInfo& info, int want) {
  int s = 0;
  for (int i = 0; i < 200; ++i) {
    s = Status(info, "/readyz");
    if (s == want) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return s;
}

class SecureClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_TRUE(MakeDirs(tmp_ + "/checkpoints").ok());
    ASSERT_TRUE(MakeDirs(tmp_ + "/work").ok());
    // A self-signed certificate for 127.0.0.1 / localhost is both the servers' certificate and
    // the clients' CA.
    const std::string cmd = absl::StrCat(
        "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
        "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout ",
        tmp_, "/key.pem -out ", tmp_, "/cert.pem 2>", tmp_, "/openssl.log");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    ASSERT_TRUE(WriteFileAtomically(tmp_ + "/tokens.yaml",
                                    "tokens:\n"
                                    "  - {tenant: team-a, token: token-team-a-0001}\n"
                                    "  - {tenant: team-b, token: token-team-b-0002}\n"
                                    "  - {tenant: ops, role: admin, token: token-admin-0003}\n")
                    .ok());
    ASSERT_TRUE(WriteFileAtomically(tmp_ + "/worker.token", "worker-token-0004\n").ok());
    ASSERT_TRUE(WriteFileAtomically(tmp_ + "/wrong.token", "not-the-worker-token\n").ok());
    const std::string cert = "--tls_cert=" + tmp_ + "/cert.pem";
    const std::string key = "--tls_key=" + tmp_ + "/key.pem";
    const std::string ca = "--tls_ca=" + tmp_ + "/cert.pem";

    checkpoint_ = Start("checkpoint", "services/checkpoint/loom-checkpoint",
                        {"--checkpoint_root=" + tmp_ + "/checkpoints", cert, key,
                         "--auth_tokens_file=" + tmp_ + "/tokens.yaml",
                         "--service_token_file=" + tmp_ + "/worker.token"},
                        &checkpoint_info_);
    scheduler_ = Start("scheduler", "services/scheduler/loom-scheduler",
                       {"--db=" + tmp_ + "/loom.db", "--checkpoint_root=" + tmp_ + "/checkpoints",
                        "--checkpoint_service=" + checkpoint_info_.grpc_address,
                        "--auth_tokens_file=" + tmp_ + "/tokens.yaml",
                        "--worker_token_file=" + tmp_ + "/worker.token",
                        "--checkpoint_token_file=" + tmp_ + "/worker.token", cert, key, ca},
                       &scheduler_info_);
    // The worker never gets a rank here (jobs ask for more ranks than it has), so any executable
    // does as its trainer.
    worker_ = Start("worker", "services/worker/loom-worker",
                    {"--scheduler=" + scheduler_info_.grpc_address, "--node_id=node-ok",
                     "--trainer=/bin/true", "--work_dir=" + tmp_ + "/work",
                     "--token_file=" + tmp_ + "/worker.token", ca},
                    &worker_info_);
    gateway_ = Start("gateway", "services/gateway/loom-gateway",
                     {"--scheduler=" + scheduler_info_.grpc_address, "--port=0", ca},
                     &gateway_info_);
  }

  std::unique_ptr<Subprocess> Start(const std::string& name, const std::string& binary,
                                    std::vector<std::string> args, ReadyInfo* info) {
    auto d = testing::StartDaemon(tmp_, name, binary, std::move(args), info);
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? std::move(*d) : nullptr;
  }

  // The HTTP API port a gateway announced in its ready file (http_url "http://HOST:PORT").
  static int HttpPort(const ReadyInfo& info) {
    const size_t colon = info.http_url.rfind(':');
    return colon == std::string::npos ? 0 : std::atoi(info.http_url.c_str() + colon + 1);
  }
  int GatewayPort() { return HttpPort(gateway_info_); }

  std::string tmp_;
  std::unique_ptr<Subprocess> checkpoint_, scheduler_, worker_, gateway_;
  ReadyInfo checkpoint_info_, scheduler_info_, worker_info_, gateway_info_;
};

TEST_F(SecureClusterTest, EveryDaemonServesHealthAndReadiness) {
  ASSERT_TRUE(checkpoint_ && scheduler_ && worker_ && gateway_);
  for (const ReadyInfo* info : {&scheduler_info_, &worker_info_, &checkpoint_info_, &gateway_info_}) {
    EXPECT_EQ(Status(*info, "/healthz"), 200) << info->name;
    // Ready: scheduler after a scheduling cycle; worker once registered (with its token, over
    // TLS); checkpoint service with a readable root; gateway once the scheduler connects (TLS).
    EXPECT_EQ(WaitReadyz(*info, 200), 200) << info->name;
    EXPECT_EQ(Status(*info, "/metrics"), 200) << info->name;
  }

  // A worker with the wrong token stays alive but never becomes ready.
  ReadyInfo bad_info;
  auto bad = Start("worker-bad", "services/worker/loom-worker",
                   {"--scheduler=" + scheduler_info_.grpc_address, "--node_id=node-bad",
                    "--trainer=/bin/true", "--work_dir=" + tmp_ + "/work-bad",
                    "--token_file=" + tmp_ + "/wrong.token", "--tls_ca=" + tmp_ + "/cert.pem"},
                   &bad_info);
  ASSERT_TRUE(bad);
  // Wait (deadline 20 s) until the scheduler has refused it at least once.
  const absl::Time refused_deadline = absl::Now() + absl::Seconds(20);
  std::string bad_log;
  while (absl::Now() < refused_deadline) {
    bad_log = ReadFile(bad->log_path()).value_or("");
    if (bad_log.find("heartbeat failed: UNAUTHENTICATED") != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(100));  // poll interval
  }
  ASSERT_NE(bad_log.find("heartbeat failed: UNAUTHENTICATED"), std::string::npos) << bad_log;
  EXPECT_EQ(Status(bad_info, "/healthz"), 200);
  EXPECT_EQ(Status(bad_info, "/readyz"), 503);

  // Readiness follows the checkpoint root.
  ASSERT_EQ(std::rename((tmp_ + "/checkpoints").c_str(), (tmp_ + "/moved").c_str()), 0);
  EXPECT_EQ(Status(checkpoint_info_, "/readyz"), 503);
  ASSERT_EQ(std::rename((tmp_ + "/moved").c_str(), (tmp_ + "/checkpoints").c_str()), 0);
  EXPECT_EQ(Status(checkpoint_info_, "/readyz"), 200);
}

TEST_F(SecureClusterTest, TenantIsolationOverHttp) {
  ASSERT_TRUE(scheduler_ && gateway_);
  const int port = GatewayPort();
  ASSERT_GT(port, 0);
  httplib::Client http("127.0.0.1", port);
  http.set_read_timeout(20);
  const httplib::Headers a = {{"Authorization", "Bearer token-team-a-0001"}};
  const httplib::Headers b = {{"Authorization", "Bearer token-team-b-0002"}};
  const httplib::Headers admin = {{"Authorization", "Bearer token-admin-0003"}};

  auto anon = http.Post("/v1/jobs", kSubmit, "application/json");
  ASSERT_TRUE(anon);
  EXPECT_EQ(anon->status, 401) << anon->body;
  EXPECT_EQ(json::parse(anon->body)["status"], "UNAUTHENTICATED");
  auto bogus = http.Get("/v1/jobs", {{"Authorization", "Bearer nope-nope-nope"}});
  ASSERT_TRUE(bogus);
  EXPECT_EQ(bogus->status, 401);

  auto submitted = http.Post("/v1/jobs", a, kSubmit, "application/json");
  ASSERT_TRUE(submitted);
  ASSERT_EQ(submitted->status, 200) << submitted->body;
  json job = json::parse(submitted->body)["job"];
  const std::string id = job["id"];
  EXPECT_EQ(job["tenant"], "team-a");

  auto mine = http.Get(("/v1/jobs/" + id).c_str(), a);
  ASSERT_TRUE(mine);
  EXPECT_EQ(mine->status, 200);
  auto theirs = http.Get(("/v1/jobs/" + id).c_str(), b);
  ASSERT_TRUE(theirs);
  EXPECT_EQ(theirs->status, 404) << theirs->body;
  auto nothing = http.Get("/v1/jobs/job-doesnotexist", b);
  ASSERT_TRUE(nothing);
  EXPECT_EQ(nothing->status, 404);
  EXPECT_EQ(json::parse(theirs->body)["message"],
            absl::StrCat("job ", id, " not found"));  // same as a missing job
  auto cancel_b = http.Post(("/v1/jobs/" + id + ":cancel").c_str(), b, "", "application/json");
  ASSERT_TRUE(cancel_b);
  EXPECT_EQ(cancel_b->status, 404);

  auto list_b = http.Get("/v1/jobs", b);
  ASSERT_TRUE(list_b);
  ASSERT_EQ(list_b->status, 200);
  EXPECT_TRUE(json::parse(list_b->body)["jobs"].empty()) << list_b->body;
  auto list_b_as_a = http.Get("/v1/jobs?tenant=team-a", b);
  ASSERT_TRUE(list_b_as_a);
  EXPECT_TRUE(json::parse(list_b_as_a->body)["jobs"].empty()) << list_b_as_a->body;
  auto list_a = http.Get("/v1/jobs", a);
  ASSERT_TRUE(list_a);
  EXPECT_EQ(json::parse(list_a->body)["jobs"].size(), 1u);
  auto list_admin = http.Get("/v1/jobs?tenant=team-a", admin);
  ASSERT_TRUE(list_admin);
  EXPECT_EQ(json::parse(list_admin->body)["jobs"].size(), 1u) << list_admin->body;

  auto cancel_a = http.Post(("/v1/jobs/" + id + ":cancel").c_str(), a, "", "application/json");
  ASSERT_TRUE(cancel_a);
  EXPECT_EQ(cancel_a->status, 200) << cancel_a->body;

  // A gateway with its own copy of the tokens file answers 401 without calling the scheduler.
  ReadyInfo gw2_info;
  auto gw2 = Start("gateway-auth", "services/gateway/loom-gateway",
                   {"--scheduler=127.0.0.1:1", "--port=0",
                    "--auth_tokens_file=" + tmp_ + "/tokens.yaml"},
                   &gw2_info);
  ASSERT_TRUE(gw2);
  const int port2 = HttpPort(gw2_info);
  ASSERT_GT(port2, 0) << gw2_info.http_url;
  httplib::Client http2("127.0.0.1", port2);
  auto early = http2.Get("/v1/jobs");
  ASSERT_TRUE(early);
  EXPECT_EQ(early->status, 401);
  EXPECT_EQ(early->get_header_value("WWW-Authenticate"), "Bearer");
  // With a valid token it does call the (unreachable) scheduler: 503.
  auto through = http2.Get("/v1/jobs", a);
  ASSERT_TRUE(through);
  EXPECT_EQ(through->status, 503);
  EXPECT_EQ(Status(gw2_info, "/healthz"), 200);
  EXPECT_EQ(Status(gw2_info, "/readyz"), 503);  // its scheduler is unreachable
}

// loomctl over TLS with LOOM_TOKEN / --token: its tenant's view; no token is UNAUTHENTICATED (16).
TEST_F(SecureClusterTest, LoomctlUsesTokenAndTls) {
  ASSERT_TRUE(scheduler_);
  const std::string loomctl = testing::RunfilePath("services/cli/loomctl");
  const std::string base = absl::StrCat(loomctl, " --scheduler=", scheduler_info_.grpc_address,
                                        " --tls_ca=", tmp_, "/cert.pem");
  auto run = [&](const std::string& env, const std::string& args, std::string* out) {
    const std::string file = tmp_ + "/loomctl.out";
    const std::string cmd = absl::StrCat(env, " ", base, " ", args, " >", file, " 2>&1");
    int status = std::system(cmd.c_str());
    *out = ReadFile(file).value_or("");
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  std::string out;
  EXPECT_EQ(run("LOOM_TOKEN=", "list", &out), 16) << out;
  EXPECT_NE(out.find("UNAUTHENTICATED"), std::string::npos) << out;
  EXPECT_EQ(run("LOOM_TOKEN=token-team-a-0001", "list", &out), 0) << out;
  EXPECT_NE(out.find("PHASE"), std::string::npos) << out;
  EXPECT_EQ(run("LOOM_TOKEN=", "--token=token-admin-0003 list --tenant=team-b", &out), 0) << out;
  // Without the CA the TLS handshake fails: UNAVAILABLE (14).
  const std::string plain = absl::StrCat("LOOM_TOKEN=token-team-a-0001 ", loomctl,
                                         " --scheduler=", scheduler_info_.grpc_address,
                                         " --timeout=3s list >/dev/null 2>&1");
  int status = std::system(plain.c_str());
  EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 14);
}

// loom-checkpoint addresses checkpoints by job id across tenants, so it takes only admin tokens
// and the cluster's service token (the scheduler's). Regression: it took any caller, so one
// tenant could list or delete another tenant's checkpoints.
TEST_F(SecureClusterTest, CheckpointServiceTakesOnlyAdminAndServiceTokens) {
  ASSERT_TRUE(checkpoint_);
  const std::string loomctl = testing::RunfilePath("services/cli/loomctl");
  auto run = [&](const std::string& token, const std::string& args, std::string* out) {
    const std::string file = tmp_ + "/loomctl-ckpt.out";
    const std::string cmd =
        absl::StrCat("LOOM_TOKEN=", token, " ", loomctl, " --checkpoint=",
                     checkpoint_info_.grpc_address, " --tls_ca=", tmp_, "/cert.pem ", args, " >",
                     file, " 2>&1");
    int status = std::system(cmd.c_str());
    *out = ReadFile(file).value_or("");
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  std::string out;
  EXPECT_EQ(run("", "checkpoint delete job-someone-else", &out), 16) << out;  // UNAUTHENTICATED
  EXPECT_EQ(run("token-team-a-0001", "checkpoint delete job-someone-else", &out), 7) << out;
  EXPECT_NE(out.find("admin token"), std::string::npos) << out;
  EXPECT_EQ(run("token-team-a-0001", "checkpoints job-someone-else", &out), 7) << out;
  // An admin passes authorization (and the job simply has no checkpoints).
  EXPECT_EQ(run("token-admin-0003", "checkpoints job-someone-else", &out), 0) << out;
  EXPECT_NE(out.find("no checkpoints"), std::string::npos) << out;
  // The cluster's service token (what the scheduler sends) is accepted too.
  EXPECT_EQ(run("worker-token-0004", "checkpoints job-someone-else", &out), 0) << out;
}

}  // namespace
}  // namespace loom
