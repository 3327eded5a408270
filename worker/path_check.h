// The worker's own check of the paths a rank assignment names, before the trainer opens anything
// (docs/operations.md "Paths a job may name"). The worker does not take the scheduler's word that
// a path was confined at submission: it applies the same policy (scheduler/path_policy.h) with
// what it knows itself, its --checkpoint_root and its --data_roots, and gives the trainer the
// resolved paths.
//
//   * checkpoint_dir must resolve to <checkpoint_root>/<job id>. Each job directory carries an
//     owner record, <checkpoint_dir>/.loom-tenant (the tenant's name), written by the first worker
//     that starts one of the job's ranks; a directory whose record names another tenant is refused.
//   * model.init_from, dataset.path and dataset.tokenizer_model: in a job directory whose owner
//     record names the assignment's tenant (a directory without a record counts as no tenant's),
//     or under a data root of that tenant.
//   * the DeepSpeed config's nvme_paths (device "nvme"): in such a job directory or under a
//     scratch root of that tenant (never a data root).
// When the assignment carries the scheduler's roots for its tenant (tenant_roots_set), every
// path must also be allowed by those: a worker whose --data_roots is the union of all tenants'
// cannot tell tenants apart, and a path swapped for a symlink after submission is judged again.
//
// Thread-safe (reads and writes only the file system).
#ifndef LOOM_WORKER_PATH_CHECK_H_
#define LOOM_WORKER_PATH_CHECK_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/worker_service.pb.h"

namespace loom::worker {

inline constexpr char kOwnerRecordName[] = ".loom-tenant";

struct WorkerPathOptions {
  // The checkpoint root as mounted on this node (the scheduler's --checkpoint_root). Empty: no
  // checkpoint directory is checked or recorded, and init_from can only name data roots.
  std::string checkpoint_root;
  // Data roots: "/path" (every tenant) or "tenant=/path" (that tenant only); absolute paths.
  std::vector<std::string> data_roots;
  // Scratch roots (--scratch_roots, node-local NVMe mounts), in the same form. Empty: a job may
  // write offload swap files only in its own checkpoint directory.
  std::vector<std::string> scratch_roots;
};

// Parses --data_roots or --scratch_roots (`name`) ("/a,team-x=/b"; empty entries skipped).
// INVALID_ARGUMENT "<name>: ..." naming the entry for one that is not "/abs" or "tenant=/abs".
absl::StatusOr<std::vector<std::string>> ParseDataRoots(const std::string& flag,
                                                        const std::string& name = "data_roots");

// Checks `a` as described above (its tenant "" counts as "default") and returns it with
// every checked path of its spec resolved. Writes the owner record of the job's
// checkpoint directory if it has none (creating the directory). PERMISSION_DENIED naming the
// field ("model.init_from: ...", "dataset.path: ...", "checkpoint_dir: ..."); INVALID_ARGUMENT
// for a relative path; INTERNAL if the owner record cannot be written.
absl::StatusOr<loom::v1::RankAssignment> CheckAssignmentPaths(const loom::v1::RankAssignment& a,
                                                              const WorkerPathOptions& options);

}  // namespace loom::worker

#endif  // LOOM_WORKER_PATH_CHECK_H_
