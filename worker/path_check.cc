#include "worker/path_check.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "scheduler/path_policy.h"

namespace loom::worker {
namespace {

// The tenant named by `dir`'s owner record; NOT_FOUND without one.
absl::StatusOr<std::string> ReadOwner(const std::string& dir) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(absl::StrCat(dir, "/", kOwnerRecordName)));
  return std::string(absl::StripAsciiWhitespace(text));
}

// The entries of `roots` ("/p" or "tenant=/p") that apply to `tenant`, as paths.
std::vector<std::string> RootsOf(const std::vector<std::string>& roots, const std::string& tenant) {
  std::vector<std::string> paths;
  for (const std::string& entry : roots) {
    if (entry[0] == '/') {
      paths.push_back(entry);
    } else if (entry.substr(0, entry.find('=')) == tenant) {
      paths.push_back(entry.substr(entry.find('=') + 1));
    }
  }
  return paths;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseDataRoots(const std::string& flag,
                                                        const std::string& name) {
  std::vector<std::string> roots;
  for (absl::string_view entry : absl::StrSplit(flag, ',', absl::SkipWhitespace())) {
    const std::string e(absl::StripAsciiWhitespace(entry));
    const size_t eq = e.find('=');
    const bool tenant_entry = !e.empty() && e[0] != '/' && eq != std::string::npos && eq > 0;
    const std::string path = tenant_entry ? e.substr(eq + 1) : e;
    if (path.empty() || path[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": '", e, "' is neither an absolute path nor tenant=<absolute path>"));
    }
    roots.push_back(e);
  }
  return roots;
}

absl::StatusOr<loom::v1::RankAssignment> CheckAssignmentPaths(const loom::v1::RankAssignment& a,
                                                              const WorkerPathOptions& options) {
  const std::string tenant = a.tenant().empty() ? "default" : a.tenant();
  PathPolicy policy;
  policy.default_data_roots = RootsOf(options.data_roots, tenant);
  policy.default_scratch_roots = RootsOf(options.scratch_roots, tenant);
  policy.checkpoint_root = options.checkpoint_root;
  if (!options.checkpoint_root.empty()) {
    // The job's own directory: exactly <root>/<job id>, recorded as this tenant's.
    ASSIGN_OR_RETURN(const std::string root,
                     ResolvePath("checkpoint_root", options.checkpoint_root));
    ASSIGN_OR_RETURN(const std::string dir, ResolvePath("checkpoint_dir", a.checkpoint_dir()));
    if (a.job_id().empty() || a.job_id().find('/') != std::string::npos ||
        dir != absl::StrCat(root == "/" ? "" : root, "/", a.job_id())) {
      return absl::PermissionDeniedError(absl::StrCat(
          "checkpoint_dir: '", a.checkpoint_dir(), "' is not ", root, "/", a.job_id(),
          " (this worker's --checkpoint_root and the job id)"));
    }
    absl::StatusOr<std::string> owner = ReadOwner(dir);
    if (owner.ok() && *owner != tenant) {
      return absl::PermissionDeniedError(absl::StrCat(
          "checkpoint_dir: ", dir, " belongs to another tenant than ", tenant));
    }
    if (!owner.ok()) {
      if (!absl::IsNotFound(owner.status())) return owner.status();
      RETURN_IF_ERROR(MakeDirs(dir));
      absl::Status written =
          WriteFileAtomically(absl::StrCat(dir, "/", kOwnerRecordName), tenant + "\n");
      if (!written.ok()) {
        return absl::InternalError(absl::StrCat("checkpoint_dir: cannot write the owner record: ",
                                                written.message()));
      }
    }
  }
  const std::string ckpt_root = options.checkpoint_root;
  const JobOwnerLookup owner_of = [&](const std::string& job_id) -> absl::StatusOr<std::string> {
    return ReadOwner(absl::StrCat(ckpt_root, "/", job_id));
  };
  loom::v1::RankAssignment checked = a;
  RETURN_IF_ERROR(ConfineJobSpecPaths(a.spec(), tenant, policy, owner_of, checked.mutable_spec()));
  if (a.tenant_roots_set()) {
    // And by the tenant's own roots as the scheduler has them: this worker's roots may be the
    // union of every tenant's, and a path may have been swapped since submission.
    PathPolicy tenant_policy;
    tenant_policy.checkpoint_root = options.checkpoint_root;
    tenant_policy.default_data_roots.assign(a.tenant_data_roots().begin(),
                                            a.tenant_data_roots().end());
    tenant_policy.default_scratch_roots.assign(a.tenant_scratch_roots().begin(),
                                               a.tenant_scratch_roots().end());
    RETURN_IF_ERROR(ConfineJobSpecPaths(a.spec(), tenant, tenant_policy, owner_of));
  }
  return checked;
}

}  // namespace loom::worker
