// File: scheduler/clock.h
//
// The scheduler's source of time. Production code uses RealClock(); tests inject a FakeClock
// (fake_clock.h) so that heartbeat timeouts and timestamps are deterministic.
#ifndef LOOM_SCHEDULER_CLOCK_H_
#define LOOM_SCHEDULER_CLOCK_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace loom {

// Abstract wall clock. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// The process-wide real clock (absl::Now()). Never null; never deleted. Thread-safe.
inline Clock* RealClock() {
  class Real final : public Clock {
   public:
    absl::Time Now() const override { return absl::Now(); }
  };
  static Real* const kClock = new Real();
  return kClock;
}

}  // namespace loom

#endif  // LOOM_SCHEDULER_CLOCK_H_
