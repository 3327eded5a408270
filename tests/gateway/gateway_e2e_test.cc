// The real loom-gateway in front of the real loom-scheduler (SQLite file, loopback, OS-chosen
// ports): a job submitted as JSON over HTTP is persisted, listed, read back and cancelled through
// the REST paths, and the scheduler's errors come back with their HTTP status.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tiny_job.h"

namespace loom {
namespace {

using ::loom::testing::RunfilePath;
using ::loom::testing::Subprocess;
using json = nlohmann::json;

const std::string kSubmit = testing::TinySubmitJobJson("rest-tiny", 1);

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return -1;
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

TEST(GatewayE2ETest, RestRoundTripThroughTheRealScheduler) {
  const std::string tmp = std::getenv("TEST_TMPDIR");
  ASSERT_TRUE(MakeDirs(tmp + "/checkpoints").ok());
  auto sched = Subprocess::Start(
      {RunfilePath("services/scheduler/loom-scheduler"), "--db=" + tmp + "/loom.db",
       "--checkpoint_root=" + tmp + "/checkpoints", "--ready_file=" + tmp + "/scheduler.json"},
      tmp + "/scheduler.log");
  ASSERT_TRUE(sched.ok()) << sched.status();
  auto sched_info = testing::WaitReady(*sched, tmp + "/scheduler.json");
  ASSERT_TRUE(sched_info.ok()) << sched_info.status();

  const int port = FreePort();
  auto gw = Subprocess::Start(
      {RunfilePath("services/gateway/loom-gateway"), "--scheduler=" + sched_info->grpc_address,
       absl::StrCat("--port=", port), "--ready_file=" + tmp + "/gateway.json"},
      tmp + "/gateway.log");
  ASSERT_TRUE(gw.ok()) << gw.status();
  auto gw_info = testing::WaitReady(*gw, tmp + "/gateway.json");
  ASSERT_TRUE(gw_info.ok()) << gw_info.status();
  EXPECT_EQ(gw_info->name, "loom-gateway");

  httplib::Client http("127.0.0.1", port);
  http.set_read_timeout(20);
  auto parse = [](const httplib::Result& r) {
    EXPECT_TRUE(r);
    return r ? json::parse(r->body, nullptr, false) : json();
  };

  // No workers: the job stays PENDING until cancelled.
  auto submitted = http.Post("/v1/jobs", kSubmit, "application/json");
  ASSERT_TRUE(submitted);
  ASSERT_EQ(submitted->status, 200) << submitted->body;
  json job = parse(submitted)["job"];
  const std::string id = job["id"];
  EXPECT_EQ(job["phase"], "JOB_PHASE_PENDING");
  EXPECT_EQ(job["spec"]["training"]["steps"], "5");  // int64: a JSON string in proto3 JSON

  auto got = http.Get(("/v1/jobs/" + id).c_str());
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(parse(got)["spec"]["name"], "rest-tiny");
  json pending = parse(http.Get("/v1/jobs?phase=JOB_PHASE_PENDING"));
  ASSERT_EQ(pending["jobs"].size(), 1u) << pending;
  EXPECT_EQ(pending["jobs"][0]["id"], id);

  auto cancelled = http.Post(("/v1/jobs/" + id + ":cancel").c_str(), "", "application/json");
  ASSERT_TRUE(cancelled);
  EXPECT_EQ(cancelled->status, 200) << cancelled->body;
  EXPECT_EQ(parse(cancelled)["phase"], "JOB_PHASE_CANCELLED");
  auto again = http.Post(("/v1/jobs/" + id + ":cancel").c_str(), "", "application/json");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 400);
  EXPECT_EQ(parse(again)["status"], "FAILED_PRECONDITION");

  auto missing = http.Get("/v1/jobs/job-00000000");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);

  // The scheduler's validation, naming the field, comes back as 400.
  std::string bad = kSubmit;
  bad.replace(bad.find("\"num_ranks\": 1"), 14, "\"num_ranks\": 0");
  auto refused = http.Post("/v1/jobs", bad, "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400) << refused->body;
  json err = parse(refused);
  EXPECT_EQ(err["status"], "INVALID_ARGUMENT");
  EXPECT_NE(err["message"].get<std::string>().find("num_ranks"), std::string::npos) << err;

  // The gateway's own metrics endpoint counts what it answered. A request is counted when its
  // handler returns, which can be just after the client has read the response: the scrape is
  // repeated (bounded) until the last request's count shows (a fresh-clone CI run read the
  // metrics before the 400's count was recorded).
  const std::string want_400 =
      "loom_gateway_requests_total{code=\"400\",method=\"POST\",route=\"/v1/jobs\"}";
  auto metrics = testing::HttpGet(gw_info->metrics_url);
  for (const absl::Time deadline = absl::Now() + absl::Seconds(10);
       metrics.ok() && metrics->find(want_400) == std::string::npos && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(20));
    metrics = testing::HttpGet(gw_info->metrics_url);
  }
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_NE(metrics->find(want_400), std::string::npos) << *metrics;
  ASSERT_TRUE(WriteFileAtomically(tmp + "/gateway.metrics", *metrics).ok());
  EXPECT_EQ(std::system(("/usr/bin/promtool check metrics < " + tmp + "/gateway.metrics > " + tmp +
                         "/promtool.log 2>&1").c_str()),
            0)
      << testing::Tail(tmp + "/promtool.log");

  EXPECT_EQ(testing::ExitCode(gw->Stop()), 0) << testing::Tail(gw->log_path());
  EXPECT_EQ(testing::ExitCode(sched->Stop()), 0);
}

}  // namespace
}  // namespace loom
