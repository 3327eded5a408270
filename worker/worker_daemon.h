// The worker daemon's core: registers the node's inventory, heartbeats rank status to the
// scheduler, starts one loom-trainer per assigned rank and stops ranks the scheduler revokes
// (gracefully, SIGUSR1, when the stop entry says graceful_stop; else SIGTERM then SIGKILL).
// Each heartbeat also carries the ranks' output lines not yet delivered (at most
// kMaxLogLinesPerHeartbeat lines and kMaxLogBytesPerHeartbeat bytes in all, oldest first); a
// line counts as delivered once a heartbeat carrying it succeeded, so a failed heartbeat's lines
// are sent again (the scheduler drops duplicates by sequence). A finished rank is forgotten only
// after its last lines were delivered.
// No gRPC here: the scheduler is reached through SchedulerClient.
#ifndef LOOM_WORKER_WORKER_DAEMON_H_
#define LOOM_WORKER_WORKER_DAEMON_H_

#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "proto/worker_service.pb.h"
#include "worker/path_check.h"
#include "worker/rank_env.h"
#include "worker/rank_process.h"
#include "worker/scheduler_client.h"
#include "worker/worker_metrics.h"

namespace loom::worker {

inline constexpr size_t kMaxLogLinesPerHeartbeat = 1000;
inline constexpr size_t kMaxLogBytesPerHeartbeat = 512 << 10;

struct WorkerOptions {
  std::string node_id;                  // required, unique in the cluster
  // slots >= 1 required; with devices (a GPU node), slots equal to their count. Each rank's
  // environment binds it to its devices (worker/rank_env.h).
  loom::v1::NodeInventory inventory;
  std::string trainer_path;             // loom-trainer executable, required
  std::string work_dir;                 // per-rank run dirs and logs, required
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  // A terminal rank status is reported this many times before the worker forgets the rank.
  int terminal_reports = 5;
  absl::Duration stop_grace = absl::Seconds(5);
  // Check the assignment's paths (checkpoint_dir, model.init_from, dataset.path) against `paths`
  // before starting its trainer (worker/path_check.h); a refused rank is reported FAILED with
  // the PERMISSION_DENIED message and no trainer starts. loom-worker turns it on
  // (--confine_paths); off here so unit tests may use any temp path.
  bool confine_paths = false;
  WorkerPathOptions paths;
  // NCCL_SOCKET_IFNAME / NCCL_IB_HCA given to every rank when set (worker/rank_env.h).
  NcclEnvOptions nccl;

  // INVALID_ARGUMENT naming the field.
  absl::Status Validate() const;
};

// Thread-safe. Run() blocks until Shutdown().
class WorkerDaemon {
 public:
  WorkerDaemon(WorkerOptions options, SchedulerClient* client, WorkerMetrics* metrics);
  ~WorkerDaemon();

  // Loop: register (retrying), then heartbeat every interval. Returns after Shutdown(), having
  // stopped every rank it started.
  void Run();
  void Shutdown();

  // One heartbeat round; exposed for tests. Registers first if needed.
  absl::Status Tick();
  int RunningRanks() const;
  // True once the scheduler accepted RegisterWorker (false again if it asks the worker to
  // register anew). The worker's /readyz.
  bool Registered() const;
  // True once the scheduler refused a heartbeat because another worker process registered this
  // node id since (ABORTED; RegisterWorkerRequest.instance_id): this daemon then stopped its
  // ranks and shut down (Run() returns), and its process should exit with an error.
  bool Superseded() const;
  // This process's random instance id (sent with every registration and heartbeat).
  const std::string& instance_id() const { return instance_id_; }

 private:
  using RankKey = std::tuple<std::string, int, int>;  // job id, attempt, rank

  absl::Status Register();
  void StartRank(const loom::v1::RankAssignment& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const WorkerOptions options_;
  SchedulerClient* const client_;
  WorkerMetrics* const metrics_;
  const std::string instance_id_;
  absl::Mutex shutdown_mu_;  // Shutdown() may be called from Tick() and a signal thread at once
  absl::Notification shutdown_;

  mutable absl::Mutex mu_;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  bool superseded_ ABSL_GUARDED_BY(mu_) = false;
  struct Rank {
    std::unique_ptr<RankProcess> process;  // null if the process could not be started
    loom::v1::RankStatus start_failure;    // reported when process is null
    int terminal_reports = 0;
    int64_t delivered_log_sequence = 0;  // lines up to this one reached the scheduler
    bool AllLogsDelivered() const {
      return process == nullptr || process->LogLinesAfter(delivered_log_sequence, 1, 1).empty();
    }
    int accelerator_index = 0;  // slot on this node (the trainer's LOOM_ACCELERATOR_INDEX)
    loom::v1::RankStatus Status() const { return process ? process->Status() : start_failure; }
    RankStats Stats() const { return process ? process->Stats() : RankStats{}; }
    bool Finished() const { return process == nullptr || process->Finished(); }
    void Stop() {
      if (process) process->Stop();
    }
    void StopGracefully() {
      if (process) process->StopGracefully();
    }
  };
  std::map<RankKey, Rank> ranks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::worker

#endif  // LOOM_WORKER_WORKER_DAEMON_H_
