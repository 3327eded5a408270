// Whether a scheduling cycle runs an admission pass, and how deep (docs/scheduling.md "Admission
// passes"). Pure bookkeeping: no store, no clock (the caller passes `now`), no lock.
//
//   * Skip: a pass reads the job records (NoteJobChanged), the rank table (the reconciler's
//     generation, passed to Choose), the nodes (NoteNodeChanged, and reachability:
//     NoteUnreachable / NoteReachable), the resume answers of the waiting jobs (summarized by
//     ResumeSummary) and the clock (backoff expiries, NotePass). When none of them changed since
//     the last pass and no backoff expired, the pass would decide what the last one did: Choose
//     answers kSkipped.
//   * Depth: a pass decides about the first `queue_depth` waiting jobs in queue order (Slurm's
//     default_queue_depth; 0 = all); a full pass runs at most every `full_interval` (Slurm's
//     sched_interval), and also without a change when the last pass left jobs unconsidered.
//
// Thread-safety: none of its own; the Scheduler calls it under its mu_.
#ifndef LOOM_SCHEDULER_ADMISSION_PASS_GATE_H_
#define LOOM_SCHEDULER_ADMISSION_PASS_GATE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace loom {

// What an admission pass did: kSkipped (nothing it reads changed: no placement, no snapshot),
// kPartial (the first queue_depth waiting jobs in queue order) or kFull (every waiting job);
// kNone before the first cycle. `considered`: waiting jobs the pass decided about; `waiting`:
// waiting jobs at the time (in the snapshot, or indexed when skipped).
struct AdmissionPassStats {
  enum class Kind { kNone, kSkipped, kPartial, kFull };
  Kind kind = Kind::kNone;
  int considered = 0;
  int waiting = 0;
};

class AdmissionPassGate {
 public:
  // `queue_depth` >= 0 (0: every pass is full); `full_interval` >= 0 (both checked by
  // SchedulerOptions validation, not here).
  AdmissionPassGate(int queue_depth, absl::Duration full_interval)
      : queue_depth_(queue_depth), full_interval_(full_interval) {}

  // A job record changed (a commit, a submission).
  void NoteJobChanged() { ++job_changes_; }
  // A node was registered, cordoned, drained, lost or otherwise changed.
  void NoteNodeChanged() { ++node_changes_; }
  // `node_id` missed its heartbeats but is kept (it takes no new ranks): a change the first time
  // it is marked; true then.
  bool NoteUnreachable(const std::string& node_id);
  // `node_id` was heard from: a change if it was unreachable (it may take new ranks again); true
  // then.
  bool NoteReachable(const std::string& node_id);
  // `node_id` was declared lost: leaves the unreachable set without a change of its own (the
  // caller notes the node's change).
  void ForgetNode(const std::string& node_id) { unreachable_.erase(node_id); }
  // All node state reloaded (Resync): no node unreachable, and a node change.
  void ResetNodes();
  bool IsUnreachable(const std::string& node_id) const { return unreachable_.count(node_id) > 0; }
  // Node changes so far (NoteNodeChanged, a change of the unreachable set, ResetNodes): while it
  // stays the same, a pool built from the nodes and IsUnreachable stays valid.
  uint64_t node_changes() const { return node_changes_; }

  // What the gate makes of a waiting job's resume lookup: "" when known (ok, or NOT_FOUND: no
  // checkpoint), else the error's message (a change of it is a change the pass must see).
  static std::string ResumeSummary(const absl::Status& answer);

  // The kind of this cycle's pass at `now`, given the rank table's generation and the waiting
  // jobs' resume summaries (job id -> ResumeSummary). Remembers these inputs for NotePass.
  AdmissionPassStats::Kind Choose(uint64_t rank_generation,
                                  std::map<std::string, std::string> resume, absl::Time now);
  // After a pass of `kind` (kPartial or kFull) chosen by the last Choose: it decided about
  // `considered` of `waiting` jobs; `not_before` holds the waiting jobs' backoff expiries
  // (absl::InfinitePast() or any time <= now for none): the earliest one after `now` wakes the
  // next pass.
  void NotePass(AdmissionPassStats::Kind kind, int considered, int waiting,
                const std::vector<absl::Time>& not_before, absl::Time now);
  // After a skipped cycle with `waiting` jobs waiting.
  void NoteSkipped(int waiting) {
    last_pass_ = AdmissionPassStats{AdmissionPassStats::Kind::kSkipped, 0, waiting};
  }

  const AdmissionPassStats& last_pass() const { return last_pass_; }

 private:
  struct Inputs {
    uint64_t jobs = 0, nodes = 0, ranks = 0;
    std::map<std::string, std::string> resume;  // job id -> ResumeSummary
    bool operator==(const Inputs& o) const {
      return jobs == o.jobs && nodes == o.nodes && ranks == o.ranks && resume == o.resume;
    }
  };

  const int queue_depth_;
  const absl::Duration full_interval_;
  uint64_t job_changes_ = 0;
  uint64_t node_changes_ = 0;
  std::set<std::string> unreachable_;
  std::optional<Inputs> last_inputs_;  // what the last pass saw
  Inputs next_inputs_;                 // computed by Choose
  absl::Time next_wake_ = absl::InfiniteFuture();
  absl::Time last_full_pass_ = absl::InfinitePast();
  bool last_pass_cut_off_ = false;
  AdmissionPassStats last_pass_;
};

}  // namespace loom

#endif  // LOOM_SCHEDULER_ADMISSION_PASS_GATE_H_
