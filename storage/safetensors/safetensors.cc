#include "storage/safetensors/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace loom::safetensors {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// The reference `Dtype` enum (safetensors/src/tensor.rs) in declaration order, which is
// increasing alignment order; `rank` is the index. The two FNUZ FP8 types are not in every
// reference release; they are placed with the other 8-bit floats.
constexpr DtypeInfo kDtypes[] = {
    {"BOOL", 8, 0},        {"F4", 4, 1},           {"F6_E2M3", 6, 2},      {"F6_E3M2", 6, 3},
    {"U8", 8, 4},          {"I8", 8, 5},           {"F8_E5M2", 8, 6},      {"F8_E4M3", 8, 7},
    {"F8_E8M0", 8, 8},     {"F8_E4M3FNUZ", 8, 9},  {"F8_E5M2FNUZ", 8, 10}, {"I16", 16, 11},
    {"U16", 16, 12},       {"F16", 16, 13},        {"BF16", 16, 14},       {"I32", 32, 15},
    {"U32", 32, 16},       {"F32", 32, 17},        {"C64", 64, 18},        {"F64", 64, 19},
    {"I64", 64, 20},       {"U64", 64, 21},
};

constexpr size_t kWriteBufferBytes = 1 << 20;

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

// Coalesces small appends into kWriteBufferBytes writes.
class BufferedWriter {
 public:
  explicit BufferedWriter(AtomicFileWriter& writer) : writer_(writer) {
    buffer_.reserve(kWriteBufferBytes);
  }
  absl::Status Append(const void* data, size_t size) {
    if (buffer_.size() + size > kWriteBufferBytes) RETURN_IF_ERROR(Flush());
    if (size >= kWriteBufferBytes) return writer_.Append(data, size);
    buffer_.append(static_cast<const char*>(data), size);
    return absl::OkStatus();
  }
  absl::Status Flush() {
    if (buffer_.empty()) return absl::OkStatus();
    absl::Status s = writer_.Append(buffer_.data(), buffer_.size());
    buffer_.clear();
    return s;
  }

 private:
  AtomicFileWriter& writer_;
  std::string buffer_;
};

// A JSON integer that fits int64_t and is >= 0.
bool AsNonNegativeInt(const json& v, int64_t* out) {
  if (!v.is_number_unsigned()) return false;
  uint64_t u = v.get<uint64_t>();
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
  *out = static_cast<int64_t>(u);
  return true;
}

}  // namespace

const DtypeInfo* FindDtype(absl::string_view name) {
  for (const DtypeInfo& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

absl::StatusOr<int64_t> TensorByteSize(absl::string_view dtype, absl::Span<const int64_t> shape) {
  const DtypeInfo* info = FindDtype(dtype);
  if (info == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", dtype, "'"));
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat("negative dimension in shape ", ShapeString(shape)));
    }
    if (__builtin_mul_overflow(numel, d, &numel)) {
      return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape), " overflows"));
    }
  }
  int64_t bits = 0;
  if (__builtin_mul_overflow(numel, static_cast<int64_t>(info->bits), &bits)) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape), " overflows"));
  }
  if (bits % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(dtype, " tensor of shape ", ShapeString(shape),
                                                   " is not a whole number of bytes"));
  }
  return bits / 8;
}

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------------
// Writer

absl::StatusOr<Header> PlanHeader(std::vector<TensorSpec> specs,
                                  const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<const DtypeInfo*, TensorSpec>> sorted;
  sorted.reserve(specs.size());
  std::set<std::string> names;
  for (TensorSpec& s : specs) {
    if (s.name == "__metadata__") {
      return absl::InvalidArgumentError("tensor name '__metadata__' is reserved");
    }
    if (!names.insert(s.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name '", s.name, "'"));
    }
    const DtypeInfo* info = FindDtype(s.dtype);
    if (info == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", s.name, "': unknown dtype '", s.dtype, "'"));
    }
    sorted.emplace_back(info, std::move(s));
  }
  // Reference order: dtype alignment descending, then name ascending (byte-wise).
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    if (a.first->rank != b.first->rank) return a.first->rank > b.first->rank;
    return a.second.name < b.second.name;
  });
  Header header;
  header.has_metadata = !metadata.empty();
  header.metadata = metadata;
  int64_t offset = 0;
  for (auto& [info, spec] : sorted) {
    auto bytes = TensorByteSize(spec.dtype, spec.shape);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", spec.name, "': ", bytes.status().message()));
    }
    TensorEntry e;
    e.name = std::move(spec.name);
    e.dtype = std::move(spec.dtype);
    e.shape = std::move(spec.shape);
    e.begin = offset;
    if (__builtin_add_overflow(offset, *bytes, &e.end)) {
      return absl::InvalidArgumentError("total tensor bytes overflow");
    }
    offset = e.end;
    header.tensors.push_back(std::move(e));
  }
  header.data_bytes = offset;
  // Validates names and metadata (UTF-8) and the header size.
  ASSIGN_OR_RETURN(std::string text, SerializeHeader(header));
  (void)text;
  return header;
}

absl::StatusOr<std::string> SerializeHeader(const Header& header) {
  // ordered_json keeps insertion order, which is the reference serialisation order:
  // __metadata__ first, then tensors in data order, each as {"dtype","shape","data_offsets"}.
  ordered_json j = ordered_json::object();
  if (header.has_metadata) {
    ordered_json meta = ordered_json::object();
    for (const auto& [k, v] : header.metadata) meta[k] = v;
    j["__metadata__"] = std::move(meta);
  }
  for (const TensorEntry& e : header.tensors) {
    ordered_json entry = ordered_json::object();
    entry["dtype"] = e.dtype;
    entry["shape"] = e.shape;
    entry["data_offsets"] = {e.begin, e.end};
    j[e.name] = std::move(entry);
  }
  std::string text;
  try {
    text = j.dump();  // compact: no spaces, as serde_json::to_string
  } catch (const ordered_json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors header: a tensor name or metadata string is not UTF-8: ", e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  if (static_cast<int64_t>(text.size()) > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors header is ", text.size(),
                                                   " bytes, over the limit ", kMaxHeaderBytes));
  }
  return text;
}

absl::StatusOr<int64_t> WriteFile(const std::string& path, std::vector<TensorSpec> specs,
                                  const TensorSource& source, const WriterOptions& options) {
  auto planned = PlanHeader(std::move(specs), options.metadata);
  if (!planned.ok()) {
    return absl::Status(planned.status().code(),
                        absl::StrCat(path, ": ", planned.status().message()));
  }
  const Header& header = *planned;
  ASSIGN_OR_RETURN(std::string text, SerializeHeader(header));
  AtomicFileWriter::Options writer_options;
  writer_options.writeback_bytes = options.writeback_bytes;
  ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Open(path, writer_options));
  BufferedWriter out(writer);
  uint64_t n = text.size();
  unsigned char prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>(n >> (8 * i));
  RETURN_IF_ERROR(out.Append(prefix, sizeof(prefix)));
  RETURN_IF_ERROR(out.Append(text.data(), text.size()));
  for (const TensorEntry& e : header.tensors) {
    int64_t written = 0;
    ByteSink sink = [&](const void* data, size_t size) -> absl::Status {
      if (written + static_cast<int64_t>(size) > e.size_bytes()) {
        return absl::InternalError(absl::StrCat(path, ": source of tensor '", e.name, "' produced ",
                                                written + size, "+ bytes, tensor has ",
                                                e.size_bytes()));
      }
      written += static_cast<int64_t>(size);
      return out.Append(data, size);
    };
    RETURN_IF_ERROR(source(e, sink));
    if (written != e.size_bytes()) {
      return absl::InternalError(absl::StrCat(path, ": source of tensor '", e.name, "' produced ",
                                              written, " bytes, tensor has ", e.size_bytes()));
    }
  }
  RETURN_IF_ERROR(out.Flush());
  int64_t total = writer.bytes_written();
  RETURN_IF_ERROR(writer.Commit());
  return total;
}

absl::StatusOr<int64_t> WriteFile(const std::string& path, const std::vector<TensorData>& tensors,
                                  const WriterOptions& options) {
  std::vector<TensorSpec> specs;
  std::map<std::string, const std::string*> bytes;
  for (const TensorData& t : tensors) {
    specs.push_back(t.spec);
    bytes[t.spec.name] = &t.bytes;
  }
  return WriteFile(
      path, std::move(specs),
      [&](const TensorEntry& e, const ByteSink& sink) {
        const std::string& b = *bytes.at(e.name);
        return sink(b.data(), b.size());
      },
      options);
}

// ---------------------------------------------------------------------------------------------
// Reader

absl::StatusOr<Header> ParseHeader(absl::string_view text, int64_t data_bytes_available,
                                   absl::string_view file) {
  auto invalid = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": invalid safetensors header: ", what));
  };
  if (text.empty() || text.front() != '{') return invalid("does not start with '{'");

  // Duplicate keys: nlohmann keeps the last one silently, so watch the keys as they are parsed.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  int duplicate_depth = 0;
  json::parser_callback_t watch = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
          duplicate = parsed.get<std::string>();
          duplicate_depth = static_cast<int>(open_objects.size());
        }
        break;
      default:
        break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text.begin(), text.end(), watch);
  } catch (const json::exception& e) {
    return invalid(absl::StrCat("not UTF-8 JSON: ", e.what()));
  }
  if (!duplicate.empty()) {
    return invalid(duplicate_depth == 1
                       ? absl::StrCat("duplicate tensor name '", duplicate, "'")
                       : absl::StrCat("duplicate key '", duplicate, "' inside an entry"));
  }
  if (!j.is_object()) return invalid("not a JSON object");

  Header header;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return invalid("__metadata__ is not an object");
      header.has_metadata = true;
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return invalid(absl::StrCat("__metadata__ value of '", m.key(), "' is not a string"));
        }
        header.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": invalid safetensors header: tensor '", name, "': ", what));
    };
    if (!v.is_object()) return bad("entry is not an object");
    TensorEntry e;
    e.name = name;
    auto dtype = v.find("dtype");
    if (dtype == v.end() || !dtype->is_string()) return bad("missing string \"dtype\"");
    e.dtype = dtype->get<std::string>();
    if (FindDtype(e.dtype) == nullptr) return bad(absl::StrCat("unknown dtype '", e.dtype, "'"));
    auto shape = v.find("shape");
    if (shape == v.end() || !shape->is_array()) return bad("missing array \"shape\"");
    for (const json& d : *shape) {
      int64_t dim = 0;
      if (!AsNonNegativeInt(d, &dim)) {
        return bad(absl::StrCat("shape ", shape->dump(), " is not a list of non-negative integers"));
      }
      e.shape.push_back(dim);
    }
    auto offsets = v.find("data_offsets");
    if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2 ||
        !AsNonNegativeInt((*offsets)[0], &e.begin) || !AsNonNegativeInt((*offsets)[1], &e.end)) {
      return bad("\"data_offsets\" is not [BEGIN, END] of non-negative integers");
    }
    if (e.end < e.begin) {
      return bad(absl::StrCat("data_offsets [", e.begin, ",", e.end, "] end before begin"));
    }
    auto bytes = TensorByteSize(e.dtype, e.shape);
    if (!bytes.ok()) return bad(bytes.status().message());
    if (*bytes != e.size_bytes()) {
      return bad(absl::StrCat("data_offsets [", e.begin, ",", e.end, "] span ", e.size_bytes(),
                              " bytes but ", e.dtype, " ", ShapeString(e.shape), " needs ",
                              *bytes));
    }
    header.tensors.push_back(std::move(e));
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorEntry& a, const TensorEntry& b) {
              return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
            });
  int64_t expected = 0;
  const TensorEntry* prev = nullptr;
  for (const TensorEntry& e : header.tensors) {
    if (e.begin < expected) {
      return invalid(absl::StrCat("tensor '", e.name, "' data_offsets [", e.begin, ",", e.end,
                                  "] overlap tensor '", prev->name, "' [", prev->begin, ",",
                                  prev->end, "]"));
    }
    if (e.begin > expected) {
      return invalid(prev == nullptr
                         ? absl::StrCat("first tensor '", e.name, "' begins at ", e.begin,
                                        ", not 0")
                         : absl::StrCat("gap of ", e.begin - expected, " bytes between tensor '",
                                        prev->name, "' (ends at ", expected, ") and tensor '",
                                        e.name, "' (begins at ", e.begin, ")"));
    }
    expected = e.end;
    prev = &e;
  }
  header.data_bytes = expected;
  if (expected > data_bytes_available) {
    return absl::DataLossError(absl::StrCat(
        file, ": truncated safetensors file: tensor '", prev->name, "' ends at data byte ",
        expected, " but the file holds only ", data_bytes_available, " data bytes"));
  }
  if (expected < data_bytes_available) {
    return invalid(absl::StrCat(data_bytes_available - expected,
                                " trailing bytes after the last tensor (data ends at ", expected,
                                ")"));
  }
  return header;
}

absl::StatusOr<std::unique_ptr<Reader>> Reader::Open(const std::string& path) {
  std::unique_ptr<Reader> r(new Reader());
  r->path_ = path;
  r->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (r->fd_ < 0) return ErrnoError("cannot open", path);
  struct stat st;
  if (::fstat(r->fd_, &st) != 0) return ErrnoError("cannot stat", path);
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  r->file_bytes_ = st.st_size;
  if (r->file_bytes_ < 8) {
    return absl::DataLossError(absl::StrCat(path, ": truncated safetensors file: ", r->file_bytes_,
                                            " bytes, shorter than the 8-byte header length"));
  }
  unsigned char prefix[8];
  ASSIGN_OR_RETURN(size_t got, PreadUpTo(r->fd_, prefix, 8, 0, path));
  if (got != 8) return absl::DataLossError(absl::StrCat(path, ": short read of the header length"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];
  if (n > static_cast<uint64_t>(kMaxHeaderBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": invalid safetensors header: length ", n,
                                                   " exceeds the limit ", kMaxHeaderBytes));
  }
  if (static_cast<int64_t>(n) > r->file_bytes_ - 8) {
    return absl::DataLossError(absl::StrCat(path, ": truncated safetensors file: header length ", n,
                                            " but only ", r->file_bytes_ - 8,
                                            " bytes follow the length prefix"));
  }
  r->header_bytes_ = static_cast<int64_t>(n);
  std::string text(n, '\0');
  ASSIGN_OR_RETURN(got, PreadUpTo(r->fd_, text.data(), n, 8, path));
  if (got != n) return absl::DataLossError(absl::StrCat(path, ": short read of the header"));
  ASSIGN_OR_RETURN(r->header_, ParseHeader(text, r->file_bytes_ - 8 - r->header_bytes_, path));
  for (size_t i = 0; i < r->header_.tensors.size(); ++i) {
    r->index_.emplace(r->header_.tensors[i].name, i);
  }
  return r;
}

Reader::~Reader() {
  if (fd_ >= 0) ::close(fd_);
}

const TensorEntry* Reader::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

absl::StatusOr<std::string> Reader::ReadTensor(absl::string_view name) const {
  const TensorEntry* e = Find(name);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", name, "'"));
  }
  std::string out(static_cast<size_t>(e->size_bytes()), '\0');
  RETURN_IF_ERROR(ReadTensorRange(*e, 0, out.data(), out.size()));
  return out;
}

absl::Status Reader::ReadTensorRange(const TensorEntry& e, int64_t offset, void* dst,
                                     size_t size_bytes) const {
  if (offset < 0 || offset + static_cast<int64_t>(size_bytes) > e.size_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": range [", offset, ", ",
                                                   offset + static_cast<int64_t>(size_bytes),
                                                   ") outside tensor '", e.name, "' of ",
                                                   e.size_bytes(), " bytes"));
  }
  int64_t file_offset = 8 + header_bytes_ + e.begin + offset;
  ASSIGN_OR_RETURN(size_t got, PreadUpTo(fd_, dst, size_bytes, file_offset, path_));
  if (got != size_bytes) {
    return absl::DataLossError(absl::StrCat(path_, ": tensor '", e.name, "': read ", got, " of ",
                                            size_bytes, " bytes (file shrank?)"));
  }
  return absl::OkStatus();
}

}  // namespace loom::safetensors
