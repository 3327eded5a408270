// File: scheduler/job_table.h
//
// The scheduler's job records by id, with every index and count kept in step with them
// (issue 49: they were thirteen loose members of the Scheduler facade, each kept in step by hand
// at four call sites):
//   * submission order (sequence -> id: ListJobs, ListJobsPage, queue positions),
//   * request id -> job id (SubmitJob's idempotency),
//   * the active jobs (not ended, and placed at least once: the cycle's hang, ready-timeout and
//     resume checks visit only these) and the waiting jobs (PENDING or RECOVERING: what the
//     admission cycle orders), so a cycle's cost follows the live jobs, not every job ever
//     submitted,
//   * jobs per phase and per (tenant, queue, phase) (the gauges, the tenants' unfinished-job
//     limit) without a walk over the history,
//   * the submissions being committed (ids, request ids and tenants handed out but not yet in
//     the table: job_repository.h's group commit).
//
// Records are inserted only through Add (a record new to the table) and Replace (its next
// stored version); both refresh the indexes and counts. The map-like accessors (find, at, begin,
// end) give the records themselves: a caller may change a record in place only in fields no index
// keys on (reason, message, progress, state); a change of phase or attempt goes through Replace.
//
// Not thread-safe: the Scheduler guards it with its mutex. Pointers into the table (active(),
// waiting()) stay valid until Clear(): records are never erased one by one.
#ifndef LOOM_SCHEDULER_JOB_TABLE_H_
#define LOOM_SCHEDULER_JOB_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "proto/common.pb.h"
#include "scheduler/cluster_snapshot.h"
#include "storage/job_store.h"

namespace loom {

class JobTable {
 public:
  using Records = std::map<std::string, JobRecord>;  // by id
  // (tenant, queue, phase) -> jobs.
  using TenantCounts = std::map<std::tuple<std::string, std::string, loom::v1::JobPhase>, int>;
  // A waiting job's record and the keys the admission cycle orders it by (taken from the record
  // at its Add or Replace). `record` is `keys.job` with write access: the snapshot hands the
  // cycle the const keys, the scheduler applies the decisions through `record`.
  struct WaitingEntry {
    JobRecord* record;
    ClusterSnapshot::WaitingJob keys;
  };

  // Record access by id, as a std::map's.
  Records::iterator find(const std::string& id) { return records_.find(id); }
  Records::const_iterator find(const std::string& id) const { return records_.find(id); }
  Records::iterator begin() { return records_.begin(); }
  Records::iterator end() { return records_.end(); }
  Records::const_iterator begin() const { return records_.begin(); }
  Records::const_iterator end() const { return records_.end(); }
  size_t size() const { return records_.size(); }
  size_t count(const std::string& id) const { return records_.count(id); }
  // std::out_of_range for an unknown id, as std::map::at.
  JobRecord& at(const std::string& id) { return records_.at(id); }
  const JobRecord& at(const std::string& id) const { return records_.at(id); }

  // Adds a stored record that is new to the table (loaded at start, or a committed submission):
  // indexed, counted in its phase, and the next sequence moves past its sequence. A record with
  // an id already in the table replaces it (as Replace).
  JobRecord& Add(JobRecord job);
  // Replaces the record of job.id (added if absent) with its next version: its counts move from
  // the old phase to the new one, and the active/waiting indexes follow the new phase and
  // attempt. Returns the stored record.
  JobRecord& Replace(JobRecord job);
  // Forgets every record, index and count (the scheduler reloads from the store after a failed
  // write). Keeps the next sequence and the submissions in flight: what was handed out to
  // submissions still being committed must not be handed out again.
  void Clear();

  // The job submitted with `request_id`, or nullptr.
  const JobRecord* FindByRequest(const std::string& request_id) const;
  // Ids in submission order (sequence -> id).
  const std::map<int64_t, std::string>& order() const { return order_; }
  // Jobs not ended and placed at least once (attempt > 0 or not PENDING), by id.
  const std::map<std::string, JobRecord*>& active() const { return active_; }
  // Jobs waiting for a placement (record_helpers.h Waiting: PENDING or RECOVERING), by id.
  const std::map<std::string, WaitingEntry>& waiting() const { return waiting_; }
  const std::map<loom::v1::JobPhase, int>& phase_counts() const { return phase_counts_; }
  const TenantCounts& tenant_counts() const { return tenant_counts_; }
  // Counts phase changes (and additions): a reader that caches something derived from the phase
  // counts compares it with the value it saw.
  uint64_t phase_changes() const { return phase_changes_; }
  // Jobs of `tenant` in a non-terminal phase, plus its submissions in flight.
  int64_t UnfinishedJobs(const std::string& tenant) const;

  // Submissions being committed. BeginSubmission reserves `id` and `request_id` (may be empty)
  // for `tenant` and returns the job's sequence; EndSubmission releases them once the commit
  // ended (Add the record first if it was stored).
  int64_t BeginSubmission(const std::string& id, const std::string& request_id,
                          const std::string& tenant);
  void EndSubmission(const JobRecord& job);
  // Whether `id` names a job in the table or a submission in flight (a new id must not).
  bool IdTaken(const std::string& id) const;
  // Whether a submission with `request_id` is being committed.
  bool RequestInFlight(const std::string& request_id) const;

 private:
  void Index(JobRecord* job);
  void Count(const JobRecord& job, loom::v1::JobPhase phase, int delta);

  Records records_;
  std::map<int64_t, std::string> order_;
  std::map<std::string, std::string> by_request_;
  std::map<std::string, JobRecord*> active_;
  std::map<std::string, WaitingEntry> waiting_;
  std::map<loom::v1::JobPhase, int> phase_counts_;
  TenantCounts tenant_counts_;
  uint64_t phase_changes_ = 0;
  int64_t next_sequence_ = 1;
  std::set<std::string> inflight_ids_;
  std::set<std::string> inflight_requests_;
  std::map<std::string, int> inflight_by_tenant_;
};

}  // namespace loom

#endif  // LOOM_SCHEDULER_JOB_TABLE_H_
