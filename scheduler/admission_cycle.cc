#include "scheduler/admission_cycle.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "scheduler/placement.h"
#include "scheduler/preemption.h"
#include "scheduler/record_helpers.h"

namespace loom {
namespace {

using loom::v1::AcceleratorKind;
using Decision = AdmissionDecision;

AcceleratorKind KindOfSpec(const loom::v1::JobSpec& spec) { return KindOf(spec.resources()); }

std::string UnschedulableMessage(const Eligibility& e, int need, const std::string& kind) {
  if (e.require_single_domain && need <= e.capacity) {
    return absl::StrCat("needs ", need, " ", kind,
                        " rank slots in one topology domain (require_single_domain); the largest "
                        "domain offers ",
                        e.max_domain_capacity, e.narrowed_by.empty() ? "" : "; ", e.narrowed_by);
  }
  if (e.narrowed_by.empty()) {
    return absl::StrCat("needs ", need, " ", kind, " rank slots; the ", e.live_nodes_of_kind,
                        " live ", kind, " nodes offer ", e.capacity,
                        " in total (register more workers)");
  }
  return absl::StrCat("needs ", need, " ", kind, " rank slots; the nodes that qualify offer ",
                      e.capacity, " (", e.live_nodes_of_kind, " live ", kind, " nodes with ",
                      e.live_slots_of_kind, " slots; ", e.narrowed_by, ")");
}

Decision Wait(const JobRecord& job, int waiting, std::string reason, std::string message,
              std::string outcome = "") {
  Decision d;
  d.kind = Decision::Kind::kWait;
  d.job_id = job.id;
  d.waiting = waiting;
  d.reason = std::move(reason);
  d.message = std::move(message);
  d.outcome = std::move(outcome);
  return d;
}

// A wait whose reason and message are the job's already: no strings copied (Decision::unchanged).
Decision WaitUnlessUnchanged(const JobRecord& job, int waiting, const char* reason,
                             const std::string& message, const char* outcome) {
  if (job.reason == reason && job.message == message) {
    Decision d;
    d.kind = Decision::Kind::kWait;
    d.job_id = job.id;
    d.waiting = waiting;
    d.outcome = outcome;
    d.unchanged = true;
    return d;
  }
  return Wait(job, waiting, reason, message, outcome);
}

// Slots of the snapshot's nodes: in use, being released, and held per placed job.
struct SlotUse {
  std::vector<int> used, releasing;
  std::map<std::string, std::map<int, int>> held;  // job -> node -> slots (not asked to stop)
  std::map<std::string, int> live_ranks;           // job -> ranks not ended
  std::set<std::string> has_ranks;                 // jobs with any rank, ended or not
  // Per node: the planned host bytes (JobSchedulingState.planned_rank_host_bytes, with the
  // admission margin) of the live ranks on it, stopping ones included.
  std::vector<int64_t> host_planned;
};

SlotUse CountSlots(const ClusterSnapshot& snapshot, const NodePool& pool) {
  SlotUse s;
  s.used.assign(pool.size(), 0);
  s.releasing.assign(pool.size(), 0);
  s.host_planned.assign(pool.size(), 0);
  int64_t rank_host_bytes = 0;  // of `job`'s ranks
  // Ranks are ordered by job: one lookup per job, not per rank.
  const std::string* job = nullptr;
  int* live = nullptr;
  std::map<int, int>* job_held = nullptr;
  for (const ClusterSnapshot::Rank& rank : snapshot.ranks) {
    if (job == nullptr || *job != rank.job_id) {
      job = &rank.job_id;
      s.has_ranks.insert(s.has_ranks.end(), rank.job_id);
      live = nullptr;
      job_held = nullptr;
      auto placed = snapshot.placed.find(rank.job_id);
      rank_host_bytes = placed == snapshot.placed.end()
                            ? 0
                            : placed->second.job->state.planned_rank_host_bytes();
    }
    if (rank.ended) continue;
    if (live == nullptr) live = &s.live_ranks[rank.job_id];
    ++*live;
    const int i = pool.Find(rank.node_id);
    if (i < 0) continue;
    ++s.used[i];
    s.host_planned[i] += rank_host_bytes;
    if (rank.stop_requested) {
      ++s.releasing[i];
    } else {
      if (job_held == nullptr) job_held = &s.held[rank.job_id];
      ++(*job_held)[i];
    }
  }
  return s;
}

}  // namespace

AdmissionResult RunAdmissionCycle(const ClusterSnapshot& snapshot,
                                  const AdmissionOptions& options) {
  AdmissionResult result;
  const QueuesConfig& queues = *options.queues;
  const absl::Time now = snapshot.now;
  const NodePool& pool = *snapshot.pool;
  const int n = pool.size();
  SlotUse slots = CountSlots(snapshot, pool);
  std::vector<int>& releasing = slots.releasing;
  const std::map<std::string, std::map<int, int>>& held = slots.held;

  std::vector<int> avail(n, 0);
  std::map<AcceleratorKind, int64_t> kind_avail, capacity;
  for (int i = 0; i < n; ++i) {
    const PoolNode& p = pool.node(i);
    if (!p.live) continue;
    capacity[p.inventory.accelerator()] += p.inventory.slots();
    if (!p.schedulable) {
      releasing[i] = 0;
      continue;
    }
    avail[i] = std::max(0, p.inventory.slots() - slots.used[i]);
    kind_avail[p.inventory.accelerator()] += avail[i];
  }
  // Host memory free per node for more ranks (-1: the node reports none; never limits).
  std::vector<int64_t> host_free(n, -1);
  bool memory_reported = false;
  for (int i = 0; i < n; ++i) {
    const int64_t host = pool.node(i).inventory.host_memory_bytes();
    if (host <= 0) continue;
    host_free[i] = std::max<int64_t>(0, host - slots.host_planned[i]);
    memory_reported = true;
  }
  QuotaLedger ledger(&queues);
  std::map<std::string, std::map<AcceleratorKind, int64_t>> tenant_used;
  for (const auto& [job_id, count] : slots.live_ranks) {
    auto j = snapshot.placed.find(job_id);
    if (j == snapshot.placed.end()) continue;
    const JobRecord& job = *j->second.job;
    ledger.Add(QueueOf(job.spec), KindOfSpec(job.spec), count);
    tenant_used[job.tenant][KindOfSpec(job.spec)] += count;
  }

  // 1. The fair-sharing iterator: waiting jobs per tenant, each list by priority (highest
  // first), then submission order. Sort keys copied out of the records.
  struct Entry {
    int32_t priority;
    int64_t sequence;
    const ClusterSnapshot::WaitingJob* waiting;
  };
  std::map<std::string, std::vector<Entry>> by_tenant;
  {
    std::vector<Entry>* last = nullptr;
    const std::string* last_tenant = nullptr;
    for (const ClusterSnapshot::WaitingJob& w : snapshot.waiting) {
      if (last_tenant == nullptr || (w.tenant != last_tenant && *last_tenant != *w.tenant)) {
        last = &by_tenant[*w.tenant];
        last_tenant = w.tenant;
      }
      last->push_back({w.priority, w.sequence, &w});
    }
  }
  struct Cursor {
    std::string tenant;
    std::vector<Entry>* jobs;
    size_t next = 0;
    double share = 0;
  };
  std::vector<Cursor> cursors;
  for (auto& [tenant, jobs] : by_tenant) {
    std::sort(jobs.begin(), jobs.end(), [](const Entry& a, const Entry& b) {
      if (a.priority != b.priority) return a.priority > b.priority;
      return a.sequence < b.sequence;
    });
    cursors.push_back(
        {tenant, &jobs, 0, DominantShare(tenant_used[tenant], capacity, queues.Weight(tenant))});
  }
  // Next job: highest priority, then the tenant with the lowest weighted dominant share, then
  // the oldest.
  auto before = [](const Cursor& a, const Cursor& b) {
    const Entry& x = (*a.jobs)[a.next];
    const Entry& y = (*b.jobs)[b.next];
    if (x.priority != y.priority) return x.priority > y.priority;
    if (a.share != b.share) return a.share < b.share;
    return x.sequence < y.sequence;
  };

  std::map<AcceleratorKind, std::string> head;  // kind -> the blocked job holding a reservation
  // The "Queued" messages of jobs behind a kind's head, built once per head (not per job).
  std::map<AcceleratorKind, std::string> behind, behind_no_backfill;
  std::map<std::string, Eligibility> eligibility_cache;
  std::set<std::string> preempted;  // victims of this cycle: no longer running
  std::vector<Decision>& out = result.decisions;
  while (true) {
    Cursor* cursor = nullptr;
    for (Cursor& c : cursors) {
      if (c.next < c.jobs->size() && (cursor == nullptr || before(c, *cursor))) cursor = &c;
    }
    if (cursor == nullptr) break;
    const ClusterSnapshot::WaitingJob& waiting = *(*cursor->jobs)[cursor->next++].waiting;
    const int index = static_cast<int>(&waiting - snapshot.waiting.data());
    if (options.max_jobs > 0 && result.considered >= options.max_jobs) {
      // Past the pass's depth: no decision, only the queue position (shares are fixed now).
      result.queue_order[waiting.kind].push_back(*waiting.id);
      continue;
    }
    ++result.considered;
    const JobRecord& record = *waiting.job;
    const std::string& job_id = record.id;
    const loom::v1::JobSpec& spec = record.spec;
    const AcceleratorKind kind = waiting.kind;
    const int need = spec.resources().num_ranks();
    const std::string kind_name = AcceleratorKindName(kind);
    result.queue_order[kind].push_back(job_id);

    // 2. The previous attempt's ranks must all have ended (or their node been declared lost)
    // before the next attempt starts: two incarnations of one rank never run at once.
    // The attempt and the backoff expiry from the keys (job_table.h refreshes them at every
    // Add and Replace).
    if (waiting.attempt > 0 && slots.has_ranks.count(job_id)) continue;
    if (waiting.not_before_us > 0 && now < absl::FromUnixMicros(waiting.not_before_us)) {
      out.push_back(Wait(
          record, index, "Backoff",
          absl::StrCat("backoff until ", Utc(absl::FromUnixMicros(waiting.not_before_us)),
                       record.state.ready_timeouts() > 0
                           ? absl::StrCat(" after ", record.state.ready_timeouts(),
                                          " consecutive gang-ready timeout(s)")
                           : absl::StrCat(" after restart ", record.state.user_restarts() +
                                                                 record.state.infra_restarts()),
                       "; ", PhaseMessage(record))));
      continue;
    }
    const QueueConfig* queue = queues.Find(QueueOf(spec));
    if (queue == nullptr) {
      out.push_back(Wait(
          record, index, "UnknownQueue",
          absl::StrCat("queue ", QueueOf(spec), " is not configured (--queues_config)")));
      continue;
    }
    const RankMemoryNeed memory{record.state.planned_rank_host_bytes(),
                                record.state.planned_rank_device_bytes()};
    auto [e_it, inserted] =
        eligibility_cache.try_emplace(EligibilityKey(spec.resources(), memory));
    if (inserted) e_it->second = ComputeEligibility(pool, spec.resources(), memory);
    const Eligibility& e = e_it->second;
    if (need > e.capacity || (e.require_single_domain && need > e.max_domain_capacity)) {
      out.push_back(Wait(record, index, "Unschedulable", UnschedulableMessage(e, need, kind_name),
                         "infeasible"));
      continue;
    }
    const QuotaLedger::Check quota = ledger.Fits(*queue, kind, need);
    if (!quota.ok) {
      out.push_back(Wait(record, index, "WaitingForQuota", quota.message, "quota"));
      continue;
    }
    auto h = head.find(kind);
    if (h != head.end() && !options.enable_backfill) {
      out.push_back(
          WaitUnlessUnchanged(record, index, "Queued", behind_no_backfill[kind], "blocked"));
      continue;
    }

    // 3. Place the gang on free slots, away from the job's suspect nodes if it can.
    std::vector<char> avoid;
    if (record.state.suspect_nodes_size() > 0) {
      avoid.assign(n, 0);
      for (const std::string& s : record.state.suspect_nodes()) {
        const int i = pool.Find(s);
        if (i >= 0) avoid[i] = 1;
      }
    }
    std::vector<int> placement;
    bool memory_blocked = false;  // the free slots hold the gang, their free memory does not
    int64_t memory_held = 0;      // ranks of it the free slots' memory holds
    if (need <= kind_avail[kind]) {
      if (memory.host > 0 && memory_reported) {
        std::vector<int> by_memory = avail;
        for (int i = 0; i < n; ++i) {
          if (host_free[i] >= 0) {
            by_memory[i] = static_cast<int>(std::min<int64_t>(avail[i], host_free[i] / memory.host));
          }
        }
        placement = PlaceGang(pool, e, by_memory, need, avoid);
        if (placement.empty() && !PlaceGang(pool, e, avail, need, avoid).empty()) {
          memory_blocked = true;
          memory_held = EligibleFree(e, by_memory);
        }
      } else {
        placement = PlaceGang(pool, e, avail, need, avoid);
      }
    }
    if (!placement.empty()) {
      if (waiting.resume_unavailable.has_value()) {
        // Never restart from scratch because the catalog could not answer: try next cycle.
        out.push_back(Wait(record, index, "CheckpointsUnavailable",
                           absl::StrCat("cannot find the newest committed checkpoint to resume "
                                        "from: ",
                                        *waiting.resume_unavailable)));
        continue;
      }
      Decision d;
      d.kind = Decision::Kind::kStart;
      d.job_id = job_id;
      d.waiting = index;
      d.outcome = "admitted";
      d.nodes.reserve(placement.size());
      for (int i : placement) d.nodes.push_back(pool.node(i).id);
      out.push_back(std::move(d));
      for (int i : placement) {
        --avail[i];
        if (host_free[i] >= 0) host_free[i] = std::max<int64_t>(0, host_free[i] - memory.host);
      }
      kind_avail[kind] -= need;
      // Placed: no longer waiting, so it takes no queue position.
      result.queue_order[kind].pop_back();
      ledger.Add(queue->name, kind, need);
      tenant_used[record.tenant][kind] += need;
      cursor->share =
          DominantShare(tenant_used[record.tenant], capacity, queues.Weight(record.tenant));
      continue;
    }
    if (h != head.end()) {
      out.push_back(WaitUnlessUnchanged(record, index, "Queued", behind[kind], "blocked"));
      continue;
    }
    if (memory_blocked) {
      // Not the head: its slots are free, and memory frees only as other jobs' ranks end.
      out.push_back(Wait(
          record, index, "WaitingForMemory",
          absl::StrFormat("needs %d %s ranks of %.2f GiB host memory each (planned, with the "
                          "admission margin); the nodes with free slots have room for %d of "
                          "them beside the ranks running there",
                          need, kind_name, static_cast<double>(memory.host) / (1 << 30),
                          memory_held),
          "no_capacity"));
      continue;
    }

    // 4. The first job of its kind that does not fit: the head. It may preempt, and it
    // reserves the slots it will start on so that later jobs only backfill around it.
    int64_t max_domain_free = 0;
    const int64_t free_now = EligibleFree(e, avail, &max_domain_free);
    std::vector<int> later = avail;  // free slots once stopping ranks are gone
    for (int i = 0; i < n; ++i) later[i] += releasing[i];
    std::vector<int> plan = PlaceGang(pool, e, later, need, {});
    std::string reason = "WaitingForSlots";
    std::string message = absl::StrCat("needs ", need, " ", kind_name, " rank slots");
    if (e.require_single_domain) absl::StrAppend(&message, " in one topology domain");
    absl::StrAppend(&message, "; ", free_now, " of ", e.capacity, " are free");
    if (e.require_single_domain && free_now >= need) {
      absl::StrAppend(&message, " (the largest free domain has ", max_domain_free, ")");
    }
    if (!plan.empty()) {
      absl::StrAppend(&message, "; the rest are being released by stopping ranks");
    }
    // A placed job may still be preempted or waited for while it starts or runs.
    auto running = [&](const JobRecord& other, bool starting_too) {
      if (preempted.count(other.id)) return false;
      return other.phase == v1::JOB_PHASE_RUNNING ||
             (starting_too && other.phase == v1::JOB_PHASE_STARTING);
    };
    if (plan.empty() && options.enable_preemption) {
      std::vector<VictimCandidate> candidates;
      for (const auto& [other_id, held_slots] : held) {
        const JobRecord& other = *snapshot.placed.at(other_id).job;
        if (!running(other, /*starting_too=*/true) || KindOfSpec(other.spec) != kind ||
            other.spec.priority() >= spec.priority()) {
          continue;
        }
        VictimCandidate c;
        c.job_id = other_id;
        c.priority = other.spec.priority();
        c.sequence = other.sequence;
        c.lost_work = LostWork(other.progress.step(), other.progress.last_checkpoint_step(),
                               static_cast<int>(other.rank_nodes.size()));
        for (const auto& [i, k] : held_slots) {
          if (pool.node(i).schedulable) c.slots.emplace_back(i, k);
        }
        if (!c.slots.empty()) candidates.push_back(std::move(c));
      }
      std::vector<int> trial(n);
      const std::vector<size_t> victims =
          candidates.empty() ? std::vector<size_t>{}
                             : ChooseVictims(candidates, n, [&](const std::vector<int>& extra) {
                                 for (int i = 0; i < n; ++i) trial[i] = later[i] + extra[i];
                                 return !PlaceGang(pool, e, trial, need, {}).empty();
                               });
      if (!victims.empty()) {
        std::vector<std::string> names;
        for (size_t v : victims) {
          const VictimCandidate& c = candidates[v];
          Decision d;
          d.kind = Decision::Kind::kPreempt;
          d.job_id = c.job_id;
          d.reason = "Preempted";
          d.message = absl::StrCat("preempted by job ", job_id, " (priority ", spec.priority(),
                                   " > ", c.priority,
                                   "); resumes from its newest committed checkpoint (",
                                   c.lost_work, " rank-steps since it are lost)");
          out.push_back(std::move(d));
          preempted.insert(c.job_id);
          for (const auto& [i, k] : c.slots) later[i] += k;
          names.push_back(absl::StrCat(c.job_id, " (priority ", c.priority, ", loses ",
                                       c.lost_work, " rank-steps)"));
        }
        plan = PlaceGang(pool, e, later, need, {});
        reason = "WaitingForPreemption";
        absl::StrAppend(&message, "; preempted ", absl::StrJoin(names, ", "),
                        "; waiting for their ranks to stop");
      }
    }
    if (plan.empty()) {
      // EASY backfill: walk the running jobs by expected end (remaining steps x median step
      // time) until the gang fits; jobs without an estimate never end for this purpose.
      std::vector<std::pair<absl::Time, std::string>> ends;
      for (const auto& [other_id, held_slots] : held) {
        const ClusterSnapshot::PlacedJob& placed = snapshot.placed.at(other_id);
        const JobRecord& other = *placed.job;
        if (!running(other, /*starting_too=*/false) || KindOfSpec(other.spec) != kind) continue;
        const double median = placed.median_step_seconds;
        if (median <= 0) continue;
        const int64_t remaining =
            std::max<int64_t>(0, other.spec.training().steps() - other.progress.step());
        ends.emplace_back(now + absl::Seconds(median * static_cast<double>(remaining)), other_id);
      }
      std::sort(ends.begin(), ends.end());
      int64_t future_free = EligibleFree(e, later);
      for (const auto& [end, other_id] : ends) {
        int64_t added = 0;
        for (const auto& [i, k] : held.at(other_id)) {
          if (!pool.node(i).schedulable) continue;
          later[i] += k;
          if (e.member[i]) added += k;
        }
        if (added == 0) continue;
        future_free += added;
        if (future_free < need) continue;
        plan = PlaceGang(pool, e, later, need, {});
        if (!plan.empty()) {
          absl::StrAppend(&message, "; expected to start in about ",
                          absl::FormatDuration(absl::Trunc(end - now, absl::Seconds(1))),
                          " when running jobs finish (slots reserved; smaller jobs may backfill "
                          "around it)");
          break;
        }
      }
    }
    if (!plan.empty()) {
      // Reserve the part of the plan that must come from slots free now.
      std::map<int, int> per_node;
      for (int i : plan) ++per_node[i];
      for (const auto& [i, k] : per_node) {
        const int freed_by_then = later[i] - avail[i];
        const int r = std::max(0, std::min(avail[i], k - freed_by_then));
        avail[i] -= r;
        kind_avail[kind] -= r;
      }
    } else {
      // No estimate: every free slot it could use is reserved (nothing backfills onto them).
      for (const auto& [d, nodes] : e.groups) {
        for (int i : nodes) {
          kind_avail[kind] -= avail[i];
          avail[i] = 0;
        }
      }
    }
    head[kind] = job_id;
    behind_no_backfill[kind] = absl::StrCat("waiting behind job ", job_id);
    behind[kind] = absl::StrCat("waiting behind job ", job_id,
                                " (it holds a reservation; starting now would delay it)");
    const std::string outcome =
        reason == "WaitingForPreemption" ? "preempting" : "no_capacity";
    out.push_back(Wait(record, index, reason, message, outcome));
  }
  return result;
}

}  // namespace loom
