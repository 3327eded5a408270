#include "storage/checkpoint/deepspeed_frozen.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace loom::storage::deepspeed {
namespace {

namespace fs = std::filesystem;
using K = PyValue::Kind;

constexpr int64_t kMaxPickleBytes = 256 << 20;

absl::Status Invalid(const std::string& file, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", what));
}

struct Shape {
  std::string name;
  std::vector<int64_t> dims;
  int64_t numel = 1;
};

absl::StatusOr<std::vector<Shape>> FrozenShapes(const PyValue& top, const std::string& file) {
  std::vector<Shape> out;
  const PyValue* fs = top.Get("frozen_param_shapes");
  if (fs == nullptr || fs->is(K::kNone)) return out;
  if (!fs->is(K::kDict)) {
    return Invalid(file, absl::StrCat("'frozen_param_shapes' is a ", KindName(fs->kind), ", not a dict"));
  }
  for (const auto& [k, v] : fs->entries) {
    if (!k->is(K::kString)) return Invalid(file, "frozen_param_shapes has a non-str key");
    Shape s;
    s.name = k->s;
    if (!v->is(K::kTuple)) {
      return Invalid(file, absl::StrCat("frozen_param_shapes '", s.name, "' is not a torch.Size"));
    }
    for (const auto& d : v->items) {
      if (!d->is(K::kInt) || d->i < 0) {
        return Invalid(file, absl::StrCat("frozen_param_shapes '", s.name, "' has a bad dimension"));
      }
      s.dims.push_back(d->i);
      s.numel *= d->i;
    }
    out.push_back(std::move(s));
  }
  return out;
}

// The fragment of `name` in one model-states file, as a byte run of its archive.
struct Fragment {
  int64_t byte_offset = 0;
  int64_t elements = 0;
  std::string dtype;
};

absl::StatusOr<Fragment> FindFragment(const PyValue& fragments, const TorchArchive& archive,
                                      const std::string& name, int64_t want_elements,
                                      const char* want_what) {
  const std::string& file = archive.path();
  const PyValue* t = fragments.Get(name);
  if (t == nullptr) {
    return Invalid(file, absl::StrCat("frozen_param_fragments has no '", name,
                                      "' (frozen_param_shapes lists it)"));
  }
  const std::string where = absl::StrCat("frozen_param_fragments['", name, "']");
  if (!t->is(K::kTensor)) return Invalid(file, absl::StrCat(where, " is a ", KindName(t->kind), ", not a tensor"));
  const TensorRef& ref = t->tensor;
  if (FrozenElementBytes(ref.dtype) == 0) {
    return Invalid(file, absl::StrCat(where, " has dtype ", ref.dtype, " (F32, BF16 or F16 expected)"));
  }
  if (!ref.contiguous() || ref.storage_offset < 0) return Invalid(file, absl::StrCat(where, " is not contiguous"));
  if (ref.numel() != want_elements) {
    return Invalid(file, absl::StrCat(where, " has ", ref.numel(), " elements, expected ", want_elements, " (",
                                      want_what, ")"));
  }
  const int eb = FrozenElementBytes(ref.dtype);
  const ArchiveRecord* rec = archive.Find("data/" + ref.storage_key);
  const int64_t need = (ref.storage_offset + ref.numel()) * eb;
  if (rec == nullptr || rec->size < need) {
    return absl::DataLossError(absl::StrCat(file, ": ", where, " needs ", need, " bytes of storage record data/",
                                            ref.storage_key, ", which has ", rec == nullptr ? 0 : rec->size));
  }
  return Fragment{rec->offset + ref.storage_offset * eb, ref.numel(), ref.dtype};
}

absl::StatusOr<const PyValue*> Fragments(const PyValue& top, const std::string& file, size_t count) {
  const PyValue* f = top.Get("frozen_param_fragments");
  if (f == nullptr || !f->is(K::kDict)) {
    return Invalid(file, absl::StrCat("no 'frozen_param_fragments' dict for the ", count,
                                      " parameters of frozen_param_shapes"));
  }
  return f;
}

}  // namespace

int FrozenElementBytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  return 0;
}

void WidenToF32(const std::string& dtype, const char* src, int64_t n, float* dst) {
  if (dtype == "F32") {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
    return;
  }
  const bool bf16 = dtype == "BF16";
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    uint32_t bits;
    if (bf16) {
      bits = static_cast<uint32_t>(h) << 16;  // bf16 is the top half of an fp32
    } else {  // IEEE 754 binary16 -> binary32
      const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
      uint32_t exp = (h >> 10) & 0x1fu;
      uint32_t mant = h & 0x3ffu;
      if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);  // inf, NaN (payload kept)
      } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
      } else if (mant == 0) {
        bits = sign;  // +-0
      } else {  // subnormal half: normalise
        exp = 113;
        while ((mant & 0x400u) == 0) {
          mant <<= 1;
          --exp;
        }
        bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
      }
    }
    std::memcpy(dst + i, &bits, 4);
  }
}

absl::StatusOr<FrozenParams> ReadFrozenParams(std::unique_ptr<TorchArchive> model0_archive,
                                              const PyValue& model0, const std::string& checkpoint_dir,
                                              int zero_stage, int world_size) {
  FrozenParams out;
  const std::string file0 = model0_archive->path();
  out.archives.push_back(std::move(model0_archive));
  ASSIGN_OR_RETURN(std::vector<Shape> shapes, FrozenShapes(model0, file0));
  if (shapes.empty()) return out;
  for (const Shape& s : shapes) out.params.push_back(FrozenParam{s.name, s.dims, "", {}});

  if (zero_stage <= 2) {  // _zero2_merge_frozen_params: the fragment is the whole parameter
    ASSIGN_OR_RETURN(const PyValue* frags, Fragments(model0, file0, shapes.size()));
    for (size_t i = 0; i < shapes.size(); ++i) {
      ASSIGN_OR_RETURN(Fragment f, FindFragment(*frags, *out.archives[0], shapes[i].name, shapes[i].numel,
                                                "the numel of its frozen_param_shapes entry"));
      out.params[i].dtype = f.dtype;
      if (f.elements > 0) out.params[i].pieces.push_back(FrozenPiece{0, f.byte_offset, f.elements});
    }
    return out;
  }

  // _zero3_merge_frozen_params: cat over ranks of the ceil(n/N)-element partitions, first n.
  for (int r = 0; r < world_size; ++r) {
    PyRef tree;  // rank r's pickle, dropped after this rank
    const PyValue* top = &model0;
    if (r > 0) {
      const std::string path =
          (fs::path(checkpoint_dir) / absl::StrCat("zero_pp_rank_", r, "_mp_rank_00_model_states.pt")).string();
      std::error_code ec;
      if (!fs::exists(path, ec)) {
        return absl::FailedPreconditionError(absl::StrCat(
            path, ": missing (frozen_param_shapes in ", file0, " lists ", shapes.size(),
            " frozen parameters, whose rank ", r, " fragments this file holds)"));
      }
      ASSIGN_OR_RETURN(auto archive, TorchArchive::Open(path));
      ASSIGN_OR_RETURN(std::string pkl, archive->ReadPickle(kMaxPickleBytes));
      ASSIGN_OR_RETURN(tree, Unpickle(pkl, path));
      top = tree.get();
      out.archives.push_back(std::move(archive));
    }
    const TorchArchive& archive = *out.archives[r];
    ASSIGN_OR_RETURN(const PyValue* frags, Fragments(*top, archive.path(), shapes.size()));
    for (size_t i = 0; i < shapes.size(); ++i) {
      const int64_t n = shapes[i].numel;
      const int64_t part = (n + world_size - 1) / world_size;
      ASSIGN_OR_RETURN(Fragment f, FindFragment(*frags, archive, shapes[i].name, part,
                                                "ceil(numel / world size), rank r's ZeRO-3 partition"));
      FrozenParam& p = out.params[i];
      if (r == 0) {
        p.dtype = f.dtype;
      } else if (f.dtype != p.dtype) {
        return Invalid(archive.path(), absl::StrCat("frozen_param_fragments['", p.name, "'] has dtype ", f.dtype,
                                                    ", rank 0's has ", p.dtype));
      }
      const int64_t take = std::max<int64_t>(0, std::min(part, n - r * part));
      if (take > 0) p.pieces.push_back(FrozenPiece{r, f.byte_offset, take});
    }
  }
  return out;
}

}  // namespace loom::storage::deepspeed
