// File: scheduler/fake_clock.h
//
// A manually advanced Clock for tests. Thread-safe.
#ifndef LOOM_SCHEDULER_FAKE_CLOCK_H_
#define LOOM_SCHEDULER_FAKE_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "scheduler/clock.h"

namespace loom {

class FakeClock final : public Clock {
 public:
  // Starts at `start` (default: 2024-01-01T00:00:00Z, any fixed instant would do).
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1704067200)) : now_(start) {}

  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  void Set(absl::Time t) {
    absl::MutexLock lock(&mu_);
    now_ = t;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom

#endif  // LOOM_SCHEDULER_FAKE_CLOCK_H_
