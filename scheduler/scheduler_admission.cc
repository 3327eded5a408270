// The Scheduler facade's side of the admission cycle: builds the ClusterSnapshot from its state
// (under its lock), runs the pure cycle (admission_cycle.h) and applies the decisions in order
// (StartAttempt, RequeueJob, pending reasons); also the gang-ready timeouts (CheckReadyTimeouts).
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "scheduler/admission_cycle.h"
#include "scheduler/cluster_snapshot.h"
#include "scheduler/record_helpers.h"
#include "scheduler/restart_policy.h"
#include "scheduler/scheduler.h"

#include "scheduler/device_binding.h"
#include "scheduler/scheduler_internal.h"

namespace loom {

ClusterSnapshot Scheduler::BuildSnapshot(std::vector<JobRecord*>* waiting_records) {
  ClusterSnapshot s;
  s.now = clock_->Now();
  if (node_pool_ == nullptr || node_pool_changes_ != admission_gate_.node_changes()) {
    std::vector<PoolNode> nodes;
    nodes.reserve(nodes_.size());
    for (const auto& [node_id, node] : nodes_) {
      PoolNode p;
      p.id = node_id;
      p.inventory = node.inventory;
      p.live = !node.lost;
      p.cordoned = node.admin.cordoned() || node.admin.draining();
      // An unreachable node is kept for its stepping ranks only: no new ranks until it
      // heartbeats. The gate's set (CheckNodeLiveness marks it at the start of each cycle, a
      // heartbeat clears it), so that the pool is rebuilt whenever it changes.
      p.schedulable = p.live && !p.cordoned && !admission_gate_.IsUnreachable(node_id);
      nodes.push_back(std::move(p));
    }
    node_pool_ = std::make_shared<const NodePool>(std::move(nodes));
    node_pool_changes_ = admission_gate_.node_changes();
  }
  s.pool = node_pool_;
  const RankReconciler::RankMap& ranks = reconciler_.ranks();
  s.ranks.reserve(ranks.size());
  const std::string* last_job = nullptr;
  for (const auto& [key, rt] : ranks) {
    s.ranks.push_back({key.first, rt.node_id, RankEnded(rt.state), rt.stop_requested});
    if (last_job != nullptr && *last_job == key.first) continue;
    last_job = &key.first;
    auto j = jobs_.find(key.first);
    if (j == jobs_.end()) continue;
    s.placed.emplace_hint(s.placed.end(), key.first,
                          ClusterSnapshot::PlacedJob{&j->second, MedianStepSeconds(key.first)});
  }
  s.waiting.reserve(jobs_.waiting().size());
  waiting_records->clear();
  waiting_records->reserve(jobs_.waiting().size());
  for (const auto& [job_id, entry] : jobs_.waiting()) {  // id order, as jobs_
    waiting_records->push_back(entry.record);
    ClusterSnapshot::WaitingJob w = entry.keys;  // the keys only: no read of the record
    if (w.attempt >= 1) {
      auto it = prefetched_resume_.find(job_id);
      if (it == prefetched_resume_.end()) {
        w.resume_unavailable = "lookup in progress (the checkpoint catalog has not answered yet)";
      } else if (!it->second.ok() && !absl::IsNotFound(it->second.status())) {
        w.resume_unavailable = std::string(it->second.status().message());
      }
    }
    s.waiting.push_back(std::move(w));
  }
  return s;
}

absl::Status Scheduler::PlacePendingJobs(int max_jobs, CyclePhases* phases) {
  PhaseClock timer;
  AdmissionOptions options;
  options.queues = &options_.queues;
  options.enable_preemption = options_.enable_preemption;
  options.enable_backfill = options_.enable_backfill;
  options.max_jobs = max_jobs;
  const absl::Time now = clock_->Now();
  std::vector<JobRecord*> waiting_records;  // parallel to snapshot.waiting
  const ClusterSnapshot snapshot = BuildSnapshot(&waiting_records);
  phases->snapshot = timer.Lap();
  AdmissionResult result = RunAdmissionCycle(snapshot, options);
  phases->decide = timer.Lap();
  // Before the decisions are applied: their own changes (placements, preemptions) make the next
  // cycle look once more.
  NoteAdmissionPass(max_jobs == 0 ? AdmissionPassStats::Kind::kFull
                                  : AdmissionPassStats::Kind::kPartial,
                    snapshot, result.considered, now);
  queue_order_ = std::move(result.queue_order);
  // Outcomes counted here and added once per pass (a full pass decides about every waiting job),
  // also when applying a decision fails part-way.
  std::map<std::string, int64_t> outcomes;
  absl::Cleanup count_outcomes = [&] {
    if (metrics_ != nullptr) {
      for (const auto& [outcome, count] : outcomes) metrics_->AdmissionAttempts(outcome, count);
    }
    phases->apply = timer.Lap();
  };
  for (AdmissionDecision& d : result.decisions) {
    switch (d.kind) {
      case AdmissionDecision::Kind::kStart: {
        absl::StatusOr<bool> started = StartAttempt(d.job_id, d.nodes);
        RETURN_IF_ERROR(started.status());
        if (!*started) continue;
        break;
      }
      case AdmissionDecision::Kind::kPreempt:
        RETURN_IF_ERROR(RequeueJob(d.job_id, d.reason, d.message, /*preempted=*/true));
        break;
      case AdmissionDecision::Kind::kWait:
        if (d.reason == "CheckpointsUnavailable") {
          // As a start that found no resume answer: the attempt's bookkeeping is reset.
          resume_from_.erase(d.job_id);
          blame_.erase(d.job_id);
        }
        if (!d.unchanged) {
          SetPendingReason(*waiting_records[d.waiting], std::move(d.reason), std::move(d.message));
        }
        break;
    }
    if (!d.outcome.empty()) ++outcomes[d.outcome];
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Scheduler::StartAttempt(const std::string& job_id,
                                             const std::vector<std::string>& placement) {
  const JobRecord& job = jobs_.at(job_id);
  const int need = static_cast<int>(placement.size());
  JobRecord updated = job;
  updated.phase = v1::JOB_PHASE_STARTING;
  updated.attempt = job.attempt + 1;
  updated.rank_nodes = placement;
  updated.rendezvous_port = 0;
  updated.reason = "Starting";
  updated.failure_class = v1::FAILURE_CLASS_UNSPECIFIED;
  updated.state.set_attempt_start_us(absl::ToUnixMicros(clock_->Now()));
  updated.state.set_not_before_us(0);
  updated.message = absl::StrCat("attempt ", updated.attempt, ": ", need,
                                 " ranks placed; waiting for rank 0's rendezvous port");
  resume_from_.erase(job_id);
  blame_.erase(job_id);  // a new attempt: earlier failures are settled
  if (updated.attempt > 1) {
    absl::StatusOr<CommittedCheckpoint> newest = PrefetchedResume(job_id);
    if (!newest.ok() && !absl::IsNotFound(newest.status())) {
      // Never restart from scratch because the catalog could not answer: try next cycle.
      SetPendingReason(
          jobs_.at(job_id), "CheckpointsUnavailable",
          absl::StrCat("cannot find the newest committed checkpoint to resume from: ",
                       newest.status().message()));
      return false;
    }
    if (newest.ok()) resume_from_[job_id] = *newest;
    if (newest.ok()) {
      // The job is back at the checkpoint until the attempt reports: the steps after it are
      // lost (issue 53's operator pass: an attempt resumed from its final step had nothing to
      // report, and the job ended SUCCEEDED showing the step before the restart, 491 of 2000).
      updated.progress.set_step(newest->step);
      updated.progress.set_last_checkpoint_step(newest->step);
      absl::StrAppend(&updated.message, " (resuming from ", newest->path,
                      newest->skipped.empty() ? "" : absl::StrCat("; ", newest->skipped,
                                                                  ": marked corrupt"),
                      ")");
    } else if (absl::StrContains(newest.status().message(), "skipped step")) {
      absl::StrAppend(&updated.message, " (", newest.status().message(), ": starting over)");
    } else {
      absl::StrAppend(&updated.message, " (no committed checkpoint: starting over)");
    }
    if (job.phase == v1::JOB_PHASE_RECOVERING) {
      absl::StrAppend(&updated.message, ". Previously: ", PhaseMessage(job));  // why it restarted
    }
  }
  if (updated.start_time == absl::InfinitePast()) updated.start_time = clock_->Now();
  {
    // Device binding (device_binding.h): each rank its own device of its node.
    std::map<std::string, std::vector<int32_t>> devices;
    for (const std::string& node_id : placement) {
      auto n = nodes_.find(node_id);
      if (n == nodes_.end() || devices.count(node_id)) continue;
      for (const auto& d : n->second.inventory.devices()) devices[node_id].push_back(d.index());
    }
    absl::StatusOr<std::vector<int32_t>> bound =
        BindDevices(placement, devices, HeldDevices(job_id, placement));
    if (!bound.ok()) {
      SetPendingReason(jobs_.at(job_id), "DevicesUnavailable", std::string(bound.status().message()));
      return false;
    }
    updated.state.clear_rank_device_indices();
    for (int32_t index : *bound) updated.state.add_rank_device_indices(index);
  }
  RETURN_IF_ERROR(CommitJob(std::move(updated)));
  reconciler_.ForgetLastStepAdvance(job_id);  // the new attempt's first report gives no interval
  const JobRecord& placed = jobs_.at(job_id);
  for (int32_t rank = 0; rank < need; ++rank) {
    RankRuntime rt;
    rt.attempt = placed.attempt;
    rt.node_id = placement[rank];
    rt.device_index = placed.state.rank_device_indices(rank);
    PutRank({job_id, rank}, rt);
  }
  VLOG(1) << "job " << job_id << " attempt " << placed.attempt << " placed: rank 0 on "
          << placement[0] << ", " << need << " ranks";
  return true;
}

absl::Status Scheduler::RequeueJob(const std::string& job_id, const std::string& reason,
                                   const std::string& message, bool preempted) {
  const JobRecord& job = jobs_.at(job_id);
  if (job.phase != v1::JOB_PHASE_STARTING && job.phase != v1::JOB_PHASE_RUNNING) {
    return absl::OkStatus();
  }
  JobRecord updated = job;
  updated.phase = v1::JOB_PHASE_PENDING;
  updated.reason = reason;
  updated.message = message;
  updated.failure_class = preempted ? v1::FAILURE_CLASS_PREEMPTED : v1::FAILURE_CLASS_UNSPECIFIED;
  if (preempted) updated.state.set_preemptions(updated.state.preemptions() + 1);
  updated.state.set_attempt_start_us(0);
  RETURN_IF_ERROR(CommitJob(std::move(updated)));
  if (preempted && metrics_ != nullptr) metrics_->JobRestarted(v1::FAILURE_CLASS_PREEMPTED);
  LOG(WARNING) << "job " << job_id << " requeued (" << reason << "): " << message;
  reconciler_.ForgetAttemptSteps(job_id);  // rank 0's last advance and every rank's steps
  StopLiveRanks(job_id, /*graceful=*/false);
  return absl::OkStatus();
}

absl::Status Scheduler::CheckReadyTimeouts() {
  const absl::Time now = clock_->Now();
  std::vector<std::string> expired;
  for (const auto& [job_id, job] : jobs_.active()) {  // STARTING jobs are among them
    if (job->phase != v1::JOB_PHASE_STARTING || job->state.attempt_start_us() <= 0) continue;
    // An excused pause of the scheduler itself does not count (ExcusePause).
    if (AwakeTime(absl::FromUnixMicros(job->state.attempt_start_us()), now) >
        options_.ready_timeout) {
      expired.push_back(job_id);
    }
  }
  for (const std::string& job_id : expired) {
    JobRecord& job = jobs_.at(job_id);
    const int32_t k = job.state.ready_timeouts() + 1;
    const absl::Duration backoff =
        ExponentialBackoff(k, options_.ready_backoff_base, options_.ready_backoff_cap);
    // Persisted by FailAttempt's commit below.
    job.state.set_ready_timeouts(k);
    job.state.set_not_before_us(absl::ToUnixMicros(now + backoff));
    int running = 0;
    std::string suspect;
    std::vector<std::string> not_running;
    const RankReconciler::RankMap& ranks = reconciler_.ranks();
    for (auto it = ranks.lower_bound({job_id, 0}); it != ranks.end() && it->first.first == job_id;
         ++it) {
      if (it->second.state == v1::RANK_STATE_RUNNING ||
          it->second.state == v1::RANK_STATE_SUCCEEDED) {
        ++running;
      } else {
        if (suspect.empty()) suspect = it->second.node_id;
        if (not_running.size() < 4) {
          not_running.push_back(absl::StrCat("rank ", it->first.second, " on ", it->second.node_id));
        }
      }
    }
    const std::string message = absl::StrCat(
        "only ", running, " of ", job.rank_nodes.size(), " ranks running ",
        absl::FormatDuration(options_.ready_timeout), " after placement (not running: ",
        absl::StrJoin(not_running, ", "), "); gang-ready timeout ", k, ", next attempt not before ",
        Utc(now + backoff), " (backoff ", absl::FormatDuration(backoff), ")");
    LOG(WARNING) << "job " << job_id << ": " << message;
    RETURN_IF_ERROR(FailAttempt(job_id, v1::FAILURE_CLASS_INFRA, "ReadyTimeout", message, suspect));
  }
  return absl::OkStatus();
}

}  // namespace loom
