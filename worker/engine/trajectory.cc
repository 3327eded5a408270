#include "worker/engine/trajectory.h"

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/checkpoint/consolidate.h"

namespace loom::engine {

using nlohmann::json;

absl::StatusOr<std::unique_ptr<TrajectoryRecorder>> TrajectoryRecorder::Open(
    const std::string& dir, const TrajectoryShape& shape) {
  if (dir.empty()) return absl::InvalidArgumentError("--trajectory_dir: empty path");
  if (shape.window <= 0 || shape.micro_batch_size <= 0 || shape.gradient_accumulation_steps <= 0) {
    return absl::InvalidArgumentError("--trajectory_dir: empty batch shape");
  }
  std::unique_ptr<TrajectoryRecorder> r(new TrajectoryRecorder(dir, shape));
  for (const std::string& sub : {r->InitialShardsDir(), r->FinalShardsDir()}) {
    struct stat st;
    if (::stat(sub.c_str(), &st) == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--trajectory_dir: ", dir, " already holds a trajectory (", sub,
          " exists); use a fresh directory"));
    }
  }
  RETURN_IF_ERROR(MakeDirs(dir));
  ASSIGN_OR_RETURN(AtomicFileWriter w,
                   AtomicFileWriter::Open(absl::StrCat(dir, "/tokens_rank_", shape.rank, ".bin")));
  r->tokens_.emplace(std::move(w));
  if (shape.pack_documents) {
    ASSIGN_OR_RETURN(AtomicFileWriter pw, AtomicFileWriter::Open(absl::StrCat(
                                              dir, "/positions_rank_", shape.rank, ".bin")));
    r->positions_.emplace(std::move(pw));
  }
  return r;
}

absl::Status TrajectoryRecorder::AppendBatch(const int64_t* tokens, int64_t rows, int64_t window,
                                             const int64_t* positions) {
  if (rows != shape_.micro_batch_size || window != shape_.window) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trajectory: batch of [", rows, ", ", window, "] tokens, expected [",
        shape_.micro_batch_size, ", ", shape_.window, "]"));
  }
  if (!tokens_.has_value()) return absl::FailedPreconditionError("trajectory: already finished");
  // Little-endian on every platform Loom builds for (x86-64, aarch64): the bytes as they are.
  const size_t bytes = static_cast<size_t>(rows * window) * sizeof(int64_t);
  RETURN_IF_ERROR(tokens_->Append(tokens, bytes));
  if (shape_.pack_documents) {
    if (positions == nullptr) {
      return absl::InvalidArgumentError("trajectory: a packed batch without its positions");
    }
    RETURN_IF_ERROR(positions_->Append(positions, bytes));
  }
  ++batches_;
  return absl::OkStatus();
}

void TrajectoryRecorder::RecordStep(int64_t step, double loss, double lr, double grad_norm,
                                    bool skipped) {
  steps_.push_back({step, loss, lr, grad_norm, skipped});
}

absl::Status TrajectoryRecorder::ExportHf(const std::string& shards_dir, int64_t step,
                                          const std::string& name) const {
  storage::ConsolidateOptions opts;
  opts.dtype = "F32";
  // step 0 means "newest" to Consolidate; the shards directory is fresh (Open), so its newest
  // checkpoint is the only one.
  return storage::Consolidate(shards_dir, step, absl::StrCat(dir_, "/", name), opts).status();
}

absl::Status TrajectoryRecorder::Finish() {
  const int64_t run = shape_.steps - shape_.start_step;
  const int64_t expected = run * shape_.gradient_accumulation_steps;
  if (batches_ != expected) {
    return absl::FailedPreconditionError(absl::StrCat(
        "trajectory: ", batches_, " micro-batches recorded, expected ", expected));
  }
  if (!tokens_.has_value()) return absl::FailedPreconditionError("trajectory: already finished");
  RETURN_IF_ERROR(tokens_->Commit());
  tokens_.reset();
  if (positions_.has_value()) {
    RETURN_IF_ERROR(positions_->Commit());
    positions_.reset();
  }
  json index = {{"rank", shape_.rank},
                {"dtype", "int64-le"},
                {"shape", {run, shape_.gradient_accumulation_steps, shape_.micro_batch_size,
                           shape_.window}},
                {"start_step", shape_.start_step}};
  RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(dir_, "/tokens_rank_", shape_.rank, ".json"),
                                      index.dump(2)));
  if (shape_.rank != 0) return absl::OkStatus();
  json steps = json::array();
  for (const Step& s : steps_) {
    steps.push_back({{"step", s.step},
                     {"loss", s.loss},
                     {"lr", s.lr},
                     {"grad_norm", s.grad_norm},
                     {"skipped", s.skipped}});
  }
  json traj = {{"format", "loom-trajectory-v1"},
               {"world_size", shape_.world_size},
               {"start_step", shape_.start_step},
               {"steps", shape_.steps},
               {"gradient_accumulation_steps", shape_.gradient_accumulation_steps},
               {"micro_batch_size", shape_.micro_batch_size},
               {"sequence_length", shape_.sequence_length},
               {"pack_documents", shape_.pack_documents},
               {"steps_run", std::move(steps)}};
  return WriteFileAtomically(dir_ + "/trajectory.json", traj.dump(2));
}

}  // namespace loom::engine
