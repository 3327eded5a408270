// File: scheduler/job_repository.h
//
// The scheduler's durable state (docs/design/DESIGN.md "A job's path", step 2): every read and
// write of the JobStore the Scheduler makes goes through a JobRepository, and new jobs are
// group-committed here. Moved out of scheduler.cc / scheduler_submit.cc (issue 16, "the scheduler
// core in named pieces"); the Scheduler stays the facade holding its own lock.
//
// Group commit (as databases batch commits behind one log flush; e.g. PostgreSQL's
// commit_delay, or the "group commit" of DeWitt et al., "Implementation Techniques for Main
// Memory Database Systems", SIGMOD 1984, section 4): Submit() queues a job record and returns at
// once; one commit thread takes every record queued so far and stores them with one
// JobStore::CreateJobs call (one transaction, one fsync with SqliteJobStore's synchronous=FULL),
// then calls the BatchListener with the batch and its status, then each submission's Done. A
// submission is therefore acknowledged (Done with OK) only after its batch is durable, and the
// listener has adopted the batch before any submitter hears back. While a batch is being written
// new submissions queue for the next one, so the batch size grows with the offered load and no
// caller's thread (e.g. a gRPC callback thread) waits on the disk. (A second thread for the
// listener and the replies, overlapping them with the next batch's fsync, was measured and not
// kept: batches got smaller -- 1.6 jobs instead of 2.2 under 8 closed-loop clients -- and the
// throughput did not change; docs/benchmarks.md "Control plane".)
//
// Joining a batch: a caller may announce a submission before its record exists
// (StartPreparing(), e.g. before validating a spec) and ends the announcement after Submit() or
// on giving up (FinishPreparing(); PreparingScope does both). When the commit thread finds work,
// it first waits -- at most `join_wait` -- for every submission that was announced at that
// moment to be queued or abandoned, so submissions already inside the daemon share the
// transaction instead of each waiting for the next fsync. Like PostgreSQL's commit_delay with
// commit_siblings, but it waits only for submissions already in flight, never for ones that
// have not started, so an idle or lightly loaded daemon commits at once. Measured with 8
// closed-loop clients (docs/benchmarks.md "Control plane"): the transaction's own cost -- the
// COMMIT's WAL pages and fsync -- was ~19% of the daemon's CPU at ~2 jobs per batch; with the
// join, 24,000 submissions took ~8,100 transactions instead of ~12,100.
//
// A caller must end every announcement it starts: one left open makes every later batch wait
// the full join_wait. Shutdown does not wait for announcements (the destructor ends the wait).
//
// Batches: all records of a batch or none (JobStore::CreateJobs); a failed batch fails every
// submission in it with the store's status (e.g. ALREADY_EXISTS, UNAVAILABLE) and is not retried.
// At most max_batch records per transaction (default 4,096).
//
// Thread-safety: every method may be called from any thread. The listener and the Done callbacks
// run on the commit thread, without this class's lock held; they may take the caller's locks
// (lock order: a caller's lock before this class's, never the reverse) and may call Submit(), but
// must not block on a later batch. The destructor commits what is queued, then joins the thread.
#ifndef LOOM_SCHEDULER_JOB_REPOSITORY_H_
#define LOOM_SCHEDULER_JOB_REPOSITORY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/common.pb.h"
#include "storage/job_store.h"

namespace loom {

class JobRepository {
 public:
  // Called on the commit thread after each batch's transaction: the records in submission order
  // and the transaction's status.
  using BatchListener = std::function<void(const std::vector<JobRecord>&, const absl::Status&)>;
  // A submission's acknowledgement: the record as stored, and OK once its batch committed, else
  // the store's error. The record is the repository's and is not read after `done` returns, so
  // `done` may move from it (the reply takes its spec instead of copying it).
  using Done = std::function<void(JobRecord&, const absl::Status&)>;

  struct Stats {
    int64_t batches = 0;        // transactions written (failed ones included)
    int64_t jobs = 0;           // records in them
    int64_t largest_batch = 0;  // most records in one transaction
    int64_t failed_batches = 0;
    int64_t join_waits = 0;     // batches that waited for announced submissions
    int64_t join_timeouts = 0;  // ... and stopped waiting at join_wait
  };

  // `store` must outlive the repository. `on_batch` may be empty. `max_batch` >= 1.
  // `join_wait`: the longest a batch waits for announced submissions (zero: never waits).
  JobRepository(JobStore* store, BatchListener on_batch, int max_batch = 4096,
                absl::Duration join_wait = absl::Milliseconds(2));
  ~JobRepository();
  JobRepository(const JobRepository&) = delete;
  JobRepository& operator=(const JobRepository&) = delete;

  // Queues `job` for the next batch; `done` runs on the commit thread once it is stored (or its
  // batch failed). After the destructor started: FAILED_PRECONDITION through `done` at once.
  void Submit(JobRecord job, Done done);
  // Submit() and wait for the acknowledgement.
  absl::Status SubmitAndWait(JobRecord job);

  // A submission being prepared (see "Joining a batch"). Each StartPreparing() must be matched
  // by one FinishPreparing(), after the Submit() if there is one.
  void StartPreparing();
  void FinishPreparing();
  class PreparingScope {
   public:
    explicit PreparingScope(JobRepository* repository) : repository_(repository) {
      repository_->StartPreparing();
    }
    ~PreparingScope() { repository_->FinishPreparing(); }
    PreparingScope(const PreparingScope&) = delete;
    PreparingScope& operator=(const PreparingScope&) = delete;

   private:
    JobRepository* const repository_;
  };

  // The store's own calls, unbatched (JobStore's contracts).
  absl::StatusOr<std::vector<JobRecord>> ListJobs(
      loom::v1::JobPhase phase = loom::v1::JOB_PHASE_UNSPECIFIED);
  absl::StatusOr<std::vector<NodeRecord>> ListNodes();
  absl::Status UpdateJob(const JobRecord& job);
  absl::Status UpdateJobs(const std::vector<JobRecord>& jobs);
  absl::Status UpsertNode(const NodeRecord& node);
  absl::Status WriteMetrics(const std::vector<MetricRow>& rows);
  absl::StatusOr<std::vector<MetricRow>> ListMetrics(const std::string& job_id, int64_t after_key,
                                                     int limit);

  // Versioned job updates, for callers that write without holding the lock their records were
  // copied under (the Scheduler stores a cycle's or a heartbeat's changes after releasing its
  // mutex). versions[i] is the version the caller gave jobs[i] when it copied it (from one
  // counter that grows with every change, so a later state of a job has a larger version). A
  // record whose version is not larger than one already written for its job is dropped (a
  // newer state is durable already); the rest are written in one UpdateJobs transaction. Calls
  // are serialized, so a late, older write never overwrites a newer one. The store's error as
  // returned (then nothing of the call was written). INVALID_ARGUMENT if the sizes differ.
  absl::Status UpdateJobsVersioned(const std::vector<JobRecord>& jobs,
                                   const std::vector<uint64_t>& versions);

  Stats stats() const;

 private:
  struct Pending {
    JobRecord job;
    Done done;
  };
  void CommitLoop();
  // The commit thread's join wait is over: every submission announced when it began waiting
  // (join_target_) finished preparing, the repository is stopping, or the batch is full.
  bool JoinedOrFull() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  JobStore* const store_;
  const BatchListener on_batch_;
  const size_t max_batch_;
  const absl::Duration join_wait_;
  mutable absl::Mutex mu_;
  // Announced submissions: started and finished so far (StartPreparing / FinishPreparing).
  uint64_t preparing_started_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t preparing_finished_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t join_target_ ABSL_GUARDED_BY(mu_) = 0;  // preparing_started_ when the wait began
  std::vector<Pending> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  // UpdateJobsVersioned: the newest version written per job id. Own lock (held across the store
  // call; never while taking mu_).
  absl::Mutex versions_mu_;
  std::map<std::string, uint64_t> written_versions_ ABSL_GUARDED_BY(versions_mu_);
  std::thread commit_thread_;
};

}  // namespace loom

#endif  // LOOM_SCHEDULER_JOB_REPOSITORY_H_
