// RefreshParams for stages 1/2 (zero_refresh.cc): each rank's updated master partition reaches
// every rank's full replica. Two ranks as threads over real Gloo; fp32 params (direct gathers
// into the replicas, left in flight and waited by Acquire, here in reverse order) and bf16
// params (cast send buffers, waited in RefreshParams); an even parameter (n == N*p) and an odd,
// padded one. Each rank writes known values into its own partition; the reference is the
// formula of those values written out in the test. Also: a micro-step that uses no parameter
// waits for the gathers (FinishMicroStep), so the masters can be written afterwards without
// reaching the replicas.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/engine/collectives.h"
#include "worker/engine/partition.h"
#include "worker/engine/testing/thread_gang.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {
namespace {

using testing::FirstFailure;
using testing::RunGang;
using spec::LlamaConfig;
using spec::LlamaParamSpecs;
using spec::ParamSpec;

// Element j of parameter i after the update: small multiples of 1/4, exact in bf16.
float Updated(size_t i, int64_t j) { return 0.25f * static_cast<float>(j + 1) + 8.0f * i; }

const std::vector<ParamSpec> kSpecs = {{"a", {4, 6}, ParamSpec::Kind::kLinear},
                                       {"b", {5}, ParamSpec::Kind::kNorm},  // padded on 2 ranks
                                       {"c", {3, 4}, ParamSpec::Kind::kLinear}};

// Writes each rank's partition of every master: Updated(i, j), or `garbage` when non-zero.
void WriteMasters(ZeroProvider& z, int world, int rank, float garbage) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < z.params().size(); ++i) {
    ZeroParam& p = z.params()[i];
    const PartitionSlice s = ComputePartition(p.numel, world, rank);
    for (int64_t k = 0; k < s.valid(); ++k) {
      p.master[k] = garbage != 0 ? garbage : Updated(i, s.begin + k);
    }
  }
}

void ExpectReplicasUpdated(ZeroProvider& z, const std::string& what) {
  for (size_t q = z.params().size(); q-- > 0;) {  // reverse: waits out of start order
    const at::Tensor full = z.Acquire(q).to(at::kFloat).reshape({-1});
    for (int64_t j = 0; j < full.numel(); ++j) {
      EXPECT_EQ(full[j].item<float>(), Updated(q, j)) << what << " param " << q << " elem " << j;
    }
    z.Release(q);
  }
}

void RunStage(int stage, at::ScalarType dtype) {
  const std::string what = absl::StrCat("stage ", stage, " ", c10::toString(dtype));
  std::vector<absl::Status> st = RunGang(2, [&](int rank, Collectives& world) -> absl::Status {
    ZeroOptions o;
    o.stage = stage;
    o.param_dtype = dtype;
    o.allgather_bucket_size = 10;  // several synchronous buckets for the bf16 gathers
    absl::StatusOr<std::unique_ptr<ZeroProvider>> z =
        ZeroProvider::Create(kSpecs, &world, {3, 0.02}, o);
    if (!z.ok()) return z.status();
    WriteMasters(**z, 2, rank, 0);
    (*z)->RefreshParams();
    ExpectReplicasUpdated(**z, what + " rank " + std::to_string(rank));
    // Again, then a micro-step without any use of a parameter: its end waits for the gathers,
    // so writing the masters afterwards leaves the replicas as gathered.
    WriteMasters(**z, 2, rank, 0);
    (*z)->RefreshParams();
    (*z)->BeginMicroStep(/*last=*/true);
    (*z)->FinishMicroStep();
    WriteMasters(**z, 2, rank, -1000.0f);
    ExpectReplicasUpdated(**z, what + " after FinishMicroStep, rank " + std::to_string(rank));
    return absl::OkStatus();
  });
  EXPECT_TRUE(FirstFailure(st).ok()) << what << ": " << FirstFailure(st);
}

TEST(ZeroRefreshTest, EveryRanksPartitionReachesEveryReplica) {
  for (int stage : {1, 2}) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) RunStage(stage, dtype);
  }
}

// One rank (local collectives), stages 1/2: with params_view_masters an fp32 replica is a view
// of its master (a master write reaches forward at once, RefreshParams copies nothing); without
// it, or with bf16 params, the replica is a copy that only RefreshParams updates.
TEST(ZeroRefreshOneRankTest, Fp32ReplicaViewsTheMasterOnlyWhenAsked) {
  for (int stage : {1, 2}) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      for (bool view : {false, true}) {
        const std::string what = absl::StrCat("stage ", stage, " ", c10::toString(dtype),
                                              " params_view_masters ", view);
        std::unique_ptr<Collectives> coll = CreateLocalCollectives();
        ZeroOptions o;
        o.stage = stage;
        o.param_dtype = dtype;
        o.params_view_masters = view;
        std::unique_ptr<ZeroProvider> z = *ZeroProvider::Create(kSpecs, coll.get(), {3, 0.02}, o);
        const bool aliased = view && dtype == at::kFloat;
        auto write = [&](bool garbage) { WriteMasters(*z, 1, 0, garbage ? -1000.0f : 0.0f); };
        for (const ZeroParam& p : z->params()) {
          EXPECT_EQ(p.replica.is_alias_of(p.master), aliased) << what << " " << p.spec.name;
        }
        write(false);
        z->RefreshParams();
        ExpectReplicasUpdated(*z, what);
        write(true);  // not refreshed: a view shows it, a copy keeps the refreshed values
        for (size_t q = 0; q < z->params().size(); ++q) {
          const at::Tensor full = z->Acquire(q).to(at::kFloat).reshape({-1});
          for (int64_t j = 0; j < full.numel(); ++j) {
            EXPECT_EQ(full[j].item<float>(), aliased ? -1000.0f : Updated(q, j))
                << what << " param " << q << " elem " << j;
          }
          z->Release(q);
        }
        // The master is not counted twice when the replica is its view.
        int64_t master_bytes = 0, replica_bytes = 0;
        for (const ZeroParam& p : z->params()) {
          master_bytes += p.master.nbytes();
          replica_bytes += p.replica.nbytes();
        }
        EXPECT_EQ(z->memory().current(MemoryKind::kParams), replica_bytes) << what;
        EXPECT_EQ(z->memory().current(MemoryKind::kOptimizerStates),
                  2 * master_bytes + (aliased ? 0 : master_bytes))
            << what;
      }
    }
  }
}

// One rank, stage 3: with params_view_masters an fp32 Acquire returns a view of the shard (the
// master) and gathers nothing: a master write is seen at once, no gather buffer is counted, and
// persistent parameters hold no second copy; without it, or with bf16 params, Acquire returns a
// gathered copy that keeps the values it was gathered with. Both inside a traced micro-step
// (record, then replay with prefetches) and outside one.
TEST(ZeroRefreshOneRankTest, Stage3Fp32AcquireViewsTheShardOnlyWhenAsked) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (bool view : {false, true}) {
      for (int64_t persistence : {int64_t{0}, int64_t{100}}) {
        const std::string what = absl::StrCat(c10::toString(dtype), " params_view_masters ", view,
                                              " persistence ", persistence);
        std::unique_ptr<Collectives> coll = CreateLocalCollectives();
        ZeroOptions o;
        o.stage = 3;
        o.param_dtype = dtype;
        o.params_view_masters = view;
        o.param_persistence_threshold = persistence;
        std::unique_ptr<ZeroProvider> z = *ZeroProvider::Create(kSpecs, coll.get(), {3, 0.02}, o);
        const bool aliased = view && dtype == at::kFloat;
        const int64_t params_at_rest = z->memory().current(MemoryKind::kParams);
        auto write = [&](float garbage) { WriteMasters(*z, 1, 0, garbage); };
        write(0);
        z->RefreshParams();  // bf16: casts the masters into the shards
        for (int micro = 0; micro < 3; ++micro) {  // untraced, record, replay
          const bool traced = micro > 0;
          if (traced) z->BeginMicroStep(/*last=*/true);
          for (size_t q = 0; q < z->params().size(); ++q) {
            const ZeroParam& p = z->params()[q];
            const at::Tensor full = z->Acquire(q);
            EXPECT_EQ(full.is_alias_of(p.master), aliased) << what << " micro " << micro;
            EXPECT_EQ(full.sizes(), at::IntArrayRef(p.spec.shape)) << what;
            if (aliased) {
              EXPECT_EQ(z->memory().current(MemoryKind::kBuffers), 0) << what << " param " << q;
              EXPECT_EQ(z->memory().current(MemoryKind::kParams), params_at_rest) << what;
            } else if (!p.persistent) {
              EXPECT_GE(z->memory().current(MemoryKind::kBuffers), full.nbytes()) << what;
            }
            const at::Tensor before = full.to(at::kFloat).reshape({-1}).clone();
            write(-1000.0f);  // a view shows it, a gathered copy keeps what it gathered
            const at::Tensor after = full.to(at::kFloat).reshape({-1});
            for (int64_t j = 0; j < full.numel(); ++j) {
              EXPECT_EQ(before[j].item<float>(), Updated(q, j)) << what << " param " << q;
              EXPECT_EQ(after[j].item<float>(), aliased ? -1000.0f : Updated(q, j))
                  << what << " param " << q << " elem " << j;
            }
            write(0);
            z->Release(q);
          }
          if (traced) z->FinishMicroStep();
          z->RefreshParams();  // drops the persistent gathers (stale after a step)
        }
        EXPECT_EQ(z->memory().current(MemoryKind::kParams), params_at_rest) << what;
      }
    }
  }
}

}  // namespace
}  // namespace loom::engine
