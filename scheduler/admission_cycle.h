// File: scheduler/admission_cycle.h
//
// The admission cycle: one pass over a ClusterSnapshot (cluster_snapshot.h) that decides which
// waiting jobs start where, which running jobs are preempted for them, and why each of the
// others still waits. Pure: snapshot in, decisions out; no store, no clock, no lock, no gRPC.
// The Scheduler facade applies the decisions in order (scheduler_admission.cc). The policy is
// docs/scheduling.md; the structure follows Kueue's scheduler (a fair-sharing iterator over
// the pending workloads, quota checks per ClusterQueue, preemption as a separate step):
//
//   1. Order. Waiting jobs are grouped by tenant, each group by priority (highest first), then
//      submission sequence. The next job is the highest-priority group head; ties go to the
//      tenant with the lowest weighted dominant share of the live slots (queues.h,
//      DominantShare; updated as jobs of the tenant are admitted in this cycle), then to the
//      oldest.
//   2. Skip or explain. A job whose previous attempt still has ranks waits silently; one in
//      restart / gang-ready backoff waits ("Backoff"); an unconfigured queue ("UnknownQueue");
//      a gang larger than every eligible node together offers ("Unschedulable"); over its
//      queue's quota ("WaitingForQuota", QuotaLedger: nominal quota and borrowing).
//   3. Place. A gang that fits the free slots is placed (placement.h, PlaceGang, avoiding the
//      job's suspect nodes when possible), unless its resume checkpoint is not known yet
//      ("CheckpointsUnavailable"). Host memory is packed across jobs (issue 48): on a node that
//      reports its memory, the ranks placed there by this and every other job (live ranks,
//      stopping ones included, each counted at its job's planned_rank_host_bytes, which carry
//      the admission margin) must fit that memory; a gang that the free slots hold but their
//      nodes' free memory does not waits ("WaitingForMemory", without a reservation).
//   4. Head reservation and backfill. The first job of an accelerator kind that does not fit is
//      the kind's head: it reserves the slots it will start on (those being released by
//      stopping ranks; else, with preemption enabled, those of lower-priority victims chosen by
//      preemption.h; else those of running jobs in order of expected end, EASY backfill,
//      Lifka 1995), and later jobs of the kind are placed only on slots it does not need
//      ("Queued" when they would delay it). A head without an estimate reserves every free
//      slot it could use. With backfill disabled nothing passes a head.
//
// Decisions are in the order the cycle made them; applying them in that order reproduces the
// cycle (a preemption precedes the reason of the head that caused it).
// Thread-safety: pure function.
#ifndef LOOM_SCHEDULER_ADMISSION_CYCLE_H_
#define LOOM_SCHEDULER_ADMISSION_CYCLE_H_

#include <map>
#include <string>
#include <vector>

#include "proto/common.pb.h"
#include "scheduler/cluster_snapshot.h"
#include "scheduler/queues.h"

namespace loom {

struct AdmissionOptions {
  const QueuesConfig* queues = nullptr;  // required; outlives the call
  bool enable_preemption = true;
  bool enable_backfill = true;
  // Decide about at most this many waiting jobs, the first in queue order (0 = all), as
  // Slurm's default_queue_depth: the rest get no decision (they keep their reasons) and take
  // only their queue positions. A pass's cost is then O(max_jobs) in decisions, plus the sort.
  int max_jobs = 0;
};

struct AdmissionDecision {
  enum class Kind {
    kStart,     // start the job's next attempt with rank r on nodes[r]
    kPreempt,   // requeue the running job (reason, message); its slots go to a head job
    kWait,      // the job keeps waiting with this reason and message
  };
  Kind kind = Kind::kWait;
  std::string job_id;
  // kStart and kWait: the job's index in ClusterSnapshot::waiting (the facade applies the
  // decision through it, without a lookup by id); -1 for kPreempt.
  int waiting = -1;
  std::vector<std::string> nodes;  // kStart: node id per rank
  std::string reason;              // kWait / kPreempt, e.g. "WaitingForQuota", "Preempted"
  std::string message;
  // The loom_admission_attempts_total outcome to count ("" none): admitted, infeasible,
  // quota, blocked, preempting, no_capacity.
  std::string outcome;
  // kWait only: the job already has exactly this reason and message, so `reason` and `message`
  // are left empty and there is nothing to set (a job queued behind the same head as in the
  // last cycle; no strings are built for it).
  bool unchanged = false;
};

struct AdmissionResult {
  std::vector<AdmissionDecision> decisions;
  // Per accelerator kind, the jobs still waiting in the order the cycle considered them
  // (ExplainPending's queue position); started jobs are not in it.
  std::map<loom::v1::AcceleratorKind, std::vector<std::string>> queue_order;
  // Waiting jobs the cycle decided about (all of them unless AdmissionOptions::max_jobs cut
  // the pass short).
  int considered = 0;
};

AdmissionResult RunAdmissionCycle(const ClusterSnapshot& snapshot,
                                  const AdmissionOptions& options);

}  // namespace loom

#endif  // LOOM_SCHEDULER_ADMISSION_CYCLE_H_
