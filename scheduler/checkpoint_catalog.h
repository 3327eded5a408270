// What the scheduler needs to know of a job's checkpoints: the newest committed one (a new attempt
// resumes from it) and retention. Two implementations: the storage library on a directory the
// scheduler can read (LocalCheckpointCatalog, the default), and loom-checkpoint's gRPC API
// (services/scheduler, --checkpoint_service), so the scheduler needs no access to the checkpoint
// volume. No gRPC here.
#ifndef LOOM_SCHEDULER_CHECKPOINT_CATALOG_H_
#define LOOM_SCHEDULER_CHECKPOINT_CATALOG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/common.pb.h"

namespace loom {

struct CommittedCheckpoint {
  int64_t step = 0;
  std::string path;  // the step directory, as the trainers see it
  // NewestIntact only: newer committed steps that failed verification and were skipped
  // ("skipped step 8 (<reason>)", joined by "; "); "" if none.
  std::string skipped;
};

// Implementations must be thread-safe (the scheduler calls them from its scheduling loop and its
// retention thread, not under its lock, except once at startup) and bound their own latency (a
// remote call carries a deadline).
class CheckpointCatalog {
 public:
  virtual ~CheckpointCatalog() = default;
  // NOT_FOUND if the job has no committed checkpoint; UNAVAILABLE (and other errors) if it cannot
  // tell right now: the scheduler then waits rather than restarting from scratch.
  virtual absl::StatusOr<CommittedCheckpoint> NewestCommitted(const std::string& job_id,
                                                              const std::string& checkpoint_dir) = 0;
  // The resume point of a restarted attempt: the newest committed checkpoint whose shards pass
  // their CRC-32 check; newer committed ones that fail it are marked corrupt (so that listings
  // show it and nothing resumes from them again) and named in `skipped`. Reads the chosen
  // checkpoint once: never call it under a lock others wait on. NOT_FOUND when no intact
  // committed checkpoint exists (its message then names the skipped steps, if any); other errors
  // as NewestCommitted. Default: NewestCommitted, unverified.
  virtual absl::StatusOr<CommittedCheckpoint> NewestIntact(const std::string& job_id,
                                                           const std::string& checkpoint_dir) {
    return NewestCommitted(job_id, checkpoint_dir);
  }
  // Applies keep_last / keep_best / best_metric of `policy`; never deletes the newest committed
  // checkpoint or `protected_steps`. Returns the deleted steps.
  virtual absl::StatusOr<std::vector<int64_t>> ApplyRetention(
      const std::string& job_id, const std::string& checkpoint_dir,
      const loom::v1::CheckpointPolicy& policy, const std::vector<int64_t>& protected_steps) = 0;
};

// The storage library (storage/checkpoint) on `checkpoint_dir` directly. Thread-safe (stateless).
class LocalCheckpointCatalog : public CheckpointCatalog {
 public:
  absl::StatusOr<CommittedCheckpoint> NewestCommitted(const std::string& job_id,
                                                      const std::string& checkpoint_dir) override;
  // storage::NewestIntactCheckpoint (storage/checkpoint/resume_point.h).
  absl::StatusOr<CommittedCheckpoint> NewestIntact(const std::string& job_id,
                                                   const std::string& checkpoint_dir) override;
  absl::StatusOr<std::vector<int64_t>> ApplyRetention(
      const std::string& job_id, const std::string& checkpoint_dir,
      const loom::v1::CheckpointPolicy& policy,
      const std::vector<int64_t>& protected_steps) override;
};

}  // namespace loom

#endif  // LOOM_SCHEDULER_CHECKPOINT_CATALOG_H_
