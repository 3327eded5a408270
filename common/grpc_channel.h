// File: common/grpc_channel.h
//
// Client channels of Loom's long-lived daemons (loom-worker -> loom-scheduler, loom-gateway ->
// loom-scheduler). gRPC's default reconnect backoff starts at 1 s and grows by 1.6x up to 120 s,
// so a daemon whose scheduler was down for ten seconds could wait another ten before it even
// tried to connect again (issue 18: workers took ~20 s to come back after a scheduler restart and
// were declared lost). These channels cap the backoff instead (docs/operations.md "Restarting a
// daemon").
#ifndef LOOM_COMMON_GRPC_CHANNEL_H_
#define LOOM_COMMON_GRPC_CHANNEL_H_

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace loom {

// The default --reconnect_backoff_max of loom-worker and loom-gateway.
inline constexpr absl::Duration kDefaultReconnectBackoffMax = absl::Seconds(1);

// OK if `max_backoff` is in [10 ms, 1 h]; else INVALID_ARGUMENT naming `flag`.
absl::Status ValidateReconnectBackoff(const std::string& flag, absl::Duration max_backoff);

// Channel arguments with the reconnect backoff bounded by `max_backoff` (millisecond resolution):
// GRPC_ARG_MAX_RECONNECT_BACKOFF_MS = max_backoff and GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS =
// min(max_backoff, 1 s) (gRPC's own default initial value). gRPC adds +-20 % jitter, so once a
// peer is back a failed channel connects again within about 1.2 x max_backoff. The per-attempt
// connect timeout (GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20 s) is left as is: a refused connection
// (peer process down) fails at once.
grpc::ChannelArguments ReconnectChannelArguments(absl::Duration max_backoff);

// grpc::CreateCustomChannel(target, credentials, ReconnectChannelArguments(max_backoff)).
// Thread-safe (as gRPC channels are).
std::shared_ptr<grpc::Channel> CreateReconnectingChannel(
    const std::string& target, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    absl::Duration max_backoff);

}  // namespace loom

#endif  // LOOM_COMMON_GRPC_CHANNEL_H_
