// loom-checkpoint's gRPC adapter: loom.v1.CheckpointService (proto/checkpoint_service.proto) over
// the storage/checkpoint core (ListCheckpoints, Consolidate). A job's checkpoint directory is
// <checkpoint_root>/<job_id>. No LibTorch.
#ifndef LOOM_SERVICES_CHECKPOINT_CHECKPOINT_SERVICE_H_
#define LOOM_SERVICES_CHECKPOINT_CHECKPOINT_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "proto/checkpoint_service.grpc.pb.h"
#include "storage/checkpoint/consolidate.h"

namespace prometheus {
class Counter;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace loom {

// <checkpoint_root>/<job_id>. INVALID_ARGUMENT if job_id is empty, contains '/', a NUL byte or
// "..", or is ".".
absl::StatusOr<std::string> JobCheckpointDir(const std::string& checkpoint_root,
                                             const std::string& job_id);

struct CheckpointServiceOptions {
  // Directory holding one checkpoint directory per job. Required.
  std::string checkpoint_root;
  storage::ConsolidateOptions consolidate;
  // Authentication (both null: off, every caller allowed). Checkpoints are addressed by job id
  // and this service does not know which tenant owns a job, so every RPC needs an admin token
  // from `users` (the tokens file, common/auth.h) or the cluster's service token `service`
  // (the scheduler's calls). UNAUTHENTICATED without a known token, PERMISSION_DENIED for a
  // user-role token. Tenants reach their checkpoints' state through the scheduler (Job.progress)
  // and the exports an operator consolidates. Must outlive the service.
  const TokenAuthenticator* users = nullptr;
  const TokenAuthenticator* service = nullptr;
};

// The service. Metrics registered in the constructor on `registry`:
//   loom_checkpoint_consolidations_total{result}   counter; result = "ok" or the lower-case
//                                                  canonical code ("failed_precondition", ...);
//                                                  every one exported at 0 from the start
//   loom_checkpoint_consolidation_seconds          histogram of ConsolidateCheckpoint durations
//   loom_checkpoint_consolidated_bytes_total       counter of model.safetensors bytes written
// ConsolidateCheckpoint requests:
//   output_dir "" = <checkpoint dir>/step_<N>/hf; otherwise it must be an absolute path without
//   ".." components (INVALID_ARGUMENT), since the client and the service may not share a cwd.
//   max_shard_size / dtype as ConsolidateOptions (ParseShardSize, NormalizeOutputDtype);
//   INVALID_ARGUMENT naming the field on a bad value.
// DeleteCheckpoint / ApplyRetention: storage::DeleteCheckpoint / ApplyRetention on the job's
// directory; NOT_FOUND if the job has no checkpoint directory. A step whose files cannot be
// removed fails the call (the removal's code, naming the file and OS error; ApplyRetention after
// deleting the others) and stays listed until its files are gone.
// ListCheckpoints / GetCheckpoint also list steps whose deletion is pending (moved aside,
// files still on disk: CheckpointInfo.deletion_state, with their bytes). When no deletion or
// consolidation holds the lock, a listing first retries their removal (storage::
// RetryPendingDeletions), so leftovers go without a restart; the last error seen for each is
// kept in memory for listings made while the lock is busy.
// Consolidations and deletions run one at a time (the core's temporary file names carry the
// process id, and a deletion must not race a consolidation of the same step).
// Thread-safe.
class CheckpointServiceImpl final : public v1::CheckpointService::Service {
 public:
  CheckpointServiceImpl(CheckpointServiceOptions options, prometheus::Registry& registry);

  grpc::Status ListCheckpoints(grpc::ServerContext* context, const v1::ListCheckpointsRequest* req,
                               v1::ListCheckpointsResponse* resp) override;
  grpc::Status ConsolidateCheckpoint(grpc::ServerContext* context,
                                     const v1::ConsolidateCheckpointRequest* req,
                                     v1::ConsolidateCheckpointResponse* resp) override;
  grpc::Status DeleteCheckpoint(grpc::ServerContext* context,
                                const v1::DeleteCheckpointRequest* req,
                                v1::DeleteCheckpointResponse* resp) override;
  grpc::Status ApplyRetention(grpc::ServerContext* context, const v1::ApplyRetentionRequest* req,
                              v1::ApplyRetentionResponse* resp) override;
  grpc::Status GetCheckpoint(grpc::ServerContext* context, const v1::GetCheckpointRequest* req,
                             v1::CheckpointInfo* resp) override;
  grpc::Status VerifyCheckpoint(grpc::ServerContext* context,
                                const v1::VerifyCheckpointRequest* req,
                                v1::VerifyCheckpointResponse* resp) override;

 private:
  // OK if the caller may use this service (see CheckpointServiceOptions::users).
  grpc::Status Authorize(const grpc::ServerContext& context) const;
  // The job's checkpoint directory: INVALID_ARGUMENT for a bad id, NOT_FOUND if it is absent.
  absl::StatusOr<std::string> ExistingJobDir(const std::string& job_id) const;
  absl::StatusOr<storage::ConsolidateResult> DoConsolidate(
      const v1::ConsolidateCheckpointRequest& req);
  // The job directory's checkpoints and pending deletions, by step (see the class comment).
  absl::StatusOr<std::vector<v1::CheckpointInfo>> Listing(const std::string& dir);
  // Replaces what deletion_errors_ holds for `dir` by `failed` (the pending deletions left after
  // a retry of all of them, with their errors).
  void NoteDeletionFailures(const std::string& dir,
                            const std::vector<storage::PendingDeletion>& failed);
  // Records `error` for the pending deletions of `step` in `dir`.
  void RememberDeletionError(const std::string& dir, int64_t step, const absl::Status& error);

  const CheckpointServiceOptions options_;
  prometheus::Family<prometheus::Counter>& consolidations_;
  prometheus::Histogram& consolidation_seconds_;
  prometheus::Counter& consolidated_bytes_;
  absl::Mutex consolidate_mu_;  // held for the duration of one consolidation or deletion
  absl::Mutex deletion_errors_mu_;  // after consolidate_mu_ when both are held
  // The last removal error of each pending deletion's path ("" = none recorded).
  std::map<std::string, std::string> deletion_errors_ ABSL_GUARDED_BY(deletion_errors_mu_);
};

// Builds and starts a gRPC server for `service` on host:port (port 0 = any free port) with the
// gRPC default health service enabled. Returns the server; *bound_port receives the port.
// UNAVAILABLE if the address cannot be bound. `credentials` null = plaintext (see
// common/grpc_credentials.h for TLS).
absl::StatusOr<std::unique_ptr<grpc::Server>> StartCheckpointServer(
    const std::string& host, int port, CheckpointServiceImpl* service, int* bound_port,
    std::shared_ptr<grpc::ServerCredentials> credentials = nullptr);

}  // namespace loom

#endif  // LOOM_SERVICES_CHECKPOINT_CHECKPOINT_SERVICE_H_
