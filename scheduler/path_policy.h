// File: scheduler/path_policy.h
//
// Tenancy confinement of the file-system paths a JobSpec names (docs/operations.md "Paths a job
// may name"). Paths are data: a tenant may name
//   * files and directories under <checkpoint_root>/<job id>/ of a job that tenant owns (its
//     checkpoints and their exports, e.g. <checkpoint_root>/<job>/step_<N>/hf for init_from), and
//   * files and directories under the data roots the operator configured for that tenant,
// and nothing else. The path is resolved first (symlinks and "..": realpath of its longest
// existing prefix, the rest normalised lexically), and the resolved path is what is checked and
// what the trainer should open. A path under the checkpoint root is decided by the job-ownership
// rule alone, even if a data root contains the checkpoint root. The checkpoint root itself, and a
// job directory of another tenant or of no job, are refused with the same message, so job ids of
// other tenants cannot be probed.
//
// Paths a rank writes (scratch) are confined differently: the DeepSpeed config's
// zero_optimization.offload_optimizer.nvme_path and offload_param.nvme_path (when that block's
// device is "nvme": DeepSpeed's sample configs carry an nvme_path beside device "cpu", which
// nothing reads) may name the tenant's own jobs' checkpoint directories or the scratch roots the
// operator configured (node-local NVMe mounts), never a data root: data roots are inputs other
// tenants may read, and a rank writing there could replace them.
//
// The fields confined: model.init_from, dataset.path, dataset.tokenizer_model (empty = not
// given: the built-in corpus is Loom's, not the tenant's) and the nvme_paths above. Used by the
// scheduler at submission (owners from its job table) and again by the worker before it starts a
// trainer (owners from the owner record each job directory carries, worker/path_check.h).
//
// Errors: INVALID_ARGUMENT "<field>: ... must be an absolute path"; PERMISSION_DENIED
// "<field>: '<path>' is not in ..." naming the field. Thread-safe (pure functions; they read the
// file system to resolve paths).
#ifndef LOOM_SCHEDULER_PATH_POLICY_H_
#define LOOM_SCHEDULER_PATH_POLICY_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/common.pb.h"

namespace loom {

struct PathPolicy {
  // Absolute directory holding <job id>/ per job. Empty: no path under any checkpoint root is
  // recognised as a job's (only data roots apply).
  std::string checkpoint_root;
  // Data roots (absolute directories or files) of a tenant not in tenant_data_roots.
  std::vector<std::string> default_data_roots;
  // Per tenant: its data roots, replacing default_data_roots.
  std::map<std::string, std::vector<std::string>> tenant_data_roots;
  // Scratch roots (absolute directories, e.g. node-local NVMe mounts) where the ranks of a
  // tenant not in tenant_scratch_roots may write offload swap files. Empty: none.
  std::vector<std::string> default_scratch_roots;
  // Per tenant: its scratch roots, replacing default_scratch_roots.
  std::map<std::string, std::vector<std::string>> tenant_scratch_roots;

  const std::vector<std::string>& DataRoots(const std::string& tenant) const;
  const std::vector<std::string>& ScratchRoots(const std::string& tenant) const;
};

// What a confined path is for: read (data roots) or written by the ranks (scratch roots).
enum class PathUse { kRead, kScratch };

// The tenant owning the job with this id; NOT_FOUND (or any error) = no job this caller may use.
using JobOwnerLookup = std::function<absl::StatusOr<std::string>(const std::string& job_id)>;

// `path` with symlinks and ".." resolved: realpath(3) of the longest existing prefix, the
// remaining components normalised lexically. INVALID_ARGUMENT "<field>: ..." if it is not
// absolute.
absl::StatusOr<std::string> ResolvePath(const std::string& field, const std::string& path);

// The resolved `path` if `tenant` may name it for `use` under `policy` (see the file comment),
// else PERMISSION_DENIED naming `field`.
absl::StatusOr<std::string> ConfinePath(const std::string& field, const std::string& path,
                                        const std::string& tenant, const PathPolicy& policy,
                                        const JobOwnerLookup& owner_of,
                                        PathUse use = PathUse::kRead);

// Confines every path field of `spec` listed in the file comment (the first refusal is
// returned). With `resolved` non-null, *resolved is `spec` with those paths replaced by their
// resolved forms (in deepspeed_config too).
absl::Status ConfineJobSpecPaths(const loom::v1::JobSpec& spec, const std::string& tenant,
                                 const PathPolicy& policy, const JobOwnerLookup& owner_of,
                                 loom::v1::JobSpec* resolved = nullptr);

}  // namespace loom

#endif  // LOOM_SCHEDULER_PATH_POLICY_H_
