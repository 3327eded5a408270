#include "common/grpc_server.h"

#include <grpc/grpc.h>
#include <grpcpp/health_check_service_interface.h>

namespace loom {

void ApplyKeepalivePolicy(grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kMinClientPingIntervalMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kServerPingIntervalMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kServerPingTimeoutMs);
  // The server's own pings go out however long a stream is quiet (default: 2 without data).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

void MarkServing(grpc::Server& server, std::initializer_list<const char*> services) {
  grpc::HealthCheckServiceInterface* health = server.GetHealthCheckService();
  if (health == nullptr) return;
  for (const char* service : services) health->SetServingStatus(service, true);
}

void ShutdownGracefully(grpc::Server& server, std::chrono::system_clock::time_point deadline) {
  if (grpc::HealthCheckServiceInterface* health = server.GetHealthCheckService()) {
    health->Shutdown();
  }
  server.Shutdown(deadline);
}

}  // namespace loom
