#include "services/scheduler/grpc_checkpoint_catalog.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_credentials.h"
#include "common/grpc_status.h"

namespace loom {

absl::StatusOr<CommittedCheckpoint> GrpcCheckpointCatalog::NewestCommitted(
    const std::string& job_id, const std::string& /*checkpoint_dir*/) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(deadline_));
  AddBearerToken(ctx, token_);
  v1::ListCheckpointsRequest req;
  req.set_job_id(job_id);
  v1::ListCheckpointsResponse resp;
  grpc::Status s = stub_->ListCheckpoints(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);  // NOT_FOUND: the job has no checkpoint directory
  for (auto it = resp.checkpoints().rbegin(); it != resp.checkpoints().rend(); ++it) {
    if (it->committed()) return CommittedCheckpoint{it->step(), it->path()};
  }
  return absl::NotFoundError(absl::StrCat("job ", job_id, " has no committed checkpoint"));
}

absl::StatusOr<CommittedCheckpoint> GrpcCheckpointCatalog::NewestIntact(
    const std::string& job_id, const std::string& /*checkpoint_dir*/) {
  auto context = [this] {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(deadline_));
    AddBearerToken(*ctx, token_);
    return ctx;
  };
  v1::ListCheckpointsRequest req;
  req.set_job_id(job_id);
  v1::ListCheckpointsResponse resp;
  grpc::Status s = stub_->ListCheckpoints(context().get(), req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);  // NOT_FOUND: the job has no checkpoint directory
  std::string skipped;
  auto skip = [&skipped](int64_t step, const std::string& why) {
    absl::StrAppend(&skipped, skipped.empty() ? "" : "; ", "skipped step ", step, " (", why, ")");
  };
  for (auto it = resp.checkpoints().rbegin(); it != resp.checkpoints().rend(); ++it) {
    if (it->corrupt()) {
      skip(it->step(), absl::StrCat("marked corrupt: ", it->corrupt_reason()));
      continue;
    }
    if (!it->committed()) {
      // Damaged (unreadable manifest, wrong shard size): named, like a corrupt step; a partial
      // one (ranks still writing) is passed over.
      if (!it->damaged_reason().empty()) skip(it->step(), it->damaged_reason());
      continue;
    }
    v1::VerifyCheckpointRequest verify;
    verify.set_job_id(job_id);
    verify.set_step(it->step());
    v1::VerifyCheckpointResponse verified;
    grpc::Status v = stub_->VerifyCheckpoint(context().get(), verify, &verified);
    if (v.ok()) return CommittedCheckpoint{it->step(), it->path(), skipped};
    if (v.error_code() == grpc::StatusCode::DATA_LOSS) {
      skip(it->step(), v.error_message());
      continue;
    }
    if (v.error_code() == grpc::StatusCode::NOT_FOUND ||
        v.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      continue;  // deleted or being rewritten meanwhile
    }
    return FromGrpcStatus(v);
  }
  return absl::NotFoundError(
      skipped.empty() ? absl::StrCat("job ", job_id, " has no committed checkpoint")
                      : absl::StrCat("job ", job_id, " has no intact committed checkpoint; ",
                                     skipped));
}

absl::StatusOr<std::vector<int64_t>> GrpcCheckpointCatalog::ApplyRetention(
    const std::string& job_id, const std::string& /*checkpoint_dir*/,
    const loom::v1::CheckpointPolicy& policy, const std::vector<int64_t>& protected_steps) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(deadline_));
  AddBearerToken(ctx, token_);
  v1::ApplyRetentionRequest req;
  req.set_job_id(job_id);
  req.set_keep_last(policy.keep_last());
  req.set_keep_best(policy.keep_best());
  req.set_best_metric(policy.best_metric());
  for (int64_t step : protected_steps) req.add_protected_steps(step);
  v1::ApplyRetentionResponse resp;
  grpc::Status s = stub_->ApplyRetention(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return std::vector<int64_t>(resp.deleted_steps().begin(), resp.deleted_steps().end());
}

}  // namespace loom
