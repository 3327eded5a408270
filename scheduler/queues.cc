#include "scheduler/queues.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace loom {
namespace {

using loom::v1::AcceleratorKind;

// Upper bound on a quota or borrowing limit in rank slots: far above any cluster, and low enough
// that QuotaLedger's sums (nominal + limit, the cohort's summed quota) cannot overflow int64.
constexpr int64_t kMaxSlots = 1000000000000;

// The key of a map entry as a string; yaml-cpp throws on a sequence or map used as a key.
absl::StatusOr<std::string> KeyString(const YAML::Node& key, const std::string& path) {
  if (!key.IsScalar()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.empty() ? "top level" : path, ": key must be a string"));
  }
  return key.Scalar();
}

absl::Status CheckKeys(const YAML::Node& node, const std::string& path,
                       const std::set<std::string>& allowed) {
  for (const auto& kv : node) {
    ASSIGN_OR_RETURN(const std::string key, KeyString(kv.first, path));
    if (allowed.count(key) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, path.empty() ? "" : ".", key,
                                                     ": unknown key"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseKindMap(const YAML::Node& node, const std::string& path,
                          std::map<AcceleratorKind, int64_t>* out) {
  if (!node.IsMap()) return absl::InvalidArgumentError(absl::StrCat(path, ": must be a map"));
  for (const auto& kv : node) {
    ASSIGN_OR_RETURN(const std::string key, KeyString(kv.first, path));
    absl::StatusOr<AcceleratorKind> kind = ParseAcceleratorKind(key);
    if (!kind.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ".", key, ": ", kind.status().message()));
    }
    int64_t value = 0;
    try {
      value = kv.second.as<int64_t>();
    } catch (const YAML::Exception&) {
      return absl::InvalidArgumentError(absl::StrCat(path, ".", key, ": must be an integer"));
    }
    if (value < 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ".", key, ": must be >= 0, got ", value));
    }
    if (value > kMaxSlots) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ".", key, ": must be <= ", kMaxSlots, ", got ", value));
    }
    (*out)[*kind] = value;
  }
  return absl::OkStatus();
}

// A list of absolute paths ("data_roots", "tenants.x.scratch_roots", ...).
absl::Status ParseDataRoots(const YAML::Node& node, const std::string& path,
                            std::vector<std::string>* out) {
  if (!node.IsSequence()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": must be a list of absolute paths"));
  }
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string item = absl::StrCat(path, "[", i, "]");
    if (!node[i].IsScalar()) return absl::InvalidArgumentError(absl::StrCat(item, ": must be a path"));
    const std::string root = node[i].Scalar();
    if (root.empty() || root[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat(item, ": '", root, "' must be an absolute path"));
    }
    out->push_back(root);
  }
  return absl::OkStatus();
}

}  // namespace

int64_t QueueConfig::Nominal(AcceleratorKind kind) const {
  auto it = nominal.find(kind);
  return it == nominal.end() ? 0 : it->second;
}

int64_t QueueConfig::BorrowingLimit(AcceleratorKind kind) const {
  auto it = borrowing_limit.find(kind);
  return it == borrowing_limit.end() ? 0 : it->second;
}

QueuesConfig QueuesConfig::Default() {
  QueuesConfig config;
  QueueConfig q;
  q.name = "default";
  config.queues.push_back(q);
  return config;
}

const QueueConfig* QueuesConfig::Find(const std::string& name) const {
  for (const QueueConfig& q : queues) {
    if (q.name == name) return &q;
  }
  return nullptr;
}

double QueuesConfig::Weight(const std::string& tenant) const {
  auto it = tenant_weights.find(tenant);
  return it == tenant_weights.end() ? 1.0 : it->second;
}

absl::StatusOr<QueuesConfig> ParseQueuesConfig(const std::string& yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not valid YAML: ", e.what()));
  }
  if (!root.IsMap()) return absl::InvalidArgumentError("top level: must be a map");
  RETURN_IF_ERROR(CheckKeys(root, "", {"tenants", "queues", "data_roots", "scratch_roots"}));
  QueuesConfig config;
  try {
    if (root["data_roots"]) {
      config.data_roots.emplace();
      RETURN_IF_ERROR(ParseDataRoots(root["data_roots"], "data_roots", &*config.data_roots));
    }
    if (root["scratch_roots"]) {
      RETURN_IF_ERROR(ParseDataRoots(root["scratch_roots"], "scratch_roots", &config.scratch_roots));
    }
    if (root["tenants"]) {
      if (!root["tenants"].IsMap()) return absl::InvalidArgumentError("tenants: must be a map");
      for (const auto& kv : root["tenants"]) {
        ASSIGN_OR_RETURN(const std::string tenant, KeyString(kv.first, "tenants"));
        const std::string path = absl::StrCat("tenants.", tenant);
        if (!kv.second.IsMap()) return absl::InvalidArgumentError(absl::StrCat(path, ": must be a map"));
        RETURN_IF_ERROR(CheckKeys(kv.second, path,
                                  {"weight", "data_roots", "scratch_roots", "max_unfinished_jobs"}));
        if (kv.second["max_unfinished_jobs"]) {
          const int64_t cap = kv.second["max_unfinished_jobs"].as<int64_t>();
          if (cap < 0 || cap > kMaxSlots) {
            return absl::InvalidArgumentError(absl::StrCat(
                path, ".max_unfinished_jobs: must be in [0, ", kMaxSlots, "] (0 = no limit), got ",
                cap));
          }
          config.tenant_max_unfinished_jobs[tenant] = cap;
        }
        if (kv.second["data_roots"]) {
          RETURN_IF_ERROR(ParseDataRoots(kv.second["data_roots"], path + ".data_roots",
                                         &config.tenant_data_roots[tenant]));
        }
        if (kv.second["scratch_roots"]) {
          RETURN_IF_ERROR(ParseDataRoots(kv.second["scratch_roots"], path + ".scratch_roots",
                                         &config.tenant_scratch_roots[tenant]));
        }
        double weight = 1;
        if (kv.second["weight"]) weight = kv.second["weight"].as<double>();
        if (!(weight > 0)) {
          return absl::InvalidArgumentError(absl::StrCat(path, ".weight: must be > 0, got ", weight));
        }
        if (!std::isfinite(weight)) {
          return absl::InvalidArgumentError(absl::StrCat(path, ".weight: must be finite"));
        }
        config.tenant_weights[tenant] = weight;
      }
    }
    const YAML::Node queues = root["queues"];
    if (!queues || !queues.IsSequence() || queues.size() == 0) {
      return absl::InvalidArgumentError("queues: must be a non-empty list");
    }
    std::set<std::string> names;
    for (size_t i = 0; i < queues.size(); ++i) {
      const YAML::Node q = queues[i];
      const std::string path = absl::StrCat("queues[", i, "]");
      if (!q.IsMap()) return absl::InvalidArgumentError(absl::StrCat(path, ": must be a map"));
      RETURN_IF_ERROR(CheckKeys(q, path, {"name", "tenant", "quota", "borrowing_limit"}));
      QueueConfig queue;
      if (!q["name"] || q["name"].as<std::string>().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ".name: required"));
      }
      queue.name = q["name"].as<std::string>();
      if (!names.insert(queue.name).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ".name: queue ", queue.name, " is defined twice"));
      }
      if (q["tenant"]) queue.tenant = q["tenant"].as<std::string>();
      if (q["quota"]) {
        queue.has_quota = true;
        RETURN_IF_ERROR(ParseKindMap(q["quota"], path + ".quota", &queue.nominal));
      }
      if (q["borrowing_limit"]) {
        if (!queue.has_quota) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ".borrowing_limit: needs a quota (an unlimited queue never borrows)"));
        }
        RETURN_IF_ERROR(ParseKindMap(q["borrowing_limit"], path + ".borrowing_limit",
                                     &queue.borrowing_limit));
      }
      config.queues.push_back(std::move(queue));
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("bad value: ", e.what()));
  }
  return config;
}

absl::StatusOr<QueuesConfig> LoadQueuesConfig(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  absl::StatusOr<QueuesConfig> config = ParseQueuesConfig(text);
  if (!config.ok()) {
    return absl::Status(config.status().code(), absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

absl::StatusOr<const QueueConfig*> ResolveQueue(const QueuesConfig& config,
                                                const std::string& queue_name,
                                                const std::string& tenant) {
  const std::string name = queue_name.empty() ? "default" : queue_name;
  const QueueConfig* queue = config.Find(name);
  if (queue == nullptr) {
    std::string known;
    for (const QueueConfig& q : config.queues) absl::StrAppend(&known, known.empty() ? "" : ", ", q.name);
    return absl::InvalidArgumentError(
        absl::StrCat("spec.queue: queue ", name, " does not exist (queues: ", known, ")"));
  }
  if (!queue->tenant.empty() && queue->tenant != tenant) {
    return absl::PermissionDeniedError(absl::StrCat("spec.queue: queue ", name,
                                                    " belongs to tenant ", queue->tenant,
                                                    ", not to ", tenant));
  }
  return queue;
}

void QuotaLedger::Add(const std::string& queue, AcceleratorKind kind, int64_t slots) {
  used_[{queue, kind}] += slots;
}

int64_t QuotaLedger::Used(const std::string& queue, AcceleratorKind kind) const {
  auto it = used_.find({queue, kind});
  return it == used_.end() ? 0 : it->second;
}

QuotaLedger::Check QuotaLedger::Fits(const QueueConfig& queue, AcceleratorKind kind,
                                     int64_t need) const {
  Check check;
  if (!queue.has_quota) {
    check.ok = true;
    return check;
  }
  const std::string kind_name = AcceleratorKindName(kind);
  const int64_t used = Used(queue.name, kind);
  const int64_t nominal = queue.Nominal(kind);
  if (used + need <= nominal) {
    check.ok = true;
    return check;
  }
  const int64_t limit = queue.BorrowingLimit(kind);
  check.message = absl::StrCat("queue ", queue.name, " quota for ", kind_name, " is ", nominal,
                               ", ", used, " in use, job needs ", need);
  if (limit == 0) return check;
  if (used + need > nominal + limit) {
    absl::StrAppend(&check.message, " (borrowing limit ", limit, ")");
    return check;
  }
  // Idle quota of the cohort: summed nominal minus summed usage over queues with a quota.
  int64_t cohort_nominal = 0, cohort_used = 0;
  for (const QueueConfig& q : config_->queues) {
    if (!q.has_quota) continue;
    cohort_nominal += q.Nominal(kind);
    cohort_used += Used(q.name, kind);
  }
  if (cohort_used + need > cohort_nominal) {
    absl::StrAppend(&check.message, "; no idle ", kind_name, " quota to borrow (cohort uses ",
                    cohort_used, " of ", cohort_nominal, ")");
    return check;
  }
  check.ok = true;
  check.borrows = true;
  check.message.clear();
  return check;
}

double DominantShare(const std::map<AcceleratorKind, int64_t>& used,
                     const std::map<AcceleratorKind, int64_t>& capacity, double weight) {
  double share = 0;
  for (const auto& [kind, n] : used) {
    auto cap = capacity.find(kind);
    if (cap == capacity.end() || cap->second <= 0) continue;
    share = std::max(share, static_cast<double>(n) / static_cast<double>(cap->second));
  }
  return weight > 0 ? share / weight : share;
}

}  // namespace loom
