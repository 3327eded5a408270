#include "scheduler/path_policy.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "google/protobuf/struct.pb.h"

namespace loom {
namespace {

// Whether resolved `path` is `root` or inside it (both resolved, no trailing '/').
bool IsUnder(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || (absl::StartsWith(path, root) && path.size() > root.size() &&
                          path[root.size()] == '/');
}

std::string StripTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// The member `key` of `s` if it is an object, else nullptr.
google::protobuf::Struct* Member(google::protobuf::Struct* s, const char* key) {
  auto it = s->mutable_fields()->find(key);
  if (it == s->mutable_fields()->end() || !it->second.has_struct_value()) return nullptr;
  return it->second.mutable_struct_value();
}

// zero_optimization.<block>.nvme_path of a DeepSpeed config if a rank will write there: a
// string beside device "nvme". A value of another type is left to the config's parser, which
// refuses it naming the key.
google::protobuf::Value* NvmePath(google::protobuf::Struct* ds_config, const char* block) {
  google::protobuf::Struct* zero = Member(ds_config, "zero_optimization");
  google::protobuf::Struct* offload = zero == nullptr ? nullptr : Member(zero, block);
  if (offload == nullptr) return nullptr;
  auto device = offload->fields().find("device");
  if (device == offload->fields().end() || device->second.string_value() != "nvme") return nullptr;
  auto path = offload->mutable_fields()->find("nvme_path");
  if (path == offload->mutable_fields()->end() || !path->second.has_string_value()) return nullptr;
  return &path->second;
}

}  // namespace

const std::vector<std::string>& PathPolicy::DataRoots(const std::string& tenant) const {
  auto it = tenant_data_roots.find(tenant);
  return it == tenant_data_roots.end() ? default_data_roots : it->second;
}

const std::vector<std::string>& PathPolicy::ScratchRoots(const std::string& tenant) const {
  auto it = tenant_scratch_roots.find(tenant);
  return it == tenant_scratch_roots.end() ? default_scratch_roots : it->second;
}

absl::StatusOr<std::string> ResolvePath(const std::string& field, const std::string& path) {
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' must be an absolute path"));
  }
  std::error_code error;
  std::filesystem::path resolved = std::filesystem::weakly_canonical(path, error);
  if (error) {
    return absl::PermissionDeniedError(
        absl::StrCat(field, ": '", path, "' cannot be resolved: ", error.message()));
  }
  return StripTrailingSlashes(resolved.lexically_normal().string());
}

absl::StatusOr<std::string> ConfinePath(const std::string& field, const std::string& path,
                                        const std::string& tenant, const PathPolicy& policy,
                                        const JobOwnerLookup& owner_of, PathUse use) {
  ASSIGN_OR_RETURN(const std::string resolved, ResolvePath(field, path));
  const std::string shown =
      resolved == path ? absl::StrCat("'", path, "'") : absl::StrCat("'", path, "' (", resolved, ")");
  if (!policy.checkpoint_root.empty()) {
    absl::StatusOr<std::string> root = ResolvePath("checkpoint_root", policy.checkpoint_root);
    if (root.ok() && IsUnder(resolved, *root)) {
      // <root>/<job id>[/...]: allowed only in a directory of a job `tenant` owns.
      const size_t skip = root->size() == 1 ? 1 : root->size() + 1;  // "<root>/"
      const std::string rest = resolved.size() > skip ? resolved.substr(skip) : "";
      const std::string job_id = rest.substr(0, rest.find('/'));
      absl::StatusOr<std::string> owner =
          job_id.empty() ? absl::NotFoundError("") : owner_of(job_id);
      if (owner.ok() && *owner == tenant) return resolved;
      return absl::PermissionDeniedError(absl::StrCat(
          field, ": ", shown, " is in the checkpoint root but not in a checkpoint directory of a "
          "job of tenant ", tenant, " (a job's checkpoints and exports are under ", *root,
          "/<job id>/ and only its own tenant may name them)"));
    }
  }
  const bool scratch = use == PathUse::kScratch;
  const std::vector<std::string>& roots =
      scratch ? policy.ScratchRoots(tenant) : policy.DataRoots(tenant);
  const char* roots_name = scratch ? "scratch roots" : "data roots";
  std::vector<std::string> shown_roots;
  for (const std::string& configured : roots) {
    absl::StatusOr<std::string> root = ResolvePath(scratch ? "scratch_roots" : "data_roots", configured);
    if (!root.ok()) continue;  // the configuration is checked when it is loaded
    if (IsUnder(resolved, *root)) return resolved;
    shown_roots.push_back(configured);
  }
  return absl::PermissionDeniedError(absl::StrCat(
      field, ": ", shown, " is outside the ", roots_name, " of tenant ", tenant, " (",
      shown_roots.empty() ? "none configured" : absl::StrJoin(shown_roots, ", "),
      ") and outside its jobs' checkpoint directories",
      scratch ? " (the operator lists node-local scratch directories as scratch_roots in the "
                "scheduler's queues config and the workers' --scratch_roots)"
              // A newcomer's pass (issue 49): the message named the roots but not how to add one.
              : " (the operator adds directories as data_roots in the scheduler's queues config "
                "and the workers' --data_roots; on a local cluster: scripts/local_cluster.sh "
                "stop, then LOOM_DATA_ROOTS=DIR,... scripts/local_cluster.sh start)"));
}

absl::Status ConfineJobSpecPaths(const loom::v1::JobSpec& spec, const std::string& tenant,
                                 const PathPolicy& policy, const JobOwnerLookup& owner_of,
                                 loom::v1::JobSpec* resolved) {
  if (resolved != nullptr) *resolved = spec;
  if (!spec.model().init_from().empty()) {
    ASSIGN_OR_RETURN(std::string path, ConfinePath("model.init_from", spec.model().init_from(),
                                                   tenant, policy, owner_of));
    if (resolved != nullptr) resolved->mutable_model()->set_init_from(path);
  }
  if (!spec.dataset().path().empty()) {
    ASSIGN_OR_RETURN(std::string path, ConfinePath("dataset.path", spec.dataset().path(), tenant,
                                                   policy, owner_of));
    if (resolved != nullptr) resolved->mutable_dataset()->set_path(path);
  }
  if (!spec.dataset().tokenizer_model().empty()) {  // read by the trainer like dataset.path
    ASSIGN_OR_RETURN(std::string path,
                     ConfinePath("dataset.tokenizer_model", spec.dataset().tokenizer_model(),
                                 tenant, policy, owner_of));
    if (resolved != nullptr) resolved->mutable_dataset()->set_tokenizer_model(path);
  }
  // The swap directories of NVMe offload, written by the ranks.
  google::protobuf::Struct ds_config = spec.deepspeed_config();
  for (const char* block : {"offload_optimizer", "offload_param"}) {
    google::protobuf::Value* path = NvmePath(&ds_config, block);
    if (path == nullptr) continue;
    ASSIGN_OR_RETURN(std::string confined,
                     ConfinePath(absl::StrCat("deepspeed_config.zero_optimization.", block,
                                              ".nvme_path"),
                                 path->string_value(), tenant, policy, owner_of,
                                 PathUse::kScratch));
    path->set_string_value(confined);
  }
  if (resolved != nullptr) *resolved->mutable_deepspeed_config() = std::move(ds_config);
  return absl::OkStatus();
}

}  // namespace loom
