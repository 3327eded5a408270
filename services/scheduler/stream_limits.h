// File: services/scheduler/stream_limits.h
//
// Caps on the scheduler's open server streams (JobService.WatchJob and StreamLogs), per tenant
// and in all. Each open stream holds gRPC call state, a reactor and a subscription (about 30 KB)
// and takes a share of every fan-out of its job's events, so without a cap one tenant could grow
// the scheduler's memory and CPU without bound by opening streams (as Kubernetes' apiserver
// bounds in-flight watches with --max-requests-inflight and Slurm bounds per-user jobs).
//
// A stream takes a StreamSlot before its reactor is created and gives it back when gRPC is done
// with the call (the reactor's OnDone: a finished, failed or client-cancelled stream). Over a
// cap Acquire answers RESOURCE_EXHAUSTED naming the limit and the counts; the stream is refused
// at once, before anything is subscribed.
//
// Thread-safe.
#ifndef LOOM_SERVICES_SCHEDULER_STREAM_LIMITS_H_
#define LOOM_SERVICES_SCHEDULER_STREAM_LIMITS_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace loom {

struct StreamLimits {
  // Open streams of one tenant (loom-scheduler --max_streams_per_tenant); 0 = no limit.
  int max_streams_per_tenant = 256;
  // Open streams of every tenant together (--max_streams); 0 = no limit.
  int max_streams = 4096;
};

class StreamLimiter;

// One open stream's place under the caps; gives it back when destroyed. Move-only. An empty
// slot (default-constructed, or moved from) holds nothing.
class StreamSlot {
 public:
  StreamSlot() = default;
  StreamSlot(StreamSlot&& other) noexcept;
  StreamSlot& operator=(StreamSlot&& other) noexcept;
  StreamSlot(const StreamSlot&) = delete;
  StreamSlot& operator=(const StreamSlot&) = delete;
  ~StreamSlot() { Release(); }

  void Release();

 private:
  friend class StreamLimiter;
  StreamSlot(StreamLimiter* limiter, std::string tenant)
      : limiter_(limiter), tenant_(std::move(tenant)) {}
  StreamLimiter* limiter_ = nullptr;
  std::string tenant_;
};

class StreamLimiter {
 public:
  explicit StreamLimiter(StreamLimits limits) : limits_(limits) {}

  // A slot for one more stream of `tenant`; RESOURCE_EXHAUSTED naming the limit and the count if
  // the tenant's or the server's cap is reached. The limiter must outlive the slot.
  absl::StatusOr<StreamSlot> Acquire(const std::string& tenant);

  int Streams(const std::string& tenant) const;
  int TotalStreams() const;
  // Tests: waits up to `timeout` until `tenant` has at most `count` open streams (a client's
  // cancel reaches the server asynchronously); true if it did.
  bool AwaitStreamsAtMost(const std::string& tenant, int count, absl::Duration timeout) const;

  const StreamLimits& limits() const { return limits_; }

 private:
  friend class StreamSlot;
  void Release(const std::string& tenant);

  const StreamLimits limits_;
  mutable absl::Mutex mu_;
  std::map<std::string, int> by_tenant_ ABSL_GUARDED_BY(mu_);  // no zero entries
  int total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_STREAM_LIMITS_H_
