#include "worker/engine/zero/memory_tracker.h"

#include <algorithm>

namespace loom::engine {

void MemoryTracker::Acquire(MemoryKind kind, int64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  const int k = static_cast<int>(kind);
  cur_[k] += bytes;
  peak_[k] = std::max(peak_[k], cur_[k]);
  total_ += bytes;
  peak_total_ = std::max(peak_total_, total_);
}

void MemoryTracker::Release(MemoryKind kind, int64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  cur_[static_cast<int>(kind)] -= bytes;
  total_ -= bytes;
}

int64_t MemoryTracker::current(MemoryKind kind) const {
  std::lock_guard<std::mutex> l(mu_);
  return cur_[static_cast<int>(kind)];
}

int64_t MemoryTracker::peak(MemoryKind kind) const {
  std::lock_guard<std::mutex> l(mu_);
  return peak_[static_cast<int>(kind)];
}

int64_t MemoryTracker::current_total() const {
  std::lock_guard<std::mutex> l(mu_);
  return total_;
}

int64_t MemoryTracker::peak_total() const {
  std::lock_guard<std::mutex> l(mu_);
  return peak_total_;
}

void MemoryTracker::ResetPeaks() {
  std::lock_guard<std::mutex> l(mu_);
  for (int k = 0; k < kNumMemoryKinds; ++k) peak_[k] = cur_[k];
  peak_total_ = total_;
}

}  // namespace loom::engine
