#include "worker/engine/checkpoint_io.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "spec/model_config.h"
#include "storage/checkpoint/shard_format.h"
#include "worker/engine/collectives.h"
#include "worker/engine/loss_scaler.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/offload/offload_optimizer.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {

using nlohmann::json;

namespace {
constexpr int64_t kFinalLogitTokens = 32;
constexpr char kLossScalerFile[] = "loss_scaler.json";

// The fp16 loss scaler's state as WriteShards writes it (rank 0, next to the shards). Every
// value is checked before it is used: a scale of 0 or below, or not finite, would turn every
// weight into NaN on the first step (or skip every step) while the run still "succeeds".
// DATA_LOSS naming the file for anything else than what WriteShards writes.
absl::StatusOr<LossScaler::State> ParseLossScalerState(const std::string& path,
                                                       const std::string& text) {
  auto bad = [&path](const std::string& why) {
    return absl::DataLossError(absl::StrCat("resume_from: ", path, ": ", why));
  };
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  auto number = [&j](const char* key) -> const json* {
    auto it = j.find(key);
    return it != j.end() && it->is_number() ? &*it : nullptr;
  };
  auto integer = [&j](const char* key) -> const json* {
    auto it = j.find(key);
    return it != j.end() && it->is_number_integer() ? &*it : nullptr;
  };
  LossScaler::State st;
  const json* scale = number("scale");
  if (scale == nullptr) return bad("\"scale\" is missing or not a number");
  st.scale = scale->get<double>();
  if (!std::isfinite(st.scale) || st.scale <= 0) {
    return bad(absl::StrCat("\"scale\" ", st.scale, " is not a positive finite number"));
  }
  const json* cur_iter = integer("cur_iter");
  const json* last_overflow = integer("last_overflow_iter");
  const json* hysteresis = integer("cur_hysteresis");
  if (cur_iter == nullptr || last_overflow == nullptr || hysteresis == nullptr) {
    return bad("\"cur_iter\", \"last_overflow_iter\" and \"cur_hysteresis\" must be integers");
  }
  st.cur_iter = cur_iter->get<int64_t>();
  st.last_overflow_iter = last_overflow->get<int64_t>();
  st.cur_hysteresis = hysteresis->get<int64_t>();
  if (st.cur_iter < 0 || st.last_overflow_iter < -1 || st.last_overflow_iter > st.cur_iter ||
      st.cur_hysteresis < 1) {
    return bad(absl::StrCat("iterations out of range (cur_iter ", st.cur_iter,
                            ", last_overflow_iter ", st.last_overflow_iter, ", cur_hysteresis ",
                            st.cur_hysteresis, "; want 0 <= cur_iter, -1 <= last_overflow_iter "
                            "<= cur_iter, cur_hysteresis >= 1)"));
  }
  return st;
}
}  // namespace

CheckpointIo::CheckpointIo(const EngineOptions& options, Collectives& collectives,
                           ZeroProvider& model, LlamaModel& llama,
                           offload::OffloadOptimizer* offload, LossScaler& scaler)
    : o_(options),
      coll_(collectives),
      model_(model),
      llama_(llama),
      offload_(offload),
      scaler_(scaler) {}

std::vector<float*> CheckpointIo::MasterPointers() const {
  std::vector<float*> out;
  for (ZeroParam& p : model_.params()) {
    out.push_back(offload_ != nullptr && offload_->params_nvme() ? nullptr
                                                                 : p.master.data_ptr<float>());
  }
  return out;
}

std::vector<int64_t> CheckpointIo::PieceEnds(const storage::ShardManifest& m) const {
  std::vector<int64_t> ends;
  if (offload_ != nullptr) {  // sub-groups: runs of whole partitions, in the same order
    for (int64_t g = 0; g < offload_->num_sub_groups(); ++g) ends.push_back(offload_->group_end(g));
  } else {
    for (const storage::ShardParam& p : m.params) {
      ends.push_back(p.partition_offset + p.partition_numel);
    }
  }
  return ends;
}

absl::Status CheckpointIo::WriteShards(const std::string& base_dir, int64_t step,
                                       const CheckpointMeta& meta) {
  storage::ShardManifest m;
  m.step = step;
  m.rank = coll_.rank();
  m.world_size = coll_.world_size();
  m.zero_stage = o_.ds.zero.stage;  // the per-parameter partition layout for every stage
  m.model_config_json = spec::LlamaConfigToHfJson(o_.model);
  m.tokenizer = o_.tokenizer;
  m.optimizer_step = meta.optimizer_step;
  m.optimizer = o_.ds.optimizer.name();
  m.sections = {"fp32_params", "exp_avg", "exp_avg_sq"};
  // Recorded for retention (keep the best by eval_loss): identical on every rank, since both
  // losses are all-reduced means.
  for (const auto& [name, value] : meta.metrics) m.metrics[name] = value;
  m.side_files = meta.side_files;
  for (size_t i = 0; i < model_.params().size(); ++i) {
    const ZeroParam& p = model_.params()[i];
    storage::ShardParam sp;
    sp.name = p.spec.name;
    sp.shape = p.spec.shape;
    sp.numel = p.numel;
    m.params.push_back(sp);
  }
  storage::AssignPartitionLayout(m);
  std::vector<int64_t> ends = PieceEnds(m);
  const std::vector<float*> masters = offload_ != nullptr ? MasterPointers()
                                                          : std::vector<float*>();
  const std::string dir = absl::StrCat(base_dir, "/", storage::StepDirName(step));
  if (scaler_.enabled() && coll_.rank() == 0) {
    const LossScaler::State st = scaler_.state();
    json j = {{"scale", st.scale},
              {"cur_iter", st.cur_iter},
              {"last_overflow_iter", st.last_overflow_iter},
              {"cur_hysteresis", st.cur_hysteresis}};
    const std::string text = j.dump();
    RETURN_IF_ERROR(MakeDirs(dir));
    RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(dir, "/", kLossScalerFile), text));
    // Listed in rank 0's manifest, so that verifying the checkpoint covers it.
    m.side_files.push_back(storage::SideFile{kLossScalerFile, static_cast<int64_t>(text.size()),
                                             storage::Crc32(0, text.data(), text.size())});
  }
  RETURN_IF_ERROR(storage::WriteShardPieces(
      dir, m, ends,
      [&](size_t section, size_t piece, int64_t, int64_t count, float* dst) -> absl::Status {
        if (offload_ != nullptr) {
          return offload_->ExportGroupSection(static_cast<int64_t>(piece),
                                              static_cast<int>(section), masters, dst);
        }
        const at::Tensor t = model_.CheckpointPartition(piece, static_cast<int>(section));
        std::memcpy(dst, t.data_ptr<float>(), count * sizeof(float));
        return absl::OkStatus();
      }));
  return absl::OkStatus();
}

absl::Status CheckpointIo::Load(const std::string& dir, int64_t* step, int64_t* optimizer_step) {
  ASSIGN_OR_RETURN(storage::ShardManifest m0, storage::ReadManifest(dir, 0));
  if (m0.world_size != coll_.world_size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "resume_from: ", dir, " was written with world size ", m0.world_size,
        " but this run has world size ", coll_.world_size(),
        " (its shards are partitioned for that world size at every ZeRO stage and cannot be "
        "resharded here; consolidate it and start a new run from the export with "
        "model.init_from)"));
  }
  ASSIGN_OR_RETURN(storage::ShardManifest m, storage::ReadManifest(dir, coll_.rank()));
  // Every rank must resume the same step: manifests that disagree (a directory that is not a
  // committed checkpoint, e.g. one rank's manifest from another step) used to start the ranks
  // at different steps, train wrong losses, and abort when their collectives fell out of step.
  at::Tensor agreed = at::tensor({static_cast<double>(m.step), -static_cast<double>(m.step),
                                  static_cast<double>(m.optimizer_step),
                                  -static_cast<double>(m.optimizer_step)},
                                 at::kDouble);
  RETURN_IF_ERROR(coll_.AllReduce(agreed, ReduceOp::kMax));
  const double* a = agreed.data_ptr<double>();
  if (a[0] != -a[1] || a[2] != -a[3]) {
    return absl::DataLossError(absl::StrCat(
        "resume_from: ", dir, ": the ranks' manifests disagree (steps ", -a[1], " to ", a[0],
        ", optimizer steps ", -a[3], " to ", a[2], "; this rank's ",
        storage::ManifestFileName(coll_.rank()), " says step ", m.step,
        "): not a committed checkpoint"));
  }
  std::vector<ZeroParam>& params = model_.params();
  if (m.params.size() != params.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "resume_from: ", dir, " has ", m.params.size(), " parameters, the model has ",
        params.size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (m.params[i].name != params[i].spec.name || m.params[i].shape != params[i].spec.shape ||
        m.params[i].partition_numel != params[i].slice.partition_numel) {
      return absl::FailedPreconditionError(absl::StrCat(
          "resume_from: ", dir, " parameter ", i, " is ", m.params[i].name, " [",
          absl::StrJoin(m.params[i].shape, ", "), "] (", m.params[i].partition_numel,
          " elements on this rank); this run's model has ", params[i].spec.name, " [",
          absl::StrJoin(params[i].spec.shape, ", "), "] (", params[i].slice.partition_numel,
          "): the checkpoint was written for another model.config"));
    }
  }
  if (m.sections != std::vector<std::string>{"fp32_params", "exp_avg", "exp_avg_sq"}) {
    return absl::FailedPreconditionError(absl::StrCat(
        "resume_from: ", dir, " has sections [", absl::StrJoin(m.sections, ", "),
        "], expected [fp32_params, exp_avg, exp_avg_sq]"));
  }
  if (scaler_.enabled()) {
    const std::string path = absl::StrCat(dir, "/", kLossScalerFile);
    if (::access(path.c_str(), F_OK) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "resume_from: ", path, " does not exist: this run uses fp16 loss scaling and the "
          "checkpoint holds no loss-scaler state (it was written without fp16?)"));
    }
    ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path, 1 << 20));
    for (const storage::SideFile& f : m0.side_files) {  // checkpoints since 2026-12-05
      if (f.name == kLossScalerFile) RETURN_IF_ERROR(storage::CheckSideFileData(path, 0, f, text));
    }
    ASSIGN_OR_RETURN(LossScaler::State st, ParseLossScalerState(path, text));
    scaler_.set_state(st);
  }
  // Verified (size, CRC-32) before anything is loaded, then streamed piece by piece (every rank
  // in the same order: stage 0 all-gathers each piece).
  const std::vector<float*> masters = offload_ != nullptr ? MasterPointers()
                                                          : std::vector<float*>();
  RETURN_IF_ERROR(storage::ReadShardPieces(
      dir, m, PieceEnds(m),
      [&](size_t section, size_t piece, int64_t, int64_t, const float* src) -> absl::Status {
        if (offload_ != nullptr) {
          return offload_->ImportGroupSection(static_cast<int64_t>(piece),
                                              static_cast<int>(section), masters, src);
        }
        model_.LoadPartition(piece, static_cast<int>(section), src);
        return absl::OkStatus();
      }));
  model_.RefreshParams();
  *optimizer_step = m.optimizer_step;
  *step = m.step;
  return absl::OkStatus();
}

absl::Status CheckpointIo::WriteFinalLogits(const data::TokenStream& heldout) {
  at::NoGradGuard no_grad;
  const int64_t n = std::min<int64_t>(
      {kFinalLogitTokens, o_.model.max_position_embeddings, static_cast<int64_t>(heldout.size())});
  std::vector<int64_t> tokens = heldout.Slice(0, n);
  at::Tensor ids = at::tensor(tokens, at::kLong).view({1, n});
  at::Tensor logits =
      llama_.Forward(ids).to(at::kFloat).squeeze(0).contiguous();  // all ranks gather
  if (coll_.rank() != 0 || o_.checkpoint_dir.empty()) return absl::OkStatus();
  json rows = json::array();
  const float* p = logits.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    rows.push_back(std::vector<float>(p + i * o_.model.vocab_size,
                                      p + (i + 1) * o_.model.vocab_size));
  }
  json out = {{"tokens", tokens}, {"logits", std::move(rows)}};
  RETURN_IF_ERROR(MakeDirs(o_.checkpoint_dir));
  return WriteFileAtomically(o_.checkpoint_dir + "/final_logits.json", out.dump());
}

absl::Status CheckpointIo::ExportTrajectoryWeights(TrajectoryRecorder& trajectory,
                                                   const std::string& shards_dir, int64_t step,
                                                   const std::string& name,
                                                   const CheckpointMeta& meta) {
  RETURN_IF_ERROR(WriteShards(shards_dir, step, meta));
  RETURN_IF_ERROR(coll_.Barrier());  // every rank's shard is written
  if (coll_.rank() == 0) RETURN_IF_ERROR(trajectory.ExportHf(shards_dir, step, name));
  return absl::OkStatus();
}

TrajectoryShape TrajectoryShapeFor(const EngineOptions& o, int rank, int world_size,
                                   int64_t start_step) {
  TrajectoryShape shape;
  shape.rank = rank;
  shape.world_size = world_size;
  shape.start_step = start_step;
  shape.steps = o.steps;
  shape.gradient_accumulation_steps = o.ds.gradient_accumulation_steps;
  shape.micro_batch_size = o.ds.train_micro_batch_size_per_gpu;
  shape.sequence_length = o.sequence_length;
  shape.pack_documents = o.pack_documents;
  shape.window =
      (o.test_rank_sequence_length > 0 ? o.test_rank_sequence_length : o.sequence_length) + 1;
  return shape;
}

}  // namespace loom::engine
