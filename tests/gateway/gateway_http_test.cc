// HTTP-level behaviour of the real loom-gateway binary in front of the real loom-scheduler
// (SQLite file, loopback, OS-chosen ports), driven with raw HTTP/1.1 requests written byte for
// byte: a body-less POST exactly as `curl -XPOST` sends it, a wrong method, an oversized body
// (declared, announced with Expect: 100-continue, and chunked) and a request httplib cannot parse.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tiny_job.h"

namespace loom {
namespace {

using ::loom::ReadyInfo;
using ::loom::testing::Subprocess;
using json = nlohmann::json;

constexpr size_t kMaxBody = 64 << 10;  // the gateway's --max_body_bytes in this test

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};

// Sends `request` as is on a new loopback connection and reads one response (headers, then a
// Content-Length body). The socket has a 20 s receive timeout, so a gateway that waits for a
// body that never comes answers (httplib's 5 s read timeout) before the test gives up.
absl::StatusOr<HttpResponse> RawRequest(int port, const std::string& request) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{20, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return absl::UnavailableError("connect");
  }
  size_t sent = 0;
  while (sent < request.size()) {
    ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may close early (e.g. after a 413): read what it said
    sent += static_cast<size_t>(n);
  }
  std::string in;
  HttpResponse resp;
  size_t header_end = std::string::npos;
  size_t want = std::string::npos;
  char buf[4096];
  while (true) {
    if (header_end == std::string::npos) {
      header_end = in.find("\r\n\r\n");
      if (header_end != std::string::npos) {
        std::vector<std::string> lines = absl::StrSplit(in.substr(0, header_end), "\r\n");
        std::vector<std::string> status_line = absl::StrSplit(lines[0], ' ');
        if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &resp.status)) {
          ::close(fd);
          return absl::InternalError(absl::StrCat("bad status line: ", lines[0]));
        }
        for (size_t i = 1; i < lines.size(); ++i) {
          size_t colon = lines[i].find(':');
          if (colon == std::string::npos) continue;
          resp.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
              std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
        }
        size_t length = 0;
        want = absl::SimpleAtoi(resp.headers["content-length"], &length)
                   ? header_end + 4 + length
                   : header_end + 4;
      }
    }
    if (want != std::string::npos && in.size() >= want) break;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    in.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (want == std::string::npos || in.size() < want) {
    return absl::DeadlineExceededError(absl::StrCat("incomplete response: '", in, "'"));
  }
  resp.body = in.substr(header_end + 4, want - header_end - 4);
  return resp;
}

class GatewayHttpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = std::getenv("TEST_TMPDIR");
    ASSERT_TRUE(MakeDirs(tmp_ + "/checkpoints").ok());
    ReadyInfo sched_info, gw_info;
    auto sched = testing::StartDaemon(
        tmp_, "scheduler", "services/scheduler/loom-scheduler",
        {"--db=" + tmp_ + "/loom.db", "--checkpoint_root=" + tmp_ + "/checkpoints"}, &sched_info);
    ASSERT_TRUE(sched.ok()) << sched.status();
    scheduler_ = std::move(*sched);
    auto gw = testing::StartDaemon(
        tmp_, "gateway", "services/gateway/loom-gateway",
        {"--scheduler=" + sched_info.grpc_address, "--port=0",
         absl::StrCat("--max_body_bytes=", kMaxBody)},
        &gw_info);
    ASSERT_TRUE(gw.ok()) << gw.status();
    gateway_ = std::move(*gw);
    absl::string_view url = gw_info.http_url;
    ASSERT_TRUE(absl::ConsumePrefix(&url, "http://127.0.0.1:")) << gw_info.http_url;
    ASSERT_TRUE(absl::SimpleAtoi(url, &port_)) << gw_info.http_url;
  }

  std::string Host() const { return absl::StrCat("Host: 127.0.0.1:", port_, "\r\n"); }

  // A pending job (no workers), submitted with a normal Content-Length POST.
  std::string SubmitJob(const std::string& name) {
    const std::string body = testing::TinySubmitJobJson(name, 1);
    auto resp = RawRequest(port_, absl::StrCat("POST /v1/jobs HTTP/1.1\r\n", Host(),
                                               "Content-Type: application/json\r\n",
                                               "Content-Length: ", body.size(), "\r\n\r\n", body));
    EXPECT_TRUE(resp.ok()) << resp.status();
    if (!resp.ok()) return "";
    EXPECT_EQ(resp->status, 200) << resp->body;
    return json::parse(resp->body, nullptr, false)["job"]["id"].get<std::string>();
  }

  // The JSON error body, checked to be the gateway's shape.
  static json ErrorBody(const HttpResponse& resp) {
    json body = json::parse(resp.body, nullptr, false);
    EXPECT_FALSE(body.is_discarded()) << resp.body;
    EXPECT_TRUE(body.contains("code") && body.contains("status") && body.contains("message"))
        << resp.body;
    EXPECT_EQ(resp.headers.count("content-type") ? resp.headers.at("content-type") : "",
              "application/json");
    return body.is_discarded() ? json::object() : body;
  }

  std::string tmp_;
  std::unique_ptr<Subprocess> scheduler_;
  std::unique_ptr<Subprocess> gateway_;
  int port_ = 0;
};

// Regression: the documented `curl -XPOST .../v1/jobs/JOB:cancel` (and :kill) sends no
// Content-Length; the gateway waited for a body and answered 400 {"status": "UNKNOWN",
// "message": "HTTP 400"}.
TEST_F(GatewayHttpTest, BodylessCurlPostCancelsAndKills) {
  for (const char* verb : {"cancel", "kill"}) {
    const std::string id = SubmitJob(absl::StrCat("curl-", verb));
    ASSERT_FALSE(id.empty());
    // Exactly what curl 7.88 sends for `curl -XPOST http://127.0.0.1:PORT/v1/jobs/ID:cancel`.
    auto resp = RawRequest(port_, absl::StrCat("POST /v1/jobs/", id, ":", verb, " HTTP/1.1\r\n",
                                               Host(), "User-Agent: curl/7.88.1\r\n",
                                               "Accept: */*\r\n\r\n"));
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ(resp->status, 200) << verb << ": " << resp->body;
    json job = json::parse(resp->body, nullptr, false);
    EXPECT_EQ(job["id"], id) << resp->body;
    EXPECT_EQ(job["phase"], "JOB_PHASE_CANCELLED") << resp->body;
  }
  // The real curl, as the docs show it.
  const std::string id = SubmitJob("curl-binary");
  const std::string out = tmp_ + "/curl.out";
  const int rc = std::system(absl::StrCat("curl -s -XPOST http://127.0.0.1:", port_, "/v1/jobs/",
                                          id, ":cancel > ", out).c_str());
  ASSERT_EQ(rc, 0);
  auto text = ReadFile(out);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(json::parse(*text, nullptr, false)["phase"], "JOB_PHASE_CANCELLED") << *text;
}

// Regression: a wrong method on a served path was 404 "no route".
TEST_F(GatewayHttpTest, WrongMethodIs405WithAllow) {
  const std::string id = SubmitJob("method");
  struct Case {
    std::string request_line;
    std::string allow;
  };
  for (const Case& c : {Case{absl::StrCat("GET /v1/jobs/", id, ":cancel"), "POST"},
                        Case{absl::StrCat("PUT /v1/jobs/", id, ":kill"), "POST"},
                        Case{absl::StrCat("DELETE /v1/jobs/", id), "GET"},
                        Case{"PATCH /v1/jobs", "GET, POST"},
                        Case{absl::StrCat("POST /v1/jobs/", id, "/logs"), "GET"}}) {
    auto resp = RawRequest(port_, absl::StrCat(c.request_line, " HTTP/1.1\r\n", Host(),
                                               "Content-Length: 0\r\n\r\n"));
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ(resp->status, 405) << c.request_line << ": " << resp->body;
    EXPECT_EQ(resp->headers["allow"], c.allow) << c.request_line;
    json err = ErrorBody(*resp);
    EXPECT_EQ(err["status"], "UNIMPLEMENTED") << c.request_line;
    EXPECT_NE(err["message"].get<std::string>().find("allowed: " + c.allow), std::string::npos)
        << err;
  }
  // An unknown path stays 404.
  auto resp = RawRequest(port_, absl::StrCat("GET /v1/widgets HTTP/1.1\r\n", Host(), "\r\n"));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->status, 404);
  EXPECT_EQ(ErrorBody(*resp)["message"], "no route for GET /v1/widgets");
}

// Regression: an oversized body was read whole and forwarded, and came back 429
// RESOURCE_EXHAUSTED from gRPC. Now the declared length is refused before any byte of the body
// is read: the request below never sends its body, so a gateway that tried to read it would
// time out (400) instead of answering 413.
TEST_F(GatewayHttpTest, OversizedBodyIs413BeforeItIsRead) {
  const std::string declared = absl::StrCat("Content-Length: ", 100 << 20, "\r\n");
  auto resp = RawRequest(port_, absl::StrCat("POST /v1/jobs HTTP/1.1\r\n", Host(),
                                             "Content-Type: application/json\r\n", declared,
                                             "\r\n"));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->status, 413) << resp->body;
  json err = ErrorBody(*resp);
  EXPECT_EQ(err["status"], "INVALID_ARGUMENT");
  EXPECT_EQ(err["message"], absl::StrCat("request body of ", 100 << 20,
                                         " bytes is over the gateway's limit of ", kMaxBody,
                                         " bytes (--max_body_bytes)"));
  // curl announces bodies over 1 MiB with Expect: 100-continue: refused instead of "100 Continue".
  resp = RawRequest(port_, absl::StrCat("POST /v1/jobs HTTP/1.1\r\n", Host(), declared,
                                        "Expect: 100-continue\r\n\r\n"));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->status, 413) << resp->body;
  EXPECT_EQ(ErrorBody(*resp)["status"], "INVALID_ARGUMENT");
  // A chunked body is cut off at the limit.
  const std::string chunk(kMaxBody, 'x');
  resp = RawRequest(port_, absl::StrCat("POST /v1/jobs HTTP/1.1\r\n", Host(),
                                        "Transfer-Encoding: chunked\r\n\r\n", absl::Hex(chunk.size()),
                                        "\r\n", chunk, "\r\n1\r\nx\r\n0\r\n\r\n"));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->status, 413) << resp->body;
  // A body at the limit is read and parsed (here: not JSON, so the parser's 400).
  const std::string at_limit(kMaxBody, ' ');
  resp = RawRequest(port_, absl::StrCat("POST /v1/jobs HTTP/1.1\r\n", Host(), "Content-Length: ",
                                        at_limit.size(), "\r\n\r\n", at_limit));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->status, 400) << resp->body;
  EXPECT_NE(ErrorBody(*resp)["message"].get<std::string>().find("loom.v1.SubmitJobRequest"),
            std::string::npos);
}

// Regression: errors cpp-httplib raised itself came back as {"status": "UNKNOWN", "message":
// "HTTP 400"}.
TEST_F(GatewayHttpTest, LibraryErrorsHaveRealCodesAndMessages) {
  auto resp = RawRequest(port_, "NOT-HTTP\r\n\r\n");
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->status, 400);
  json err = ErrorBody(*resp);
  EXPECT_EQ(err["status"], "INVALID_ARGUMENT");
  EXPECT_EQ(err["code"], 3);
  EXPECT_NE(err["message"].get<std::string>().find("malformed HTTP request"), std::string::npos)
      << err;

  // A submission must say how long its body is.
  resp = RawRequest(port_, absl::StrCat("POST /v1/jobs HTTP/1.1\r\n", Host(), "\r\n"));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->status, 411) << resp->body;
  err = ErrorBody(*resp);
  EXPECT_EQ(err["status"], "INVALID_ARGUMENT");
  EXPECT_NE(err["message"].get<std::string>().find("Content-Length"), std::string::npos) << err;

  // A URI over httplib's limit (8192 bytes).
  resp = RawRequest(port_, absl::StrCat("GET /v1/jobs/", std::string(9000, 'a'), " HTTP/1.1\r\n",
                                        Host(), "\r\n"));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->status, 414);
  EXPECT_EQ(ErrorBody(*resp)["status"], "INVALID_ARGUMENT");
}

}  // namespace
}  // namespace loom
