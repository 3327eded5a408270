#include "worker/engine/zenflow_setup.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "storage/checkpoint/shard_format.h"
#include "worker/engine/optim/column_selection.h"

namespace loom::engine {
namespace {

// v2 keeps its CRC-32 after the magic. v1 (read, not written) ended with it, and a file that
// ends with its own CRC-32 has the same whole-file CRC-32 for any content (CRC-32's residue,
// 0x2144df1c), which made the manifest's side-file checksum blind to a swapped or stale file.
constexpr char kMagic[] = "LOOMZF02";
constexpr char kMagicV1[] = "LOOMZF01";

void Put(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), 8); }

}  // namespace

std::pair<int, int> SplitZenFlowThreads(int threads, double perc) {
  threads = std::max(1, threads);
  const int pt = static_cast<int>(std::ceil(perc * threads));
  if (pt <= 0 || pt >= threads) return {threads, threads};
  return {pt, threads - pt};
}

absl::StatusOr<std::unique_ptr<optim::ZenFlowPipeline>> MakeTrainerZenFlow(
    const EngineOptions& o, Collectives& coll, ZeroProvider& model, int64_t steps_per_epoch) {
  const spec::ZenFlowConfig& zf = o.ds.zero.zenflow;
  const spec::OptimizerConfig& oc = o.ds.optimizer;
  optim::ZenFlowOptions zo;
  zo.adam.beta1 = oc.beta1;
  zo.adam.beta2 = oc.beta2;
  zo.adam.eps = oc.eps;
  zo.adam.weight_decay = oc.weight_decay;
  zo.adam.decoupled_weight_decay = oc.decoupled_weight_decay;
  zo.adam.bias_correction = oc.bias_correction;
  const auto [pt, cpu] = SplitZenFlowThreads(o.threads_per_rank, zf.pt_reserved_cores_perc);
  zo.adam.threads = zf.overlap_step ? cpu : std::max(1, o.threads_per_rank);
  zo.device_threads = pt;
  if (zf.overlap_step && pt < o.threads_per_rank) at::set_num_threads(pt);
  zo.topk_ratio = zf.topk_ratio;
  zo.overlap_step = zf.overlap_step;
  zo.host_accumulation = !o.test_zenflow_fused_accumulation;
  zo.auto_ratio = zf.auto_ratio;
  zo.schedule.warm_up = zf.full_warm_up_rounds;
  zo.schedule.update_interval = zf.update_interval;
  const int64_t epoch = zf.steps_per_epoch > 0 ? zf.steps_per_epoch : steps_per_epoch;
  zo.schedule.select_interval =
      optim::SelectIntervalSteps(zf.select_strategy, zf.select_interval, epoch);
  if (zo.schedule.select_interval == 0) {
    LOG(WARNING) << "zenflow: no epoch length for select_strategy \"" << zf.select_strategy
                 << "\": columns are selected once and never re-selected";
  }
  std::vector<int64_t> numels;
  std::vector<optim::ZenFlowParam> params;
  for (const ZeroParam& p : model.params()) {
    numels.push_back(p.master.numel());
    optim::ZenFlowParam zp;
    if (p.spec.shape.size() == 2) {
      zp.rows = p.spec.shape[0];
      zp.cols = p.spec.shape[1];
    } else {
      zp.rows = p.numel;
    }
    zp.begin = p.slice.begin;
    zp.end = p.slice.end;
    params.push_back(zp);
  }
  ASSIGN_OR_RETURN(optim::SubGroupPlan plan,
                   optim::SubGroupPlan::Create(numels, o.ds.zero.sub_group_size));
  optim::PartitionSource source = [&model](size_t i) {
    ZeroParam& p = model.params()[i];
    return OptimizerPartition{p.master, p.grad, p.exp_avg, p.exp_avg_sq};
  };
  LOG(INFO) << "zenflow: topk_ratio " << zf.topk_ratio << ", select every "
            << zo.schedule.select_interval << " steps, update_interval "
            << (zf.update_interval == 0 ? std::string("auto")
                                        : std::to_string(zf.update_interval))
            << ", overlap_step " << zf.overlap_step << ", warm-up " << zf.full_warm_up_rounds
            << ", threads training " << pt << " / CPU optimizer " << zo.adam.threads;
  // Where forward reads the masters themselves (one rank, fp32), the selective update runs on
  // the CPU optimizer's host thread while the next forward starts, each parameter's first read
  // waiting for its own update through the provider's master fence (zenflow_pipeline.h).
  zo.defer_selective = model.params_view_masters();
  zo.gradient_buffers = model.gradient_buffers();
  ASSIGN_OR_RETURN(std::unique_ptr<optim::ZenFlowPipeline> pipeline,
                   optim::ZenFlowPipeline::Create(zo, std::move(plan), std::move(params), source,
                                                  &coll));
  if (pipeline->defers_selective()) {
    optim::ZenFlowPipeline* p = pipeline.get();
    model.set_master_fence([p](ParamId i) { p->AwaitMaster(i); });
  }
  return pipeline;
}

std::string ZenFlowStateFile(const std::string& step_dir, int rank) {
  return absl::StrCat(step_dir, "/zenflow_rank", rank, ".bin");
}

absl::StatusOr<storage::SideFile> SaveZenFlowState(optim::ZenFlowPipeline& pipeline,
                                                   const std::string& step_dir, int rank) {
  std::vector<std::pair<std::string, at::Tensor>> state = pipeline.ExportState();
  std::string out(kMagic, 8);
  out.append(4, '\0');  // the CRC-32 of everything after it, filled in below
  Put(&out, state.size());
  for (const auto& [name, t0] : state) {
    const at::Tensor t = t0.contiguous();
    Put(&out, name.size());
    out += name;
    uint8_t dtype = t.scalar_type() == at::kFloat ? 0 : t.scalar_type() == at::kLong ? 1 : 2;
    out.push_back(static_cast<char>(dtype));
    Put(&out, static_cast<uint64_t>(t.numel()));
    out.append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  }
  const uint32_t crc = storage::Crc32(0, out.data() + 12, out.size() - 12);
  std::memcpy(out.data() + 8, &crc, 4);
  RETURN_IF_ERROR(MakeDirs(step_dir));
  const std::string path = ZenFlowStateFile(step_dir, rank);
  RETURN_IF_ERROR(WriteFileAtomically(path, out));
  return storage::SideFile{path.substr(path.rfind('/') + 1), static_cast<int64_t>(out.size()),
                           storage::Crc32(0, out.data(), out.size())};
}

absl::Status LoadZenFlowState(optim::ZenFlowPipeline& pipeline, const std::string& step_dir,
                              int rank, int64_t step) {
  const std::string path = ZenFlowStateFile(step_dir, rank);
  absl::StatusOr<std::string> data = ReadFile(path);
  if (!data.ok()) {
    return absl::NotFoundError(absl::StrCat(path, ": ZenFlow state of this checkpoint: ",
                                            data.status().message()));
  }
  const std::string& s = *data;
  // The rank's manifest vouches for the file (checkpoints since 2026-12-05): a file of another
  // rank or step (same size, its own CRC intact) is caught here, not by ImportState.
  absl::StatusOr<storage::ShardManifest> manifest = storage::ReadManifest(step_dir, rank);
  if (manifest.ok()) {
    const std::string name = path.substr(path.rfind('/') + 1);
    for (const storage::SideFile& f : manifest->side_files) {
      if (f.name != name) continue;
      absl::Status st = storage::CheckSideFileData(path, rank, f, s);
      if (!st.ok()) {
        return absl::DataLossError(absl::StrCat(
            st.message(), " (not the ZenFlow state this rank wrote with this step's shard)"));
      }
    }
  }
  auto corrupt = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(path, ": ", why));
  };
  if (s.size() < 20) return corrupt("not a state file");
  const bool v1 = std::memcmp(s.data(), kMagicV1, 8) == 0;
  if (!v1 && std::memcmp(s.data(), kMagic, 8) != 0) return corrupt("not a state file");
  uint32_t crc = 0;
  std::memcpy(&crc, s.data() + (v1 ? s.size() - 4 : 8), 4);
  const uint32_t got = v1 ? storage::Crc32(0, s.data(), s.size() - 4)
                          : storage::Crc32(0, s.data() + 12, s.size() - 12);
  if (got != crc) return corrupt("CRC-32 mismatch");
  size_t pos = v1 ? 8 : 12;
  const size_t end = v1 ? s.size() - 4 : s.size();
  auto get = [&](uint64_t* v) {
    if (pos + 8 > end) return false;
    std::memcpy(v, s.data() + pos, 8);
    pos += 8;
    return true;
  };
  uint64_t count = 0;
  if (!get(&count) || count > (1u << 20)) return corrupt("bad tensor count");
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (uint64_t q = 0; q < count; ++q) {
    uint64_t len = 0, numel = 0;
    if (!get(&len) || len >= end - pos) return corrupt("truncated name");  // no pos + len wrap
    std::string name = s.substr(pos, len);
    pos += len;
    const uint8_t dtype = static_cast<uint8_t>(s[pos++]);
    if (dtype > 2 || !get(&numel)) return corrupt(absl::StrCat(name, ": bad header"));
    const at::ScalarType st = dtype == 0 ? at::kFloat : dtype == 1 ? at::kLong : at::kDouble;
    const size_t width = dtype == 0 ? 4 : 8;
    if (numel > (end - pos) / width) return corrupt(absl::StrCat(name, ": truncated values"));
    const size_t bytes = numel * width;
    at::Tensor t = at::empty({static_cast<int64_t>(numel)}, st);
    std::memcpy(t.data_ptr(), s.data() + pos, bytes);
    pos += bytes;
    state.emplace_back(std::move(name), std::move(t));
  }
  absl::Status st = pipeline.ImportState(state, step);
  if (!st.ok()) return absl::Status(st.code(), absl::StrCat(path, ": ", st.message()));
  return absl::OkStatus();
}

}  // namespace loom::engine
