// CheckpointCatalog over loom-checkpoint's gRPC API (ListCheckpoints, VerifyCheckpoint,
// ApplyRetention), so the scheduler needs no access to the checkpoint volume. Every call carries
// a deadline (a verification reads the whole checkpoint: size the deadline for that).
#ifndef LOOM_SERVICES_SCHEDULER_GRPC_CHECKPOINT_CATALOG_H_
#define LOOM_SERVICES_SCHEDULER_GRPC_CHECKPOINT_CATALOG_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/checkpoint_service.grpc.pb.h"
#include "scheduler/checkpoint_catalog.h"

namespace loom {

// Thread-safe (gRPC stubs are).
class GrpcCheckpointCatalog : public CheckpointCatalog {
 public:
  // `token` (may be empty) is sent as a bearer token on every call (loom-checkpoint's
  // --service_token_file).
  GrpcCheckpointCatalog(std::shared_ptr<grpc::Channel> channel, absl::Duration deadline,
                        std::string token = "")
      : stub_(v1::CheckpointService::NewStub(std::move(channel))),
        deadline_(deadline),
        token_(std::move(token)) {}

  // The service resolves job ids under its own checkpoint root; `checkpoint_dir` is unused.
  absl::StatusOr<CommittedCheckpoint> NewestCommitted(const std::string& job_id,
                                                      const std::string& checkpoint_dir) override;
  // ListCheckpoints, then VerifyCheckpoint of the newest committed steps until one passes (the
  // service marks those that fail with DATA_LOSS corrupt); steps already marked are skipped.
  absl::StatusOr<CommittedCheckpoint> NewestIntact(const std::string& job_id,
                                                   const std::string& checkpoint_dir) override;
  absl::StatusOr<std::vector<int64_t>> ApplyRetention(
      const std::string& job_id, const std::string& checkpoint_dir,
      const loom::v1::CheckpointPolicy& policy,
      const std::vector<int64_t>& protected_steps) override;

 private:
  std::unique_ptr<v1::CheckpointService::Stub> stub_;
  absl::Duration deadline_;
  std::string token_;
};

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_GRPC_CHECKPOINT_CATALOG_H_
