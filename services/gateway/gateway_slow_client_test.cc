// Regression test of breakit H1: 8 slow unauthenticated connections hung a loom-gateway
// indefinitely. Each sent a request line and then one header byte every 2-3 s: a byte always came
// within the 5 s read timeout, and nothing bounded the time to read the whole header section, so
// with --http_threads 8 every pool thread served a trickle and every other request (healthz, an
// authenticated list) timed out until the attacker stopped.
//
// Here a real loom-gateway binary (--http_threads 8, --header_timeout 1s, --body_timeout 1s, its
// token check on, an unreachable scheduler) meets as many trickling clients as it has threads,
// each sending a byte every 200 ms (well within the read timeout) until it is answered. Each must
// be answered 408 naming --header_timeout and closed within the deadline plus kSlack, and a
// normal request made while they trickle must be answered within the same time. The body
// deadline (POST /v1/jobs with a token) and the keep-alive idle bound are checked likewise.
// No sleeps: the trickle is paced by waiting (poll, 200 ms) for the gateway's answer, and every
// other wait is a socket read under RawConnection's 20 s timeout or a condition variable's.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/daemon.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "services/gateway/gateway_raw_connection.h"
#include "tests/testing/subprocess.h"

namespace loom::gateway {
namespace {

constexpr int kThreads = 8;  // --http_threads: the default on 2 cores, as in the report
const absl::Duration kHeaderTimeout = absl::Seconds(1);
const absl::Duration kBodyTimeout = absl::Seconds(1);
constexpr int kPaceMs = 200;  // one byte per 200 ms: the 5 s read timeout never fires
// After the deadline: the gateway's lingering close (up to 1 s) before a thread is free again,
// plus scheduling on a loaded 2-core machine.
const absl::Duration kSlack = absl::Seconds(3);
// A trickle never answered is given up after this (the gateway before the fix: never).
const absl::Duration kGiveUp = absl::Seconds(12);

constexpr char kToken[] = "tok-team-a";

struct Trickled {
  int status = 0;  // 0: no answer before kGiveUp
  std::string message;
  absl::Duration answered_after = absl::InfiniteDuration();  // from the first byte sent
  bool closed = false;
  absl::Duration closed_after = absl::InfiniteDuration();
};

std::string Message(const std::string& body) {
  const nlohmann::json json = nlohmann::json::parse(body, nullptr, false);
  return json.is_object() && json.contains("message") && json["message"].is_string()
             ? json["message"].get<std::string>()
             : "";
}

// Sends `head`, then `drip` one byte per kPaceMs (cycling) until the gateway answers or kGiveUp
// passes; calls `trickling` once 3 bytes of the drip are out.
Trickled Trickle(int port, const std::string& head, const std::string& drip,
                 const std::function<void()>& trickling) {
  Trickled out;
  RawConnection c(port);
  if (!c.ok()) return out;
  const absl::Time start = absl::Now();
  if (!c.Send(head)) return out;
  for (size_t i = 0; !c.WaitReadable(kPaceMs); ++i) {
    if (absl::Now() - start > kGiveUp) return out;
    if (!c.Send(drip.substr(i % drip.size(), 1))) break;  // the gateway closed
    if (i == 2) trickling();
  }
  absl::StatusOr<RawResponse> resp = c.ReadResponse();
  out.answered_after = absl::Now() - start;
  if (resp.ok()) {
    out.status = resp->status;
    out.message = Message(resp->body);
  }
  out.closed = c.ReadToEof();
  out.closed_after = absl::Now() - start;
  return out;
}

// Counts clients that are trickling; the test waits (with a timeout) until all are.
class Latch {
 public:
  void Arrive() {
    std::lock_guard<std::mutex> lock(mu_);
    ++count_;
    cv_.notify_all();
  }
  bool WaitFor(int n, absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] { return count_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int count_ = 0;
};

class GatewaySlowClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = absl::StrCat(
        ::testing::TempDir(), "/", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_TRUE(MakeDirs(dir).ok()) << dir;
    const std::string tokens = dir + "/tokens.yaml";
    ASSERT_TRUE(WriteFileAtomically(tokens, absl::StrCat("tokens:\n  - {tenant: team-a, role: "
                                                         "user, token: ",
                                                         kToken, "}\n"))
                    .ok());
    ReadyInfo info;
    auto gateway = loom::testing::StartDaemon(
        dir, "loom-gateway", "services/gateway/loom-gateway",
        {"--scheduler=127.0.0.1:1", "--host=127.0.0.1", "--port=0",
         absl::StrCat("--http_threads=", kThreads), absl::StrCat("--auth_tokens_file=", tokens),
         absl::StrCat("--header_timeout=", absl::FormatDuration(kHeaderTimeout)),
         absl::StrCat("--body_timeout=", absl::FormatDuration(kBodyTimeout))},
        &info);
    ASSERT_TRUE(gateway.ok()) << gateway.status();
    gateway_ = std::move(*gateway);
    ASSERT_TRUE(absl::SimpleAtoi(info.http_url.substr(info.http_url.rfind(':') + 1), &port_))
        << info.http_url;
  }

  void TearDown() override {
    if (gateway_ == nullptr) return;
    EXPECT_EQ(loom::testing::ExitCode(gateway_->Stop()), 0)
        << loom::testing::Tail(gateway_->log_path());
  }

  // kThreads clients trickle `drip` after `head` while the test makes a normal request; each is
  // answered 408 with `message`, and closed, within `deadline` + kSlack.
  void ExpectTricklesTimeOut(const std::string& head, const std::string& drip,
                             absl::Duration deadline, const std::string& message) {
    Latch latch;
    std::vector<Trickled> results(kThreads);
    std::vector<std::thread> clients;
    for (int t = 0; t < kThreads; ++t) {
      clients.emplace_back([&, t] {
        bool arrived = false;
        results[t] = Trickle(port_, head, drip, [&] {
          arrived = true;
          latch.Arrive();
        });
        if (!arrived) latch.Arrive();  // answered (or failed) before trickling 3 bytes
      });
    }
    ASSERT_TRUE(latch.WaitFor(kThreads, kGiveUp));

    // While they trickle (every thread of the gateway holds one): a normal request on a fresh
    // connection, then an authenticated list on the same one (the scheduler is unreachable: 503).
    const absl::Time asked = absl::Now();
    RawConnection c(port_);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c.Send("GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n"));
    absl::StatusOr<RawResponse> health = c.ReadResponse();
    const absl::Duration health_after = absl::Now() - asked;
    ASSERT_TRUE(c.Send(absl::StrCat("GET /v1/jobs HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer ",
                                    kToken, "\r\n\r\n")));
    absl::StatusOr<RawResponse> list = c.ReadResponse();
    ASSERT_TRUE(health.ok()) << health.status();
    EXPECT_EQ(health->status, 200);
    EXPECT_LE(health_after, deadline + kSlack) << "a normal request waited for the trickles";
    ASSERT_TRUE(list.ok()) << list.status();
    EXPECT_EQ(list->status, 503) << list->body;

    for (std::thread& t : clients) t.join();
    for (int t = 0; t < kThreads; ++t) {
      const Trickled& r = results[t];
      EXPECT_EQ(r.status, 408) << "client " << t << " (0: no answer in " << kGiveUp << ")";
      EXPECT_EQ(r.message, message) << "client " << t;
      EXPECT_GE(r.answered_after, deadline) << "client " << t;
      EXPECT_LE(r.answered_after, deadline + kSlack) << "client " << t;
      EXPECT_TRUE(r.closed) << "client " << t;
      EXPECT_LE(r.closed_after, deadline + kSlack) << "client " << t;
    }
  }

  std::unique_ptr<loom::testing::Subprocess> gateway_;
  int port_ = 0;
};

// The reported attack: a request line, then a header trickling a byte at a time, without a
// token, on every thread of the gateway.
TEST_F(GatewaySlowClientTest, SlowHeadersAre408WithinTheDeadlineAndOthersAreServed) {
  ExpectTricklesTimeOut("GET /v1/jobs HTTP/1.1\r\nHost: gw\r\n", "X-Slow: aaaaaaaaaaaaaaaa\r\n",
                        kHeaderTimeout,
                        "the request line and headers were not received within 1s "
                        "(--header_timeout)");
}

// The request line itself trickling: the deadline counts from the request's first byte.
TEST_F(GatewaySlowClientTest, SlowRequestLineIs408) {
  const Trickled r = Trickle(port_, "G", "ET /healthz?aaaaaaaaaaaaaaaaaaaaaaaa", [] {});
  EXPECT_EQ(r.status, 408);
  EXPECT_EQ(r.message,
            "the request line and headers were not received within 1s (--header_timeout)");
  EXPECT_LE(r.answered_after, kHeaderTimeout + kSlack);
  EXPECT_TRUE(r.closed);
}

// A body trickling after an authenticated POST /v1/jobs's headers (the token check passed, the
// route reads the body): 408 naming --body_timeout.
TEST_F(GatewaySlowClientTest, SlowBodiesAre408WithinTheDeadlineAndOthersAreServed) {
  ExpectTricklesTimeOut(
      absl::StrCat("POST /v1/jobs HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer ", kToken,
                   "\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"),
      "{\"name\": \"aaaaaaaaaaaaaaaaaaaaaaaa\"", kBodyTimeout,
      "the request body was not received within 1s (--body_timeout)");
}

// The idle time before a request (the first, or the next on a kept-alive connection) stays
// bounded by httplib's keep-alive timeout, 5 s.
TEST_F(GatewaySlowClientTest, IdleConnectionsAreClosedAfterTheKeepAliveTimeout) {
  const absl::Duration keep_alive = absl::Seconds(5);
  const absl::Time start = absl::Now();
  RawConnection silent(port_);
  RawConnection kept(port_);
  ASSERT_TRUE(silent.ok() && kept.ok());
  ASSERT_TRUE(kept.Send("GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n"));
  absl::StatusOr<RawResponse> resp = kept.ReadResponse();
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->status, 200);
  EXPECT_TRUE(silent.ReadToEof());
  EXPECT_TRUE(kept.ReadToEof());
  EXPECT_LE(absl::Now() - start, keep_alive + kSlack);
}

}  // namespace
}  // namespace loom::gateway
