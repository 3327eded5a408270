// The streaming responses of loom-gateway (GET /v1/jobs/{id}:watch and
// GET /v1/jobs/{id}/logs?follow=true): a server-streaming gRPC call runs on a thread of its own,
// so that httplib's content provider, on the request's pool thread, never blocks in the call's
// Read() and can notice a client that went away while the job is quiet (a keep-alive write for
// :watch, a socket probe for followed logs). Internal to services/gateway.
//
// Why a thread per stream: httplib 0.11 serves each request on one thread of a fixed pool, and
// a provider that blocks in Read() on a quiet job holds that thread until the job speaks, even
// after the client left; a few such requests exhaust the pool and the whole gateway stops
// answering (breakit_s41 H3).
#ifndef LOOM_SERVICES_GATEWAY_GATEWAY_STREAM_H_
#define LOOM_SERVICES_GATEWAY_GATEWAY_STREAM_H_

#include <grpcpp/client_context.h>
#include <httplib.h>

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace loom::gateway::internal {

// One streaming call and the response text it produced, from its reader thread to the content
// provider. Thread-safe. Destroying it (the provider's releaser, once the response ended for any
// reason) cancels the call and joins the thread.
class StreamPump {
 public:
  // Queues one piece of response text; blocks while more than kMaxQueuedBytes wait for the
  // client (a slow client slows the call instead of growing the gateway's memory); false once
  // the pump is being destroyed (stop reading).
  using Emit = std::function<bool(std::string text)>;
  // Runs on the pump's thread: starts the call on `ctx`, reads it to its end, emits the text of
  // each message and of a final error. An exception it throws ends the stream.
  using Run = std::function<void(grpc::ClientContext* ctx, const Emit& emit)>;

  static constexpr size_t kMaxQueuedBytes = 1 << 20;

  StreamPump(std::unique_ptr<grpc::ClientContext> ctx, Run run);
  ~StreamPump();
  StreamPump(const StreamPump&) = delete;
  StreamPump& operator=(const StreamPump&) = delete;

  // Waits up to `timeout` for queued text and returns all of it ("" on a timeout); sets *ended
  // once the call has ended and everything it emitted was returned.
  std::string Next(absl::Duration timeout, bool* ended);

 private:
  bool Push(std::string text);

  std::unique_ptr<grpc::ClientContext> ctx_;
  absl::Mutex mu_;
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// The content provider of a followed log stream (application/x-ndjson). It waits up to `probe`
// for lines; when none came it probes the connection (httplib's DataSink::is_writable, which
// peeks at the socket: a client that closed its end reads as end-of-file) and ends the response
// when the client has gone, so that the releaser cancels the StreamLogs call and the pool thread
// is free again within about `probe`.
//
// Why a probe and not a keep-alive line as :watch sends: the documented body is one LogLine per
// line, and an empty line is not valid NDJSON for every reader (the NDJSON spec lets parsers
// skip empty lines, it does not make them). A probe writes nothing. What it cannot see is a
// client whose host vanished without closing the connection (noticed only when a write to it
// fails, as before); and a client that half-closes its sending side (shutdown(SHUT_WR)) while
// still reading looks gone to it, which HTTP clients that stream (curl, browsers, Python's)
// do not do.
httplib::ContentProviderWithoutLength FollowLogsProvider(std::shared_ptr<StreamPump> pump,
                                                         absl::Duration probe);

}  // namespace loom::gateway::internal

#endif  // LOOM_SERVICES_GATEWAY_GATEWAY_STREAM_H_
