// loomctl's checkpoint commands (`checkpoints`, `consolidate`, `checkpoint verify|delete|retain`):
// one function each, over a CheckpointService stub, printing what a user reads. Flags and
// addresses stay in loomctl.cc. Exit statuses: 0, or the gRPC status code of the failed call
// (printed by `fail`), as every loomctl command.
#ifndef LOOM_SERVICES_CLI_CHECKPOINT_COMMANDS_H_
#define LOOM_SERVICES_CLI_CHECKPOINT_COMMANDS_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/checkpoint_service.grpc.pb.h"

namespace loom::cli {

struct CheckpointCommandContext {
  // A client context with the caller's token and a deadline of `deadline` from now
  // (absl::ZeroDuration(): loomctl's --timeout).
  std::function<std::unique_ptr<grpc::ClientContext>(absl::Duration deadline)> context;
  // Prints a failed call's status and returns its exit status.
  std::function<int(const absl::Status&)> fail;
};

// `loomctl checkpoints JOB_ID`: one line per step (COMMITTED "yes"/"no"/"CORRUPT", or
// "DELETING"/"DELETE_FAILED" for a step whose files are still there, with the reason), then the
// disk usage. A job without checkpoints is not an error.
int ListCheckpoints(loom::v1::CheckpointService::Stub& stub, const std::string& job_id,
                    const CheckpointCommandContext& ctx);

// `loomctl consolidate JOB_ID`: a relative output_dir is made absolute (the service runs
// elsewhere). Deadline 30 minutes.
int Consolidate(loom::v1::CheckpointService::Stub& stub, const std::string& job_id, int64_t step,
                std::string output_dir, const std::string& max_shard_size,
                const std::string& dtype, const CheckpointCommandContext& ctx);

// `loomctl checkpoint delete JOB_ID --step=N` and `checkpoint retain JOB_ID --keep_last=K`.
int DeleteCheckpoint(loom::v1::CheckpointService::Stub& stub, const std::string& job_id,
                     int64_t step, const std::vector<int64_t>& protected_steps,
                     const CheckpointCommandContext& ctx);
int RetainCheckpoints(loom::v1::CheckpointService::Stub& stub, const std::string& job_id,
                      int32_t keep_last, const std::vector<int64_t>& protected_steps,
                      const CheckpointCommandContext& ctx);

// `loomctl checkpoint verify PATH` (offline): 0 valid, 3 invalid, 5 nothing there.
int VerifyCheckpoint(const std::string& path);

// --protect's values as steps; INVALID_ARGUMENT naming the one that is not a number.
absl::StatusOr<std::vector<int64_t>> ParseProtectedSteps(const std::vector<std::string>& values);

}  // namespace loom::cli

#endif  // LOOM_SERVICES_CLI_CHECKPOINT_COMMANDS_H_
