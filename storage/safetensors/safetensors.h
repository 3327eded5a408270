// safetensors: Hugging Face's tensor file format (https://github.com/huggingface/safetensors;
// docs/design/TECHNIQUES.md §5.3). Layout:
//
//   bytes [0, 8)        N = header length, u64 little-endian
//   bytes [8, 8+N)      UTF-8 JSON object, starting with '{', right-padded with spaces:
//                       {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [..],
//                        "data_offsets": [BEGIN, END]}, ...}
//   bytes [8+N, EOF)    the data buffer; a tensor's bytes are [8+N+BEGIN, 8+N+END), little-endian,
//                       C (row-major) order.
//
// The writer reproduces the reference (Rust) writer byte for byte: `__metadata__` first, tensors
// sorted by dtype alignment descending then by name, offsets contiguous from 0, compact JSON padded
// with spaces to a multiple of 8 bytes. Tensor bytes are streamed from a caller-supplied source, so a
// writer never holds the whole model.
//
// The reader validates the file as the reference reader does (tensor.rs `read_metadata` +
// `Metadata::validate`), and additionally rejects duplicate names and non-string metadata values.
//
// Error scheme (every message names the file, and the tensor where there is one):
//   DATA_LOSS         the file ends before what its own header promises: fewer than 8 bytes, a
//                     header length past the end of the file, tensor data past the end of the file;
//                     or a read returned fewer bytes than the validated layout promised.
//   INVALID_ARGUMENT  anything else malformed: header length > 100,000,000, header not UTF-8 JSON
//                     or not starting with '{', unknown dtype, bad shape, bad offsets, size mismatch,
//                     gaps or overlaps between tensors, trailing bytes after the last tensor,
//                     duplicate names, non-string metadata.
//   NOT_FOUND         the file or a requested tensor does not exist.
#ifndef LOOM_STORAGE_SAFETENSORS_SAFETENSORS_H_
#define LOOM_STORAGE_SAFETENSORS_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace loom::safetensors {

// The reference reader refuses headers longer than this (tensor.rs MAX_HEADER_SIZE).
inline constexpr int64_t kMaxHeaderBytes = 100'000'000;

// A dtype the format knows. `rank` is its position in the reference `Dtype` enum, which is in
// increasing alignment order; the writer sorts by rank descending.
struct DtypeInfo {
  const char* name;  // "F32", "BF16", ...
  int bits;          // bits per element (4 for F4, 6 for F6_*, 8 for BOOL)
  int rank;
};

// The dtype called `name` (case-sensitive), or nullptr if the format does not define it.
// Known: BOOL F4 F6_E2M3 F6_E3M2 U8 I8 F8_E5M2 F8_E4M3 F8_E8M0 F8_E4M3FNUZ F8_E5M2FNUZ I16 U16 F16
// BF16 I32 U32 F32 C64 F64 I64 U64.
const DtypeInfo* FindDtype(absl::string_view name);

// Bytes of a tensor of `dtype` and `shape`. INVALID_ARGUMENT on an unknown dtype, a negative
// dimension, arithmetic overflow, or a sub-byte dtype whose total is not a whole number of bytes.
absl::StatusOr<int64_t> TensorByteSize(absl::string_view dtype, absl::Span<const int64_t> shape);

// What a writer is given per tensor.
struct TensorSpec {
  std::string name;            // e.g. "model.layers.0.self_attn.q_proj.weight"
  std::string dtype;           // e.g. "F32"
  std::vector<int64_t> shape;  // [] for a 0-d tensor; dims may be 0
};

// One tensor of a header. Offsets are bytes relative to the start of the data buffer.
struct TensorEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0;  // inclusive
  int64_t end = 0;    // exclusive
  int64_t numel() const;
  int64_t size_bytes() const { return end - begin; }
};

struct Header {
  // Present iff the file has a `__metadata__` key.
  bool has_metadata = false;
  std::map<std::string, std::string> metadata;
  // Sorted by data offset (for a header planned by the writer: in write order).
  std::vector<TensorEntry> tensors;
  // Bytes of the data buffer (= end of the last tensor).
  int64_t data_bytes = 0;
};

// ---------------------------------------------------------------------------------------------
// Writer

struct WriterOptions {
  // Written as `__metadata__`. {"format": "pt"} by default because some transformers releases
  // refuse files without it (docs/design/TECHNIQUES.md §5.2 step 7). Empty = no `__metadata__` key
  // at all.
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  // Start writeback every this many bytes (AtomicFileWriter::Options); 0 = only at the end.
  int64_t writeback_bytes = 0;
};

// Orders `specs` as the reference writer does and assigns contiguous offsets from 0.
// INVALID_ARGUMENT on duplicate or reserved ("__metadata__") names, names or metadata that are not
// valid UTF-8, unknown dtypes, bad shapes, or a header over kMaxHeaderBytes.
absl::StatusOr<Header> PlanHeader(std::vector<TensorSpec> specs,
                                  const std::map<std::string, std::string>& metadata);

// The compact JSON of `header` padded with spaces to a multiple of 8 bytes (the N bytes that
// follow the length prefix). `header` must come from PlanHeader.
absl::StatusOr<std::string> SerializeHeader(const Header& header);

// Receives a tensor's bytes, in order, in as many pieces as the source likes.
using ByteSink = std::function<absl::Status(const void* data, size_t size_bytes)>;
// Produces the bytes of `entry` (exactly entry.size_bytes() of them) by calling `sink`.
// Called once per tensor, in file order (PlanHeader's order). Errors are passed through.
using TensorSource = std::function<absl::Status(const TensorEntry& entry, const ByteSink& sink)>;

// Writes a safetensors file at `path` crash-safely (common/file_util AtomicFileWriter: temporary
// name, fsync, rename, directory fsync; nothing at `path` unless the whole file was written),
// streaming each tensor's bytes from `source`. Memory: the header plus a 1 MiB write buffer.
// Returns the file size in bytes. Errors: those of PlanHeader; INTERNAL if `source` produces more
// or fewer bytes than a tensor needs; I/O errors of the file writer; any error of `source`.
// Thread-compatible (distinct paths may be written concurrently; AtomicFileWriter names its
// temporary file after the process id, so one process must not write the same path twice at once).
absl::StatusOr<int64_t> WriteFile(const std::string& path, std::vector<TensorSpec> specs,
                                  const TensorSource& source, const WriterOptions& options = {});

// In-memory convenience: `bytes` must hold exactly the tensor's bytes.
struct TensorData {
  TensorSpec spec;
  std::string bytes;
};
absl::StatusOr<int64_t> WriteFile(const std::string& path, const std::vector<TensorData>& tensors,
                                  const WriterOptions& options = {});

// ---------------------------------------------------------------------------------------------
// Reader

// Parses and validates a header JSON (the N bytes after the length prefix) against a data buffer
// of `data_bytes_available` bytes. `file` only names the file in errors. Error codes as above.
absl::StatusOr<Header> ParseHeader(absl::string_view json, int64_t data_bytes_available,
                                   absl::string_view file);

// An open, validated safetensors file. Only the header is held in memory; tensor bytes are read
// on demand with pread. Thread-safe (all methods are const after Open).
class Reader {
 public:
  // Opens and validates `path`. NOT_FOUND if absent; DATA_LOSS / INVALID_ARGUMENT as above.
  static absl::StatusOr<std::unique_ptr<Reader>> Open(const std::string& path);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const std::string& path() const { return path_; }
  const Header& header() const { return header_; }
  // Tensors in data-offset order.
  const std::vector<TensorEntry>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  // N, the JSON header length; the data buffer starts at byte 8 + N.
  int64_t header_bytes() const { return header_bytes_; }
  int64_t file_bytes() const { return file_bytes_; }

  // The entry called `name`, or nullptr.
  const TensorEntry* Find(absl::string_view name) const;

  // All bytes of tensor `name`. NOT_FOUND if absent; DATA_LOSS on a short read.
  absl::StatusOr<std::string> ReadTensor(absl::string_view name) const;

  // `size_bytes` bytes of `entry` starting `offset` bytes into the tensor, into `dst`.
  // INVALID_ARGUMENT if the range is outside the tensor; DATA_LOSS on a short read.
  absl::Status ReadTensorRange(const TensorEntry& entry, int64_t offset, void* dst,
                               size_t size_bytes) const;

 private:
  Reader() = default;
  std::string path_;
  int fd_ = -1;
  int64_t header_bytes_ = 0;
  int64_t file_bytes_ = 0;
  Header header_;
  std::map<std::string, size_t, std::less<>> index_;
};

}  // namespace loom::safetensors

#endif  // LOOM_STORAGE_SAFETENSORS_SAFETENSORS_H_
