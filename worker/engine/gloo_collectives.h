// The Gloo implementation of Collectives (collectives.h): the CPU path's process groups,
// built by a rendezvous over a c10d::TCPStore, with Loom's point-to-point all-gather and
// reduce-scatter and Gloo's own all-reduce, all-to-all, broadcast and barrier.
//
// Shapes, dtypes, ordering, errors and thread-safety are Collectives' (collectives.h). Sizes in
// elements, times in absl::Duration.
#ifndef LOOM_WORKER_ENGINE_GLOO_COLLECTIVES_H_
#define LOOM_WORKER_ENGINE_GLOO_COLLECTIVES_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/engine/collectives.h"

namespace loom::engine {

struct GlooOptions {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  // Rank 0 listens here (0: the OS chooses); other ranks connect to master_addr:master_port.
  int master_port = 0;
  // Address this rank's Gloo transport binds to and its peers dial (loom-trainer passes its
  // node's advertised address, common/net_address.h GlooBindAddress); "" : the machine's
  // hostname (Gloo's default device). No address is inferred from master_addr.
  std::string bind_address;
  absl::Duration timeout = absl::Seconds(300);
  // Rank 0 only: called with the bound TCPStore port once it listens, before waiting for peers.
  std::function<void(int port)> on_listening;
  // Test only: every get of this rank's rendezvous store waits this long first (a slow rank).
  absl::Duration test_store_get_delay = absl::ZeroDuration();
};

// Rendezvous through a c10d::TCPStore and build a c10d::ProcessGroupGloo (subgroups: a
// c10d::PrefixStore over that store and a new ProcessGroupGloo of the members). All-gather and
// reduce-scatter are point-to-point sends and receives between the caller's tensors; the
// reduce-scatter sums in rank order after the receives. Gloo's native _reduce_scatter_base and
// _allgather_base (LibTorch 2.x) copy through a full-size temporary and were 2-5x slower at the
// engine's bucket sizes (collectives_bench, docs/benchmarks.md).
// All-to-all is Gloo's alltoall_base with equal splits.
// Returns only once every rank has connected (a barrier ends the rendezvous, so a rank that fails
// and exits right after it cannot strand a slower peer inside Gloo's connect; same for subgroups).
// Errors: INVALID_ARGUMENT for bad ranks/ports, UNAVAILABLE / DEADLINE_EXCEEDED when peers do
// not arrive within the timeout.
absl::StatusOr<std::unique_ptr<Collectives>> CreateGlooCollectives(const GlooOptions& options);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_GLOO_COLLECTIVES_H_
