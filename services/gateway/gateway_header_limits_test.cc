// Regression tests of issue 42 defect 1: the gateway had no limit on the number or size of
// request headers and applied none before authentication (10,000 headers were answered 200; a
// single header line over 8 KiB was 400 "malformed HTTP request"; two Authorization headers were
// accepted, the first winning). Now GatewayServer (gateway_server.h) bounds the header section
// while reading it: 431 naming the limit, 414 for a request line over 8 KiB, the connection
// closed after the answer, before the token check; and two Authorization (or Host) headers are
// 400 naming the header.
//
// Raw HTTP/1.1 bytes on loopback against GatewayServer with JobGateway's routes and its token
// check; the scheduler's address refuses connections (a route that reaches it answers 503), so
// every status below is the gateway's own. No sleeps: every read waits under a 20 s deadline.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "gtest/gtest.h"
#include "services/gateway/gateway.h"
#include "services/gateway/gateway_raw_connection.h"
#include "services/gateway/gateway_server.h"

namespace loom::gateway {
namespace {

constexpr char kToken[] = "Bearer tok-team-a";

// "GET <target> HTTP/1.1", then `fields` (each without CRLF), then the blank line.
std::string Request(const std::string& target, const std::vector<std::string>& fields,
                    const std::string& method = "GET") {
  std::string out = absl::StrCat(method, " ", target, " HTTP/1.1\r\n");
  for (const std::string& field : fields) absl::StrAppend(&out, field, "\r\n");
  return out + "\r\n";
}

// `count` header fields: Host, then X-Filler-<i>: v.
std::vector<std::string> Fields(int count) {
  std::vector<std::string> fields = {"Host: gw"};
  for (int i = 1; i < count; ++i) fields.push_back(absl::StrCat("X-Filler-", i, ": v"));
  return fields;
}

// GET /healthz of exactly `total` bytes (request line, fields and blank line, CRLFs included):
// Host, then X-Pad-<i> fields of at most 8000 bytes each.
std::string HealthzOfSize(size_t total) {
  std::vector<std::string> fields = {"Host: gw"};
  size_t size = Request("/healthz", fields).size();
  for (int i = 0; size < total; ++i) {
    const std::string name = absl::StrCat("X-Pad-", i, ": ");
    size_t line = std::min<size_t>(8000, total - size);  // with its CRLF
    if (total - size - line != 0 && total - size - line < 16) line -= 16;  // room for the last
    fields.push_back(name + std::string(line - name.size() - 2, 'a'));
    size += line;
  }
  return Request("/healthz", fields);
}

std::string Message(const RawResponse& resp) {
  const nlohmann::json body = nlohmann::json::parse(resp.body, nullptr, false);
  EXPECT_TRUE(body.is_object() && body.contains("message")) << resp.body;
  return body.is_object() && body.contains("message") ? body["message"].get<std::string>() : "";
}

class GatewayHeaderLimitsTest : public ::testing::Test {
 protected:
  void Start(HeaderLimits limits = HeaderLimits()) {
    auth_ = std::make_unique<TokenAuthenticator>(
        TokenAuthenticator::ForToken("tok-team-a", Caller{"team-a", Role::kUser}));
    // Port 1 on loopback refuses connections: a request that passes the gateway gets 503.
    stub_ = loom::v1::JobService::NewStub(
        grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials()));
    GatewayOptions options;
    options.rpc_timeout = absl::Seconds(10);
    options.auth = auth_.get();
    gateway_ = std::make_unique<JobGateway>(stub_.get(), options);
    server_ = std::make_unique<GatewayServer>(limits);
    SetHttpThreads(*server_, 4);
    gateway_->Register(*server_);
    port_ = server_->bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    listener_ = std::thread([this] { server_->listen_after_bind(); });
  }

  void TearDown() override {
    if (server_ != nullptr) server_->stop();
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

// The reported case: 10,000 headers were 200 on /healthz and, without a token, went through the
// token check (401) after all of them had been stored.
TEST_F(GatewayHeaderLimitsTest, TenThousandHeadersAre431BeforeAuthentication) {
  Start();
  for (const char* target : {"/healthz", "/v1/jobs"}) {
    bool closed = false;
    const RawResponse resp = Exchange(Request(target, Fields(10000)), &closed);
    EXPECT_EQ(resp.status, 431) << target << ": " << resp.body;
    EXPECT_EQ(Message(resp), "the request has more than 100 header fields (--max_header_count)");
    EXPECT_EQ(resp.headers.count("www-authenticate"), 0u) << target;
    EXPECT_TRUE(closed) << target;
  }
}

TEST_F(GatewayHeaderLimitsTest, HundredHeadersAreServedAndOneMoreIs431) {
  Start();
  RawConnection c(port_);
  ASSERT_TRUE(c.ok());
  // Twice on one connection: the limit is per request, and keep-alive still works.
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(c.Send(Request("/healthz", Fields(100))));
    absl::StatusOr<RawResponse> ok = c.ReadResponse();
    ASSERT_TRUE(ok.ok()) << ok.status();
    EXPECT_EQ(ok->status, 200);
    EXPECT_EQ(ok->body, "ok\n");
  }
  ASSERT_TRUE(c.Send(Request("/healthz", Fields(101))));
  absl::StatusOr<RawResponse> refused = c.ReadResponse();
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->status, 431);
  EXPECT_EQ(refused->headers["connection"], "close");
  EXPECT_TRUE(c.ReadToEof());
  // A token does not lift the limit.
  std::vector<std::string> fields = Fields(101);
  fields.push_back(absl::StrCat("Authorization: ", kToken));
  bool closed = false;
  EXPECT_EQ(Exchange(Request("/v1/jobs", fields), &closed).status, 431);
  EXPECT_TRUE(closed);
}

TEST_F(GatewayHeaderLimitsTest, HeaderSectionOver64KiBIs431) {
  Start();
  bool closed = false;
  const std::string at_limit = HealthzOfSize(64 << 10);
  ASSERT_EQ(at_limit.size(), 64u << 10);
  EXPECT_EQ(Exchange(at_limit).status, 200);
  const std::string over = HealthzOfSize((64 << 10) + 1);
  ASSERT_EQ(over.size(), (64u << 10) + 1);
  const RawResponse resp = Exchange(over, &closed);
  EXPECT_EQ(resp.status, 431) << resp.body;
  EXPECT_EQ(Message(resp),
            "the request line and headers are longer than 65536 bytes (--max_header_bytes)");
  EXPECT_TRUE(closed);
  // Without a token, on a route that needs one: the size is refused first.
  std::string unauthenticated = over;
  unauthenticated.replace(0, std::string("GET /healthz").size(), "GET /v1/jobs/j-1");
  EXPECT_EQ(Exchange(unauthenticated, &closed).status, 431);
}

// One line over 8 KiB was 400 "malformed HTTP request" (httplib's compiled-in limit); a line of
// exactly 8192 bytes with its CRLF is still served, so the limit matches the library's.
TEST_F(GatewayHeaderLimitsTest, OneHeaderLineOver8KiBIs431) {
  Start();
  const std::string name = "X-Big: ";
  bool closed = false;
  const RawResponse at_limit =
      Exchange(Request("/healthz", {"Host: gw", name + std::string(8192 - name.size() - 2, 'a')}));
  EXPECT_EQ(at_limit.status, 200) << at_limit.body;
  const RawResponse over = Exchange(
      Request("/healthz", {"Host: gw", name + std::string(8193 - name.size() - 2, 'a')}),
      &closed);
  EXPECT_EQ(over.status, 431) << over.body;
  EXPECT_EQ(Message(over), "header field line 2 is longer than 8192 bytes");
  EXPECT_TRUE(closed);
}

TEST_F(GatewayHeaderLimitsTest, RequestLineOver8KiBIs414AndItsHeadersAreNotRead) {
  Start();
  bool closed = false;
  // httplib read every header after a long request line (into a map it discarded).
  const RawResponse resp =
      Exchange(Request("/healthz?x=" + std::string(9000, 'a'), Fields(5000)), &closed);
  EXPECT_EQ(resp.status, 414) << resp.body;
  EXPECT_EQ(Message(resp), "the request line is longer than 8192 bytes");
  EXPECT_TRUE(closed);
}

// The first Authorization header was checked and forwarded; a proxy or log in front may take
// another as the caller.
TEST_F(GatewayHeaderLimitsTest, TwoAuthorizationHeadersAre400) {
  Start();
  const std::string valid = absl::StrCat("Authorization: ", kToken);
  const std::string other = "Authorization: Bearer tok-someone-else";
  for (const auto& pair : std::vector<std::vector<std::string>>{
           {valid, other}, {other, valid}, {valid, valid}}) {
    const RawResponse resp = Exchange(Request("/v1/jobs", {"Host: gw", pair[0], pair[1]}));
    EXPECT_EQ(resp.status, 400) << absl::StrJoin(pair, " / ") << ": " << resp.body;
    EXPECT_EQ(Message(resp), "the request has 2 Authorization headers; send one");
  }
  const RawResponse hosts = Exchange(Request("/healthz", {"Host: gw", "Host: other"}));
  EXPECT_EQ(hosts.status, 400) << hosts.body;
  EXPECT_EQ(Message(hosts), "the request has 2 Host headers; send one");
  // One token still passes the gateway (the unreachable scheduler answers 503).
  EXPECT_EQ(Exchange(Request("/v1/jobs", {"Host: gw", valid})).status, 503);
}

TEST_F(GatewayHeaderLimitsTest, ConfiguredLimitsApply) {
  HeaderLimits limits;
  limits.max_count = 5;
  limits.max_bytes = 512;
  Start(limits);
  bool closed = false;
  EXPECT_EQ(Exchange(Request("/healthz", Fields(5))).status, 200);
  const RawResponse count = Exchange(Request("/healthz", Fields(6)), &closed);
  EXPECT_EQ(count.status, 431);
  EXPECT_EQ(Message(count), "the request has more than 5 header fields (--max_header_count)");
  EXPECT_EQ(Exchange(HealthzOfSize(512)).status, 200);
  const RawResponse bytes = Exchange(HealthzOfSize(513), &closed);
  EXPECT_EQ(bytes.status, 431);
  EXPECT_EQ(Message(bytes),
            "the request line and headers are longer than 512 bytes (--max_header_bytes)");
}

// After the headers httplib reads a chunk's size line byte by byte into a buffer without bound:
// a size line longer than a header line ends the body (the line was read whole, and
// "000...01" then taken as a size of 1).
TEST_F(GatewayHeaderLimitsTest, ChunkSizeLineOver8KiBEndsTheBody) {
  Start();
  const std::string request =
      Request("/v1/jobs",
              {"Host: gw", absl::StrCat("Authorization: ", kToken),
               "Transfer-Encoding: chunked", "Content-Type: application/json"},
              "POST") +
      std::string(100000, '0') + "2\r\n{}\r\n0\r\n\r\n";
  bool closed = false;
  const RawResponse resp = Exchange(request, &closed);
  EXPECT_EQ(resp.status, 400) << resp.body;
  EXPECT_EQ(Message(resp),
            "the request body could not be read (truncated, or a bad chunked encoding)");
  EXPECT_TRUE(closed);
}

}  // namespace
}  // namespace loom::gateway
