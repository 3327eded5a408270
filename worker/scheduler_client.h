// The worker daemon's view of loom-scheduler's WorkerService. The gRPC implementation lives in
// services/worker; tests use a fake. Implementations must be thread-compatible.
#ifndef LOOM_WORKER_SCHEDULER_CLIENT_H_
#define LOOM_WORKER_SCHEDULER_CLIENT_H_

#include "absl/status/statusor.h"
#include "proto/worker_service.pb.h"

namespace loom::worker {

class SchedulerClient {
 public:
  virtual ~SchedulerClient() = default;
  // UNAVAILABLE or DEADLINE_EXCEEDED while the scheduler is unreachable (the daemon retries on
  // its next tick).
  virtual absl::StatusOr<loom::v1::RegisterWorkerResponse> RegisterWorker(
      const loom::v1::RegisterWorkerRequest& request) = 0;
  // NOT_FOUND if the scheduler does not know this node (the daemon registers again).
  virtual absl::StatusOr<loom::v1::HeartbeatResponse> Heartbeat(
      const loom::v1::HeartbeatRequest& request) = 0;
};

}  // namespace loom::worker

#endif  // LOOM_WORKER_SCHEDULER_CLIENT_H_
