// The Scheduler facade's node API: registration, the operator's list / cordon / uncordon /
// drain of nodes, and the queue listing.
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
#include "scheduler/job_state.h"
#include "scheduler/path_policy.h"
#include "scheduler/placement.h"
#include "scheduler/preemption.h"
#include "scheduler/record_helpers.h"
#include "scheduler/restart_policy.h"
#include "scheduler/scheduler_internal.h"

namespace loom {

namespace {
// Regression (break-it pass, 2026-12-05): a 1,000,000-byte reason was stored and returned in
// every ListNodes.
absl::Status CheckAdminReason(const std::string& reason) {
  if (reason.size() <= kMaxAdminReasonBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("reason: ", reason.size(),
                                                 " bytes, longer than ", kMaxAdminReasonBytes));
}
}  // namespace

absl::StatusOr<absl::Duration> Scheduler::RegisterWorker(const std::string& node_id,
                                                         const loom::v1::NodeInventory& inventory,
                                                         const std::string& instance_id) {
  if (node_id.empty()) return absl::InvalidArgumentError("node_id: required");
  RETURN_IF_ERROR(CheckRequiredId("node_id", node_id));
  RETURN_IF_ERROR(CheckIdLength("instance_id", instance_id));
  if (inventory.slots() < 1 || inventory.slots() > kMaxSlotsPerNode) {
    return absl::InvalidArgumentError(absl::StrCat("inventory.slots: must be in [1, ",
                                                   kMaxSlotsPerNode, "], got ", inventory.slots()));
  }
  if (!loom::v1::AcceleratorKind_IsValid(inventory.accelerator())) {
    return absl::InvalidArgumentError(
        absl::StrCat("inventory.accelerator: unknown kind ", inventory.accelerator()));
  }
  if (inventory.accelerator_memory_bytes() < 0 || inventory.host_memory_bytes() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inventory.accelerator_memory_bytes / host_memory_bytes: must be >= 0, got ",
        inventory.accelerator_memory_bytes(), " / ", inventory.host_memory_bytes()));
  }
  if (!inventory.cpu_arch().empty() && inventory.cpu_arch() != "x86_64" &&
      inventory.cpu_arch() != "aarch64") {
    return absl::InvalidArgumentError(absl::StrCat("inventory.cpu_arch: must be x86_64 or aarch64, got '",
                                                   absl::CEscape(inventory.cpu_arch().substr(0, 32)), "'"));
  }
  if (inventory.devices_size() > 0) {
    // Device binding (device_binding.h): one rank slot per device, distinct indices.
    if (inventory.devices_size() != inventory.slots()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "inventory.devices: ", inventory.devices_size(), " devices but ", inventory.slots(),
          " slots (a node with devices offers one slot per device)"));
    }
    std::set<int32_t> indices;
    for (const auto& d : inventory.devices()) {
      if (d.index() < 0 || !indices.insert(d.index()).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("inventory.devices: index ", d.index(), " is negative or repeats"));
      }
    }
  }
  for (const auto& [key, value] : inventory.labels()) {
    if (key.empty() || key.size() > 63 || value.size() > 63) {
      return absl::InvalidArgumentError(absl::StrCat(
          "inventory.labels: keys must be 1-63 bytes and values at most 63 bytes (key '",
          absl::CEscape(key.substr(0, 32)), "')"));
    }
  }
  absl::MutexLock lock(&mu_);
  NodeRecord node;
  node.id = node_id;
  if (auto known = nodes_.find(node_id); known != nodes_.end()) {
    const NodeRecord& was = known->second;
    node.admin = was.admin;  // cordon/drain survive re-registration
    if (!was.instance_id.empty() && was.instance_id != instance_id && !was.lost) {
      // A restarted worker (the usual case) or a second daemon given the same --node_id: either
      // way the earlier process is fenced from here on (HeartbeatLocked refuses it).
      LOG(WARNING) << "node " << node_id << ": registered by instance " << instance_id
                   << "; instance " << was.instance_id << " (last heard "
                   << absl::FormatDuration(clock_->Now() - was.last_heartbeat_time)
                   << " ago) is fenced: its heartbeats are refused";
    }
  }
  node.inventory = inventory;
  node.instance_id = instance_id;
  if (node.inventory.accelerator() == v1::ACCELERATOR_KIND_UNSPECIFIED) {
    node.inventory.set_accelerator(v1::ACCELERATOR_KIND_CPU);
  }
  node.last_heartbeat_time = clock_->Now();
  node.lost = false;
  RETURN_IF_ERROR(repository_->UpsertNode(node));
  awaiting_reregistration_.erase(node_id);
  const bool known = nodes_.count(node_id) > 0;
  nodes_[node_id] = std::move(node);
  NoteNodeChanged(node_id);
  LOG(INFO) << "node " << node_id << (known ? " re-registered: " : " registered: ")
            << inventory.slots() << " " << KindName(nodes_[node_id].inventory.accelerator())
            << " slots at " << NodeAddress(nodes_[node_id]);
  UpdateGauges();
  return options_.heartbeat_interval;
}

bool Scheduler::Unreachable(const NodeRecord& node, absl::Time now) const {
  return !node.lost && now - node.last_heartbeat_time > options_.heartbeat_timeout;
}

loom::v1::NodeInfo Scheduler::NodeInfoOf(const NodeRecord& node) const {
  loom::v1::NodeInfo info;
  info.set_node_id(node.id);
  *info.mutable_inventory() = node.inventory;
  info.set_live(!node.lost);
  info.set_unreachable(Unreachable(node, clock_->Now()));
  info.set_cordoned(node.admin.cordoned() || node.admin.draining());
  info.set_draining(node.admin.draining());
  info.set_admin_reason(node.admin.reason());
  int used = 0;
  std::set<std::string> jobs;
  for (const RankKey& key : reconciler_.RanksOnNode(node.id)) {  // the node's own ranks only
    if (RankEnded(reconciler_.ranks().at(key).state)) continue;
    ++used;
    jobs.insert(key.first);
  }
  info.set_used_slots(used);
  info.set_free_slots(node.lost ? 0 : std::max(0, node.inventory.slots() - used));
  for (const std::string& j : jobs) info.add_job_ids(j);
  return info;
}

absl::StatusOr<std::vector<loom::v1::NodeInfo>> Scheduler::ListNodes() {
  absl::MutexLock lock(&mu_);
  std::vector<loom::v1::NodeInfo> out;
  for (const auto& [id, node] : nodes_) out.push_back(NodeInfoOf(node));
  return out;
}

absl::StatusOr<loom::v1::NodeInfo> Scheduler::CordonNode(const std::string& node_id,
                                                         const std::string& reason) {
  RETURN_IF_ERROR(CheckRequiredId("node_id", node_id));
  RETURN_IF_ERROR(CheckAdminReason(reason));
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return absl::NotFoundError(absl::StrCat("node ", node_id, " not found"));
  NodeRecord updated = it->second;
  updated.admin.set_cordoned(true);
  updated.admin.set_reason(reason);
  RETURN_IF_ERROR(repository_->UpsertNode(updated));
  it->second = std::move(updated);
  NoteNodeChanged(node_id);
  LOG(INFO) << "node " << node_id << " cordoned: " << reason;
  return NodeInfoOf(it->second);
}

absl::StatusOr<loom::v1::NodeInfo> Scheduler::UncordonNode(const std::string& node_id) {
  RETURN_IF_ERROR(CheckRequiredId("node_id", node_id));
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return absl::NotFoundError(absl::StrCat("node ", node_id, " not found"));
  NodeRecord updated = it->second;
  updated.admin.Clear();
  RETURN_IF_ERROR(repository_->UpsertNode(updated));
  it->second = std::move(updated);
  NoteNodeChanged(node_id);
  LOG(INFO) << "node " << node_id << " uncordoned";
  return NodeInfoOf(it->second);
}

absl::StatusOr<loom::v1::DrainNodeResponse> Scheduler::DrainNode(const std::string& node_id,
                                                                 const std::string& reason) {
  RETURN_IF_ERROR(CheckRequiredId("node_id", node_id));
  RETURN_IF_ERROR(CheckAdminReason(reason));
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return absl::NotFoundError(absl::StrCat("node ", node_id, " not found"));
  NodeRecord updated = it->second;
  updated.admin.set_cordoned(true);
  updated.admin.set_draining(true);
  updated.admin.set_reason(reason);
  RETURN_IF_ERROR(repository_->UpsertNode(updated));
  it->second = std::move(updated);
  NoteNodeChanged(node_id);
  std::set<std::string> jobs;
  for (const RankKey& key : reconciler_.RanksOnNode(node_id)) {  // the node's own ranks only
    const RankRuntime& rt = reconciler_.ranks().at(key);
    if (!RankEnded(rt.state) && !rt.stop_requested) jobs.insert(key.first);
  }
  loom::v1::DrainNodeResponse response;
  for (const std::string& job_id : jobs) {
    const JobPhase phase = jobs_.at(job_id).phase;
    if (phase != v1::JOB_PHASE_STARTING && phase != v1::JOB_PHASE_RUNNING) continue;
    RETURN_IF_ERROR(RequeueJob(
        job_id, "Drained",
        absl::StrCat("node ", node_id, " is draining",
                     reason.empty() ? "" : absl::StrCat(" (", reason, ")"),
                     "; requeued: the next attempt resumes from the newest committed checkpoint"),
        /*preempted=*/false));
    response.add_requeued_job_ids(job_id);
  }
  LOG(INFO) << "node " << node_id << " draining (" << reason << "): requeued "
            << response.requeued_job_ids_size() << " jobs";
  *response.mutable_node() = NodeInfoOf(nodes_.at(node_id));
  UpdateGauges();
  return response;
}

absl::StatusOr<std::vector<loom::v1::QueueInfo>> Scheduler::ListQueues() {
  absl::MutexLock lock(&mu_);
  std::map<std::pair<std::string, AcceleratorKind>, int64_t> usage;
  for (const auto& [key, rt] : reconciler_.ranks()) {
    if (RankEnded(rt.state)) continue;
    auto j = jobs_.find(key.first);
    if (j == jobs_.end()) continue;
    ++usage[{QueueOf(j->second.spec), KindOf(j->second.spec)}];
  }
  std::map<std::string, std::pair<int, int>> counts;  // queue -> (pending, running)
  for (const auto& [id, job] : jobs_) {
    if (Waiting(job)) ++counts[QueueOf(job.spec)].first;
    if (job.phase == v1::JOB_PHASE_STARTING || job.phase == v1::JOB_PHASE_RUNNING ||
        job.phase == v1::JOB_PHASE_STOPPING) {
      ++counts[QueueOf(job.spec)].second;
    }
  }
  std::vector<loom::v1::QueueInfo> out;
  for (const QueueConfig& q : options_.queues.queues) {
    loom::v1::QueueInfo info;
    info.set_name(q.name);
    info.set_tenant(q.tenant);
    info.set_has_quota(q.has_quota);
    for (const auto& [kind, n] : q.nominal) (*info.mutable_nominal_quota())[KindName(kind)] = n;
    for (const auto& [kind, n] : q.borrowing_limit) {
      (*info.mutable_borrowing_limit())[KindName(kind)] = n;
    }
    for (const auto& [key, n] : usage) {
      if (key.first == q.name) (*info.mutable_usage())[KindName(key.second)] = n;
    }
    info.set_pending_jobs(counts[q.name].first);
    info.set_running_jobs(counts[q.name].second);
    info.set_tenant_weight(options_.queues.Weight(q.tenant));
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace loom
