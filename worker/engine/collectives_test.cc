// GlooCollectives on real c10d process groups: one rank per thread, over loopback TCP.
#include "worker/engine/collectives.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/time.h"

namespace loom::engine {
namespace {

// Runs body(rank, collectives) on `world` ranks, one thread each; returns when all are done.
template <typename Body>
void RunGang(int world, Body body) {
  std::promise<int> port;
  std::shared_future<int> port_f = port.get_future().share();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions o;
      o.rank = r;
      o.world_size = world;
      o.timeout = absl::Seconds(60);
      if (r == 0) {
        o.on_listening = [&](int p) { port.set_value(p); };
      } else {
        o.master_port = port_f.get();
      }
      absl::StatusOr<std::unique_ptr<Collectives>> c = CreateGlooCollectives(o);
      ASSERT_TRUE(c.ok()) << c.status();
      body(r, **c);
    });
  }
  for (std::thread& t : threads) t.join();
}

// The value rank r contributes at flat index i of tensor k: exact in fp32, different per rank.
at::Tensor Contribution(int rank, int k, int64_t n) {
  return at::arange(n, at::kFloat) * 0.25f + static_cast<float>(100 * rank + 7 * k);
}

TEST(GlooCollectivesTest, AllGatherAndCoalescedReduceScatterOnThreeRanks) {
  const int world = 3;
  const std::vector<int64_t> p = {5, 1, 4096, 7};  // partition sizes of one bucket
  RunGang(world, [&](int rank, Collectives& c) {
    // All-gather: rank q's part lands at [q*p, (q+1)*p).
    at::Tensor part = at::full({6}, static_cast<float>(rank + 1));
    at::Tensor full = at::empty({world * 6}, at::kFloat);
    ASSERT_TRUE(c.AllGather(part, full).ok());
    for (int q = 0; q < world; ++q) {
      EXPECT_TRUE(at::equal(full.narrow(0, q * 6, 6), at::full({6}, q + 1.0f))) << rank;
    }
    // Coalesced reduce-scatter of four tensors of different sizes, started before the previous
    // one is waited for (two in flight, as overlap_comm does).
    std::vector<at::Tensor> fulls, parts, fulls2, parts2;
    for (size_t k = 0; k < p.size(); ++k) {
      fulls.push_back(Contribution(rank, static_cast<int>(k), world * p[k]));
      parts.push_back(at::empty({p[k]}, at::kFloat));
      fulls2.push_back(Contribution(rank, static_cast<int>(k) + 10, world * p[k]));
      parts2.push_back(at::empty({p[k]}, at::kFloat));
    }
    auto first = c.StartReduceScatterSumCoalesced(fulls, parts);
    auto second = c.StartReduceScatterSumCoalesced(fulls2, parts2);
    ASSERT_TRUE(first->Wait().ok());
    ASSERT_TRUE(second->Wait().ok());
    // A completed collective holds no reference to the caller's tensors, even before the handle
    // is destroyed: the engine hands them back to its buffer pool right away (regression: the
    // finishing sum kept views of them, so the pool never reused a reduce-scatter buffer).
    for (size_t k = 0; k < p.size(); ++k) {
      EXPECT_EQ(fulls[k].storage().use_count(), 1) << "rank " << rank << " tensor " << k;
      EXPECT_EQ(parts[k].storage().use_count(), 1) << "rank " << rank << " tensor " << k;
    }
    for (size_t k = 0; k < p.size(); ++k) {
      for (auto [kk, out] : {std::pair{static_cast<int>(k), parts[k]},
                             std::pair{static_cast<int>(k) + 10, parts2[k]}}) {
        at::Tensor want = Contribution(0, kk, world * p[k]).narrow(0, rank * p[k], p[k]).clone();
        for (int q = 1; q < world; ++q) {  // rank order, as the interface promises
          want.add_(Contribution(q, kk, world * p[k]).narrow(0, rank * p[k], p[k]));
        }
        EXPECT_TRUE(at::equal(out, want)) << "rank " << rank << " tensor " << kk;
      }
    }
    // Every rank issued the same sequence.
    EXPECT_EQ(c.collective_count(), 3);
  });
}

TEST(GlooCollectivesTest, TwoRanksReceiveIntoTheOutputAndSumExactly) {
  RunGang(2, [&](int rank, Collectives& c) {
    at::Tensor full = Contribution(rank, 0, 2 * 1000);
    at::Tensor part = at::empty({1000}, at::kFloat);
    ASSERT_TRUE(c.ReduceScatterSum(full, part).ok());
    at::Tensor want = Contribution(0, 0, 2000).narrow(0, rank * 1000, 1000) +
                      Contribution(1, 0, 2000).narrow(0, rank * 1000, 1000);
    EXPECT_TRUE(at::equal(part, want));
    // A malformed call is refused without a collective.
    at::Tensor bad = at::empty({999}, at::kFloat);
    EXPECT_EQ(c.ReduceScatterSum(full, bad).code(), absl::StatusCode::kInvalidArgument);
  });
}

}  // namespace
}  // namespace loom::engine
