#include "scheduler/rank_reconciler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/record_helpers.h"
#include "scheduler/restart_policy.h"

namespace loom {
namespace {

// A node's part of the counts given `used` live ranks on it.
void AddNode(const NodeCapacity& node, int used, int sign, CapacityCounts* c) {
  if (node.lost) {
    c->lost_nodes += sign;
    c->accelerators[{node.kind, "lost"}] += sign * node.slots;
    return;
  }
  c->live_nodes += sign;
  c->live_nodes_by_slots[{node.kind, node.slots}] += sign;
  c->live_node_shapes[{node.kind, node.slots, node.host_memory_bytes,
                       node.accelerator_memory_bytes}] += sign;
  c->used_slots += sign * used;
  (node.cordoned ? c->cordoned_slots : c->free_slots) += sign * std::max(0, node.slots - used);
  const int allocated = std::min(node.slots, used);
  c->accelerators[{node.kind, "allocated"}] += sign * allocated;
  c->accelerators[{node.kind, node.cordoned ? "cordoned" : "free"}] +=
      sign * (node.slots - allocated);
}

}  // namespace

bool CapacityCounts::operator==(const CapacityCounts& other) const {
  if (live_nodes != other.live_nodes || lost_nodes != other.lost_nodes ||
      free_slots != other.free_slots || used_slots != other.used_slots ||
      cordoned_slots != other.cordoned_slots) {
    return false;
  }
  auto nonzero = [](const CapacityCounts& c) {
    std::map<std::pair<loom::v1::AcceleratorKind, std::string>, int> m;
    for (const auto& [k, v] : c.accelerators) {
      if (v != 0) m[k] = v;
    }
    return m;
  };
  auto nonzero_slots = [](const CapacityCounts& c) {
    std::map<std::pair<loom::v1::AcceleratorKind, int>, int> m;
    for (const auto& [k, v] : c.live_nodes_by_slots) {
      if (v != 0) m[k] = v;
    }
    return m;
  };
  auto nonzero_shapes = [](const CapacityCounts& c) {
    std::map<NodeShapeKey, int> m;
    for (const auto& [k, v] : c.live_node_shapes) {
      if (v != 0) m[k] = v;
    }
    return m;
  };
  return nonzero(*this) == nonzero(other) && nonzero_slots(*this) == nonzero_slots(other) &&
         nonzero_shapes(*this) == nonzero_shapes(other);
}

std::map<loom::v1::AcceleratorKind, int> CapacityCounts::LargestNodeSlots() const {
  std::map<loom::v1::AcceleratorKind, int> largest;
  // Ordered by (kind, slots): the last entry of a kind with nodes is its largest.
  for (const auto& [kind_slots, count] : live_nodes_by_slots) {
    if (count > 0) largest[kind_slots.first] = kind_slots.second;
  }
  return largest;
}

std::string CapacityCounts::DebugString() const {
  std::string s = absl::StrCat("nodes live=", live_nodes, " lost=", lost_nodes,
                               " slots free=", free_slots, " used=", used_slots,
                               " cordoned=", cordoned_slots, " accelerators");
  for (const auto& [k, v] : accelerators) {
    if (v != 0) absl::StrAppend(&s, " ", static_cast<int>(k.first), "/", k.second, "=", v);
  }
  absl::StrAppend(&s, " live nodes by slots");
  for (const auto& [k, v] : live_nodes_by_slots) {
    if (v != 0) absl::StrAppend(&s, " ", static_cast<int>(k.first), "/", k.second, "=", v);
  }
  absl::StrAppend(&s, " live node shapes");
  for (const auto& [k, v] : live_node_shapes) {
    if (v != 0) {
      absl::StrAppend(&s, " ", static_cast<int>(std::get<0>(k)), "/", std::get<1>(k), "/",
                      std::get<2>(k), "/", std::get<3>(k), "=", v);
    }
  }
  return s;
}

CapacityCounts CountCapacity(const std::map<std::string, NodeCapacity>& nodes,
                             const std::map<RankKey, RankRuntime>& ranks) {
  std::map<std::string, int> used_by_node;
  for (const auto& [key, rt] : ranks) {
    if (!RankEnded(rt.state)) ++used_by_node[rt.node_id];
  }
  CapacityCounts c;
  for (const auto& [node_id, node] : nodes) {
    auto u = used_by_node.find(node_id);
    AddNode(node, u == used_by_node.end() ? 0 : u->second, +1, &c);
  }
  return c;
}

// ---- The rank table. ----

RankRuntime* RankReconciler::Find(const RankKey& key) {
  auto it = ranks_.find(key);
  return it == ranks_.end() ? nullptr : &it->second;
}

void RankReconciler::Put(const RankKey& key, RankRuntime rt) {
  auto it = ranks_.find(key);
  if (it != ranks_.end()) Erase(it);
  ++generation_;
  by_node_[rt.node_id].insert(key);
  if (!RankEnded(rt.state)) AddUsed(rt.node_id, +1);
  ranks_.emplace(key, std::move(rt));
}

void RankReconciler::SetState(const RankKey& key, loom::v1::RankState state) {
  auto it = ranks_.find(key);
  if (it == ranks_.end()) return;
  const bool was_live = !RankEnded(it->second.state);
  const bool live = !RankEnded(state);
  it->second.state = state;
  if (was_live != live) {
    ++generation_;
    AddUsed(it->second.node_id, live ? +1 : -1);
  }
}

RankReconciler::RankMap::iterator RankReconciler::Erase(RankMap::const_iterator it) {
  ++generation_;
  const std::string& node_id = it->second.node_id;
  auto n = by_node_.find(node_id);
  if (n != by_node_.end()) {
    n->second.erase(it->first);
    if (n->second.empty()) by_node_.erase(n);
  }
  if (!RankEnded(it->second.state)) AddUsed(node_id, -1);
  return ranks_.erase(it);
}

void RankReconciler::Erase(const RankKey& key) {
  auto it = ranks_.find(key);
  if (it != ranks_.end()) Erase(it);
}

void RankReconciler::Clear() {
  ranks_.clear();
  by_node_.clear();
  used_by_node_.clear();
  nodes_.clear();
  counts_ = CapacityCounts();
  ++generation_;
  last_step_advance_.clear();
  step_seconds_.clear();
  progress_.Clear();
}

std::vector<RankKey> RankReconciler::RanksOnNode(const std::string& node_id) const {
  auto n = by_node_.find(node_id);
  if (n == by_node_.end()) return {};
  return std::vector<RankKey>(n->second.begin(), n->second.end());
}

bool RankReconciler::HasRanks(const std::string& job_id) const {
  auto r = ranks_.lower_bound({job_id, 0});
  return r != ranks_.end() && r->first.first == job_id;
}

void RankReconciler::StopLiveRanks(const std::string& job_id, bool graceful) {
  for (auto it = ranks_.lower_bound({job_id, 0});
       it != ranks_.end() && it->first.first == job_id;) {
    if (RankEnded(it->second.state)) {
      it = Erase(it);  // its slot is free; nothing to stop
    } else {
      if (!it->second.stop_requested) ++generation_;
      it->second.stop_requested = true;
      it->second.graceful_stop = graceful;
      ++it;
    }
  }
}

void RankReconciler::SetGracefulStop(const std::string& job_id, bool graceful,
                                     bool request_stop) {
  for (auto r = ranks_.lower_bound({job_id, 0}); r != ranks_.end() && r->first.first == job_id;
       ++r) {
    if (request_stop && !r->second.stop_requested) {
      ++generation_;
      r->second.stop_requested = true;
    }
    r->second.graceful_stop = graceful;
  }
}

std::map<std::string, std::set<int32_t>> RankReconciler::HeldDevices(
    const std::string& job_id, const std::vector<std::string>& nodes) const {
  std::map<std::string, std::set<int32_t>> held;
  for (const std::string& node_id : nodes) {
    if (held.count(node_id)) continue;  // a node named by several ranks is visited once
    std::set<int32_t>& devices = held[node_id];
    auto n = by_node_.find(node_id);
    if (n == by_node_.end()) continue;
    for (const RankKey& key : n->second) {
      if (key.first == job_id) continue;
      const RankRuntime& rt = ranks_.at(key);
      if (rt.device_index < 0 || RankEnded(rt.state)) continue;
      devices.insert(rt.device_index);
    }
  }
  return held;
}

int RankReconciler::UsedSlots(const std::string& node_id) const {
  auto u = used_by_node_.find(node_id);
  return u == used_by_node_.end() ? 0 : u->second;
}

// ---- Capacity counts. ----

void RankReconciler::Contribute(const std::string& node_id, int sign) {
  auto n = nodes_.find(node_id);
  if (n == nodes_.end()) return;
  AddNode(n->second, UsedSlots(node_id), sign, &counts_);
}

void RankReconciler::AddUsed(const std::string& node_id, int delta) {
  Contribute(node_id, -1);
  int& used = used_by_node_[node_id];
  used += delta;
  if (used == 0) used_by_node_.erase(node_id);
  Contribute(node_id, +1);
}

void RankReconciler::SetNode(const std::string& node_id, const NodeCapacity& node) {
  ++generation_;
  Contribute(node_id, -1);
  nodes_[node_id] = node;
  Contribute(node_id, +1);
}

void RankReconciler::RemoveNode(const std::string& node_id) {
  ++generation_;
  Contribute(node_id, -1);
  nodes_.erase(node_id);
}

// ---- Step timing. ----

void RankReconciler::RecordStepAdvance(const std::string& job_id, int64_t from_step,
                                       int64_t to_step, absl::Time now) {
  auto last = last_step_advance_.find(job_id);
  // The first report of an attempt (from_step may be a resumed or stale step) gives no interval.
  if (last != last_step_advance_.end() && from_step > 0 && to_step > from_step) {
    StepWindow& window = step_seconds_[job_id];
    window.samples.push_back(absl::ToDoubleSeconds(now - last->second) /
                             static_cast<double>(to_step - from_step));
    if (window.samples.size() > 32) window.samples.pop_front();
    if (window.samples.size() >= 3) {
      std::vector<double> sorted(window.samples.begin(), window.samples.end());
      std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
      window.median = sorted[sorted.size() / 2];
    }
    // The job now has an end estimate (MedianStepSeconds > 0): backfill around it may change.
    if (window.samples.size() == 3) ++generation_;
  }
  last_step_advance_[job_id] = now;
}

double RankReconciler::MedianStepSeconds(const std::string& job_id) const {
  auto window = step_seconds_.find(job_id);
  return window == step_seconds_.end() ? 0 : window->second.median;
}

std::optional<absl::Time> RankReconciler::LastStepAdvance(const std::string& job_id) const {
  auto it = last_step_advance_.find(job_id);
  if (it == last_step_advance_.end()) return std::nullopt;
  return it->second;
}

void RankReconciler::ForgetAttemptSteps(const std::string& job_id) {
  last_step_advance_.erase(job_id);
  progress_.Forget(job_id);
}

void RankReconciler::ForgetJob(const std::string& job_id) {
  last_step_advance_.erase(job_id);
  progress_.Forget(job_id);
  step_seconds_.erase(job_id);
}

// ---- Decisions. ----

std::optional<std::string> RankReconciler::SteppingJobOnNode(const std::string& node_id,
                                                             absl::Time now,
                                                             absl::Duration timeout) const {
  auto n = by_node_.find(node_id);
  if (n == by_node_.end()) return std::nullopt;
  for (const RankKey& key : n->second) {
    std::optional<absl::Time> advanced = progress_.LastAdvance(key.first);
    auto rank0 = last_step_advance_.find(key.first);
    if (rank0 != last_step_advance_.end() &&
        (!advanced.has_value() || rank0->second > *advanced)) {
      advanced = rank0->second;
    }
    if (advanced.has_value() && now - *advanced <= timeout) return key.first;
  }
  return std::nullopt;
}

SuspectChoice RankReconciler::ChooseSuspect(
    const std::string& reporting_node, const std::vector<std::string>& rank_nodes,
    const std::function<std::optional<absl::Time>(const std::string&)>& last_heartbeat,
    absl::Time now, absl::Duration heartbeat_interval) {
  SuspectChoice choice;
  choice.node_id = reporting_node;
  for (const std::string& peer : rank_nodes) {
    if (peer == reporting_node) continue;
    const std::optional<absl::Time> heard = last_heartbeat(peer);
    if (!heard.has_value()) continue;
    const absl::Duration silent = now - *heard;
    if (silent > 2 * heartbeat_interval) {
      choice.node_id = peer;
      choice.explanation = absl::StrCat(
          " (node ", peer, ", with another rank of this job, has not heartbeated for ",
          absl::FormatDuration(absl::Trunc(silent, absl::Milliseconds(100))),
          ": likely the cause)");
      break;
    }
  }
  return choice;
}

FailureVerdict RankReconciler::ClassifyFailure(const loom::v1::RankStatus& st, bool had_run,
                                               bool own, bool infra_restarts_left) {
  const RankExitClass exit = ClassifyRankExit(st, had_run);
  // A rank that only saw a peer go away is charged provisionally to the infra budget while it
  // has restarts left (else the user's): the peer's own report re-attributes the failure and
  // moves the restart to the real cause's budget (restart_attribution.cc).
  const bool provisional = own && SawPeerGoAway(st) &&
                           exit.failure_class == loom::v1::FAILURE_CLASS_USER &&
                           infra_restarts_left;
  FailureVerdict v;
  v.failure_class = own && !provisional ? exit.failure_class : loom::v1::FAILURE_CLASS_INFRA;
  v.reason = own ? exit.reason : "RankFailed";
  v.no_restart = own && exit.final;
  return v;
}

}  // namespace loom
