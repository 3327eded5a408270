// Regression tests of the follow-up to issue 42 defect 1 (limits before authentication): httplib
// 0.11 read a chunked request body whole into memory on every POST, PUT, PATCH or DELETE that no
// route reads a body for (POST /healthz, POST /v1/openapi.json, any path outside /v1/; a body
// without any length until the client closed), and its payload limit counts only a declared
// Content-Length; the body of a GET was left unread and parsed as the next request. Now the
// pre-routing handler refuses, before the body is read and before the token check, a body on a
// route that takes none (413), a Transfer-Encoding httplib would frame otherwise than a proxy
// (501, 400), and answers a path or method that no route serves (404, 405) before httplib reads
// its body; the connection is closed after each answer that leaves a body unread. Routes that
// read a body count it against --max_body_bytes while reading it, chunked or not (413).
//
// Raw HTTP/1.1 bytes on loopback against GatewayServer with JobGateway's routes, its token check
// and a body limit of 1024 bytes; the scheduler's address refuses connections (a request that
// passes the gateway gets 503). A body is announced and never finished where the answer must come
// before it is read: a gateway that waited for it would answer only at its 5 s read timeout,
// with 400. No sleeps: every read waits under a 20 s deadline.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "gtest/gtest.h"
#include "services/gateway/gateway.h"
#include "services/gateway/gateway_raw_connection.h"
#include "services/gateway/gateway_server.h"

namespace loom::gateway {
namespace {

constexpr char kAuthorization[] = "Authorization: Bearer tok-team-a";
constexpr size_t kMaxBody = 1024;
// A chunked body announced (a 64 MiB chunk) and never finished: 100 bytes of it are sent.
const std::string kUnfinishedChunkedBody = "4000000\r\n" + std::string(100, 'a');

// "<method> <target> HTTP/1.1", Host, then `fields` (each without CRLF), then the blank line.
std::string Head(const std::string& method, const std::string& target,
                 const std::vector<std::string>& fields, const std::string& version = "HTTP/1.1") {
  std::string out = absl::StrCat(method, " ", target, " ", version, "\r\nHost: gw\r\n");
  for (const std::string& field : fields) absl::StrAppend(&out, field, "\r\n");
  return out + "\r\n";
}

std::string Message(const RawResponse& resp) {
  const nlohmann::json body = nlohmann::json::parse(resp.body, nullptr, false);
  EXPECT_TRUE(body.is_object() && body.contains("message")) << resp.body;
  return body.is_object() && body.contains("message") ? body["message"].get<std::string>() : "";
}

std::string StatusName(const RawResponse& resp) {
  const nlohmann::json body = nlohmann::json::parse(resp.body, nullptr, false);
  return body.is_object() && body.contains("status") ? body["status"].get<std::string>() : "";
}

class GatewayBodyLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auth_ = std::make_unique<TokenAuthenticator>(
        TokenAuthenticator::ForToken("tok-team-a", Caller{"team-a", Role::kUser}));
    // Port 1 on loopback refuses connections: a request that passes the gateway gets 503.
    stub_ = loom::v1::JobService::NewStub(
        grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials()));
    GatewayOptions options;
    options.rpc_timeout = absl::Seconds(10);
    options.auth = auth_.get();
    options.max_body_bytes = kMaxBody;
    gateway_ = std::make_unique<JobGateway>(stub_.get(), options);
    server_ = std::make_unique<GatewayServer>();
    SetHttpThreads(*server_, 4);
    gateway_->Register(*server_);
    port_ = server_->bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    listener_ = std::thread([this] { server_->listen_after_bind(); });
  }

  void TearDown() override {
    server_->stop();
    if (listener_.joinable()) listener_.join();
  }

  RawResponse Exchange(const std::string& request, bool* closed = nullptr) {
    return gateway::Exchange(port_, request, closed);  // gateway_raw_connection.h
  }

  std::unique_ptr<TokenAuthenticator> auth_;
  std::unique_ptr<loom::v1::JobService::Stub> stub_;
  std::unique_ptr<JobGateway> gateway_;
  std::unique_ptr<GatewayServer> server_;
  int port_ = 0;
  std::thread listener_;
};

// GET /healthz with a chunked body was 200 (the body then parsed as the next request); a DELETE's
// chunked body was left unread the same way. A route that takes no body has a limit of 0 bytes:
// 413 naming the route, before the body is read and before the token check, connection closed.
TEST_F(GatewayBodyLimitsTest, BodyOnARouteThatTakesNoneIs413BeforeAuthentication) {
  struct Case {
    std::string method, target, route;
  };
  for (const Case& c : {Case{"GET", "/healthz", "/healthz"},
                        Case{"GET", "/v1/openapi.json", "/v1/openapi.json"},
                        Case{"GET", "/v1/jobs", "/v1/jobs"},  // no token: 413, not 401
                        Case{"GET", "/v1/jobs/j1:watch", "/v1/jobs/{id}:watch"},
                        Case{"DELETE", "/v1/jobs/j1/checkpoints/3",
                             "/v1/jobs/{id}/checkpoints/{step}"}}) {
    SCOPED_TRACE(c.method + " " + c.target);
    bool closed = false;
    RawResponse resp =
        Exchange(Head(c.method, c.target, {"Transfer-Encoding: chunked"}) + kUnfinishedChunkedBody,
                 &closed);
    EXPECT_EQ(resp.status, 413) << resp.body;
    EXPECT_EQ(StatusName(resp), "INVALID_ARGUMENT");
    EXPECT_EQ(Message(resp),
              absl::StrCat(c.method, " ", c.route, " takes no request body (this one is chunked)"));
    EXPECT_TRUE(closed);
    // A declared length, 10 of its 100 bytes sent.
    resp = Exchange(Head(c.method, c.target, {"Content-Length: 100"}) + std::string(10, 'a'),
                    &closed);
    EXPECT_EQ(resp.status, 413) << resp.body;
    EXPECT_EQ(Message(resp),
              absl::StrCat(c.method, " ", c.route, " takes no request body (this one declares "
                           "100 bytes)"));
    EXPECT_TRUE(closed);
  }
  // An empty declared body is no body: answered, and the connection stays open for the next.
  RawConnection c(port_);
  ASSERT_TRUE(c.Send(Head("GET", "/healthz", {"Content-Length: 0"})));
  absl::StatusOr<RawResponse> first = c.ReadResponse();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->status, 200);
  ASSERT_TRUE(c.Send(Head("GET", "/healthz", {})));
  absl::StatusOr<RawResponse> second = c.ReadResponse();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->status, 200);
  // Announced with Expect: 100-continue: refused instead of "100 Continue".
  bool closed = false;
  const RawResponse expect =
      Exchange(Head("GET", "/healthz", {"Transfer-Encoding: chunked", "Expect: 100-continue"}),
               &closed);
  EXPECT_EQ(expect.status, 413) << expect.body;
  EXPECT_TRUE(closed);
}

// POST /healthz, POST /v1/openapi.json or POST to a path outside /v1/ with a chunked body had
// that body read whole into memory before the 405 or 404 (8 clients x 64 MiB: 20 -> 800 MiB
// resident); without any length it was read until the client closed. Now answered first.
TEST_F(GatewayBodyLimitsTest, UnservedMethodOrPathIsAnsweredBeforeItsBodyIsRead) {
  struct Case {
    std::string method, target;
    std::vector<std::string> fields;
    int status;
    std::string allow;
  };
  const std::string token = kAuthorization;
  for (const Case& c : {Case{"POST", "/healthz", {}, 405, "GET"},
                        Case{"POST", "/v1/openapi.json", {}, 405, "GET"},
                        Case{"POST", "/elsewhere", {}, 404, ""},
                        Case{"PATCH", "/elsewhere", {}, 404, ""},
                        Case{"PUT", "/v1/jobs", {token}, 405, "GET, POST"},
                        Case{"POST", "/v1/jobs/j1", {token}, 405, "GET"},
                        Case{"PUT", "/v1/jobs", {}, 401, ""}}) {  // the token check first
    SCOPED_TRACE(c.method + " " + c.target);
    std::vector<std::string> fields = c.fields;
    fields.push_back("Transfer-Encoding: chunked");
    bool closed = false;
    const RawResponse resp =
        Exchange(Head(c.method, c.target, fields) + kUnfinishedChunkedBody, &closed);
    EXPECT_EQ(resp.status, c.status) << resp.body;
    EXPECT_EQ(resp.headers.count("allow") ? resp.headers.at("allow") : "", c.allow);
    EXPECT_TRUE(closed);
  }
  // No length at all: per RFC 9112 no body, while httplib read until the client closed (or its
  // 5 s read timeout, then 400). Answered at once, and the connection serves the next request.
  RawConnection c(port_);
  ASSERT_TRUE(c.Send(Head("POST", "/healthz", {})));
  absl::StatusOr<RawResponse> resp = c.ReadResponse();
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->status, 405) << resp->body;
  EXPECT_EQ(Message(*resp), "method POST is not allowed on /healthz (allowed: GET)");
  ASSERT_TRUE(c.Send(Head("GET", "/healthz", {})));
  resp = c.ReadResponse();
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->status, 200);
}

// The routes that read a body count a chunked one against --max_body_bytes while reading it:
// 413 as soon as it is over, without waiting for the rest; and without a token nothing is read.
TEST_F(GatewayBodyLimitsTest, ChunkedBodyIsBoundedWhileReadingAndUnreadWithoutAToken) {
  const std::string post = Head("POST", "/v1/jobs",
                                {kAuthorization, "Transfer-Encoding: chunked",
                                 "Content-Type: application/json"});
  bool closed = false;
  // A 64 MiB chunk announced, 2 KiB of it sent: over the limit of 1 KiB.
  RawResponse resp = Exchange(post + "4000000\r\n" + std::string(2048, ' '), &closed);
  EXPECT_EQ(resp.status, 413) << resp.body;
  EXPECT_EQ(Message(resp), "request body is over the gateway's limit of 1024 bytes "
                           "(--max_body_bytes)");
  EXPECT_TRUE(closed);
  // Small chunks adding up past the limit.
  std::string chunks;
  for (int i = 0; i < 20; ++i) absl::StrAppend(&chunks, "40\r\n", std::string(64, ' '), "\r\n");
  resp = Exchange(post + chunks, &closed);
  EXPECT_EQ(resp.status, 413) << resp.body;
  EXPECT_TRUE(closed);
  // Within the limit: read, parsed, and sent on to the scheduler (unreachable here: 503).
  resp = Exchange(post + "2\r\n{}\r\n0\r\n\r\n");
  EXPECT_EQ(resp.status, 503) << resp.body;
  // Without a token: 401 before the body is read.
  resp = Exchange(Head("POST", "/v1/jobs", {"Transfer-Encoding: chunked"}) +
                      kUnfinishedChunkedBody,
                  &closed);
  EXPECT_EQ(resp.status, 401) << resp.body;
  EXPECT_TRUE(closed);
}

// httplib frames a body as chunked only when the first Transfer-Encoding header is exactly
// "chunked", else by Content-Length or until the client closes; a proxy in front may frame it
// otherwise (request smuggling). Refused as nginx refuses them, before the token check.
TEST_F(GatewayBodyLimitsTest, TransferEncodingHttplibWouldMisframeIsRefused) {
  struct Case {
    std::vector<std::string> fields;
    std::string version;
    int status;
    std::string code, message;
  };
  for (const Case& c : {
           Case{{"Transfer-Encoding: gzip"}, "HTTP/1.1", 501, "UNIMPLEMENTED",
                "Transfer-Encoding 'gzip' is not supported (only 'chunked')"},
           Case{{"Transfer-Encoding: gzip, chunked"}, "HTTP/1.1", 501, "UNIMPLEMENTED",
                "Transfer-Encoding 'gzip, chunked' is not supported (only 'chunked')"},
           Case{{"Transfer-Encoding: chunked", "Transfer-Encoding: gzip"}, "HTTP/1.1", 400,
                "INVALID_ARGUMENT", "the request has 2 Transfer-Encoding headers; send one"},
           Case{{"Transfer-Encoding: chunked", "Content-Length: 5"}, "HTTP/1.1", 400,
                "INVALID_ARGUMENT",
                "the request has both Transfer-Encoding and Content-Length headers"},
           Case{{"Transfer-Encoding: chunked"}, "HTTP/1.0", 400, "INVALID_ARGUMENT",
                "an HTTP/1.0 request cannot carry a Transfer-Encoding header"}}) {
    SCOPED_TRACE(c.message);
    bool closed = false;
    const RawResponse resp =
        Exchange(Head("POST", "/v1/jobs", c.fields, c.version) + kUnfinishedChunkedBody, &closed);
    EXPECT_EQ(resp.status, c.status) << resp.body;
    EXPECT_EQ(StatusName(resp), c.code);
    EXPECT_EQ(Message(resp), c.message);
    EXPECT_TRUE(closed);
  }
}

}  // namespace
}  // namespace loom::gateway
