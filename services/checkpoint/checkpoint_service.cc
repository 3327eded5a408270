#include "services/checkpoint/checkpoint_service.h"

#include "common/grpc_credentials.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "storage/checkpoint/corrupt_mark.h"
#include "storage/checkpoint/shard_format.h"
#include "storage/checkpoint/verify.h"

#include <dirent.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/stat.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"

namespace loom {
namespace {

prometheus::Family<prometheus::Counter>& ConsolidationsFamily(prometheus::Registry& registry) {
  return prometheus::BuildCounter()
      .Name("loom_checkpoint_consolidations_total")
      .Help("ConsolidateCheckpoint calls by result (ok or the lower-case canonical error code).")
      .Register(registry);
}

prometheus::Histogram& SecondsHistogram(prometheus::Registry& registry) {
  return prometheus::BuildHistogram()
      .Name("loom_checkpoint_consolidation_seconds")
      .Help("Wall time of ConsolidateCheckpoint calls, seconds.")
      .Register(registry)
      // From 1 ms (a small model's consolidation; a 0.01 s lowest bucket put every one of the
      // truth test's in it) to 2 h (a 70B model from network storage).
      .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                       0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120,
                                                       300, 600, 1800, 3600, 7200});
}

prometheus::Counter& BytesCounter(prometheus::Registry& registry) {
  return prometheus::BuildCounter()
      .Name("loom_checkpoint_consolidated_bytes_total")
      .Help("Bytes of model.safetensors files written by consolidation.")
      .Register(registry)
      .Add({});
}

absl::Status ValidateOutputDir(const std::string& dir) {
  if (dir.empty()) return absl::OkStatus();
  if (dir.front() != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("output_dir: '", dir, "' is not an absolute path"));
  }
  std::vector<absl::string_view> parts = absl::StrSplit(dir, '/', absl::SkipEmpty());
  for (absl::string_view part : parts) {
    if (part == "..") {
      return absl::InvalidArgumentError(absl::StrCat("output_dir: '", dir, "' contains '..'"));
    }
  }
  // Never into a checkpoint step directory (its own or another step's, of any job): the export
  // replaces model.safetensors and config.json there, and verifying that step would then check
  // the export instead of its shards. A subdirectory of one (the default: <step>/hf) is fine.
  if (!parts.empty() && storage::ParseStepDirName(parts.back()).has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output_dir: '", dir, "' is a checkpoint step directory; export into a directory of "
        "its own (the default is <step directory>/hf)"));
  }
  if (DIR* d = ::opendir(dir.c_str()); d != nullptr) {
    bool shards = false;
    while (dirent* e = ::readdir(d)) {
      const absl::string_view name = e->d_name;
      if (absl::StartsWith(name, "rank_") &&
          (absl::EndsWith(name, ".manifest.json") || absl::EndsWith(name, ".shard"))) {
        shards = true;
        break;
      }
    }
    ::closedir(d);
    if (shards) {
      return absl::InvalidArgumentError(absl::StrCat(
          "output_dir: '", dir, "' holds checkpoint shards (rank_*.manifest.json / "
          "rank_*.shard); export into a directory of its own"));
    }
  }
  return absl::OkStatus();
}

// NOT_FOUND naming the job if its checkpoint directory does not exist.
absl::Status JobDirExists(const std::string& job_id, const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(
        absl::StrCat("job '", job_id, "' has no checkpoint directory (", dir, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> JobCheckpointDir(const std::string& checkpoint_root,
                                             const std::string& job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: empty");
  if (job_id == "." || absl::StrContains(job_id, "..") || absl::StrContains(job_id, '/') ||
      absl::StrContains(job_id, '\0')) {
    return absl::InvalidArgumentError(
        absl::StrCat("job_id: '", job_id, "' must not contain '/' or '..'"));
  }
  return absl::StrCat(checkpoint_root, "/", job_id);
}

namespace {

void ToProto(const storage::CheckpointInfo& info, v1::CheckpointInfo* out) {
  out->set_step(info.step);
  out->set_world_size(info.world_size);
  out->set_committed(info.committed);
  out->set_path(info.path);
  out->set_ranks_reported(static_cast<int32_t>(info.ranks_reported.size()));
  out->set_total_bytes(info.total_bytes);
  for (const auto& [name, value] : info.metrics) (*out->mutable_metrics())[name] = value;
  out->set_corrupt(info.corrupt);
  out->set_corrupt_reason(info.corrupt_reason);
  if (!info.corrupt && absl::IsDataLoss(info.commit_status)) {
    out->set_damaged_reason(std::string(info.commit_status.message()));
  }
}

// A step whose deletion is pending, as a listing entry (see CheckpointInfo.deletion_state).
void PendingToProto(const storage::PendingDeletion& p, const std::string& last_error,
                    v1::CheckpointInfo* out) {
  out->set_step(p.step);
  out->set_path(p.path);
  out->set_total_bytes(p.bytes);
  const std::string error = p.status.ok() ? last_error : std::string(p.status.message());
  out->set_deletion_state(error.empty() ? "deleting" : "delete_failed");
  out->set_deletion_error(error);
}

}  // namespace

absl::StatusOr<std::vector<v1::CheckpointInfo>> CheckpointServiceImpl::Listing(
    const std::string& dir) {
  auto list = storage::ListCheckpoints(dir);
  if (!list.ok()) return list.status();
  // Pending deletions are retried here too when no deletion or consolidation runs (so leftovers
  // go without a restart), else listed as they are, with the error their last removal met.
  absl::StatusOr<std::vector<storage::PendingDeletion>> pending;
  if (consolidate_mu_.TryLock()) {
    pending = storage::RetryPendingDeletions(dir);
    consolidate_mu_.Unlock();
    if (pending.ok()) NoteDeletionFailures(dir, *pending);
  } else {
    pending = storage::ListPendingDeletions(dir);
  }
  if (!pending.ok()) return pending.status();
  std::vector<v1::CheckpointInfo> out;
  out.reserve(list->size() + pending->size());
  for (const storage::CheckpointInfo& info : *list) ToProto(info, &out.emplace_back());
  {
    absl::MutexLock lock(&deletion_errors_mu_);
    for (const storage::PendingDeletion& p : *pending) {
      auto e = deletion_errors_.find(p.path);
      PendingToProto(p, e == deletion_errors_.end() ? "" : e->second, &out.emplace_back());
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const v1::CheckpointInfo& a,
                                              const v1::CheckpointInfo& b) {
    return a.step() < b.step();
  });
  return out;
}

void CheckpointServiceImpl::NoteDeletionFailures(
    const std::string& dir, const std::vector<storage::PendingDeletion>& failed) {
  absl::MutexLock lock(&deletion_errors_mu_);
  // Forget the errors of this directory's deletions that are gone, then remember the new ones.
  const std::string prefix = dir + "/";
  for (auto it = deletion_errors_.lower_bound(prefix);
       it != deletion_errors_.end() && absl::StartsWith(it->first, prefix);) {
    it = deletion_errors_.erase(it);
  }
  for (const storage::PendingDeletion& p : failed) {
    if (p.status.ok()) continue;
    deletion_errors_[p.path] = std::string(p.status.message());
    LOG_EVERY_N(WARNING, 100) << "cannot delete checkpoint step " << p.step << " (" << p.bytes
                              << " bytes left in " << p.path << "): " << p.status;
  }
}

void CheckpointServiceImpl::RememberDeletionError(const std::string& dir, int64_t step,
                                                  const absl::Status& error) {
  auto pending = storage::ListPendingDeletions(dir);
  if (!pending.ok()) return;
  absl::MutexLock lock(&deletion_errors_mu_);
  for (const storage::PendingDeletion& p : *pending) {
    if (p.step == step) deletion_errors_[p.path] = std::string(error.message());
  }
}

absl::StatusOr<std::string> CheckpointServiceImpl::ExistingJobDir(const std::string& job_id) const {
  absl::StatusOr<std::string> dir = JobCheckpointDir(options_.checkpoint_root, job_id);
  if (!dir.ok()) return dir.status();
  absl::Status exists = JobDirExists(job_id, *dir);
  if (!exists.ok()) return exists;
  return dir;
}

CheckpointServiceImpl::CheckpointServiceImpl(CheckpointServiceOptions options,
                                             prometheus::Registry& registry)
    : options_(std::move(options)),
      consolidations_(ConsolidationsFamily(registry)),
      consolidation_seconds_(SecondsHistogram(registry)),
      consolidated_bytes_(BytesCounter(registry)) {
  // Every result a call can have exists at 0 before the first call ("ok" and each canonical
  // error code), so increase() counts a result's first occurrence (issue 53).
  consolidations_.Add({{"result", "ok"}});
  for (int code = 1; code <= 16; ++code) {
    consolidations_.Add({{"result", absl::AsciiStrToLower(absl::StatusCodeToString(
                                        static_cast<absl::StatusCode>(code)))}});
  }
}

grpc::Status CheckpointServiceImpl::Authorize(const grpc::ServerContext& context) const {
  if (options_.users == nullptr && options_.service == nullptr) return grpc::Status::OK;
  if (options_.service != nullptr && CallerFromMetadata(context, options_.service).ok()) {
    return grpc::Status::OK;
  }
  absl::StatusOr<Caller> caller =
      options_.users != nullptr ? CallerFromMetadata(context, options_.users)
                                : absl::UnauthenticatedError("unknown token");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (!caller->admin()) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "loom-checkpoint: an admin token is required (checkpoints are addressed "
                        "by job id across tenants)");
  }
  return grpc::Status::OK;
}

grpc::Status CheckpointServiceImpl::ListCheckpoints(grpc::ServerContext* context,
                                                    const v1::ListCheckpointsRequest* req,
                                                    v1::ListCheckpointsResponse* resp) {
  if (grpc::Status a = Authorize(*context); !a.ok()) return a;
  absl::StatusOr<std::string> dir = ExistingJobDir(req->job_id());
  if (!dir.ok()) return ToGrpcStatus(dir.status());
  auto list = Listing(*dir);
  if (!list.ok()) return ToGrpcStatus(list.status());
  for (v1::CheckpointInfo& info : *list) {
    resp->set_total_bytes(resp->total_bytes() + info.total_bytes());
    if (!info.deletion_state().empty()) {
      resp->set_deleting_bytes(resp->deleting_bytes() + info.total_bytes());
    }
    *resp->add_checkpoints() = std::move(info);
  }
  return grpc::Status::OK;
}

grpc::Status CheckpointServiceImpl::GetCheckpoint(grpc::ServerContext* context,
                                                  const v1::GetCheckpointRequest* req,
                                                  v1::CheckpointInfo* resp) {
  if (grpc::Status a = Authorize(*context); !a.ok()) return a;
  absl::StatusOr<std::string> dir = ExistingJobDir(req->job_id());
  if (!dir.ok()) return ToGrpcStatus(dir.status());
  auto list = Listing(*dir);
  if (!list.ok()) return ToGrpcStatus(list.status());
  for (v1::CheckpointInfo& info : *list) {
    if (info.step() != req->step()) continue;
    *resp = std::move(info);  // the checkpoint if it exists, else its pending deletion
    return grpc::Status::OK;
  }
  return ToGrpcStatus(absl::NotFoundError(
      absl::StrCat("job '", req->job_id(), "' has no checkpoint of step ", req->step())));
}

grpc::Status CheckpointServiceImpl::VerifyCheckpoint(grpc::ServerContext* context,
                                                     const v1::VerifyCheckpointRequest* req,
                                                     v1::VerifyCheckpointResponse* resp) {
  if (grpc::Status a = Authorize(*context); !a.ok()) return a;
  std::string path = req->path();
  if (!path.empty()) {
    // Only what lies under the checkpoint root; no "..", so a caller cannot probe the host.
    const std::string root = options_.checkpoint_root + "/";
    if (path.rfind(root, 0) != 0 || absl::StrContains(path, "..")) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("path: '", path, "' is not under the checkpoint root ", root)));
    }
  } else {
    auto dir = JobCheckpointDir(options_.checkpoint_root, req->job_id());
    if (!dir.ok()) return ToGrpcStatus(dir.status());
    if (req->step() < 0) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("step: ", req->step(), " is negative (0 = the newest committed step)")));
    }
    if (req->step() == 0) {
      // As ConsolidateCheckpoint: 0 is the newest committed step (it was refused here, while
      // consolidation took it; break-it pass, 2026-12-05).
      if (grpc::Status e = ToGrpcStatus(JobDirExists(req->job_id(), *dir)); !e.ok()) return e;
      absl::StatusOr<storage::CheckpointInfo> newest = storage::NewestCommittedCheckpoint(*dir);
      if (!newest.ok()) return ToGrpcStatus(newest.status());
      path = newest->path;
    } else {
      path = absl::StrCat(*dir, "/", storage::StepDirName(req->step()));
    }
  }
  absl::StatusOr<storage::VerifyReport> report = storage::VerifyPath(path);
  if (!report.ok()) {
    // A committed step whose shard fails its size or CRC-32 check is marked corrupt, so that
    // listings show it and no resume (nor "newest" consolidation) picks it again.
    if (absl::IsDataLoss(report.status()) &&
        storage::ParseStepDirName(path.substr(path.rfind('/') + 1)).has_value() &&
        !storage::CorruptMarkReason(path).has_value()) {
      absl::Status marked =
          storage::MarkCheckpointCorrupt(path, std::string(report.status().message()));
      LOG(WARNING) << "VerifyCheckpoint " << path << ": " << report.status().message()
                   << (marked.ok() ? "; marked corrupt"
                                   : absl::StrCat("; cannot mark it corrupt: ", marked.ToString()));
    }
    return ToGrpcStatus(report.status());
  }
  resp->set_kind(report->kind);
  for (const std::string& f : report->files) resp->add_files(f);
  resp->set_num_tensors(report->num_tensors);
  resp->set_tensor_bytes(report->tensor_bytes);
  return grpc::Status::OK;
}

absl::StatusOr<storage::ConsolidateResult> CheckpointServiceImpl::DoConsolidate(
    const v1::ConsolidateCheckpointRequest& req) {
  auto dir = JobCheckpointDir(options_.checkpoint_root, req.job_id());
  if (!dir.ok()) return dir.status();
  absl::Status valid = ValidateOutputDir(req.output_dir());
  if (!valid.ok()) return valid;
  if (req.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step: ", req.step(), " is negative"));
  }
  absl::Status exists = JobDirExists(req.job_id(), *dir);
  if (!exists.ok()) return exists;
  storage::ConsolidateOptions options = options_.consolidate;
  auto shard = storage::ParseShardSize(req.max_shard_size());
  if (!shard.ok()) return shard.status();
  options.max_shard_size_bytes = *shard;
  auto dtype = storage::NormalizeOutputDtype(req.dtype());
  if (!dtype.ok()) return dtype.status();
  options.dtype = *dtype;
  absl::MutexLock lock(&consolidate_mu_);
  return storage::Consolidate(*dir, req.step(), req.output_dir(), options);
}

grpc::Status CheckpointServiceImpl::ConsolidateCheckpoint(
    grpc::ServerContext* context, const v1::ConsolidateCheckpointRequest* req,
    v1::ConsolidateCheckpointResponse* resp) {
  if (grpc::Status a = Authorize(*context); !a.ok()) return a;
  const absl::Time start = absl::Now();
  auto result = DoConsolidate(*req);
  consolidation_seconds_.Observe(absl::ToDoubleSeconds(absl::Now() - start));
  const std::string label =
      result.ok() ? "ok" : absl::AsciiStrToLower(absl::StatusCodeToString(result.status().code()));
  consolidations_.Add({{"result", label}}).Increment();
  if (!result.ok()) {
    LOG(WARNING) << "ConsolidateCheckpoint job=" << req->job_id() << " step=" << req->step()
                 << ": " << result.status();
    return ToGrpcStatus(result.status());
  }
  consolidated_bytes_.Increment(static_cast<double>(result->safetensors_bytes));
  LOG(INFO) << "consolidated job=" << req->job_id() << " step=" << result->step << " into "
            << result->safetensors_path << " (" << result->num_tensors << " tensors, "
            << result->safetensors_bytes << " bytes, " << result->seconds << " s)";
  resp->set_step(result->step);
  resp->set_safetensors_path(result->safetensors_path);
  resp->set_config_path(result->config_path);
  resp->set_num_tensors(result->num_tensors);
  resp->set_total_bytes(result->safetensors_bytes);
  for (const std::string& f : result->files) resp->add_files(f);
  resp->set_index_path(result->index_path);
  resp->set_dtype(result->dtype);
  return grpc::Status::OK;
}

grpc::Status CheckpointServiceImpl::DeleteCheckpoint(grpc::ServerContext* context,
                                                     const v1::DeleteCheckpointRequest* req,
                                                     v1::DeleteCheckpointResponse* resp) {
  if (grpc::Status a = Authorize(*context); !a.ok()) return a;
  absl::StatusOr<std::string> dir = ExistingJobDir(req->job_id());
  if (!dir.ok()) return ToGrpcStatus(dir.status());
  std::vector<int64_t> protected_steps(req->protected_steps().begin(),
                                       req->protected_steps().end());
  absl::MutexLock lock(&consolidate_mu_);
  auto result = storage::DeleteCheckpoint(*dir, req->step(), protected_steps);
  // Nothing of this directory pending any more: forget the errors recorded for it.
  if (auto pending = storage::ListPendingDeletions(*dir); pending.ok() && pending->empty()) {
    NoteDeletionFailures(*dir, {});
  }
  if (!result.ok()) {
    LOG(WARNING) << "DeleteCheckpoint job=" << req->job_id() << " step=" << req->step() << ": "
                 << result.status();
    if (!absl::IsFailedPrecondition(result.status()) &&
        !absl::IsInvalidArgument(result.status())) {
      RememberDeletionError(*dir, req->step(), result.status());
    }
    return ToGrpcStatus(result.status());
  }
  if (result->deleted) {
    LOG(INFO) << "deleted checkpoint job=" << req->job_id() << " step=" << req->step();
  }
  resp->set_deleted(result->deleted);
  return grpc::Status::OK;
}

grpc::Status CheckpointServiceImpl::ApplyRetention(grpc::ServerContext* context,
                                                   const v1::ApplyRetentionRequest* req,
                                                   v1::ApplyRetentionResponse* resp) {
  if (grpc::Status a = Authorize(*context); !a.ok()) return a;
  absl::StatusOr<std::string> dir = ExistingJobDir(req->job_id());
  if (!dir.ok()) return ToGrpcStatus(dir.status());
  std::vector<int64_t> protected_steps(req->protected_steps().begin(),
                                       req->protected_steps().end());
  absl::MutexLock lock(&consolidate_mu_);
  storage::RetentionPolicy policy;
  policy.keep_last = req->keep_last();
  policy.keep_best = req->keep_best();
  if (!req->best_metric().empty()) policy.best_metric = req->best_metric();
  auto result = storage::ApplyRetention(*dir, policy, protected_steps);
  if (!result.ok()) return ToGrpcStatus(result.status());
  NoteDeletionFailures(*dir, result->failed);
  for (int64_t s : result->deleted_steps) resp->add_deleted_steps(s);
  for (int64_t s : result->kept_steps) resp->add_kept_steps(s);
  if (!result->deleted_steps.empty()) {
    LOG(INFO) << "retention job=" << req->job_id() << " keep_last=" << req->keep_last()
              << " deleted " << result->deleted_steps.size() << " checkpoints";
  }
  // A step that could not be deleted fails the call (the caller, e.g. the scheduler's retention,
  // must see it and retry), after the others were deleted; the message names the deleted ones.
  absl::Status failed = storage::DeletionFailures(
      absl::StrCat("retention of job '", req->job_id(), "'"), result->failed);
  if (!failed.ok()) {
    return ToGrpcStatus(absl::Status(
        failed.code(),
        absl::StrCat(failed.message(), result->deleted_steps.empty() ? "" : "; deleted steps ",
                     absl::StrJoin(result->deleted_steps, ", "))));
  }
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<grpc::Server>> StartCheckpointServer(
    const std::string& host, int port, CheckpointServiceImpl* service, int* bound_port,
    std::shared_ptr<grpc::ServerCredentials> credentials) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  ApplyKeepalivePolicy(builder);
  *bound_port = 0;
  const std::string address = absl::StrCat(host, ":", port);
  builder.AddListeningPort(
      address, credentials != nullptr ? credentials : grpc::InsecureServerCredentials(),
      bound_port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *bound_port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve gRPC on ", address));
  }
  MarkServing(*server, {"loom.v1.CheckpointService"});
  return server;
}

}  // namespace loom
