#include "common/daemon.h"

#include <httplib.h>
#include <prometheus/counter.h>
#include <prometheus/registry.h>

#include <atomic>

#include "gtest/gtest.h"

namespace loom {
namespace {

TEST(MetricsEndpointTest, ServesMetricsHealthAndReadiness) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter().Name("loom_test_things_total").Help("t").Register(*registry)
      .Add({{"kind", "a"}}).Increment(3);
  std::atomic<bool> ready{false};
  auto ep = MetricsEndpoint::Start("127.0.0.1", 0, registry, [&ready]() -> absl::Status {
    if (ready) return absl::OkStatus();
    return absl::UnavailableError("store not loaded");
  });
  ASSERT_TRUE(ep.ok()) << ep.status();
  ASSERT_GT((*ep)->port(), 0);
  EXPECT_EQ((*ep)->url(), "http://127.0.0.1:" + std::to_string((*ep)->port()) + "/metrics");
  EXPECT_EQ((*ep)->ready_url(), "http://127.0.0.1:" + std::to_string((*ep)->port()) + "/readyz");

  httplib::Client c("127.0.0.1", (*ep)->port());
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_NE(m->body.find("loom_test_things_total{kind=\"a\"} 3"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("# TYPE loom_test_things_total counter"), std::string::npos);

  auto h = c.Get("/healthz");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(h->body, "ok\n");

  auto r = c.Get("/readyz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_NE(r->body.find("store not loaded"), std::string::npos);
  ready = true;
  r = c.Get("/readyz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);

  (*ep)->SetReadyCheck([] { return absl::FailedPreconditionError("not registered"); });
  r = c.Get("/readyz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_NE(r->body.find("not registered"), std::string::npos);

  auto other = c.Get("/nope");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
}

TEST(MetricsEndpointTest, StartsAndStopsRepeatedly) {
  auto registry = std::make_shared<prometheus::Registry>();
  for (int i = 0; i < 20; ++i) {
    auto ep = MetricsEndpoint::Start("127.0.0.1", 0, registry);
    ASSERT_TRUE(ep.ok()) << ep.status();
  }
}

TEST(MetricsEndpointTest, BusyPortIsUnavailable) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto a = MetricsEndpoint::Start("127.0.0.1", 0, registry);
  ASSERT_TRUE(a.ok());
  auto b = MetricsEndpoint::Start("127.0.0.1", (*a)->port(), registry);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
}

TEST(MetricsEndpointTest, UnbindableAddressIsUnavailable) {
  auto ep = MetricsEndpoint::Start("203.0.113.7", 0, std::make_shared<prometheus::Registry>());
  EXPECT_EQ(ep.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace loom
