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

#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <chrono>
#include <initializer_list>

namespace loom {

inline constexpr int kMinClientPingIntervalMs = 10'000;
inline constexpr int kServerPingIntervalMs = 30'000;
inline constexpr int kServerPingTimeoutMs = 10'000;

// Sets the policy above on `builder`.
void ApplyKeepalivePolicy(grpc::ServerBuilder& builder);

// Health (grpc.health.v1, grpc::EnableDefaultHealthCheckService before the build): marks each
// of `services` (full names, e.g. "loom.v1.JobService") SERVING beside the server-wide "", so a
// client can ask about the service it uses (issue 52: they answered NOT_FOUND).
void MarkServing(grpc::Server& server, std::initializer_list<const char*> services);

// Graceful stop: every health status NOT_SERVING first (health watchers, load balancers and
// clients hear it before the server goes away), then Server::Shutdown, letting calls in flight
// finish until `deadline`. Does not Wait().
void ShutdownGracefully(grpc::Server& server, std::chrono::system_clock::time_point deadline);

}  // namespace loom

#endif  // LOOM_COMMON_GRPC_SERVER_H_
