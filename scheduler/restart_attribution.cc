// Scheduler: failure attribution across ranks of one attempt (restart_policy.h). Kept apart from
// scheduler.cc; runs under the scheduler's lock like the heartbeat that calls it.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "scheduler/job_state.h"
#include "scheduler/restart_policy.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_internal.h"

namespace loom {
void Scheduler::RecordBlame(const std::string& job_id, int32_t attempt,
                            const loom::v1::RankStatus& st, const std::string& node_id,
                            const std::string& cause_text, loom::v1::FailureClass failure_class) {
  auto job = jobs_.find(job_id);
  // Only when this report ended the attempt (a job already RECOVERING for another reason, or
  // stopping, keeps its attribution).
  if (job == jobs_.end() || job->second.attempt != attempt ||
      (job->second.phase != v1::JOB_PHASE_RECOVERING && job->second.phase != v1::JOB_PHASE_FAILED) ||
      blame_.count(job_id) > 0) {
    return;
  }
  Blame b;
  b.attempt = attempt;
  b.status = st;
  b.status.clear_log_lines();
  b.node_id = node_id;
  b.cause_text = cause_text;
  b.failure_class = failure_class;
  blame_[job_id] = std::move(b);
}

absl::Status Scheduler::ReconsiderBlame(const loom::v1::RankStatus& st,
                                        const std::string& node_id) {
  auto b = blame_.find(st.job_id());
  auto job_it = jobs_.find(st.job_id());
  if (b == blame_.end() || job_it == jobs_.end() || b->second.attempt != st.attempt() ||
      job_it->second.attempt != st.attempt() ||
      (job_it->second.phase != v1::JOB_PHASE_RECOVERING &&
       job_it->second.phase != v1::JOB_PHASE_FAILED) ||
      (b->second.status.rank() == st.rank() && b->second.node_id == node_id)) {
    return absl::OkStatus();
  }
  if (!IsLikelierCause(st, b->second.status)) return absl::OkStatus();
  Blame& blame = b->second;
  JobRecord updated = job_it->second;
  const loom::v1::FailureClass cls = ClassifyRankExit(st, /*had_run=*/true).failure_class;
  // The budget the restart is charged to, before and after re-attribution.
  auto max_restarts_of = [&](bool infra) {
    return infra ? (!updated.spec.has_max_infra_restarts() || updated.spec.max_infra_restarts() < 0
                        ? options_.default_max_infra_restarts
                        : updated.spec.max_infra_restarts())
                 : updated.spec.max_restarts();
  };
  const bool was_infra = IsInfraClass(blame.failure_class);
  const std::string old_note = RestartNote(
      was_infra, was_infra ? updated.state.infra_restarts() : updated.state.user_restarts(),
      max_restarts_of(was_infra));
  const std::string cause = RankExitMessage(st.rank(), node_id, st);
  const std::string combined = absl::StrCat(
      cause, " (likely the cause: ",
      st.term_signal() > 0 ? "killed by a signal"
      : CauseScore(st) < CauseScore(blame.status)
          ? "its own error, while the other only saw a peer go away"
          : "it exited first",
      "); rank ", blame.status.rank(), " on node ", blame.node_id,
      " reported first: ", blame.cause_text.substr(0, 1024));
  const bool infra = IsInfraClass(cls);
  if (updated.phase == v1::JOB_PHASE_RECOVERING && infra != was_infra) {
    // Charge the restart to the budget of the real cause.
    if (infra) {
      updated.state.set_user_restarts(std::max(0, updated.state.user_restarts() - 1));
      updated.state.set_infra_restarts(updated.state.infra_restarts() + 1);
    } else {
      updated.state.set_infra_restarts(std::max(0, updated.state.infra_restarts() - 1));
      updated.state.set_user_restarts(updated.state.user_restarts() + 1);
    }
  }
  updated.failure_class = cls;
  const int32_t max_restarts = max_restarts_of(infra);
  const int32_t used = infra ? updated.state.infra_restarts() : updated.state.user_restarts();
  const bool over_budget = updated.phase == v1::JOB_PHASE_RECOVERING && used > max_restarts;
  // The message and the history entry that FailAttempt wrote (which WatchJob's events and
  // GetJob show) name the cause and the budget charged: both follow the re-attribution, so that
  // they say what the record's counters say.
  std::vector<std::pair<std::string, std::string>> rewrites = {{blame.cause_text, combined}};
  if (updated.phase == v1::JOB_PHASE_RECOVERING && !over_budget) {
    rewrites.emplace_back(absl::StrCat("(", old_note, ")"),
                          absl::StrCat("(", RestartNote(infra, used, max_restarts), ")"));
  }
  updated.message = absl::StrReplaceAll(updated.message, rewrites);
  auto* history = updated.state.mutable_history();
  if (!history->empty() && history->rbegin()->attempt() == updated.attempt &&
      history->rbegin()->phase() == updated.phase) {
    history->rbegin()->set_message(absl::StrReplaceAll(history->rbegin()->message(), rewrites));
    // A waiting job's in-memory message may be a pending reason by now: restore the failure.
    if (updated.phase == v1::JOB_PHASE_RECOVERING) updated.message = history->rbegin()->message();
  }
  bool known = false;
  for (const std::string& n : updated.state.suspect_nodes()) known |= n == node_id;
  if (!known && !node_id.empty()) updated.state.add_suspect_nodes(node_id);
  LOG(WARNING) << "job " << st.job_id() << " attempt " << st.attempt() << ": failure re-attributed: "
               << combined;
  blame.status = st;
  blame.status.clear_log_lines();
  blame.node_id = node_id;
  blame.cause_text = combined;
  blame.failure_class = cls;
  if (over_budget) {
    // The real cause's budget has no restart left: the job ends as it would have at once.
    updated.state.set_user_restarts(infra ? updated.state.user_restarts()
                                          : updated.state.user_restarts() - 1);
    updated.state.set_infra_restarts(infra ? updated.state.infra_restarts() - 1
                                           : updated.state.infra_restarts());
    RETURN_IF_ERROR(CommitJob(std::move(updated)));
    return EndJob(st.job_id(), v1::JOB_PHASE_FAILED, cls, "RankFailed",
                  absl::StrCat(combined, " (attempt ", st.attempt(), "; all ", max_restarts, " ",
                               infra ? "infra" : "user", " restarts used)",
                               ResumeHint(jobs_.at(st.job_id()))));
  }
  return CommitJob(std::move(updated));
}

}  // namespace loom
