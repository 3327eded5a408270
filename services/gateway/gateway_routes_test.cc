// loom-gateway's explain, watch (server-sent events), queue and node routes and its request
// metrics, over real HTTP on loopback against a real loom-scheduler with bearer tokens
// (GatewayClusterTest): success paths, 401 without a token, 403 for a user token on admin
// routes, another tenant's job answering 404 like a missing one, and the event stream of a job
// cancelled through the API.
#include <httplib.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "services/gateway/gateway_test_cluster.h"

namespace loom::gateway {
namespace {

using json = nlohmann::json;

TEST_F(GatewayClusterTest, ServedOpenApiDocumentIsTheCommittedFile) {
  auto res = client_->Get("/v1/openapi.json");  // no token needed
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  const json doc = json::parse(res->body);
  auto committed = ReadFile(absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"),
                                         "/services/gateway/openapi.json"));
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(doc, json::parse(*committed));
  for (const char* path :
       {"/v1/jobs/{id}:explain", "/v1/jobs/{id}:watch", "/v1/jobs/{id}/checkpoints",
        "/v1/jobs/{id}/checkpoints/{step}", "/v1/jobs/{id}/checkpoints/{step}:consolidate",
        "/v1/jobs/{id}/checkpoints/{step}:verify", "/v1/jobs/{id}/checkpoints:applyRetention",
        "/v1/queues", "/v1/nodes", "/v1/nodes/{id}:cordon", "/v1/nodes/{id}:uncordon",
        "/v1/nodes/{id}:drain"}) {
    EXPECT_TRUE(doc["paths"].contains(path)) << path;
  }
}

TEST_F(GatewayClusterTest, ExplainWithTenantRules) {
  const std::string id = Submit(kTeamA, 2);  // no node registered: it waits
  ASSERT_FALSE(id.empty());
  auto [code, why] = Call("GET", "/v1/jobs/" + id + ":explain", kTeamA);
  ASSERT_EQ(code, 200) << why;
  EXPECT_EQ(why["phase"], "JOB_PHASE_PENDING") << why;
  EXPECT_FALSE(why["reason"].get<std::string>().empty()) << why;
  EXPECT_FALSE(why["message"].get<std::string>().empty()) << why;
  // The admin sees every tenant's job; team-b's token gets 404 like a missing job.
  EXPECT_EQ(Call("GET", "/v1/jobs/" + id + ":explain", kAdmin).first, 200);
  auto [other, other_err] = Call("GET", "/v1/jobs/" + id + ":explain", kTeamB);
  EXPECT_EQ(other, 404) << other_err;
  EXPECT_EQ(other_err["status"], "NOT_FOUND");
  auto [missing, missing_err] = Call("GET", "/v1/jobs/job-nope:explain", kTeamA);
  EXPECT_EQ(missing, 404) << missing_err;
  auto [anon, anon_err] = Call("GET", "/v1/jobs/" + id + ":explain", "");
  EXPECT_EQ(anon, 401) << anon_err;
  EXPECT_EQ(anon_err["status"], "UNAUTHENTICATED");
  auto [bad, bad_err] = Call("GET", "/v1/jobs/" + id + ":explain", "Bearer not-a-token");
  EXPECT_EQ(bad, 401) << bad_err;
  auto [post, post_err] = Call("POST", "/v1/jobs/" + id + ":explain", kTeamA);
  EXPECT_EQ(post, 405) << post_err;
}

// The frames of an event stream, as the test reads them (not the gateway's code).
struct SseEvent {
  std::string event, id, data;
};
std::vector<SseEvent> ParseSse(const std::string& text) {
  std::vector<SseEvent> events;
  for (absl::string_view block : absl::StrSplit(text, "\n\n", absl::SkipEmpty())) {
    SseEvent e;
    for (absl::string_view line : absl::StrSplit(block, '\n')) {
      if (absl::StartsWith(line, ":")) continue;  // a comment (keep-alive)
      if (absl::StartsWith(line, "event: ")) e.event = std::string(line.substr(7));
      if (absl::StartsWith(line, "id: ")) e.id = std::string(line.substr(4));
      if (absl::StartsWith(line, "data: ")) e.data = std::string(line.substr(6));
    }
    if (!e.event.empty() || !e.data.empty()) events.push_back(e);
  }
  return events;
}

// A GET of an event stream on its own connection and thread; the body as it arrives.
class SseReader {
 public:
  SseReader(int port, const std::string& path, const std::string& authorization,
            int stop_after_events = 0)
      : client_("127.0.0.1", port) {
    client_.set_read_timeout(30);
    thread_ = std::thread([this, path, authorization, stop_after_events] {
      httplib::Headers headers = {{"Authorization", authorization}};
      httplib::Result res = client_.Get(
          path.c_str(), headers,
          [this](const httplib::Response& r) {
            absl::MutexLock l(&mu_);
            status_ = r.status;
            content_type_ = r.get_header_value("Content-Type");
            return true;
          },
          [this, stop_after_events](const char* data, size_t n) {
            absl::MutexLock l(&mu_);
            body_.append(data, n);
            // Go away after that many events (the stream's connection is closed).
            return stop_after_events == 0 ||
                   static_cast<int>(ParseSse(body_).size()) < stop_after_events;
          });
      absl::MutexLock l(&mu_);
      if (res) body_ += "";  // the response completed
      ended_ = true;
    });
  }
  ~SseReader() {
    client_.stop();
    if (thread_.joinable()) thread_.join();
  }
  // Waits up to `timeout` for `pred(body)`.
  template <typename Pred>
  bool Await(Pred pred, absl::Duration timeout) {
    absl::MutexLock l(&mu_);
    auto cond = [&] { return pred(body_, ended_); };
    return mu_.AwaitWithTimeout(absl::Condition(&cond), timeout);
  }
  std::string body() {
    absl::MutexLock l(&mu_);
    return body_;
  }
  int status() {
    absl::MutexLock l(&mu_);
    return status_;
  }
  std::string content_type() {
    absl::MutexLock l(&mu_);
    return content_type_;
  }

 private:
  httplib::Client client_;
  absl::Mutex mu_;
  std::string body_;
  int status_ = 0;
  std::string content_type_;
  bool ended_ = false;
  std::thread thread_;
};

TEST_F(GatewayClusterTest, WatchStreamsTheTransitionsOfAJobCancelledThroughTheApi) {
  const std::string id = Submit(kTeamA, 2);
  ASSERT_FALSE(id.empty());
  SseReader watch(http_port_, "/v1/jobs/" + id + ":watch", kTeamA);
  ASSERT_TRUE(watch.Await([](const std::string& body, bool ended) {
    return ended || !ParseSse(body).empty();
  }, absl::Seconds(20))) << watch.body();
  EXPECT_EQ(watch.status(), 200);
  EXPECT_EQ(watch.content_type(), "text/event-stream");
  auto [code, cancelled] = Call("POST", "/v1/jobs/" + id + ":cancel", kTeamA);
  ASSERT_EQ(code, 200) << cancelled;
  // The stream ends after the job's terminal event.
  ASSERT_TRUE(watch.Await([](const std::string&, bool ended) { return ended; },
                          absl::Seconds(20)))
      << watch.body();
  const std::vector<SseEvent> events = ParseSse(watch.body());
  ASSERT_GE(events.size(), 2u) << watch.body();
  EXPECT_EQ(events.front().event, "Snapshot");
  EXPECT_EQ(events.front().id, "1");
  json first = json::parse(events.front().data);
  EXPECT_EQ(first["job"]["id"], id);
  EXPECT_EQ(first["job"]["phase"], "JOB_PHASE_PENDING") << first;
  EXPECT_EQ(events.back().event, "PhaseChanged");
  EXPECT_EQ(events.back().id, std::to_string(events.size()));
  json last = json::parse(events.back().data);
  EXPECT_EQ(last["job"]["phase"], "JOB_PHASE_CANCELLED") << last;
  // The whole stream counted once, under its template, when it ended.
  EXPECT_TRUE(AwaitRequests("/v1/jobs/{id}:watch", "GET", "200", 1));
  EXPECT_EQ(DurationCount("/v1/jobs/{id}:watch", "GET"), 1);
}

TEST_F(GatewayClusterTest, WatchEndsWhenTheClientGoesAway) {
  const std::string id = Submit(kTeamA, 2);
  ASSERT_FALSE(id.empty());
  {
    SseReader watch(http_port_, "/v1/jobs/" + id + ":watch", kTeamA, /*stop_after_events=*/1);
    ASSERT_TRUE(watch.Await([](const std::string&, bool ended) { return ended; },
                            absl::Seconds(20)));
  }
  // The job is still waiting, so only the client's leaving can end the gateway's response: the
  // keep-alive write fails, the response is logged (counted) and the WatchJob call cancelled.
  EXPECT_TRUE(AwaitRequests("/v1/jobs/{id}:watch", "GET", "200", 1));
  auto [code, job] = Call("GET", "/v1/jobs/" + id, kTeamA);
  EXPECT_EQ(job["phase"], "JOB_PHASE_PENDING") << job;
}

TEST_F(GatewayClusterTest, WatchErrorsAreJsonBeforeTheStream) {
  const std::string id = Submit(kTeamA, 1);
  ASSERT_FALSE(id.empty());
  auto [other, other_err] = Call("GET", "/v1/jobs/" + id + ":watch", kTeamB);
  EXPECT_EQ(other, 404) << other_err;
  auto [missing, missing_err] = Call("GET", "/v1/jobs/job-nope:watch", kTeamA);
  EXPECT_EQ(missing, 404) << missing_err;
  EXPECT_EQ(missing_err["status"], "NOT_FOUND");
  auto [anon, anon_err] = Call("GET", "/v1/jobs/" + id + ":watch", "");
  EXPECT_EQ(anon, 401) << anon_err;
}

TEST_F(GatewayClusterTest, QueuesForEveryTenant) {
  const std::string id = Submit(kTeamA, 2);
  ASSERT_FALSE(id.empty());
  for (const char* token : {kTeamA, kTeamB, kAdmin}) {
    auto [code, queues] = Call("GET", "/v1/queues", token);
    ASSERT_EQ(code, 200) << queues;
    ASSERT_EQ(queues["queues"].size(), 1u) << queues;
    EXPECT_EQ(queues["queues"][0]["name"], "default");
    EXPECT_EQ(queues["queues"][0]["hasQuota"], true);
    EXPECT_EQ(queues["queues"][0]["nominalQuota"]["cpu"], "4");  // int64: a JSON string
  }
  auto [code, queues] = Call("GET", "/v1/queues", kAdmin);
  EXPECT_EQ(queues["queues"][0]["pendingJobs"], 1) << queues;
  EXPECT_EQ(Call("GET", "/v1/queues", "").first, 401);
  EXPECT_EQ(Call("POST", "/v1/queues", kAdmin).first, 405);
}

TEST_F(GatewayClusterTest, NodesListCordonUncordonDrainNeedAnAdmin) {
  RegisterNode("node-a", 2);
  RegisterNode("node-b", 2);
  auto [code, nodes] = Call("GET", "/v1/nodes", kAdmin);
  ASSERT_EQ(code, 200) << nodes;
  ASSERT_EQ(nodes["nodes"].size(), 2u) << nodes;
  EXPECT_EQ(nodes["nodes"][0]["nodeId"], "node-a");
  EXPECT_EQ(nodes["nodes"][0]["inventory"]["slots"], 2) << nodes;
  EXPECT_EQ(nodes["nodes"][0]["live"], true);
  // A user token is refused (403) for every node route, no token 401.
  for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"GET", "/v1/nodes"}, {"POST", "/v1/nodes/node-a:cordon"},
           {"POST", "/v1/nodes/node-a:uncordon"}, {"POST", "/v1/nodes/node-a:drain"}}) {
    auto [user, user_err] = Call(method, path, kTeamA);
    EXPECT_EQ(user, 403) << path << " " << user_err;
    EXPECT_EQ(user_err["status"], "PERMISSION_DENIED") << path;
    EXPECT_EQ(Call(method, path, "").first, 401) << path;
  }
  auto [c, cordoned] = Call("POST", "/v1/nodes/node-b:cordon", kAdmin, R"({"reason": "ECC errors"})");
  ASSERT_EQ(c, 200) << cordoned;
  EXPECT_EQ(cordoned["nodeId"], "node-b");
  EXPECT_EQ(cordoned["cordoned"], true);
  EXPECT_EQ(cordoned["adminReason"], "ECC errors");
  auto [u, uncordoned] = Call("POST", "/v1/nodes/node-b:uncordon", kAdmin);
  ASSERT_EQ(u, 200) << uncordoned;
  EXPECT_EQ(uncordoned["cordoned"], false);
  // A 2-rank job lands on one node; draining it requeues the job.
  const std::string id = Submit(kTeamA, 2);
  std::string node;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (node.empty() && absl::Now() < deadline) {
    auto [g, job] = Call("GET", "/v1/jobs/" + id, kTeamA);
    if (job.contains("rankNodes") && !job["rankNodes"].empty()) node = job["rankNodes"][0];
    if (node.empty()) absl::SleepFor(absl::Milliseconds(10));  // polling with a deadline
  }
  ASSERT_FALSE(node.empty()) << "the job was not placed";
  auto [d, drained] = Call("POST", "/v1/nodes/" + node + ":drain", kAdmin, R"({"reason": "kernel"})");
  ASSERT_EQ(d, 200) << drained;
  EXPECT_EQ(drained["node"]["draining"], true) << drained;
  EXPECT_EQ(drained["requeuedJobIds"], json::array({id})) << drained;
  // Unknown node 404; a body naming another node 400; an unknown body field 400.
  auto [n, nerr] = Call("POST", "/v1/nodes/node-x:cordon", kAdmin);
  EXPECT_EQ(n, 404) << nerr;
  auto [m, merr] = Call("POST", "/v1/nodes/node-a:cordon", kAdmin, R"({"nodeId": "node-b"})");
  EXPECT_EQ(m, 400) << merr;
  EXPECT_EQ(merr["message"].get<std::string>().rfind("node_id: ", 0), 0u) << merr;
  auto [f, ferr] = Call("POST", "/v1/nodes/node-a:cordon", kAdmin, R"({"why": "x"})");
  EXPECT_EQ(f, 400) << ferr;
}

TEST_F(GatewayClusterTest, MetricsCountRequestsByRouteTemplateMethodAndCode) {
  const std::string id = Submit(kTeamA, 1);
  Call("GET", "/v1/jobs/" + id, kTeamA);
  Call("GET", "/v1/jobs/" + id, kTeamA);
  Call("GET", "/v1/jobs/job-nope", kTeamA);
  Call("GET", "/v1/nodes", kTeamA);
  Call("GET", "/v1/nodes", kAdmin);
  Call("GET", "/v1/no/such/path", kAdmin);
  EXPECT_TRUE(AwaitRequests("/v1/jobs/{id}", "GET", "200", 2));
  EXPECT_TRUE(AwaitRequests("/v1/jobs/{id}", "GET", "404", 1));
  EXPECT_TRUE(AwaitRequests("/v1/nodes", "GET", "403", 1));
  EXPECT_TRUE(AwaitRequests("/v1/nodes", "GET", "200", 1));
  EXPECT_TRUE(AwaitRequests("unmatched", "GET", "404", 1));
  EXPECT_TRUE(AwaitRequests("/v1/jobs", "POST", "200", 1));
  EXPECT_EQ(Requests("/v1/jobs/{id}", "GET", "200"), 2);
  EXPECT_EQ(DurationCount("/v1/jobs/{id}", "GET"), 3);  // 2 x 200, 1 x 404
  EXPECT_EQ(DurationCount("/v1/nodes", "GET"), 2);      // 403, 200
  // Series exist from the start, at 0, so that increase() counts a first request (issue 53).
  EXPECT_TRUE(HasRequestsSeries("/v1/jobs/{id}/logs", "GET", "200"));
  EXPECT_TRUE(HasRequestsSeries("/v1/nodes/{id}:drain", "POST", "404"));
  EXPECT_TRUE(HasRequestsSeries("unmatched", "POST", "404"));
  EXPECT_EQ(Requests("/v1/jobs/{id}/logs", "GET", "200"), 0);
  EXPECT_EQ(DurationCount("/v1/nodes/{id}:drain", "POST"), 0);
  // ... also the codes an operator pass found born at their first request (issue 53): a PUT or
  // DELETE on a route that takes GET and POST (405), a scheduler past the gateway's deadline
  // (504), a DELETE of an unknown path (404).
  EXPECT_TRUE(HasRequestsSeries("/v1/jobs", "PUT", "405"));
  EXPECT_TRUE(HasRequestsSeries("/v1/jobs", "GET", "504"));
  EXPECT_TRUE(HasRequestsSeries("unmatched", "DELETE", "404"));
  EXPECT_EQ(Requests("/v1/jobs", "DELETE", "405"), 0);
  auto [code, err] = Call("DELETE", "/v1/jobs", kTeamA);
  EXPECT_EQ(code, 405) << err;
  EXPECT_TRUE(AwaitRequests("/v1/jobs", "DELETE", "405", 1));
  // Counters rise by one per request.
  Call("GET", "/v1/jobs/" + id, kTeamA);
  EXPECT_TRUE(AwaitRequests("/v1/jobs/{id}", "GET", "200", 3));
  EXPECT_EQ(Requests("/v1/jobs/{id}", "GET", "200"), 3);
}

}  // namespace
}  // namespace loom::gateway
