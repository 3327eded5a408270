// FailingCollectives over a local group and over real Gloo ranks (the thread harness): the
// k-th collective reports the injected status, the others the real one, and the counters
// mirror the wrapped group.
#include "worker/engine/testing/failing_collectives.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>

#include "worker/engine/testing/thread_gang.h"

namespace loom::engine::testing {
namespace {

TEST(FailingCollectivesTest, OnlyTheKthFailsWhenNotSticky) {
  std::unique_ptr<Collectives> local = CreateLocalCollectives();
  FailingCollectives f(*local, 2, absl::UnavailableError("peer gone"), /*sticky=*/false);
  at::Tensor a = at::ones({4}), b = at::empty({4});
  EXPECT_TRUE(f.AllGather(a, b).ok());
  EXPECT_TRUE(at::equal(a, b));
  auto second = f.StartReduceScatterSum(a, b);
  EXPECT_EQ(f.started(), 2);
  EXPECT_TRUE(f.failed());
  EXPECT_EQ(second->Wait().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(f.Barrier().ok());
  EXPECT_EQ(f.collective_count(), local->collective_count());
  EXPECT_EQ(f.collective_hash(), local->collective_hash());
  EXPECT_EQ(f.elements_moved(), local->elements_moved());
}

TEST(FailingCollectivesTest, StickyFailureCoversEveryLaterCall) {
  std::unique_ptr<Collectives> local = CreateLocalCollectives();
  FailingCollectives f(*local, 1, absl::DeadlineExceededError("timed out"));
  at::Tensor t = at::ones({2});
  EXPECT_EQ(f.AllReduce(t, ReduceOp::kSum).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(f.Broadcast(t, 0).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(f.NewSubgroup({0}, "g").status().code(), absl::StatusCode::kDeadlineExceeded);
  at::Tensor out = at::empty({2});
  EXPECT_EQ(f.AllToAll(t, out).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(f.started(), 4);
}

TEST(FailingCollectivesTest, RealGlooRanksStayMatchedAfterAnInjectedFailure) {
  std::vector<absl::Status> st = RunGang(2, [](int rank, Collectives& world) {
    FailingCollectives f(world, 1, absl::InternalError("injected"), /*sticky=*/false);
    at::Tensor t = at::full({3}, static_cast<float>(rank + 1));
    // The data still moved: the real all-reduce ran on both ranks.
    EXPECT_EQ(f.AllReduce(t, ReduceOp::kSum).code(), absl::StatusCode::kInternal);
    EXPECT_TRUE(at::equal(t, at::full({3}, 3.0f)));
    at::Tensor u = at::full({1}, static_cast<float>(rank));
    absl::Status s = f.AllReduce(u, ReduceOp::kMax);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(u.item<float>(), 1.0f);
    EXPECT_EQ(f.collective_count(), 2);
    return absl::OkStatus();
  });
  EXPECT_TRUE(FirstFailure(st).ok()) << FirstFailure(st);
}

// The harness itself: a rank that never joins a collective makes its peer's collective time
// out by itself (DEADLINE_EXCEEDED), and the gang returns instead of hanging.
TEST(ThreadGangTest, AHungPeerFailsTheGangWithinTheTimeout) {
  GangOptions o;
  o.collective_timeout = absl::Seconds(2);
  o.deadline = absl::Seconds(30);
  std::vector<absl::Status> st = RunGang(
      2,
      [](int rank, Collectives& world) {
        if (rank == 1) return absl::OkStatus();  // skips the collective
        at::Tensor t = at::ones({1});
        return world.AllReduce(t, ReduceOp::kSum);
      },
      o);
  ASSERT_EQ(st.size(), 2u);
  EXPECT_FALSE(st[0].ok());
  EXPECT_TRUE(st[1].ok());
  EXPECT_FALSE(FirstFailure(st).ok());
}

// The gang's own deadline is the backstop: a rank stuck outside any collective (here waiting on
// a signal that only comes after the gang returned) is reported DEADLINE_EXCEEDED at the
// deadline and detached; RunGang returns instead of hanging.
TEST(ThreadGangTest, ARankPastTheDeadlineIsReportedAndTheGangReturns) {
  GangOptions o;
  o.collective_timeout = absl::Seconds(5);
  o.deadline = absl::Seconds(2);
  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> released = release->get_future().share();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<absl::Status> st = RunGang(
      2,
      [released](int rank, Collectives&) {
        if (rank == 1) released.wait_for(std::chrono::seconds(60));
        return absl::OkStatus();
      },
      o);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  release->set_value();  // lets the detached rank finish
  ASSERT_EQ(st.size(), 2u);
  EXPECT_TRUE(st[0].ok()) << st[0];
  EXPECT_EQ(st[1].code(), absl::StatusCode::kDeadlineExceeded) << st[1];
  EXPECT_LT(waited, 30.0);
}

}  // namespace
}  // namespace loom::engine::testing
