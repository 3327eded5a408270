#include "worker/worker_daemon.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/trainer/exit_codes.h"
#include "worker/rank_env.h"

namespace loom::worker {

absl::Status WorkerOptions::Validate() const {
  if (node_id.empty()) return absl::InvalidArgumentError("node_id: required");
  if (inventory.slots() < 1) return absl::InvalidArgumentError("inventory.slots: must be >= 1");
  if (inventory.devices_size() > 0 && inventory.slots() != inventory.devices_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("inventory.slots: ", inventory.slots(), " on a node with ",
                     inventory.devices_size(), " devices (must be equal: one rank per device)"));
  }
  if (trainer_path.empty()) return absl::InvalidArgumentError("trainer_path: required");
  if (work_dir.empty()) return absl::InvalidArgumentError("work_dir: required");
  if (confine_paths) {
    for (const auto& [name, roots] : {std::pair{"data_roots", &paths.data_roots},
                                      std::pair{"scratch_roots", &paths.scratch_roots}}) {
      for (const std::string& root : *roots) {
        if (root.empty() || (root[0] != '/' && root.find("=/") == std::string::npos)) {
          return absl::InvalidArgumentError(
              absl::StrCat(name, ": '", root, "' is neither /path nor tenant=/path"));
        }
      }
    }
  }
  if (heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("heartbeat_interval: must be positive");
  }
  return absl::OkStatus();
}

namespace {
// "<pid>-<64 random bits in hex>": unique per process, readable in the scheduler's log.
std::string NewInstanceId() {
  absl::BitGen gen;
  return absl::StrCat(::getpid(), "-", absl::Hex(absl::Uniform<uint64_t>(gen), absl::kZeroPad16));
}
}  // namespace

WorkerDaemon::WorkerDaemon(WorkerOptions options, SchedulerClient* client, WorkerMetrics* metrics)
    : options_(std::move(options)),
      client_(client),
      metrics_(metrics),
      instance_id_(NewInstanceId()) {}

WorkerDaemon::~WorkerDaemon() {
  absl::MutexLock l(&mu_);
  for (auto& [key, rank] : ranks_) rank.Stop();
  ranks_.clear();  // destructors join the reader threads
}

absl::Status WorkerDaemon::Register() {
  loom::v1::RegisterWorkerRequest req;
  req.set_node_id(options_.node_id);
  req.set_instance_id(instance_id_);
  *req.mutable_inventory() = options_.inventory;
  ASSIGN_OR_RETURN(auto resp, client_->RegisterWorker(req));
  (void)resp;
  absl::MutexLock l(&mu_);
  if (!registered_) LOG(INFO) << "registered node " << options_.node_id << " with the scheduler";
  registered_ = true;
  return absl::OkStatus();
}

void WorkerDaemon::StartRank(const loom::v1::RankAssignment& a) {
  RankKey key{a.job_id(), a.attempt(), a.rank()};
  if (ranks_.count(key)) return;  // already running (assignments are re-sent until reported)
  RankProcessOptions po;
  po.trainer_path = options_.trainer_path;
  po.run_dir = absl::StrCat(options_.work_dir, "/", a.job_id(), "/attempt_", a.attempt());
  po.stop_grace = options_.stop_grace;
  po.bind_address = options_.inventory.address();  // this node's advertised address
  // The lowest slot no unfinished rank of this node holds: the accelerator this rank uses.
  std::set<int> taken;
  for (const auto& [k, r] : ranks_) {
    if (!r.Finished()) taken.insert(r.accelerator_index);
  }
  int index = 0;
  while (taken.count(index) > 0) ++index;
  // The scheduler's binding wins over the local choice (worker/rank_env.h).
  if (!a.device_indices().empty()) index = a.device_indices(0);
  ranks_[key].accelerator_index = index;
  // Reported as a failed rank so that the scheduler fails the attempt.
  // exit_code -1: no trainer ran (a rank failure within the restart budget).
  auto fail = [&](const std::string& error, int exit_code = -1) {
    loom::v1::RankStatus& st = ranks_[key].start_failure;
    st.set_job_id(a.job_id());
    st.set_attempt(a.attempt());
    st.set_rank(a.rank());
    st.set_state(loom::v1::RANK_STATE_FAILED);
    st.set_exit_code(exit_code);
    st.set_error(error);
  };
  absl::StatusOr<std::vector<std::string>> env =
      RankEnvironment(a, options_.inventory, index, options_.nccl);
  if (!env.ok()) {
    LOG(ERROR) << "refusing rank " << a.rank() << " of " << a.job_id() << ": " << env.status();
    fail(absl::StrCat("worker ", options_.node_id, " refused to start the trainer: ",
                      env.status().message()));
    return;
  }
  po.extra_env = *std::move(env);
  loom::v1::RankAssignment checked = a;
  if (options_.confine_paths) {
    absl::StatusOr<loom::v1::RankAssignment> confined = CheckAssignmentPaths(a, options_.paths);
    if (!confined.ok()) {
      LOG(ERROR) << "refusing rank " << a.rank() << " of " << a.job_id() << ": "
                 << confined.status();
      // A path the tenant may not name fails every attempt alike: a configuration error, not
      // retried (restart_policy.h), rather than a rank failure that spends restarts.
      fail(absl::StrCat("worker ", options_.node_id, " refused to start the trainer: ",
                        confined.status().message()),
           kTrainerExitConfigError);
      return;
    }
    checked = *std::move(confined);
  }
  auto proc = RankProcess::Start(checked, po);
  if (!proc.ok()) {
    LOG(ERROR) << "cannot start rank " << a.rank() << " of " << a.job_id() << ": "
               << proc.status();
    fail(absl::StrCat("worker ", options_.node_id, " could not start the trainer: ",
                      proc.status().message()));
    return;
  }
  ranks_[key].process = std::move(*proc);
}

absl::Status WorkerDaemon::Tick() {
  bool registered;
  {
    absl::MutexLock l(&mu_);
    if (superseded_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node ", options_.node_id, ": this worker instance was superseded; it does not register "
          "again"));
    }
    registered = registered_;
  }
  if (!registered) RETURN_IF_ERROR(Register());

  loom::v1::HeartbeatRequest req;
  req.set_node_id(options_.node_id);
  req.set_instance_id(instance_id_);
  std::vector<loom::v1::RankStatus> statuses;
  std::vector<RankStats> stats;
  std::map<RankKey, int64_t> sent_up_to;  // newest line sent per rank in this heartbeat
  std::vector<WorkerMetrics::AcceleratorAssignment> accelerators;
  {
    absl::MutexLock l(&mu_);
    size_t lines_left = kMaxLogLinesPerHeartbeat, bytes_left = kMaxLogBytesPerHeartbeat;
    for (auto& [key, rank] : ranks_) {
      statuses.push_back(rank.Status());
      stats.push_back(rank.Stats());
      loom::v1::RankStatus* st = req.add_ranks();
      *st = statuses.back();
      const loom::v1::RankState state = statuses.back().state();
      if (state == loom::v1::RANK_STATE_STARTING || state == loom::v1::RANK_STATE_RUNNING) {
        accelerators.push_back({std::get<0>(key), std::get<2>(key), rank.accelerator_index});
      }
      if (rank.process == nullptr || lines_left == 0 || bytes_left == 0) continue;
      for (loom::v1::RankLogLine& line :
           rank.process->LogLinesAfter(rank.delivered_log_sequence, lines_left, bytes_left)) {
        lines_left -= 1;
        bytes_left -= std::min(bytes_left, line.text().size());
        sent_up_to[key] = line.sequence();
        *st->add_log_lines() = std::move(line);
      }
    }
  }
  if (metrics_ != nullptr) {
    metrics_->RecordAcceleratorAssignments(options_.node_id, accelerators);
    metrics_->RecordRanks(statuses, options_.inventory.slots());
    // Every reported rank has its own series (job, attempt, rank): a terminal rank's final
    // numbers until it is forgotten.
    for (size_t i = 0; i < statuses.size(); ++i) metrics_->RecordRankStats(statuses[i], stats[i]);
  }
  absl::StatusOr<loom::v1::HeartbeatResponse> resp = client_->Heartbeat(req);
  if (metrics_ != nullptr) metrics_->RecordHeartbeat(resp.ok());
  if (!resp.ok()) {
    if (absl::IsNotFound(resp.status())) {
      absl::MutexLock l(&mu_);
      registered_ = false;  // the scheduler lost us (e.g. restarted on a new DB): register again
    }
    if (absl::IsAborted(resp.status())) {
      // Another process registered this node id: it owns the node's ranks now. Never register
      // again (the two would take the node from each other in turn): stop and shut down.
      LOG(ERROR) << "node " << options_.node_id << " (instance " << instance_id_
                 << "): " << resp.status().message() << "; stopping every rank and shutting down";
      {
        absl::MutexLock l(&mu_);
        superseded_ = true;
        registered_ = false;
        for (auto& [key, rank] : ranks_) rank.Stop();
      }
      Shutdown();
    }
    return resp.status();
  }
  absl::MutexLock l(&mu_);
  for (const auto& [key, sequence] : sent_up_to) {
    auto it = ranks_.find(key);
    if (it != ranks_.end()) it->second.delivered_log_sequence = sequence;
  }
  // Terminal ranks are reported a few times (and until their last lines were delivered), then
  // forgotten.
  for (auto it = ranks_.begin(); it != ranks_.end();) {
    if (it->second.Finished() &&
        ++it->second.terminal_reports >= options_.terminal_reports &&
        it->second.AllLogsDelivered()) {
      it = ranks_.erase(it);
    } else {
      ++it;
    }
  }
  for (const loom::v1::RankAssignment& a : resp->stop()) {
    for (auto& [key, rank] : ranks_) {
      if (std::get<0>(key) == a.job_id() && std::get<1>(key) == a.attempt()) {
        if (a.graceful_stop()) {
          rank.StopGracefully();
        } else {
          rank.Stop();
        }
      }
    }
  }
  for (const loom::v1::RankAssignment& a : resp->start()) StartRank(a);
  return absl::OkStatus();
}

bool WorkerDaemon::Registered() const {
  absl::MutexLock l(&mu_);
  return registered_;
}

int WorkerDaemon::RunningRanks() const {
  absl::MutexLock l(&mu_);
  int n = 0;
  for (const auto& [key, rank] : ranks_) n += rank.Finished() ? 0 : 1;
  return n;
}

void WorkerDaemon::Run() {
  absl::Time last_error_log = absl::InfinitePast();
  while (!shutdown_.HasBeenNotified()) {
    absl::Status s = Tick();
    if (!s.ok() && absl::Now() - last_error_log > absl::Seconds(10)) {
      LOG(WARNING) << "heartbeat failed: " << s;
      last_error_log = absl::Now();
    }
    shutdown_.WaitForNotificationWithTimeout(options_.heartbeat_interval);
  }
  absl::MutexLock l(&mu_);
  for (auto& [key, rank] : ranks_) rank.Stop();
}

void WorkerDaemon::Shutdown() {
  absl::MutexLock l(&shutdown_mu_);
  if (!shutdown_.HasBeenNotified()) shutdown_.Notify();
}

bool WorkerDaemon::Superseded() const {
  absl::MutexLock l(&mu_);
  return superseded_;
}

}  // namespace loom::worker
