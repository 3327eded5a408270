#include "storage/checkpoint/deepspeed_consolidate.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "storage/checkpoint/consolidate.h"
#include "storage/checkpoint/deepspeed_archive.h"
#include "storage/checkpoint/deepspeed_frozen.h"
#include "storage/checkpoint/deepspeed_pickle.h"
#include "storage/safetensors/safetensors.h"

namespace loom::storage {
namespace {

namespace fs = std::filesystem;
using deepspeed::PyValue;
using deepspeed::TorchArchive;
using K = PyValue::Kind;

constexpr int64_t kMaxPickleBytes = 256 << 20;

// A run of elements at a byte offset of one archive: fp32 partitions of the optim file of rank
// `rank`, or (frozen parameters, OutTensor::dtype) of model-states file `rank - N`.
struct Segment {
  int rank = 0;
  int64_t byte_offset = 0;
  int64_t elements = 0;
};

struct OutTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<Segment> pieces;
  std::string dtype = "F32";  // of the stored elements; written as F32
};

struct Param {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 1;
};

absl::Status Invalid(const std::string& file, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", what));
}

absl::StatusOr<std::string> TagDir(const std::string& dir, const std::string& tag) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": no such checkpoint directory"));
  }
  std::string t = tag;
  if (t.empty() && fs::exists(fs::path(dir) / "latest", ec)) {
    ASSIGN_OR_RETURN(std::string latest, ReadRegularFile((fs::path(dir) / "latest").string(), 4096));
    t = std::string(absl::StripAsciiWhitespace(latest));
    if (t.empty() || t.find('/') != std::string::npos || t == "..") {
      return Invalid((fs::path(dir) / "latest").string(), "does not name a tag directory");
    }
  }
  const std::string out = t.empty() ? dir : (fs::path(dir) / t).string();
  if (!fs::is_directory(out, ec)) {
    return absl::NotFoundError(absl::StrCat(out, ": tag directory not found"));
  }
  return out;
}

// Each rank's fp32 partitions as segments of its archive.
struct RankState {
  std::string path;
  std::unique_ptr<TorchArchive> archive;
  int zero_stage = 0;
  int64_t partition_count = 0;
  std::vector<Segment> groups;  // stage 1-2: one per group; stage 3: one per sub-group
};

absl::StatusOr<int64_t> IntValue(const PyValue* v, const std::string& file, const char* key) {
  if (v == nullptr) return Invalid(file, absl::StrCat("no '", key, "'"));
  if (v->is(K::kInt)) return v->i;
  if (v->is(K::kList) && !v->items.empty()) {  // partition_count per group: all the same N
    int64_t m = 0;
    for (const auto& e : v->items) {
      if (!e->is(K::kInt)) return Invalid(file, absl::StrCat("'", key, "' is not an int list"));
      m = std::max(m, e->i);
    }
    return m;
  }
  return Invalid(file, absl::StrCat("'", key, "' is a ", deepspeed::KindName(v->kind), ", not an int"));
}

absl::StatusOr<RankState> ReadRank(const std::string& path, int rank) {
  RankState rs;
  rs.path = path;
  ASSIGN_OR_RETURN(rs.archive, TorchArchive::Open(path));
  ASSIGN_OR_RETURN(std::string pkl, rs.archive->ReadPickle(kMaxPickleBytes));
  ASSIGN_OR_RETURN(deepspeed::PyRef top, deepspeed::Unpickle(pkl, path));
  const PyValue* osd = top->Get("optimizer_state_dict");
  if (osd == nullptr || !osd->is(K::kDict)) return Invalid(path, "no 'optimizer_state_dict' dict");
  ASSIGN_OR_RETURN(int64_t stage, IntValue(osd->Get("zero_stage"), path, "zero_stage"));
  ASSIGN_OR_RETURN(rs.partition_count, IntValue(osd->Get("partition_count"), path, "partition_count"));
  if (stage < 1 || stage > 3) return Invalid(path, absl::StrCat("zero_stage ", stage, " (want 1, 2 or 3)"));
  rs.zero_stage = static_cast<int>(stage);
  const char* key = stage == 3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups";
  const PyValue* flats = osd->Get(key);
  if (flats == nullptr || !flats->is(K::kList)) {
    return Invalid(path, absl::StrCat("no '", key, "' list for zero_stage ", stage));
  }
  for (size_t g = 0; g < flats->items.size(); ++g) {
    const PyValue& t = *flats->items[g];
    const std::string where = absl::StrCat(key, "[", g, "]");
    if (!t.is(K::kTensor)) return Invalid(path, absl::StrCat(where, " is not a tensor"));
    if (t.tensor.dtype != "F32") {
      return Invalid(path, absl::StrCat(where, " has dtype ", t.tensor.dtype, ", expected F32"));
    }
    if (!t.tensor.contiguous() || t.tensor.storage_offset < 0) {
      return Invalid(path, absl::StrCat(where, " is not contiguous"));
    }
    const deepspeed::ArchiveRecord* rec = rs.archive->Find("data/" + t.tensor.storage_key);
    const int64_t need = (t.tensor.storage_offset + t.tensor.numel()) * 4;
    if (rec == nullptr || rec->size < need) {
      return absl::DataLossError(absl::StrCat(
          path, ": ", where, " needs ", need, " bytes of storage record data/",
          t.tensor.storage_key, ", which has ", rec == nullptr ? 0 : rec->size));
    }
    rs.groups.push_back(Segment{rank, rec->offset + t.tensor.storage_offset * 4, t.tensor.numel()});
  }
  return rs;
}

// param_shapes: a list of ordered dicts (one per group), or one dict.
absl::StatusOr<std::vector<std::vector<Param>>> ParamShapes(const PyValue& top, const std::string& file) {
  const PyValue* ps = top.Get("param_shapes");
  if (ps == nullptr) return Invalid(file, "no 'param_shapes'");
  std::vector<const PyValue*> groups;
  if (ps->is(K::kDict)) {
    groups.push_back(ps);
  } else if (ps->is(K::kList)) {
    for (const auto& g : ps->items) groups.push_back(g.get());
  } else {
    return Invalid(file, "'param_shapes' is neither a list nor a dict");
  }
  std::vector<std::vector<Param>> out;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g]->is(K::kDict)) return Invalid(file, absl::StrCat("param_shapes[", g, "] is not a dict"));
    out.emplace_back();
    for (const auto& [k, v] : groups[g]->entries) {
      if (!k->is(K::kString)) return Invalid(file, absl::StrCat("param_shapes[", g, "] has a non-str key"));
      Param p;
      p.name = k->s;
      if (!v->is(K::kTuple)) return Invalid(file, absl::StrCat("param_shapes '", p.name, "' is not a torch.Size"));
      for (const auto& d : v->items) {
        if (!d->is(K::kInt) || d->i < 0) {
          return Invalid(file, absl::StrCat("param_shapes '", p.name, "' has a bad dimension"));
        }
        p.shape.push_back(d->i);
        p.numel *= d->i;
      }
      out.back().push_back(std::move(p));
    }
  }
  return out;
}

// Elements [begin, begin + n) of the concatenation of `segs`, as pieces.
absl::Status Slice(const std::vector<Segment>& segs, int64_t begin, int64_t n,
                   std::vector<Segment>* out) {
  int64_t start = 0;
  for (const Segment& s : segs) {
    if (n == 0) break;
    const int64_t end = start + s.elements;
    if (begin < end) {
      const int64_t take = std::min(n, end - begin);
      out->push_back(Segment{s.rank, s.byte_offset + (begin - start) * 4, take});
      begin += take;
      n -= take;
    }
    start = end;
  }
  if (n != 0) return absl::OutOfRangeError("past the end");
  return absl::OkStatus();
}

int64_t Total(const std::vector<Segment>& segs) {
  int64_t t = 0;
  for (const Segment& s : segs) t += s.elements;
  return t;
}

std::string HfName(absl::string_view name) {
  while (absl::ConsumePrefix(&name, "module.")) {
  }
  return std::string(name);
}

absl::Status WriteIndex(const std::string& path, const std::vector<ShardPlanFile>& plan, int64_t total) {
  nlohmann::json weight_map = nlohmann::json::object();
  for (const ShardPlanFile& f : plan) {
    for (const std::string& t : f.tensors) weight_map[t] = f.file_name;
  }
  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  return WriteFileAtomically(path, index.dump(2) + "\n");
}

}  // namespace

absl::StatusOr<DeepSpeedConsolidateResult> ConsolidateDeepSpeed(
    const std::string& dir, const std::string& output_dir,
    const DeepSpeedConsolidateOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  DeepSpeedConsolidateResult result;
  ASSIGN_OR_RETURN(result.checkpoint_dir, TagDir(dir, options.tag));
  const fs::path ckpt(result.checkpoint_dir);
  std::error_code ec;

  // Model states.
  std::string model_file;
  for (const char* n : {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"}) {
    if (model_file.empty() && fs::exists(ckpt / n, ec)) model_file = (ckpt / n).string();
  }
  if (model_file.empty()) {
    return absl::NotFoundError(absl::StrCat(
        result.checkpoint_dir, ": neither mp_rank_00_model_states.pt nor "
        "zero_pp_rank_0_mp_rank_00_model_states.pt: not a DeepSpeed checkpoint directory"));
  }
  std::vector<std::vector<Param>> groups;
  std::map<std::string, std::string> shared;  // alias -> source
  int64_t dp_world_size = 0;
  std::unique_ptr<TorchArchive> model_archive;
  deepspeed::PyRef model_top;
  {
    ASSIGN_OR_RETURN(model_archive, TorchArchive::Open(model_file));
    ASSIGN_OR_RETURN(std::string pkl, model_archive->ReadPickle(kMaxPickleBytes));
    ASSIGN_OR_RETURN(model_top, deepspeed::Unpickle(pkl, model_file));
    const deepspeed::PyRef& top = model_top;
    if (!top->is(K::kDict)) return Invalid(model_file, "the pickled object is not a dict");
    ASSIGN_OR_RETURN(groups, ParamShapes(*top, model_file));
    if (const PyValue* sp = top->Get("shared_params"); sp != nullptr && sp->is(K::kDict)) {
      for (const auto& [k, v] : sp->entries) {
        if (!k->is(K::kString) || !v->is(K::kString)) return Invalid(model_file, "shared_params is not str -> str");
        shared[k->s] = v->s;
      }
    }
    if (const PyValue* v = top->Get("buffer_names");
        v != nullptr && (v->is(K::kDict) || v->is(K::kList)) && !(v->entries.empty() && v->items.empty())) {
      return absl::UnimplementedError(absl::StrCat(
          model_file, ": non-empty 'buffer_names' (persistent buffers are not consolidated yet)"));
    }
    if (const PyValue* d = top->Get("dp_world_size"); d != nullptr && d->is(K::kInt)) dp_world_size = d->i;
  }

  // Optim states, by rank.
  static const std::regex kOptim(R"(^(bf16_)?zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt$)");
  std::map<int, std::string> by_rank;
  std::string prefix;
  for (const auto& e : fs::directory_iterator(ckpt, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, m, kOptim)) {
      by_rank[std::stoi(m[2].str())] = e.path().string();
      prefix = m[1].str();
    }
  }
  if (by_rank.empty()) {
    return absl::NotFoundError(absl::StrCat(
        result.checkpoint_dir, ": no zero_pp_rank_*_mp_rank_00_optim_states.pt (ZeRO stage 0 "
        "checkpoints are not read here)"));
  }
  std::vector<RankState> ranks;
  for (const auto& [r, path] : by_rank) {
    if (r != static_cast<int>(ranks.size())) {
      return absl::FailedPreconditionError(absl::StrCat(
          (ckpt / absl::StrCat(prefix, "zero_pp_rank_", ranks.size(), "_mp_rank_00_optim_states.pt")).string(),
          ": missing (rank files present: ", absl::StrJoin(by_rank, ",", [](std::string* o, const auto& kv) {
            absl::StrAppend(o, kv.first);
          }), ")"));
    }
    ASSIGN_OR_RETURN(RankState rs, ReadRank(path, r));
    ranks.push_back(std::move(rs));
  }
  const int64_t n_ranks = static_cast<int64_t>(ranks.size());
  const RankState& r0 = ranks[0];
  for (const RankState& rs : ranks) {
    if (rs.zero_stage != r0.zero_stage || rs.partition_count != r0.partition_count) {
      return absl::FailedPreconditionError(absl::StrCat(
          rs.path, ": zero_stage ", rs.zero_stage, ", partition_count ", rs.partition_count,
          " disagree with ", r0.path, " (", r0.zero_stage, ", ", r0.partition_count, ")"));
    }
  }
  if (r0.partition_count != n_ranks) {
    const std::string& file = r0.partition_count > n_ranks
        ? (ckpt / absl::StrCat(prefix, "zero_pp_rank_", n_ranks, "_mp_rank_00_optim_states.pt")).string()
        : ranks[r0.partition_count].path;
    return absl::FailedPreconditionError(absl::StrCat(
        file, ": world size mismatch: partition_count is ", r0.partition_count, " but ", n_ranks,
        " rank files are present", r0.partition_count > n_ranks ? " (this one is missing)" : " (this one is extra)"));
  }
  if (dp_world_size != 0 && dp_world_size != n_ranks) {
    return absl::FailedPreconditionError(absl::StrCat(
        model_file, ": world size mismatch: dp_world_size ", dp_world_size, " but ", n_ranks,
        " rank files (partition_count ", r0.partition_count, ")"));
  }
  result.zero_stage = r0.zero_stage;
  result.world_size = static_cast<int>(n_ranks);

  // Where each parameter's elements are.
  std::vector<OutTensor> tensors;
  if (r0.zero_stage <= 2) {
    for (const RankState& rs : ranks) {
      if (rs.groups.size() != groups.size() || rs.groups.size() != r0.groups.size()) {
        return Invalid(rs.path, absl::StrCat(rs.groups.size(), " fp32 groups, but param_shapes in ",
                                             model_file, " has ", groups.size()));
      }
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      std::vector<Segment> full;
      for (const RankState& rs : ranks) full.push_back(rs.groups[g]);
      const int64_t avail = Total(full);
      int64_t offset = 0;
      for (const Param& p : groups[g]) {
        OutTensor t{p.name, p.shape, {}};
        if (!Slice(full, offset, p.numel, &t.pieces).ok()) {
          return Invalid(model_file, absl::StrCat("param_shapes group ", g, ": '", p.name, "' (", p.numel,
                                                  " elements at element ", offset, ") runs past the ", avail,
                                                  " elements of the ", n_ranks, " partitions (numel mismatch)"));
        }
        offset += p.numel;
        tensors.push_back(std::move(t));
      }
      const int64_t align = 2 * n_ranks;  // zero_to_fp32's sanity check
      if ((offset + align - 1) / align != (avail + align - 1) / align) {
        return Invalid(r0.path, absl::StrCat("group ", g, ": param_shapes in ", model_file, " consume ", offset,
                                             " of the partitions' ", avail, " elements (numel mismatch)"));
      }
    }
  } else {
    std::vector<std::vector<Segment>> flat(n_ranks);
    for (int64_t r = 0; r < n_ranks; ++r) flat[r] = ranks[r].groups;
    const int64_t per_rank = Total(flat[0]);
    for (const RankState& rs : ranks) {
      if (Total(rs.groups) != per_rank) {
        return Invalid(rs.path, absl::StrCat("fp32_flat_groups hold ", Total(rs.groups),
                                             " elements, rank 0 holds ", per_rank));
      }
    }
    int64_t offset = 0;
    for (const auto& group : groups) {
      for (const Param& p : group) {
        const int64_t part = (p.numel + n_ranks - 1) / n_ranks;
        OutTensor t{p.name, p.shape, {}};
        for (int64_t r = 0; r < n_ranks; ++r) {
          const int64_t take = std::max<int64_t>(0, std::min(part, p.numel - r * part));
          if (take > 0 && !Slice(flat[r], offset, take, &t.pieces).ok()) {
            return Invalid(ranks[r].path, absl::StrCat(
                "fp32_flat_groups end before '", p.name, "' (", p.numel, " elements, ", part,
                " per rank at element ", offset, " of ", per_rank, "; param_shapes in ", model_file,
                ": numel mismatch)"));
          }
        }
        offset += part;
        tensors.push_back(std::move(t));
      }
    }
    if (offset != per_rank) {
      return Invalid(r0.path, absl::StrCat("param_shapes in ", model_file, " consume ", offset, " of the ",
                                           per_rank, " elements per rank (numel mismatch)"));
    }
  }

  // Frozen parameters (deepspeed_frozen.h), from the model-states files.
  ASSIGN_OR_RETURN(deepspeed::FrozenParams frozen,
                   deepspeed::ReadFrozenParams(std::move(model_archive), *model_top, result.checkpoint_dir,
                                               r0.zero_stage, static_cast<int>(n_ranks)));
  model_top.reset();
  for (deepspeed::FrozenParam& f : frozen.params) {
    OutTensor t{f.name, f.shape, {}, f.dtype};
    for (const deepspeed::FrozenPiece& p : f.pieces) {
      t.pieces.push_back(Segment{static_cast<int>(n_ranks) + p.file, p.byte_offset, p.elements});
    }
    tensors.push_back(std::move(t));
  }
  std::vector<const TorchArchive*> archives;  // Segment::rank -> archive
  for (const RankState& rs : ranks) archives.push_back(rs.archive.get());
  for (const auto& a : frozen.archives) archives.push_back(a.get());

  // Names: wrapper prefix off, ties once.
  std::set<std::string> present;
  for (const OutTensor& t : tensors) present.insert(t.name);
  for (const auto& [alias, source] : shared) {
    if (present.count(alias)) continue;  // stored on its own: written on its own
    result.skipped_tensors.push_back(HfName(alias));
    if (HfName(alias) == "model.embed_tokens.weight" && HfName(source) == "lm_head.weight") {
      for (OutTensor& t : tensors) {
        if (t.name == source) {
          t.name = alias;
          result.skipped_tensors.back() = HfName(source);
        }
      }
    }
  }
  std::map<std::string, size_t> by_name;
  std::vector<std::pair<std::string, int64_t>> sizes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    tensors[i].name = HfName(tensors[i].name);
    if (!by_name.emplace(tensors[i].name, i).second) {
      return Invalid(model_file, absl::StrCat("two parameters are both named '", tensors[i].name, "'"));
    }
    sizes.emplace_back(tensors[i].name, Total(tensors[i].pieces) * 4);
    result.tensor_bytes += sizes.back().second;
  }
  result.num_tensors = static_cast<int64_t>(tensors.size());

  // Write.
  fs::create_directories(output_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", output_dir, ": ", ec.message()));
  const int64_t piece = std::max<int64_t>(4, options.piece_bytes / 4 * 4);
  std::vector<char> buffer(static_cast<size_t>(piece));
  std::vector<float> widened;  // frozen BF16/F16 elements as fp32
  const safetensors::TensorSource source = [&](const safetensors::TensorEntry& e,
                                               const safetensors::ByteSink& sink) -> absl::Status {
    const OutTensor& t = tensors[by_name.at(e.name)];
    const int64_t eb = t.dtype == "F32" ? 4 : deepspeed::FrozenElementBytes(t.dtype);
    const int64_t chunk = piece / 4 * eb;  // stored bytes per read: `piece` bytes of output
    for (const Segment& s : t.pieces) {
      const TorchArchive& a = *archives[s.rank];
      for (int64_t done = 0; done < s.elements * eb;) {
        const int64_t n = std::min<int64_t>(chunk, s.elements * eb - done);
        RETURN_IF_ERROR(a.ReadAt(s.byte_offset + done, buffer.data(), static_cast<size_t>(n)));
        if (eb == 4 && t.dtype == "F32") {
          RETURN_IF_ERROR(sink(buffer.data(), static_cast<size_t>(n)));
        } else {
          widened.resize(static_cast<size_t>(n / eb));
          deepspeed::WidenToF32(t.dtype, buffer.data(), n / eb, widened.data());
          RETURN_IF_ERROR(sink(reinterpret_cast<const char*>(widened.data()), widened.size() * 4));
        }
        done += n;
      }
    }
    return absl::OkStatus();
  };
  const std::vector<ShardPlanFile> plan = PlanShards(sizes, options.max_shard_size_bytes);
  for (const ShardPlanFile& f : plan) {
    std::vector<safetensors::TensorSpec> specs;
    for (const std::string& name : f.tensors) {
      specs.push_back({name, "F32", tensors[by_name.at(name)].shape});
    }
    const std::string path = (fs::path(output_dir) / f.file_name).string();
    safetensors::WriterOptions wo;
    wo.writeback_bytes = 32 << 20;
    ASSIGN_OR_RETURN(int64_t bytes, safetensors::WriteFile(path, std::move(specs), source, wo));
    result.safetensors_bytes += bytes;
    result.files.push_back(path);
  }
  if (plan.size() > 1) {
    result.index_path = (fs::path(output_dir) / "model.safetensors.index.json").string();
    RETURN_IF_ERROR(WriteIndex(result.index_path, plan, result.tensor_bytes));
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace loom::storage
