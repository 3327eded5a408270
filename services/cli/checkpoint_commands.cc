#include "services/cli/checkpoint_commands.h"

#include <unistd.h>

#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "services/cli/terminal_text.h"
#include "storage/checkpoint/verify.h"

namespace loom::cli {

int ListCheckpoints(loom::v1::CheckpointService::Stub& stub, const std::string& job_id,
                    const CheckpointCommandContext& ctx) {
  loom::v1::ListCheckpointsRequest req;
  req.set_job_id(job_id);
  loom::v1::ListCheckpointsResponse resp;
  grpc::Status s = stub.ListCheckpoints(ctx.context(absl::ZeroDuration()).get(), req, &resp);
  if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
    std::printf("job %s has no checkpoints (yet): %s\n", TerminalSafe(job_id).c_str(),
                TerminalSafe(s.error_message()).c_str());
    return 0;
  }
  if (!s.ok()) return ctx.fail(loom::FromGrpcStatus(s));
  std::printf("%-10s %-13s %-8s %-14s %-10s %s\n", "STEP", "COMMITTED", "RANKS", "BYTES",
              "EVAL_LOSS", "PATH");
  for (const auto& c : resp.checkpoints()) {
    auto eval = c.metrics().find("eval_loss");
    // A step being deleted whose files are still there: "DELETE_FAILED" / "DELETING".
    const std::string state = !c.deletion_state().empty()
                                  ? absl::AsciiStrToUpper(TerminalSafe(c.deletion_state()))
                                  : (c.corrupt() ? "CORRUPT" : (c.committed() ? "yes" : "no"));
    std::printf("%-10lld %-13s %d/%-6d %-14lld %-10s %s\n", static_cast<long long>(c.step()),
                state.c_str(), c.ranks_reported(), c.world_size(),
                static_cast<long long>(c.total_bytes()),
                eval == c.metrics().end() ? "-" : absl::StrFormat("%.4f", eval->second).c_str(),
                TerminalSafe(c.path()).c_str());
    if (c.corrupt()) {
      std::printf("           corrupt: %s\n", TerminalSafe(c.corrupt_reason()).c_str());
    }
    if (!c.deletion_error().empty()) {
      std::printf("           delete failed: %s\n", TerminalSafe(c.deletion_error()).c_str());
    }
  }
  std::printf("disk usage: %lld bytes", static_cast<long long>(resp.total_bytes()));
  if (resp.deleting_bytes() > 0) {
    std::printf(" (%lld of them in steps being deleted)",
                static_cast<long long>(resp.deleting_bytes()));
  }
  std::printf("\n");
  return 0;
}

int Consolidate(loom::v1::CheckpointService::Stub& stub, const std::string& job_id, int64_t step,
                std::string output_dir, const std::string& max_shard_size,
                const std::string& dtype, const CheckpointCommandContext& ctx) {
  loom::v1::ConsolidateCheckpointRequest req;
  req.set_job_id(job_id);
  req.set_step(step);
  if (!output_dir.empty() && output_dir[0] != '/') {
    // The service runs elsewhere; it takes absolute paths only.
    char cwd[4096];
    if (::getcwd(cwd, sizeof(cwd)) != nullptr) output_dir = absl::StrCat(cwd, "/", output_dir);
  }
  req.set_output_dir(output_dir);
  req.set_max_shard_size(max_shard_size);
  req.set_dtype(dtype);
  loom::v1::ConsolidateCheckpointResponse resp;
  grpc::Status s = stub.ConsolidateCheckpoint(ctx.context(absl::Minutes(30)).get(), req, &resp);
  if (!s.ok()) return ctx.fail(loom::FromGrpcStatus(s));
  std::printf("consolidated step %lld: %lld tensors, %lld bytes, %s\nsafetensors: %s\nconfig:      %s\n",
              static_cast<long long>(resp.step()), static_cast<long long>(resp.num_tensors()),
              static_cast<long long>(resp.total_bytes()), resp.dtype().c_str(),
              resp.safetensors_path().c_str(), resp.config_path().c_str());
  if (!resp.index_path().empty()) {
    for (const std::string& f : resp.files()) std::printf("shard:       %s\n", f.c_str());
  }
  return 0;
}

int DeleteCheckpoint(loom::v1::CheckpointService::Stub& stub, const std::string& job_id,
                     int64_t step, const std::vector<int64_t>& protected_steps,
                     const CheckpointCommandContext& ctx) {
  loom::v1::DeleteCheckpointRequest req;
  req.set_job_id(job_id);
  req.set_step(step);
  for (int64_t p : protected_steps) req.add_protected_steps(p);
  loom::v1::DeleteCheckpointResponse resp;
  grpc::Status s = stub.DeleteCheckpoint(ctx.context(absl::ZeroDuration()).get(), req, &resp);
  if (!s.ok()) return ctx.fail(loom::FromGrpcStatus(s));
  std::printf("step %lld %s\n", static_cast<long long>(req.step()),
              resp.deleted() ? "deleted" : "was already gone");
  return 0;
}

int RetainCheckpoints(loom::v1::CheckpointService::Stub& stub, const std::string& job_id,
                      int32_t keep_last, const std::vector<int64_t>& protected_steps,
                      const CheckpointCommandContext& ctx) {
  loom::v1::ApplyRetentionRequest req;
  req.set_job_id(job_id);
  req.set_keep_last(keep_last);
  for (int64_t p : protected_steps) req.add_protected_steps(p);
  loom::v1::ApplyRetentionResponse resp;
  grpc::Status s = stub.ApplyRetention(ctx.context(absl::ZeroDuration()).get(), req, &resp);
  if (!s.ok()) return ctx.fail(loom::FromGrpcStatus(s));
  std::printf("deleted: %s\nkept:    %s\n", absl::StrJoin(resp.deleted_steps(), " ").c_str(),
              absl::StrJoin(resp.kept_steps(), " ").c_str());
  return 0;
}

int VerifyCheckpoint(const std::string& path) {
  auto report = loom::storage::VerifyPath(path);
  if (!report.ok()) {
    std::fprintf(stderr, "loomctl: INVALID %s: %s\n",
                 absl::StatusCodeToString(report.status().code()).c_str(),
                 std::string(report.status().message()).c_str());
    return absl::IsNotFound(report.status()) ? 5 : 3;
  }
  std::printf("OK %s: %s, %lld files, %lld tensors, %lld bytes\n", path.c_str(),
              report->kind.c_str(), static_cast<long long>(report->files.size()),
              static_cast<long long>(report->num_tensors),
              static_cast<long long>(report->tensor_bytes));
  return 0;
}

absl::StatusOr<std::vector<int64_t>> ParseProtectedSteps(const std::vector<std::string>& values) {
  std::vector<int64_t> out;
  for (const std::string& s : values) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(s, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("--protect: '", s, "' is not a step"));
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace loom::cli
