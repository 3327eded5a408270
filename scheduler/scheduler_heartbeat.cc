// The Scheduler facade's rank reconciler: folds a node's heartbeat (rank reports) into job
// state: rendezvous hand-out, progress and retention triggers, rank failures with their
// classification and suspect node, lost ranks, assignments and stops in the reply; and the
// cycle's liveness checks over the same state (step advances, hangs, node liveness). Runs under
// the facade's lock (scheduler.h).
#include "scheduler/scheduler.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "scheduler/device_binding.h"
#include "scheduler/job_state.h"
#include "scheduler/path_policy.h"
#include "scheduler/placement.h"
#include "scheduler/preemption.h"
#include "scheduler/record_helpers.h"
#include "scheduler/restart_policy.h"
#include "scheduler/scheduler_internal.h"

namespace loom {

absl::StatusOr<loom::v1::HeartbeatResponse> Scheduler::Heartbeat(
    const loom::v1::HeartbeatRequest& request) {
  RETURN_IF_ERROR(CheckRequiredId("node_id", request.node_id()));
  // Output lines first, without the scheduler's lock (the buffer has its own, and deduplicates
  // lines of a retried heartbeat by sequence).
  for (const loom::v1::RankStatus& st : request.ranks()) {
    logs_->Append(st.job_id(), st.attempt(), st.rank(), st.log_lines());
  }
  RecordMetrics(request);  // rank 0's steps and evaluations into the job's metric history
  absl::ReleasableMutexLock lock(&mu_);
  // The job changes this heartbeat makes (phases, the rendezvous port, a checkpoint step) are
  // stored in one transaction after mu_ is released, before the reply is sent: no fsync under
  // the lock every other heartbeat and the cycle need (docs/benchmarks.md "Control plane").
  std::map<std::string, JobRecord> deferred;
  deferred_writes_ = &deferred;
  absl::StatusOr<loom::v1::HeartbeatResponse> response = HeartbeatLocked(request);
  deferred_writes_ = nullptr;
  RETURN_IF_ERROR(StoreOffLock(deferred, &lock));
  return response;
}

absl::StatusOr<loom::v1::HeartbeatResponse> Scheduler::HeartbeatLocked(
    const loom::v1::HeartbeatRequest& request) {
  const std::string& node_id = request.node_id();
  auto node_it = nodes_.find(node_id);
  if (node_it == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat("node ", node_id, " is not registered; register again"));
  }
  if (!request.instance_id().empty()) {
    std::string& owner = node_it->second.instance_id;
    if (owner.empty()) {
      owner = request.instance_id();  // after a scheduler restart: the first one heard owns it
    } else if (owner != request.instance_id()) {
      return absl::AbortedError(absl::StrCat(
          "node ", node_id, " was registered by another worker instance (", owner,
          "); this instance (", request.instance_id(),
          ") is superseded: two daemons must not share a --node_id"));
    }
  }
  if (node_it->second.lost) {
    return absl::NotFoundError(
        absl::StrCat("node ", node_id, " was declared lost; register again"));
  }
  // The heartbeat time lives in memory only: Load() gives every node a fresh grace after a
  // restart, so a stored time would never be read, and writing it made every heartbeat an fsync
  // under this lock (2,000 nodes at 1 Hz = 2,000 fsyncs/s; docs/benchmarks.md "Control plane").
  node_it->second.last_heartbeat_time = clock_->Now();
  awaiting_reregistration_.erase(node_id);
  admission_gate_.NoteReachable(node_id);  // if it was unreachable: it may take new ranks again
  const RankReconciler::RankMap& ranks = reconciler_.ranks();

  loom::v1::HeartbeatResponse response;
  std::map<std::pair<std::string, int32_t>, bool> stops;  // (job id, attempt) -> graceful
  auto add_stop = [&stops](const std::string& job_id, int32_t attempt, bool graceful) {
    auto [it, inserted] = stops.emplace(std::make_pair(job_id, attempt), graceful);
    if (!inserted) it->second = it->second && graceful;  // a kill overrides a graceful stop
  };
  std::set<RankKey> seen;
  std::set<std::string> touched_jobs;

  for (const loom::v1::RankStatus& st : request.ranks()) {
    const RankKey key{st.job_id(), st.rank()};
    RankRuntime* found = reconciler_.Find(key);
    const bool ours =
        found != nullptr && found->attempt == st.attempt() && found->node_id == node_id;
    if (!ours) {
      // An old attempt, an ended job, or a rank placed elsewhere: it must not keep running.
      if (!RankEnded(st.state())) add_stop(st.job_id(), st.attempt(), false);
      continue;
    }
    RankRuntime& rt = *found;
    seen.insert(key);
    const RankState previous = rt.state;
    rt.reported = true;
    reconciler_.SetState(key, st.state());  // keeps the slot counts
    const auto job_it = jobs_.find(st.job_id());
    if (job_it != jobs_.end() && job_it->second.phase == v1::JOB_PHASE_STOPPING) {
      // Graceful stop in progress: keep rank 0's progress (its final checkpoint step).
      if (st.rank() == 0 && st.has_progress()) {
        JobRecord updated = job_it->second;
        updated.progress = MergeProgress(job_it->second.progress, st.progress());
        if (updated.progress.total_steps() == 0) {
          updated.progress.set_total_steps(updated.spec.training().steps());
        }
        if (!google::protobuf::util::MessageDifferencer::Equals(updated.progress,
                                                                job_it->second.progress)) {
          RETURN_IF_ERROR(CommitJob(std::move(updated)));
        }
      }
      const bool graceful = rt.graceful_stop;
      if (RankEnded(st.state())) {
        RecordStoppingRank(st, node_id);
        reconciler_.Erase(key);
      } else {
        add_stop(st.job_id(), st.attempt(), graceful);
      }
      continue;
    }
    if (rt.stop_requested || job_it == jobs_.end() || IsTerminal(job_it->second.phase)) {
      // Rank 0 of a cancelled (or otherwise ended) job's last attempt reports the steps it made
      // between the last heartbeat and its stop: the record keeps them (issue 53: a killed job
      // read step 8119 while its rank's final step, which the dashboards showed, was 8199).
      if (job_it != jobs_.end() && IsTerminal(job_it->second.phase) && st.rank() == 0 &&
          st.has_progress() && job_it->second.attempt == st.attempt() &&
          st.progress().step() > job_it->second.progress.step()) {
        JobRecord updated = job_it->second;
        updated.progress = MergeProgress(job_it->second.progress, st.progress());
        if (updated.progress.total_steps() == 0) {
          updated.progress.set_total_steps(updated.spec.training().steps());
        }
        RETURN_IF_ERROR(CommitJob(std::move(updated)));
      }
      // A rank of an attempt that already failed: perhaps the real cause, reporting late.
      if (st.state() == v1::RANK_STATE_FAILED) {
        RETURN_IF_ERROR(ReconsiderBlame(st, node_id));
        // Ending the job may have forgotten this ended rank.
        if (reconciler_.Find(key) == nullptr) continue;
      }
      if (RankEnded(st.state())) {
        reconciler_.Erase(key);
      } else {
        add_stop(st.job_id(), st.attempt(), false);
      }
      continue;
    }
    JobRecord& job = job_it->second;
    // Every rank's step, not only rank 0's: any stepping rank proves the gang alive
    // (CheckNodeLiveness), also while rank 0's own worker is silent.
    if (st.has_progress()) {
      reconciler_.ObserveRankStep(job.id, st.attempt(), st.rank(), st.progress().step(),
                                  clock_->Now());
    }
    if (st.rank() == 0 && !RankReconciler::ValidRendezvousPort(st.rendezvous_port())) {
      // A broken worker: handing ranks 1..N-1 this port would only fail their rendezvous later.
      RETURN_IF_ERROR(FailAttempt(st.job_id(), v1::FAILURE_CLASS_SETUP, "RendezvousFailed",
                                  absl::StrCat("rank 0 on node ", node_id,
                                               " reported rendezvous port ", st.rendezvous_port(),
                                               ", outside [1, 65535]"),
                                  node_id));
      continue;
    }
    if (st.rank() == 0) {
      // The whole record (its spec included) is copied only when it must be committed; a
      // progress-only report changes the progress in place (NoteProgress).
      const bool new_port = st.rendezvous_port() > 0 && job.rendezvous_port == 0;
      loom::v1::Progress progress = job.progress;
      if (st.has_progress()) {
        if (st.progress().last_checkpoint_step() > job.progress.last_checkpoint_step()) {
          ApplyRetention(job);
        }
        if (st.progress().step() > job.progress.step()) {
          RecordStepAdvance(job.id, job.progress.step(), st.progress().step());
        }
        progress = MergeProgress(job.progress, st.progress());
        if (progress.total_steps() == 0) progress.set_total_steps(job.spec.training().steps());
      }
      if (new_port ||
          progress.last_checkpoint_step() != job.progress.last_checkpoint_step()) {
        JobRecord updated = job;
        if (new_port) {
          updated.rendezvous_port = st.rendezvous_port();
          if (updated.phase == v1::JOB_PHASE_STARTING) {
            updated.message = absl::StrCat("attempt ", job.attempt, ": rank 0 rendezvous at ",
                                           NodeAddress(node_it->second), ":",
                                           st.rendezvous_port(), "; waiting for every rank to run");
          }
          LOG(INFO) << "job " << job.id << " attempt " << job.attempt
                    << ": rank 0 rendezvous at " << NodeAddress(node_it->second) << ":"
                    << st.rendezvous_port();
        }
        updated.progress = std::move(progress);
        RETURN_IF_ERROR(CommitJob(std::move(updated)));
      } else if (!google::protobuf::util::MessageDifferencer::Equals(progress, job.progress)) {
        NoteProgress(job.id, std::move(progress));  // written with the next cycle
      }
    }
    if (st.state() == v1::RANK_STATE_FAILED || st.state() == v1::RANK_STATE_STOPPED) {
      const bool had_run = previous == v1::RANK_STATE_RUNNING;
      // A rank that lost a peer fails with a collective error ("connection reset"); the peer's
      // node, gone silent, is the likely cause and the better suspect (RankReconciler).
      const SuspectChoice suspect = RankReconciler::ChooseSuspect(
          node_id, job.rank_nodes,
          [this](const std::string& peer) -> std::optional<absl::Time> {
            auto n = nodes_.find(peer);
            if (n == nodes_.end()) return std::nullopt;
            return n->second.last_heartbeat_time;
          },
          clock_->Now(), options_.heartbeat_interval);
      const std::string message =
          absl::StrCat(RankExitMessage(st.rank(), node_id, st), suspect.explanation);
      // Losing a peer whose node went silent is an infrastructure failure (infra budget).
      const bool own = suspect.node_id == node_id;
      const bool infra_left =
          job.state.infra_restarts() <
          (!job.spec.has_max_infra_restarts() || job.spec.max_infra_restarts() < 0
               ? options_.default_max_infra_restarts
               : job.spec.max_infra_restarts());
      const FailureVerdict verdict = RankReconciler::ClassifyFailure(st, had_run, own, infra_left);
      const int32_t attempt = job.attempt;
      RETURN_IF_ERROR(FailAttempt(st.job_id(), verdict.failure_class, verdict.reason, message,
                                  suspect.node_id, verdict.no_restart));
      RecordBlame(st.job_id(), attempt, st, node_id, message, verdict.failure_class);
      continue;
    }
    touched_jobs.insert(st.job_id());
  }

  // Ranks this node reported before but no longer does: the worker lost them. Ranks that
  // were asked to stop and are not reported are gone: their slots are free.
  // Only this node's ranks (ranks_by_node_), in key order; each is looked up again because
  // FailAttempt may end (and forget) other ranks of the same job.
  for (const RankKey& key : RanksOnNode(node_id)) {
    if (seen.count(key)) continue;
    auto it = ranks.find(key);
    if (it == ranks.end()) continue;
    const RankRuntime& rt = it->second;
    if (rt.stop_requested) {
      EraseRank(it);
      continue;
    }
    if (rt.reported && !RankEnded(rt.state)) {
      RETURN_IF_ERROR(FailAttempt(key.first, v1::FAILURE_CLASS_INFRA, "RankLost",
                                  absl::StrCat("rank ", key.second, " on node ", node_id,
                                               " is no longer reported by its worker"),
                                  node_id));
      touched_jobs.erase(key.first);
    }
  }

  for (const std::string& job_id : touched_jobs) RETURN_IF_ERROR(AdvanceJob(job_id));
  RETURN_IF_ERROR(FinishStops());

  // Replies: assignments not yet acknowledged, and stops.
  for (const RankKey& key : RanksOnNode(node_id)) {
    auto found = ranks.find(key);
    if (found == ranks.end()) continue;
    const RankRuntime& rt = found->second;
    if (rt.stop_requested) {
      add_stop(key.first, rt.attempt, rt.graceful_stop);
      continue;
    }
    if (rt.reported) continue;
    if (undurable_.count(key.first)) continue;  // its placement is being stored: next heartbeat
    const JobRecord& job = jobs_.at(key.first);
    if (key.second != 0 && job.rendezvous_port == 0) continue;  // wait for rank 0's port
    *response.add_start() = StartAssignment(job, key.second);
  }
  for (const auto& [job_attempt, graceful] : stops) {
    loom::v1::RankAssignment* stop = response.add_stop();
    stop->set_job_id(job_attempt.first);
    stop->set_attempt(job_attempt.second);
    stop->set_graceful_stop(graceful);
  }
  // The node, slot and accelerator counts are kept incrementally by reconciler_ (as the phase
  // counts are): refreshing every gauge costs O(accelerator kinds), not a walk over every rank and
  // node (docs/benchmarks.md "Control plane at cluster scale").
  UpdateGauges(/*with_tenant_counts=*/false);
  return response;
}

std::map<std::string, std::set<int32_t>> Scheduler::HeldDevices(
    const std::string& job_id, const std::vector<std::string>& nodes) const {
  return reconciler_.HeldDevices(job_id, nodes);
}

loom::v1::RankAssignment Scheduler::StartAssignment(const JobRecord& job, int32_t rank) const {
  loom::v1::RankAssignment a;
  a.set_job_id(job.id);
  a.set_attempt(job.attempt);
  a.set_rank(rank);
  a.set_world_size(static_cast<int32_t>(job.rank_nodes.size()));
  *a.mutable_spec() = job.spec;
  auto node = nodes_.find(job.rank_nodes.at(0));
  a.set_master_addr(node == nodes_.end() ? job.rank_nodes.at(0) : NodeAddress(node->second));
  a.set_master_port(job.rendezvous_port);
  a.set_checkpoint_dir(job.checkpoint_dir);
  a.set_tenant(job.tenant);
  if (options_.confine_paths) {  // the worker judges the paths again by the tenant's own roots
    const PathPolicy policy = SubmissionPathPolicy();
    for (const std::string& root : policy.DataRoots(job.tenant)) a.add_tenant_data_roots(root);
    for (const std::string& root : policy.ScratchRoots(job.tenant)) {
      a.add_tenant_scratch_roots(root);
    }
    a.set_tenant_roots_set(true);
  }
  // Device binding (device_binding.h): the rank's own device and its place among the attempt's
  // ranks on its node.
  auto rt = reconciler_.ranks().find({job.id, rank});
  if (rt != reconciler_.ranks().end() && rt->second.device_index >= 0) {
    a.add_device_indices(rt->second.device_index);
  }
  const auto [local_rank, local_world_size] = LocalRank(job.rank_nodes, rank);
  a.set_local_rank(local_rank);
  a.set_local_world_size(local_world_size);
  if (job.attempt > 1) {
    auto r = resume_from_.find(job.id);
    if (r != resume_from_.end()) a.set_resume_from(r->second.path);
  }
  return a;
}

absl::Status Scheduler::AdvanceJob(const std::string& job_id) {
  const JobRecord& job = jobs_.at(job_id);
  if (IsTerminal(job.phase)) return absl::OkStatus();
  int total = 0, running_or_done = 0, succeeded = 0;
  const RankReconciler::RankMap& ranks = reconciler_.ranks();
  for (auto it = ranks.lower_bound({job_id, 0}); it != ranks.end() && it->first.first == job_id;
       ++it) {
    ++total;
    if (it->second.state == v1::RANK_STATE_SUCCEEDED) ++succeeded;
    if (it->second.state == v1::RANK_STATE_SUCCEEDED || it->second.state == v1::RANK_STATE_RUNNING) {
      ++running_or_done;
    }
  }
  if (total == 0 || total != static_cast<int>(job.rank_nodes.size())) return absl::OkStatus();
  if (succeeded == total) {
    return MarkSucceeded(job_id, absl::StrCat("all ", total, " ranks succeeded"));
  }
  if (running_or_done == total && job.phase == v1::JOB_PHASE_STARTING) {
    JobRecord updated = job;
    updated.phase = v1::JOB_PHASE_RUNNING;
    updated.state.set_ready_timeouts(0);  // the gang came up: backoff starts over
    updated.reason = "Running";
    updated.message = absl::StrCat("all ", total, " ranks running");
    RETURN_IF_ERROR(CommitJob(std::move(updated)));
  }
  return absl::OkStatus();
}

void Scheduler::RecordStepAdvance(const std::string& job_id, int64_t from_step,
                                  int64_t to_step) {
  reconciler_.RecordStepAdvance(job_id, from_step, to_step, clock_->Now());
}

absl::Status Scheduler::CheckHangs() {
  const absl::Time now = clock_->Now();
  std::vector<std::pair<std::string, std::string>> hung;  // (job id, message)
  for (const auto& [job_id, job_ptr] : jobs_.active()) {  // RUNNING jobs are among them
    const JobRecord& job = *job_ptr;
    if (job.phase != v1::JOB_PHASE_RUNNING) continue;
    const std::optional<absl::Time> last = reconciler_.LastStepAdvance(job_id);
    const double median_s = MedianStepSeconds(job_id);  // 0 until 3 steps were timed
    if (!last.has_value() || median_s <= 0) continue;
    const absl::Duration threshold =
        std::max(options_.hang_min_timeout, absl::Seconds(options_.hang_step_time_factor * median_s));
    const absl::Duration idle = AwakeTime(*last, now);  // an excused pause is no hang
    if (idle > threshold) {
      hung.emplace_back(job_id, absl::StrCat("no step progress for ",
                                             absl::FormatDuration(absl::Trunc(idle, absl::Seconds(1))),
                                             " after step ", job.progress.step(), " (limit ",
                                             absl::FormatDuration(absl::Trunc(threshold, absl::Seconds(1))),
                                             ", median step time ", absl::StrFormat("%.3f", median_s),
                                             " s)"));
    }
  }
  for (const auto& [job_id, message] : hung) {
    LOG(WARNING) << "job " << job_id << " hung: " << message;
    reconciler_.ForgetJob(job_id);
    RETURN_IF_ERROR(FailAttempt(job_id, v1::FAILURE_CLASS_INFRA, "Hang", message, ""));
  }
  return absl::OkStatus();
}

void Scheduler::ExcusePause(absl::Duration pause) {
  if (pause <= absl::ZeroDuration()) return;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (auto& [node_id, node] : nodes_) {
    if (node.lost) continue;
    node.last_heartbeat_time = std::min(now, node.last_heartbeat_time + pause);
  }
  pauses_.emplace_back(now, pause);
  if (pauses_.size() > 16) pauses_.pop_front();
  LOG(WARNING) << "the scheduler did not run for " << absl::FormatDuration(pause)
               << ": that time does not count against the workers' heartbeats, hang detection "
                  "or gang-ready timeouts";
}

absl::Duration Scheduler::AwakeTime(absl::Time since, absl::Time now) const {
  absl::Duration awake = now - since;
  for (const auto& [end, length] : pauses_) {
    const absl::Time from = std::max(since, end - length);
    const absl::Time to = std::min(now, end);
    if (to > from) awake -= to - from;
  }
  return std::max(awake, absl::ZeroDuration());
}

absl::Status Scheduler::CheckNodeLiveness() {
  const absl::Time now = clock_->Now();
  for (auto& [node_id, node] : nodes_) {
    // Not heard from since this scheduler started: at least the re-registration grace.
    const absl::Duration timeout =
        awaiting_reregistration_.count(node_id) > 0
            ? std::max(options_.heartbeat_timeout, options_.reregistration_grace)
            : options_.heartbeat_timeout;
    // Unreachable (missed heartbeats for heartbeat_timeout, not lost) takes no new ranks: a
    // change of that set is a change the admission pass must see.
    if (Unreachable(node, now)) admission_gate_.NoteUnreachable(node_id);
    if (node.lost || now - node.last_heartbeat_time <= timeout) continue;
    // Missed heartbeats alone do not make a node lost while a job with a rank on it is still
    // stepping (any of its ranks, reporting through another node, advanced within the timeout;
    // rank_progress.h): the gang's collectives cannot progress without that node's ranks, so
    // they are alive. The node is then "unreachable" (NodeInfo.unreachable): kept, but given no
    // new ranks until it heartbeats again.
    // Only the node's own ranks are visited (RankReconciler::SteppingJobOnNode).
    const std::string stepping_job =
        reconciler_.SteppingJobOnNode(node_id, now, options_.heartbeat_timeout).value_or("");
    if (!stepping_job.empty()) {
      LOG_EVERY_N(WARNING, 20) << "node " << node_id << " has not heartbeated for "
                               << absl::FormatDuration(now - node.last_heartbeat_time)
                               << " but job " << stepping_job
                               << " on it is still stepping; node unreachable, not lost";
      continue;
    }
    NodeRecord updated = node;
    updated.lost = true;
    RETURN_IF_ERROR(repository_->UpsertNode(updated));  // through the repository, as every write
    node = std::move(updated);
    admission_gate_.ForgetNode(node_id);
    NoteNodeChanged(node_id);
    const std::string message = absl::StrCat(
        "node ", node_id, " lost: no heartbeat for ",
        absl::FormatDuration(absl::Trunc(now - node.last_heartbeat_time, absl::Milliseconds(1))),
        " (timeout ", absl::FormatDuration(timeout), ")");
    LOG(WARNING) << message;
    std::set<std::string> affected;
    for (const RankKey& key : RanksOnNode(node_id)) {
      if (reconciler_.Find(key) == nullptr) continue;
      affected.insert(key.first);
      reconciler_.Erase(key);  // the node is gone, and so are its ranks
    }
    for (const std::string& job_id : affected) {
      // Rank 0 reports SUCCEEDED only after the trainers' final barrier, which every rank
      // reaches after writing its last checkpoint shard: the lost node's ranks had finished.
      auto rank0 = reconciler_.ranks().find({job_id, 0});
      if (rank0 != reconciler_.ranks().end() && rank0->second.state == v1::RANK_STATE_SUCCEEDED &&
          !IsTerminal(jobs_.at(job_id).phase) &&
          jobs_.at(job_id).phase != v1::JOB_PHASE_STOPPING) {
        RETURN_IF_ERROR(MarkSucceeded(
            job_id, absl::StrCat("training completed (rank 0 passed the final barrier of all ",
                                 jobs_.at(job_id).rank_nodes.size(), " ranks); ", message,
                                 " afterwards")));
        continue;
      }
      if (jobs_.at(job_id).phase == v1::JOB_PHASE_RECOVERING) {
        // The attempt already ended (typically a peer rank failing with a collective error when
        // this node died): name the lost node in the job's message and avoid it.
        JobRecord updated = jobs_.at(job_id);
        // Onto the failure message (the in-memory one may be a pending reason by now).
        updated.message = absl::StrCat(PhaseMessage(updated), "; then ", message,
                                       ": likely the cause");
        auto* history = updated.state.mutable_history();
        if (!history->empty() && history->rbegin()->phase() == updated.phase) {
          history->rbegin()->set_message(updated.message.substr(0, kMaxHistoryMessageBytes));
        }
        AddSuspect(&updated, node_id);
        RETURN_IF_ERROR(CommitJob(std::move(updated)));
        continue;
      }
      RETURN_IF_ERROR(FailAttempt(job_id, v1::FAILURE_CLASS_INFRA, "NodeLost", message, node_id));
    }
  }
  return absl::OkStatus();
}

}  // namespace loom
