// File: scheduler/queues.h
//
// Tenants, queues and quotas of the scheduler (docs/scheduling.md), as pure data plus the
// arithmetic the scheduling cycle needs. The model follows Kueue's ClusterQueue (nominal quota
// per resource flavor, borrowing limit, one cohort) and Slurm/Kueue fair sharing (dominant
// resource share over a weight):
//
//   * A queue belongs to one tenant (or to every tenant when its tenant is empty) and has, per
//     accelerator kind, a nominal quota in rank slots and an optional borrowing limit. A queue
//     without a `quota` section is unlimited; a queue with one may use only the kinds it lists
//     (an unlisted kind has nominal 0, so it can only borrow).
//   * All queues form one cohort. A job fits its queue's quota when usage + need <= nominal, or
//     when it borrows: usage + need <= nominal + borrowing_limit AND the cohort's usage of that
//     kind (over queues with a quota for it) stays within the cohort's summed nominal quota,
//     i.e. only idle quota of other queues is borrowed.
//   * Fair share of a tenant = max over kinds of (its used slots of the kind / live slots of
//     the kind) / its weight (dominant resource fairness, Ghodsi et al., NSDI 2011).
//
// Config file (YAML, loom-scheduler --queues_config):
//
//   data_roots:                 # optional: what every tenant's dataset.path / init_from may
//     - /usr/share/games/fortunes #   name outside its jobs' checkpoints (default: the
//                                 #   scheduler's --fortunes_dir); [] = nothing
//   scratch_roots: [/local_nvme]  # optional: where every tenant's ranks may write NVMe offload
//                                 #   swap files (nvme_path); default none
//   tenants:                    # optional; weight defaults to 1
//     team-a: {weight: 2, data_roots: [/data/team-a]}   # data_roots (and scratch_roots) replace
//                                                       # the top-level ones
//     team-b: {max_unfinished_jobs: 5000}  # replaces --max_unfinished_jobs_per_tenant (0 = none)
//   queues:
//     - name: a-gpu
//       tenant: team-a          # optional: "" = any tenant may submit
//       quota: {h100: 8, cpu: 16}
//       borrowing_limit: {h100: 4}
//
// Quotas and borrowing limits are integers in [0, 10^12]; weights are finite and > 0; keys are
// strings; data roots are absolute paths (scheduler/path_policy.h says how they are used). Without a file there is one "default" queue, open to every tenant, with no quota.
// Thread-safety: the config types are immutable values; QuotaLedger is not thread-safe.
#ifndef LOOM_SCHEDULER_QUEUES_H_
#define LOOM_SCHEDULER_QUEUES_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/accelerator_kind.h"  // AcceleratorKindName, ParseAcceleratorKind
#include "proto/common.pb.h"

namespace loom {


struct QueueConfig {
  std::string name;
  std::string tenant;  // "" = open to every tenant
  bool has_quota = false;  // false: unlimited
  std::map<loom::v1::AcceleratorKind, int64_t> nominal;          // rank slots
  std::map<loom::v1::AcceleratorKind, int64_t> borrowing_limit;  // absent = no borrowing

  int64_t Nominal(loom::v1::AcceleratorKind kind) const;
  int64_t BorrowingLimit(loom::v1::AcceleratorKind kind) const;
};

struct QueuesConfig {
  std::vector<QueueConfig> queues;  // in file order; names unique
  std::map<std::string, double> tenant_weights;  // absent tenant: weight 1
  // Data roots of tenants without their own (absent: the scheduler's default, its fortunes dir).
  std::optional<std::vector<std::string>> data_roots;
  std::map<std::string, std::vector<std::string>> tenant_data_roots;
  // Scratch roots (nvme_path, scheduler/path_policy.h) of tenants without their own; default none.
  std::vector<std::string> scratch_roots;
  std::map<std::string, std::vector<std::string>> tenant_scratch_roots;
  // tenants.<t>.max_unfinished_jobs: replaces SchedulerOptions::max_unfinished_jobs_per_tenant
  // for that tenant (0 = no limit).
  std::map<std::string, int64_t> tenant_max_unfinished_jobs;

  // One "default" queue, open to every tenant, no quota.
  static QueuesConfig Default();
  // nullptr if no queue has this name.
  const QueueConfig* Find(const std::string& name) const;
  double Weight(const std::string& tenant) const;
};

// Parses the YAML text above. INVALID_ARGUMENT naming the offending key path (e.g.
// "queues[1].quota.h100: must be >= 0") for unknown keys, bad kinds, duplicate names, negative
// quotas, non-positive weights or data roots that are not absolute paths.
absl::StatusOr<QueuesConfig> ParseQueuesConfig(const std::string& yaml_text);
// Reads and parses `path`; NOT_FOUND / INVALID_ARGUMENT (prefixed with the path).
absl::StatusOr<QueuesConfig> LoadQueuesConfig(const std::string& path);

// The queue a job submitted as `tenant` to `queue_name` ("" = "default") goes to.
// INVALID_ARGUMENT "queue X does not exist" / PERMISSION_DENIED "queue X belongs to tenant Y".
absl::StatusOr<const QueueConfig*> ResolveQueue(const QueuesConfig& config,
                                                const std::string& queue_name,
                                                const std::string& tenant);

// Slots in use per queue and kind, for quota checks within one scheduling cycle.
class QuotaLedger {
 public:
  explicit QuotaLedger(const QueuesConfig* config) : config_(config) {}

  void Add(const std::string& queue, loom::v1::AcceleratorKind kind, int64_t slots);
  int64_t Used(const std::string& queue, loom::v1::AcceleratorKind kind) const;

  struct Check {
    bool ok = false;
    bool borrows = false;  // fits only by borrowing idle quota of other queues
    std::string message;   // why not, e.g. "queue a-gpu quota for h100 is 8, 6 in use"
  };
  // Whether `need` more slots of `kind` fit `queue`'s quota (see the file comment).
  Check Fits(const QueueConfig& queue, loom::v1::AcceleratorKind kind, int64_t need) const;

 private:
  const QueuesConfig* config_;
  std::map<std::pair<std::string, loom::v1::AcceleratorKind>, int64_t> used_;
};

// Dominant resource share of a tenant: max over kinds of used[kind] / capacity[kind] (kinds with
// no capacity are skipped), divided by `weight`. 0 when nothing is used.
double DominantShare(const std::map<loom::v1::AcceleratorKind, int64_t>& used,
                     const std::map<loom::v1::AcceleratorKind, int64_t>& capacity, double weight);

}  // namespace loom

#endif  // LOOM_SCHEDULER_QUEUES_H_
