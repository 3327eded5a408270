// File: services/cli/admin_commands.h
//
// loomctl's operator commands over loom.v1.AdminService (proto/admin_service.proto):
//   loomctl nodes                         table of nodes: kind, slots used/total, domain, arch,
//                                         state (live/lost, cordoned/draining), jobs
//   loomctl cordon NODE [--reason=...]    no new ranks on NODE
//   loomctl uncordon NODE
//   loomctl drain NODE [--reason=...]     cordon + requeue NODE's jobs (they resume from their
//                                         newest committed checkpoint elsewhere)
//   loomctl queues                        queues with tenant, quota, borrowing limit, usage,
//                                         pending and running jobs
// --json prints the responses with protobuf's JSON mapping instead.
#ifndef LOOM_SERVICES_CLI_ADMIN_COMMANDS_H_
#define LOOM_SERVICES_CLI_ADMIN_COMMANDS_H_

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <functional>
#include <memory>
#include <string>

namespace loom {

// True for "nodes", "cordon", "uncordon", "drain", "queues".
bool IsAdminCommand(const std::string& cmd);

// Runs one command against the scheduler on `channel`, each call with a context from
// `make_context` (deadline, bearer token); prints to stdout, errors to stderr. Returns the
// process exit code (0, 2 for a usage error, else the gRPC status code).
int RunAdminCommand(const std::string& cmd, const std::string& arg,
                    std::shared_ptr<grpc::Channel> channel,
                    const std::function<std::unique_ptr<grpc::ClientContext>()>& make_context,
                    const std::string& reason, bool json);

}  // namespace loom

#endif  // LOOM_SERVICES_CLI_ADMIN_COMMANDS_H_
