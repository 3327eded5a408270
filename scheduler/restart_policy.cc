#include "scheduler/restart_policy.h"

#include <signal.h>
#include <string.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/trainer/exit_codes.h"

namespace loom {

RankExitClass ClassifyRankExit(const loom::v1::RankStatus& st, bool had_run) {
  RankExitClass out;
  if (st.term_signal() == 0 && st.exit_code() == kTrainerExitConfigError) {
    out.reason = "ConfigError";
    out.final = true;
    return out;
  }
  if (st.term_signal() == 0 && st.exit_code() == kTrainerExitDatasetError) {
    // The job's data set changed since it first started, or cannot hold the job's windows:
    // every attempt would fail the same way (or, worse, train on other data).
    out.reason = "DatasetError";
    out.final = true;
    return out;
  }
  if (st.term_signal() == 0 && st.exit_code() == kTrainerExitDataError) {
    out.reason = "DataError";
    out.failure_class = v1::FAILURE_CLASS_INFRA;
    return out;
  }
  const std::string error = absl::AsciiStrToLower(st.error());
  // Exit status 137 (SIGKILL) is the OOM killer's only where the worker could not tell
  // (worker/oom_kill.h): an operator's `kill -9` was counted as "oom" (issue 53).
  const bool oom_killed =
      st.oom_kill() == v1::OOM_KILL_YES ||
      (st.oom_kill() == v1::OOM_KILL_UNKNOWN && st.exit_code() == 137);
  if (absl::StrContains(error, "out of memory") || oom_killed) {
    out.failure_class = v1::FAILURE_CLASS_OOM;
  } else if (!had_run && (st.exit_code() == 126 || st.exit_code() == 127 ||
                          absl::StrContains(error, "rendezvous"))) {
    out.failure_class = v1::FAILURE_CLASS_SETUP;
  }
  return out;
}

std::string RankExitMessage(int32_t rank, const std::string& node_id,
                            const loom::v1::RankStatus& st) {
  std::string msg = absl::StrCat("rank ", rank, " on node ", node_id, " exited with code ",
                                 st.exit_code());
  if (st.term_signal() > 0) {
    const char* name = sigabbrev_np(st.term_signal());
    absl::StrAppend(&msg, " (killed by signal ", st.term_signal(),
                    name != nullptr ? absl::StrCat(", SIG", name) : "",
                    st.oom_kill() == v1::OOM_KILL_YES  ? ", by the kernel's OOM killer"
                    : st.oom_kill() == v1::OOM_KILL_NO ? ", not by the OOM killer"
                                                       : "",
                    ")");
  }
  if (st.state() == v1::RANK_STATE_STOPPED) absl::StrAppend(&msg, " (stopped unrequested)");
  if (st.exit_code() == kTrainerExitConfigError && st.term_signal() == 0) {
    absl::StrAppend(&msg, " (configuration error)");
  } else if (st.exit_code() == kTrainerExitDataError && st.term_signal() == 0) {
    absl::StrAppend(&msg, " (data error)");
  } else if (st.exit_code() == kTrainerExitDatasetError && st.term_signal() == 0) {
    absl::StrAppend(&msg, " (dataset error)");
  }
  if (!st.error().empty()) absl::StrAppend(&msg, ": ", st.error());
  return msg;
}

bool SawPeerGoAway(const loom::v1::RankStatus& st) {
  const std::string error = absl::AsciiStrToLower(st.error());
  for (const char* symptom : {"closed by peer", "reset by peer", "connection closed",
                              "connection reset", "broken pipe", "peer closed"}) {
    if (absl::StrContains(error, symptom)) return true;
  }
  return false;
}

int CauseScore(const loom::v1::RankStatus& st) {
  if (st.term_signal() > 0) return 0;
  return SawPeerGoAway(st) ? 2 : 1;
}

bool IsLikelierCause(const loom::v1::RankStatus& candidate, const loom::v1::RankStatus& blamed) {
  const int a = CauseScore(candidate), b = CauseScore(blamed);
  if (a != b) return a < b;
  return candidate.exit_time_us() > 0 && blamed.exit_time_us() > 0 &&
         candidate.exit_time_us() < blamed.exit_time_us();
}

absl::Duration ExponentialBackoff(int32_t k, absl::Duration base, absl::Duration cap) {
  absl::Duration backoff = base;
  for (int32_t i = 1; i < k && backoff < cap; ++i) backoff *= 2;
  return std::min(backoff, cap);
}

void AppendHistory(loom::internal::JobSchedulingState* state, absl::Time time,
                   loom::v1::JobPhase phase, const std::string& reason, const std::string& message,
                   int32_t attempt) {
  loom::internal::JobHistoryEntry* e = state->add_history();
  e->set_time_us(absl::ToUnixMicros(time));
  e->set_phase(phase);
  e->set_reason(reason);
  e->set_message(message.size() <= kMaxHistoryMessageBytes
                     ? message
                     : absl::StrCat(message.substr(0, kMaxHistoryMessageBytes), "..."));
  e->set_attempt(attempt);
  const int excess = state->history_size() - kMaxJobHistory;
  if (excess > 0) state->mutable_history()->DeleteSubrange(0, excess);
}

}  // namespace loom
