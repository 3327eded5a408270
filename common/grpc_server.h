// One keepalive policy for Loom's gRPC servers (loom-scheduler, loom-checkpoint).
//
// Clients keep long, quiet streams (WatchJob of a pending job, followed logs) alive with HTTP/2
// pings; gRPC's server defaults accept a ping without data at most every 5 minutes and end the
// connection with GOAWAY "too_many_pings" after two early ones (issue 52: a client pinging every
// 10 s lost its watch with UNAVAILABLE). The policy, after gRPC's keepalive guide
// (grpc/doc/keepalive.md):
//   * clients may ping every 10 s or more, with or without calls in flight;
//   * the server pings an idle connection every 30 s and drops it if no answer comes within
//     10 s, so a client that vanished (no FIN: a lost node, a NAT timeout) frees its streams.
// Not thread-safe (a builder is configured by one thread before BuildAndStart).
#ifndef LOOM_COMMON_GRPC_SERVER_H_
#define LOOM_COMMON_GRPC_SERVER_H_

#include <grpcpp/server_builder.h>

namespace loom {

inline constexpr int kMinClientPingIntervalMs = 10'000;
inline constexpr int kServerPingIntervalMs = 30'000;
inline constexpr int kServerPingTimeoutMs = 10'000;

// Sets the policy above on `builder`.
void ApplyKeepalivePolicy(grpc::ServerBuilder& builder);

}  // namespace loom

#endif  // LOOM_COMMON_GRPC_SERVER_H_
