// An in-process multi-rank harness: `world_size` ranks as threads, each with its own real
// c10d::ProcessGroupGloo over loopback TCP (a TCPStore that rank 0 serves on 127.0.0.1, port
// chosen by the OS), so model-level tests run real collectives without spawning loom-trainer.
// LibTorch's Gloo supports several process groups in one process: each rank thread owns its
// store client, its group and its groups' worker threads.
//
// body(rank, world) runs on rank `rank`'s thread with that rank's world group; it must issue
// the same collective sequence on every rank (as in a real job). Returns one status per rank:
// the body's own, the rendezvous error, INTERNAL for an exception that escaped the body, or
// DEADLINE_EXCEEDED for a rank that had not finished when `deadline` passed (that thread is
// detached and ends when its collective times out after `collective_timeout`; keep the
// timeout below the deadline so a hung collective fails by itself first). A hung rank therefore
// fails the test and never hangs it. Each rank's group is destroyed only after every rank's
// body returned (or the deadline passed), so a rank that finishes early cannot take the store
// away from the others.
// Thread-safety: RunGang itself may be called from any one thread at a time; the bodies run
// concurrently, one Collectives object per thread (gtest EXPECT_* are thread-safe there).
#ifndef LOOM_WORKER_ENGINE_TESTING_THREAD_GANG_H_
#define LOOM_WORKER_ENGINE_TESTING_THREAD_GANG_H_

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/engine/collectives.h"

namespace loom::engine::testing {

struct GangOptions {
  // Gloo's timeout for rendezvous and every collective of the gang's groups.
  absl::Duration collective_timeout = absl::Seconds(30);
  // Wall-clock limit of the whole gang, from the start of RunGang.
  absl::Duration deadline = absl::Seconds(90);
};

std::vector<absl::Status> RunGang(int world_size,
                                  const std::function<absl::Status(int rank, Collectives&)>& body,
                                  const GangOptions& options = {});

// OK when every rank's status is OK, else the first failure prefixed by its rank.
absl::Status FirstFailure(const std::vector<absl::Status>& statuses);

}  // namespace loom::engine::testing

#endif  // LOOM_WORKER_ENGINE_TESTING_THREAD_GANG_H_
