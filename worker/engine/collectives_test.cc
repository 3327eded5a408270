// GlooCollectives on real c10d process groups: one rank per thread, over loopback TCP (the
// in-process harness of worker/engine/testing/thread_gang.h): gathers and reduce-scatters,
// all-to-all, subgroups (c10d new_group semantics) and bf16 on the wire, each against values
// computed by hand from rank-tagged inputs.
#include "worker/engine/collectives.h"
#include "worker/engine/gloo_collectives.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "worker/engine/testing/thread_gang.h"

namespace loom::engine {
namespace {

using testing::FirstFailure;

// Runs body(rank, world group) on `world` ranks, one thread each, over real Gloo (the
// in-process harness); fails the test when a rank fails or misses the gang's deadline.
template <typename Body>
void RunGang(int world, Body body) {
  std::vector<absl::Status> st = testing::RunGang(world, [&](int rank, Collectives& c) {
    body(rank, c);
    return absl::OkStatus();
  });
  EXPECT_TRUE(FirstFailure(st).ok()) << FirstFailure(st);
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

// What rank `src` puts in chunk `dst` of its all-to-all input: a tag that names both, so the
// receiver can check it got chunk `me` of rank j at [j*c, (j+1)*c).
float Tag(int src, int dst, int64_t i) { return 1000.0f * src + 10.0f * dst + 0.5f * i; }

at::Tensor AllToAllInput(int rank, int world, int64_t c, at::ScalarType dtype) {
  at::Tensor in = at::empty({world * c}, at::kFloat);
  for (int j = 0; j < world; ++j) {
    for (int64_t i = 0; i < c; ++i) in[j * c + i] = Tag(rank, j, i);
  }
  return in.to(dtype);
}

// The reference: output chunk j holds what rank j sent to `rank`.
at::Tensor AllToAllExpected(int rank, int world, int64_t c, at::ScalarType dtype) {
  at::Tensor want = at::empty({world * c}, at::kFloat);
  for (int j = 0; j < world; ++j) {
    for (int64_t i = 0; i < c; ++i) want[j * c + i] = Tag(j, rank, i);
  }
  return want.to(dtype);
}

class AllToAllTest : public ::testing::TestWithParam<int> {};

TEST_P(AllToAllTest, ChunkJGoesToRankJInFp32AndBf16) {
  const int world = GetParam();
  const int64_t c = 6;  // the tags are exact in bf16 up to 8 significant bits: keep them small
  RunGang(world, [&](int rank, Collectives& coll) {
    for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
      at::Tensor in = AllToAllInput(rank, world, c, dt);
      at::Tensor out = at::empty({world * c}, dt);
      ASSERT_TRUE(coll.AllToAll(in, out).ok()) << dt;
      EXPECT_TRUE(at::equal(out, AllToAllExpected(rank, world, c, dt))) << "rank " << rank << dt;
    }
    // Recorded like the others: count 2, N*c elements each.
    EXPECT_EQ(coll.collective_count(), 2);
    EXPECT_EQ(coll.elements_moved(), 2 * world * c);
    at::Tensor bad_in = at::empty({world * c + 1}, at::kFloat);
    at::Tensor bad_out = at::empty({world * c + 1}, at::kFloat);
    EXPECT_EQ(coll.AllToAll(bad_in, bad_out).code(), absl::StatusCode::kInvalidArgument);
    at::Tensor same = at::empty({world * c}, at::kFloat);
    EXPECT_EQ(coll.AllToAll(same, same).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(coll.collective_count(), 2) << "refused calls are not collectives";
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, AllToAllTest, ::testing::Values(2, 3));

TEST(SubgroupTest, MembersGetTheirOwnRankCountAndHashNonMembersGetNull) {
  const int world = 3;
  std::vector<uint64_t> sub_hash(world), world_hash(world);
  RunGang(world, [&](int rank, Collectives& c) {
    // {0, 2}: rank 0 is subgroup rank 0, rank 2 is subgroup rank 1; rank 1 is not a member.
    absl::StatusOr<std::unique_ptr<Collectives>> sub = c.NewSubgroup({0, 2}, "pair");
    ASSERT_TRUE(sub.ok()) << sub.status();
    EXPECT_EQ(c.collective_count(), 1) << "creation is recorded on every rank of the parent";
    if (rank == 1) {
      EXPECT_EQ(*sub, nullptr);
    } else {
      ASSERT_NE(*sub, nullptr);
      Collectives& s = **sub;
      EXPECT_EQ(s.world_size(), 2);
      EXPECT_EQ(s.rank(), rank / 2);
      // Sum of world ranks over the members only: 0 + 2.
      at::Tensor t = at::full({4}, static_cast<float>(rank));
      ASSERT_TRUE(s.AllReduce(t, ReduceOp::kSum).ok());
      EXPECT_TRUE(at::equal(t, at::full({4}, 2.0f)));
      // All-to-all on the subgroup: chunk j goes to subgroup rank j.
      at::Tensor in = AllToAllInput(s.rank(), 2, 3, at::kFloat);
      at::Tensor out = at::empty({6}, at::kFloat);
      ASSERT_TRUE(s.AllToAll(in, out).ok());
      EXPECT_TRUE(at::equal(out, AllToAllExpected(s.rank(), 2, 3, at::kFloat)));
      EXPECT_EQ(s.collective_count(), 2);
      sub_hash[rank] = s.collective_hash();
    }
    // The parent is unaffected by the subgroup's traffic and still works.
    at::Tensor t = at::full({2}, static_cast<float>(rank + 1));
    ASSERT_TRUE(c.AllReduce(t, ReduceOp::kSum).ok());
    EXPECT_TRUE(at::equal(t, at::full({2}, 6.0f)));
    EXPECT_EQ(c.collective_count(), 2);
    world_hash[rank] = c.collective_hash();
    // A second subgroup with the same name and members is a new group (own prefix).
    absl::StatusOr<std::unique_ptr<Collectives>> again = c.NewSubgroup({0, 2}, "pair");
    ASSERT_TRUE(again.ok()) << again.status();
    if (rank != 1) {
      at::Tensor u = at::full({1}, 1.0f);
      ASSERT_TRUE((*again)->AllReduce(u, ReduceOp::kSum).ok());
      EXPECT_EQ(u.item<float>(), 2.0f);
    }
    // Bad ranks or names are refused on every rank without a collective.
    EXPECT_EQ(c.NewSubgroup({2, 0}, "x").status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.NewSubgroup({0, 3}, "x").status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.NewSubgroup({}, "x").status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.NewSubgroup({0}, "a/b").status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.collective_count(), 3);
  });
  EXPECT_EQ(sub_hash[0], sub_hash[2]);
  EXPECT_EQ(world_hash[0], world_hash[1]);
  EXPECT_EQ(world_hash[1], world_hash[2]);
}

TEST(SubgroupTest, DisjointSubgroupsRunConcurrentlyAndOneRankGroupsAreLocal) {
  const int world = 3;
  RunGang(world, [&](int rank, Collectives& c) {
    // Every rank calls both, in the same order; each rank is in exactly one.
    auto a = c.NewSubgroup({0, 1}, "a");
    auto b = c.NewSubgroup({2}, "b");
    ASSERT_TRUE(a.ok() && b.ok());
    Collectives* mine = rank < 2 ? a->get() : b->get();
    ASSERT_NE(mine, nullptr);
    EXPECT_EQ((rank < 2 ? b->get() : a->get()), nullptr);
    EXPECT_EQ(mine->world_size(), rank < 2 ? 2 : 1);
    at::Tensor part = at::full({3}, static_cast<float>(10 * rank));
    at::Tensor full = at::empty({3 * mine->world_size()}, at::kFloat);
    ASSERT_TRUE(mine->AllGather(part, full).ok());
    if (rank < 2) {
      EXPECT_TRUE(at::equal(full, at::cat({at::full({3}, 0.0f), at::full({3}, 10.0f)})));
    } else {
      EXPECT_TRUE(at::equal(full, part));
    }
  });
}

// bf16 on the wire inside Gloo: values are moved bit-exactly (gathers, broadcast) and summed
// in fp32 in rank order with one rounding (reduce-scatter); AllReduce reduces an fp32 copy.
TEST(Bf16WireTest, GathersBroadcastAndReductionsOfBf16) {
  const int world = 3;
  RunGang(world, [&](int rank, Collectives& c) {
    // 1 + 2^-7 style values: every bf16 bit pattern must arrive unchanged.
    at::Tensor part = (at::arange(8, at::kFloat) * 0.0078125f + 1.0f + rank).to(at::kBFloat16);
    at::Tensor full = at::empty({world * 8}, at::kBFloat16);
    ASSERT_TRUE(c.AllGather(part, full).ok());
    for (int q = 0; q < world; ++q) {
      at::Tensor want = (at::arange(8, at::kFloat) * 0.0078125f + 1.0f + q).to(at::kBFloat16);
      EXPECT_TRUE(at::equal(full.narrow(0, q * 8, 8), want)) << q;
    }
    // Already fp16-viewed bf16 (zero_llama.cc's Wire()) still works.
    at::Tensor full2 = at::empty({world * 8}, at::kBFloat16);
    at::Tensor full2_wire = full2.view(at::kHalf);
    ASSERT_TRUE(c.AllGather(part.view(at::kHalf), full2_wire).ok());
    EXPECT_TRUE(at::equal(full2, full));

    at::Tensor b = rank == 1 ? part.clone() : at::zeros({8}, at::kBFloat16);
    ASSERT_TRUE(c.Broadcast(b, /*root=*/1).ok());
    EXPECT_TRUE(at::equal(b, (at::arange(8, at::kFloat) * 0.0078125f + 2.0f).to(at::kBFloat16)));

    // Reduce-scatter: rank 0 contributes 1, ranks 1 and 2 contribute 2^-8 (all exact in bf16).
    // Summed in bf16 arithmetic, 1 + 2^-8 ties to even (1) twice: 1. The fp32 sum in rank order
    // is 1 + 2^-7, exact in bf16: that is the rule.
    const float v = rank == 0 ? 1.0f : 1.0f / 256.0f;
    at::Tensor rs_full = at::full({world * 4}, v).to(at::kBFloat16);
    at::Tensor rs_part = at::empty({4}, at::kBFloat16);
    ASSERT_TRUE(c.ReduceScatterSum(rs_full, rs_part).ok());
    const at::Tensor want = at::full({4}, 1.0f + 1.0f / 128.0f).to(at::kBFloat16);
    EXPECT_TRUE(at::equal(rs_part, want))
        << rs_part.to(at::kFloat) << " vs " << want.to(at::kFloat);

    at::Tensor ar = at::full({5}, v).to(at::kBFloat16);
    ASSERT_TRUE(c.AllReduce(ar, ReduceOp::kSum).ok());
    EXPECT_TRUE(at::equal(ar, at::full({5}, 1.0f + 1.0f / 128.0f).to(at::kBFloat16)));
    EXPECT_EQ(ar.scalar_type(), at::kBFloat16);
  });
}

// Regression (CI of d70984a: a rank of a gang that refused its checkpoint was killed after 120 s
// without an error). A rank that fails right after the rendezvous and exits must not strand a
// slower peer still connecting: rank 0 here drops its group (and with it the TCPStore server),
// as a process exiting does, the moment CreateGlooCollectives returns, while rank 2 reads the
// store slowly. Every rank must still get its group: the rendezvous ends in a barrier, so
// rank 0 returns only after rank 2 has connected. Without it rank 2 lost the store ("Broken
// pipe") and rank 1 waited in Gloo's connect for 5x the timeout. Own threads, not
// testing::RunGang: that harness keeps every group (and rank 0's store) until all ranks are done.
TEST(GlooCollectivesTest, NoRankLeavesTheRendezvousBeforeASlowPeerHasConnected) {
  const int world = 3;
  std::promise<int> port;
  std::shared_future<int> shared = port.get_future().share();
  std::vector<absl::Status> status(world);
  std::vector<std::unique_ptr<Collectives>> groups(world);
  auto rank_main = [&](int rank, std::shared_future<int> master_port) {
    GlooOptions o;
    o.bind_address = "127.0.0.1";
    o.rank = rank;
    o.world_size = world;
    o.timeout = absl::Seconds(10);
    bool listening = false;
    if (rank == 0) {
      o.on_listening = [&](int p) {
        listening = true;
        port.set_value(p);
      };
    } else {
      o.master_port = master_port.get();
      if (o.master_port <= 0) {  // rank 0 failed before it listened: no rendezvous to join
        status[rank] = absl::UnavailableError("rank 0 never listened");
        return;
      }
    }
    if (rank == 2) o.test_store_get_delay = absl::Milliseconds(300);
    absl::StatusOr<std::unique_ptr<Collectives>> c = CreateGlooCollectives(o);
    if (rank == 0 && !listening) port.set_value(-1);  // release the others instead of hanging
    status[rank] = c.status();
    if (c.ok() && rank != 0) groups[rank] = std::move(*c);  // rank 0: gone at once
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(rank_main, r, shared);
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
}

TEST(LocalCollectivesTest, AllToAllIsACopyAndTheOnlySubgroupIsRankZero) {
  std::unique_ptr<Collectives> c = CreateLocalCollectives();
  at::Tensor in = at::arange(5, at::kFloat).to(at::kBFloat16);
  at::Tensor out = at::empty({5}, at::kBFloat16);
  ASSERT_TRUE(c->AllToAll(in, out).ok());
  EXPECT_TRUE(at::equal(in, out));
  absl::StatusOr<std::unique_ptr<Collectives>> sub = c->NewSubgroup({0}, "self");
  ASSERT_TRUE(sub.ok());
  ASSERT_NE(*sub, nullptr);
  EXPECT_EQ((*sub)->world_size(), 1);
  EXPECT_EQ((*sub)->collective_count(), 0);
  EXPECT_EQ(c->collective_count(), 2);
  EXPECT_EQ(c->NewSubgroup({1}, "x").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::engine
