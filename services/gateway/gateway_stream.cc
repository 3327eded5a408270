#include "services/gateway/gateway_stream.h"

#include <utility>

namespace loom::gateway::internal {

StreamPump::StreamPump(std::unique_ptr<grpc::ClientContext> ctx, Run run) : ctx_(std::move(ctx)) {
  thread_ = std::thread([this, run = std::move(run)] {
    // An exception leaving a std::thread ends the process: the stream ends instead.
    try {
      run(ctx_.get(), [this](std::string text) { return Push(std::move(text)); });
    } catch (...) {
    }
    absl::MutexLock lock(&mu_);
    ended_ = true;
  });
}

StreamPump::~StreamPump() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;  // wakes a Push waiting for room
  }
  ctx_->TryCancel();  // ends a Read() waiting for the next message
  if (thread_.joinable()) thread_.join();
}

bool StreamPump::Push(std::string text) {
  absl::MutexLock lock(&mu_);
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || queued_bytes_ < kMaxQueuedBytes;
  };
  mu_.Await(absl::Condition(&room));
  if (stopping_) return false;
  queued_bytes_ += text.size();
  queue_.push_back(std::move(text));
  return true;
}

std::string StreamPump::Next(absl::Duration timeout, bool* ended) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || ended_; };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  std::string out;
  while (!queue_.empty()) {
    out += queue_.front();
    queue_.pop_front();
  }
  queued_bytes_ = 0;
  *ended = ended_;
  return out;
}

httplib::ContentProviderWithoutLength FollowLogsProvider(std::shared_ptr<StreamPump> pump,
                                                         absl::Duration probe) {
  return [pump = std::move(pump), probe](size_t, httplib::DataSink& sink) {
    // httplib calls providers outside its exception handling: an exception here would end the
    // process, so it ends this response instead.
    try {
      bool ended = false;
      const std::string out = pump->Next(probe, &ended);
      if (!out.empty()) {
        if (!sink.write(out.data(), out.size())) return false;  // the client is gone
      } else if (!ended && !sink.is_writable()) {
        return false;  // quiet job, and the client closed its end: free the thread
      }
      if (ended) sink.done();
      return true;
    } catch (...) {
      return false;
    }
  };
}

}  // namespace loom::gateway::internal
