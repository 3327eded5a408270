// loom-gateway against hostile or careless clients, over raw HTTP/1.1 bytes on loopback against
// a real loom-scheduler with bearer tokens (GatewayClusterTest), each a regression test of
// breakit_s41 (services/gateway):
//   H1  a path or Range header that is not UTF-8 ended the process (nlohmann's dump threw in
//       httplib's error handler); an exception in a handler must be a 500, never a crash;
//   M2  a query parameter or JSON body that is not UTF-8 was a 500 instead of a 400;
//   H3  followed-log requests abandoned by their clients on a quiet job held httplib's pool
//       threads until the job printed, and the gateway stopped answering everyone;
//   M6  Content-Length headers that differ, or one that is not a number, were accepted;
// and one that schemathesis found (gateway_schemathesis_test): the body of a request refused
// before it was read was parsed as the connection's next request.
// No sleeps: every wait is for a condition, under a deadline.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "services/gateway/gateway_http.h"
#include "services/gateway/gateway_raw_connection.h"
#include "services/gateway/gateway_test_cluster.h"

namespace loom::gateway {
namespace {

using json = nlohmann::json;

// The message of a JSON error body ("" and a test failure if it is not one).
std::string Message(const RawResponse& resp) {
  const json body = json::parse(resp.body, nullptr, false);
  EXPECT_TRUE(body.is_object() && body.contains("message")) << resp.body;
  return body.is_object() && body.contains("message") ? body["message"].get<std::string>() : "";
}

class GatewayRobustnessTest : public GatewayClusterTest {
 protected:
  // Routes of this test only: handlers that throw, as a bug in a route would.
  void AddRoutes(httplib::Server& server) override {
    server.Get("/test/throw", [](const httplib::Request&, httplib::Response&) {
      throw std::runtime_error("broken handler \xff\xfe");
    });
    server.Get("/test/throw-int", [](const httplib::Request&, httplib::Response&) { throw 7; });
  }

  // GET /healthz on a fresh connection answers 200: the gateway is alive and has a free thread.
  void ExpectServing() {
    RawConnection c(http_port_);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c.Send("GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n"));
    absl::StatusOr<RawResponse> resp = c.ReadResponse();
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ(resp->status, 200);
    EXPECT_EQ(resp->body, "ok\n");
  }
};

// H1: both requests ended the gateway (and with it this test process). Now 404 and 416 with
// the offending bytes quoted as \xff, and the same connection serves the next request.
TEST_F(GatewayRobustnessTest, NonUtf8PathOrRangeHeaderIs4xxAndTheGatewayKeepsServing) {
  RawConnection c(http_port_);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c.Send("GET /%ff HTTP/1.1\r\nHost: gw\r\n\r\n"));
  absl::StatusOr<RawResponse> path = c.ReadResponse();
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(path->status, 404) << path->body;
  EXPECT_EQ(Message(*path), "no route for GET /\\xff");

  ASSERT_TRUE(c.Send("GET /healthz HTTP/1.1\r\nHost: gw\r\nRange: bytes=\xff\r\n\r\n"));
  absl::StatusOr<RawResponse> range = c.ReadResponse();
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->status, 416) << range->body;
  EXPECT_EQ(Message(*range), "Range 'bytes=\\xff' cannot be satisfied");

  // The same under /v1/ with a token, and a 405 quoting the path.
  ASSERT_TRUE(c.Send(absl::StrCat("GET /v1/jobs/%ff%fe/x HTTP/1.1\r\nHost: gw\r\nAuthorization: ",
                                  kTeamA, "\r\n\r\n")));
  absl::StatusOr<RawResponse> v1 = c.ReadResponse();
  ASSERT_TRUE(v1.ok()) << v1.status();
  EXPECT_EQ(v1->status, 404) << v1->body;

  ASSERT_TRUE(c.Send("GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n"));
  absl::StatusOr<RawResponse> next = c.ReadResponse();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->status, 200);
  ExpectServing();
}

// H1: no exception reaches httplib's threads. A handler's is a 500 INTERNAL JSON error whose
// message is JSON-safe even when what() is not UTF-8.
TEST_F(GatewayRobustnessTest, AnExceptionInAHandlerIsA500) {
  for (const char* path : {"/test/throw", "/test/throw-int"}) {
    RawConnection c(http_port_);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c.Send(absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: gw\r\n\r\n")));
    absl::StatusOr<RawResponse> resp = c.ReadResponse();
    ASSERT_TRUE(resp.ok()) << path << ": " << resp.status();
    EXPECT_EQ(resp->status, 500) << resp->body;
    EXPECT_EQ(resp->headers["content-type"], "application/json");
    const json body = json::parse(resp->body, nullptr, false);
    ASSERT_TRUE(body.is_object()) << resp->body;
    EXPECT_EQ(body["status"], "INTERNAL");
    EXPECT_TRUE(absl::StartsWith(body["message"].get<std::string>(), "gateway error: "))
        << body;
  }
  auto [code, err] = Call("GET", "/test/throw", "");
  EXPECT_EQ(err["message"], "gateway error: broken handler \\xff\\xfe");
  ExpectServing();
}

// M2: these answered 500 INTERNAL (nlohmann's type_error inside the handler); now 400 naming
// the parameter, or saying that the body is not UTF-8.
TEST_F(GatewayRobustnessTest, NonUtf8QueryParameterOrBodyIs400) {
  auto [value_code, value] = Call("GET", "/v1/jobs?name_prefix=%ff%fe", kTeamA);
  EXPECT_EQ(value_code, 400) << value;
  EXPECT_EQ(value["status"], "INVALID_ARGUMENT");
  EXPECT_EQ(value["message"],
            "query parameter 'name_prefix': its value '\\xff\\xfe' is not valid UTF-8 (byte 0)")
      << value;
  auto [name_code, name] = Call("GET", "/v1/jobs?%ff=1", kTeamA);
  EXPECT_EQ(name_code, 400) << name;
  EXPECT_EQ(name["message"], "query parameter name '\\xff' is not valid UTF-8") << name;
  const std::string id = Submit(kTeamA);
  ASSERT_FALSE(id.empty());
  auto [rank_code, rank] = Call("GET", "/v1/jobs/" + id + "/logs?rank=0%c0%af", kTeamA);
  EXPECT_EQ(rank_code, 400) << rank;  // an overlong '/' is not UTF-8 either
  EXPECT_NE(rank["message"].get<std::string>().find("'rank'"), std::string::npos) << rank;

  auto [body_code, body] = Call("POST", "/v1/jobs", kTeamA, "{\"spec\": \xff}");
  EXPECT_EQ(body_code, 400) << body;
  EXPECT_EQ(body["status"], "INVALID_ARGUMENT");
  EXPECT_EQ(body["message"],
            "request body is not valid UTF-8 JSON (a loom.v1.SubmitJobRequest is expected): "
            "byte 0xff at offset 9 is not UTF-8")
      << body;
  RegisterNode("worker-0", 1);
  auto [cordon_code, cordon] =
      Call("POST", "/v1/nodes/worker-0:cordon", kAdmin, "{\"reason\": \"\xff\"}");
  EXPECT_EQ(cordon_code, 400) << cordon;
  EXPECT_NE(cordon["message"].get<std::string>().find("not valid UTF-8"), std::string::npos)
      << cordon;
  // Valid UTF-8 beyond ASCII is fine.
  auto [ok_code, ok] = Call("GET", "/v1/jobs?name_prefix=%c3%a9t%c3%a9", kTeamA);
  EXPECT_EQ(ok_code, 200) << ok;
}

// H3: each abandoned follower of a quiet job held a pool thread (blocked in the StreamLogs
// Read()) until the job printed or ended; kHttpThreads of them hung the gateway for every
// client. Now the gateway notices the closed connection within `follow_probe`, cancels the
// call and frees the thread, while a follower that stays connected keeps its stream.
TEST_F(GatewayRobustnessTest, AbandonedLogFollowersFreeTheirThreads) {
  const std::string id = Submit(kTeamA, 2);  // no nodes: it waits, and prints nothing
  ASSERT_FALSE(id.empty());
  const std::string follow =
      absl::StrCat("GET /v1/jobs/", id, "/logs?follow=true HTTP/1.1\r\nHost: gw\r\n",
                   "Authorization: ", kTeamA, "\r\n\r\n");
  RawConnection live(http_port_);
  ASSERT_TRUE(live.ok());
  ASSERT_TRUE(live.Send(follow));
  ASSERT_TRUE(live.Skip("\r\n\r\n")) << "the live follower got no headers";

  // More abandoned followers than the pool has threads, one after another: each needs a free
  // thread to get its headers, which it gets only if the earlier ones were freed.
  const int abandoned = kHttpThreads + 2;
  for (int i = 0; i < abandoned; ++i) {
    RawConnection c(http_port_);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c.Send(follow));
    ASSERT_TRUE(c.ReadUntil("\r\n\r\n"))
        << "follower " << i << " got no headers: the pool is held by abandoned followers";
  }  // each closes its connection here without reading on
  // Every abandoned response ended (httplib counts a response when it ends), and the live one
  // did not: the probe ends only streams whose client left.
  EXPECT_TRUE(AwaitRequests("/v1/jobs/{id}/logs", "GET", "200", abandoned));
  auto [code, job] = Call("GET", "/v1/jobs/" + id, kTeamA);
  EXPECT_EQ(code, 200) << job;
  EXPECT_EQ(job["phase"], "JOB_PHASE_PENDING") << job;
  EXPECT_EQ(Requests("/v1/jobs/{id}/logs", "GET", "200"), abandoned);

  ASSERT_EQ(Call("POST", "/v1/jobs/" + id + ":kill", kTeamA).first, 200);
  // The live follower's stream ends with the job: no line, then the terminating chunk.
  EXPECT_TRUE(live.ReadUntil("0\r\n\r\n")) << "the live follower's stream did not end";
  EXPECT_TRUE(AwaitRequests("/v1/jobs/{id}/logs", "GET", "200", abandoned + 1));
  ExpectServing();
}

// M6 (RFC 9112 section 6.3): differing Content-Length headers, or one that is not a decimal
// number, are refused with 400 and the connection closed (its unread bytes are not parsed as a
// next request). They were read by the first value, and "2x" as 2.
TEST_F(GatewayRobustnessTest, AmbiguousContentLengthIs400AndClosesTheConnection) {
  const std::string head = absl::StrCat("POST /v1/jobs/job-nope:cancel HTTP/1.1\r\nHost: gw\r\n",
                                        "Authorization: ", kTeamA,
                                        "\r\nContent-Type: application/json\r\n");
  struct Case {
    std::string headers;
    std::string want;  // in the message
  };
  for (const Case& test : std::vector<Case>{
           {"Content-Length: 2\r\nContent-Length: 7\r\n",
            "2 Content-Length headers with different values ('2' and '7')"},
           {"Content-Length: 2x\r\n", "Content-Length '2x' is not a decimal byte count"},
           {"Content-Length: -2\r\n", "Content-Length '-2' is not a decimal byte count"},
           {"Content-Length: 2\r\nExpect: 100-continue\r\nContent-Length: 3\r\n",
            "different values"}}) {
    RawConnection c(http_port_);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c.Send(absl::StrCat(head, test.headers, "\r\n{}GET /healthz HTTP/1.1\r\n\r\n")));
    absl::StatusOr<RawResponse> resp = c.ReadResponse();
    ASSERT_TRUE(resp.ok()) << test.headers << resp.status();
    EXPECT_EQ(resp->status, 400) << test.headers << resp->body;
    EXPECT_NE(Message(*resp).find(test.want), std::string::npos) << resp->body;
    EXPECT_EQ(resp->headers["connection"], "close") << test.headers;
    EXPECT_TRUE(c.ReadToEof()) << test.headers << ": the connection stayed open";
  }
  // The same length twice is one length (RFC 9112 allows it): the request goes through.
  RawConnection same(http_port_);
  ASSERT_TRUE(same.ok());
  ASSERT_TRUE(same.Send(absl::StrCat(head, "Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}")));
  absl::StatusOr<RawResponse> resp = same.ReadResponse();
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->status, 404) << resp->body;  // job-nope: the scheduler was asked
  ExpectServing();
}

// Found by schemathesis (gateway_schemathesis_test): a POST refused before its body was read (a
// user token on a node route: 403 from the pre-routing check) left the body on the keep-alive
// connection, and the next request on it was parsed starting with those bytes: a plain GET
// /v1/nodes answered "400 malformed HTTP request". Now a refusal before the body is read closes
// the connection (the first two cases fail without the fix); a handler's own refusal (a bad
// {step}: 400) and a refusal of a request without a body keep it serving the next request.
TEST_F(GatewayRobustnessTest, ARequestRefusedBeforeItsBodyIsReadDoesNotPoisonTheConnection) {
  const std::string body = R"({"reason": "ECC errors"})";
  const std::string next = "GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n";
  auto post = [&](const std::string& path, const std::string& authorization) {
    return absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: gw\r\n",
                        authorization.empty() ? "" : "Authorization: ", authorization,
                        authorization.empty() ? "" : "\r\n",
                        "Content-Type: application/json\r\nContent-Length: ", body.size(),
                        "\r\n\r\n", body);
  };
  struct Case {
    std::string request;
    int status;
    bool closes;  // else the next request on the connection is answered
  };
  for (const Case& test : std::vector<Case>{
           {post("/v1/nodes/node-1:drain", kTeamA), 403, true},
           {post("/v1/nodes/node-1:cordon", ""), 401, true},
           {post("/v1/jobs/job-nope/checkpoints/x:consolidate", kAdmin), 400, false},
           {post("/v1/jobs/job-nope/checkpoints/x:verify", kAdmin), 400, false},
           {absl::StrCat("GET /v1/nodes HTTP/1.1\r\nHost: gw\r\nAuthorization: ", kTeamA,
                         "\r\n\r\n"),
            403, false}}) {
    const std::string line = test.request.substr(0, test.request.find('\r'));
    RawConnection c(http_port_);
    ASSERT_TRUE(c.ok());
    // One request at a time, as a client on a keep-alive connection sends them (httplib 0.11
    // does not answer requests pipelined into one read).
    ASSERT_TRUE(c.Send(test.request));
    absl::StatusOr<RawResponse> resp = c.ReadResponse();
    ASSERT_TRUE(resp.ok()) << line << ": " << resp.status();
    EXPECT_EQ(resp->status, test.status) << line << ": " << resp->body;
    if (test.closes) {
      EXPECT_EQ(resp->headers["connection"], "close") << line;
      EXPECT_TRUE(c.ReadToEof()) << line << ": the connection stayed open after the refusal";
    } else {
      ASSERT_TRUE(c.Send(next)) << line;
      absl::StatusOr<RawResponse> second = c.ReadResponse();
      ASSERT_TRUE(second.ok()) << line << ": " << second.status();
      EXPECT_EQ(second->status, 200) << line << ": the next request got " << second->body;
      EXPECT_EQ(second->body, "ok\n") << line;
    }
  }
  ExpectServing();
}

// The UTF-8 validation itself is common/utf8.h's (utf8_test); Printable quotes with it.
TEST(PrintableTest, KeepsUtf8EscapesTheRestAndCuts) {
  using internal::Printable;
  EXPECT_EQ(Printable("/\xff\xc3\xa9"), "/\\xff\xc3\xa9");
  EXPECT_EQ(Printable("abcdef", 3), "abc...");
  // What Printable returns always survives a strict dump.
  EXPECT_NO_THROW(json(Printable("\xed\xa0\x80\xf4\x90\x80\x80\xc0")).dump());
}

TEST(HttpThreadsTest, DefaultIsAtLeastEightAndTwicePerHardwareThread) {
  const int hardware = static_cast<int>(std::thread::hardware_concurrency());
  EXPECT_EQ(DefaultHttpThreads(), std::max(8, 2 * hardware));
}

}  // namespace
}  // namespace loom::gateway
