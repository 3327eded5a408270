#include "services/scheduler/stream_limits.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace loom {

StreamSlot::StreamSlot(StreamSlot&& other) noexcept
    : limiter_(std::exchange(other.limiter_, nullptr)), tenant_(std::move(other.tenant_)) {}

StreamSlot& StreamSlot::operator=(StreamSlot&& other) noexcept {
  if (this != &other) {
    Release();
    limiter_ = std::exchange(other.limiter_, nullptr);
    tenant_ = std::move(other.tenant_);
  }
  return *this;
}

void StreamSlot::Release() {
  if (limiter_ == nullptr) return;
  std::exchange(limiter_, nullptr)->Release(tenant_);
}

absl::StatusOr<StreamSlot> StreamLimiter::Acquire(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  auto it = by_tenant_.find(tenant);
  const int mine = it == by_tenant_.end() ? 0 : it->second;
  if (limits_.max_streams_per_tenant > 0 && mine >= limits_.max_streams_per_tenant) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant ", tenant, " has ", mine, " open WatchJob/StreamLogs streams, the limit ",
        "(--max_streams_per_tenant) is ", limits_.max_streams_per_tenant,
        ": close one before opening another"));
  }
  if (limits_.max_streams > 0 && total_ >= limits_.max_streams) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the scheduler has ", total_, " open WatchJob/StreamLogs streams (tenant ", tenant,
        " has ", mine, "), the limit (--max_streams) is ", limits_.max_streams,
        ": retry later"));
  }
  ++by_tenant_[tenant];
  ++total_;
  return StreamSlot(this, tenant);
}

void StreamLimiter::Release(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  auto it = by_tenant_.find(tenant);
  if (it == by_tenant_.end()) return;
  if (--it->second <= 0) by_tenant_.erase(it);
  --total_;
}

int StreamLimiter::Streams(const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = by_tenant_.find(tenant);
  return it == by_tenant_.end() ? 0 : it->second;
}

int StreamLimiter::TotalStreams() const {
  absl::MutexLock lock(&mu_);
  return total_;
}

bool StreamLimiter::AwaitStreamsAtMost(const std::string& tenant, int count,
                                       absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto at_most = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = by_tenant_.find(tenant);
    return (it == by_tenant_.end() ? 0 : it->second) <= count;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&at_most), timeout);
}

}  // namespace loom
