// The on-disk layout of one rank's ZeRO checkpoint shard, shared by the trainer (writer) and
// the checkpoint service (reader, consolidation). No LibTorch here: tensors are raw fp32 bytes.
// Every ZeRO stage (0-3) writes this same per-parameter partition layout (stage 0/1/2 ranks write
// their slice of the fp32 master and Adam state); `zero_stage` records the stage that wrote it.
//
// Layout of a checkpoint of step S with world size N under a job's checkpoint directory:
//
//   <checkpoint_dir>/step_<S, 8 digits>/rank_<r>.shard          raw little-endian fp32 sections
//   <checkpoint_dir>/step_<S, 8 digits>/rank_<r>.manifest.json  ShardManifest as JSON
//
// The shard file is the concatenation of `sections` (e.g. "fp32_params", "exp_avg",
// "exp_avg_sq"), each `section_numel` fp32 elements long. Inside every section, parameter i
// occupies elements [params[i].partition_offset, + params[i].partition_numel): rank r's ZeRO-3
// partition of the flattened parameter, i.e. flat elements [r*p, min((r+1)*p, n)) with
// p = ceil(n/N), zero-padded to p (DeepSpeed partition_parameters.py; docs/design/TECHNIQUES.md
// §1.3).
//
// Both files are written to a temporary name, fsynced and renamed; the manifest is written last,
// so its presence means the rank has reported. A checkpoint is committed when all N manifests are
// present and every shard's size and CRC-32 match its manifest.
#ifndef LOOM_STORAGE_CHECKPOINT_SHARD_FORMAT_H_
#define LOOM_STORAGE_CHECKPOINT_SHARD_FORMAT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/file_util.h"

namespace loom::storage {

inline constexpr char kShardFormatVersion[] = "loom-zero3-shard/v1";
// Largest world size a manifest may claim, and largest manifest file read; anything beyond is
// garbage, not a checkpoint (and must not make readers allocate per claimed rank).
inline constexpr int32_t kMaxManifestWorldSize = 1 << 20;
inline constexpr int64_t kMaxManifestBytes = 64 << 20;

struct ShardParam {
  // Hugging Face tensor name, e.g. "model.layers.0.self_attn.q_proj.weight".
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;            // product of shape
  int64_t partition_numel = 0;  // p = ceil(numel / world_size)
  int64_t partition_offset = 0; // element offset of this partition inside every section
};

// A file of one rank's technique state that lives next to its shard (e.g. ZenFlow's
// zenflow_rank<r>.bin, worker/engine/zenflow_setup.h), written and fsynced before the shard, so
// the manifest (written last) can vouch for it: its size and CRC-32 are checked with the shard's
// (VerifyCheckpointDir), so a corrupt or swapped side file makes the step corrupt and recovery
// falls back to an older one. `name` is a plain file name inside the step directory. A side
// file must not end with its own CRC-32: the CRC-32 of such a file is the same constant (CRC-32's
// residue, 0x2144df1c) whatever its content, so its whole-file checksum would catch nothing.
struct SideFile {
  std::string name;
  int64_t bytes = 0;
  uint32_t crc32 = 0;
  bool operator==(const SideFile& o) const {
    return name == o.name && bytes == o.bytes && crc32 == o.crc32;
  }
};

struct ShardManifest {
  std::string format = kShardFormatVersion;
  int64_t step = 0;
  int32_t rank = 0;
  int32_t world_size = 1;
  int32_t zero_stage = 3;  // the writer's stage; the layout is the same for 0-3
  // Hugging Face config.json of the model, as a JSON object text.
  std::string model_config_json = "{}";
  // Tokenizer used ("byte" or a path to a SentencePiece model copied next to the shards).
  std::string tokenizer = "byte";
  // Optimizer step counter (for bias correction on resume) and name ("adam" / "adamw").
  int64_t optimizer_step = 0;
  std::string optimizer = "adamw";
  // Training metrics at this step (e.g. "train_loss", "eval_loss"; lower is better), the same on
  // every rank. Optional in the JSON ("metrics" object of finite numbers); used by retention.
  std::map<std::string, double> metrics;
  std::vector<ShardParam> params;
  std::vector<std::string> sections = {"fp32_params"};
  int64_t section_numel = 0;
  // Filled by WriteShard: bytes of the shard file and its CRC-32 (zlib polynomial).
  int64_t shard_bytes = 0;
  uint32_t shard_crc32 = 0;
  // This rank's side files (JSON "side_files", absent when empty, so manifests without one are
  // byte-for-byte what they were before side files existed).
  std::vector<SideFile> side_files;
};

// "step_00000100".
std::string StepDirName(int64_t step);
// The step of a directory name StepDirName produces exactly ("step_00000100" -> 100); nullopt for
// any other name ("step_100", "step_-1", "hf").
std::optional<int64_t> ParseStepDirName(absl::string_view name);
std::string ShardFileName(int32_t rank);     // "rank_<r>.shard"
std::string ManifestFileName(int32_t rank);  // "rank_<r>.manifest.json"

// ceil(numel / world_size): DeepSpeed's stage-3 partition size.
int64_t PartitionNumel(int64_t numel, int32_t world_size);

// Fills partition_numel / partition_offset of every param and section_numel for `world_size`.
void AssignPartitionLayout(ShardManifest& manifest);

std::string ManifestToJson(const ShardManifest& manifest);
// INVALID_ARGUMENT naming the field on malformed or inconsistent manifests: missing fields, wrong
// types, integers that are not exact integers in range, world_size outside
// [1, kMaxManifestWorldSize], negative dims, and sizes (numel, section bytes) that overflow int64.
absl::StatusOr<ShardManifest> ManifestFromJson(const std::string& json);

// Writes rank_<r>.shard (sections in order, each section_numel floats) then the manifest into
// `step_dir` (created if needed), each atomically (WriteShardPieces, one piece per section). `section_data[i]` must hold section_numel
// floats for manifest.sections[i]. INVALID_ARGUMENT on a count mismatch.
absl::Status WriteShard(const std::string& step_dir, ShardManifest manifest,
                        absl::Span<const float* const> section_data);

// Opens rank manifest.rank's shard in `step_dir` for reading and checks it is a regular file of
// manifest.shard_bytes bytes. Never blocks on a FIFO planted as a shard (O_NONBLOCK). DATA_LOSS
// naming the file and rank when it is missing, not a regular file or of another size.
absl::StatusOr<ScopedFd> OpenShardFile(const std::string& step_dir, const ShardManifest& manifest);
// Side files (SideFile above). OpenSideFile: step_dir/want.name opened for reading, its size
// checked; DATA_LOSS naming the file and rank when it is missing, not a regular file, or of
// another size. CheckSideFileData: DATA_LOSS naming `path` and rank unless `data` has want's size
// and CRC-32 (for a reader that holds the whole file, e.g. the trainer loading ZenFlow state).
absl::StatusOr<ScopedFd> OpenSideFile(const std::string& step_dir, int32_t rank,
                                      const SideFile& want);
absl::Status CheckSideFileData(const std::string& path, int32_t rank, const SideFile& want,
                               absl::string_view data);

// Streaming shard I/O, for writers and readers that must not hold a whole shard (12 bytes per
// partition element for Adam) in memory. Every section is cut into the same pieces:
// [0, piece_ends[0]), [piece_ends[0], piece_ends[1]), ... (ascending, the last equal to
// manifest.section_numel); memory is one buffer of the largest piece.
//   produce(section, piece, offset, count, dst): fill dst with `count` floats of `section`
//   starting at element `offset`.
//   consume(section, piece, offset, count, src): take them.
// Pieces are visited section by section, in order (the file's order), so a caller whose pieces
// involve collectives issues the same sequence on every rank.
using ShardPieceProducer = std::function<absl::Status(size_t section, size_t piece,
                                                      int64_t offset, int64_t count, float* dst)>;
using ShardPieceConsumer = std::function<absl::Status(
    size_t section, size_t piece, int64_t offset, int64_t count, const float* src)>;

// As WriteShard, with the sections' contents from `produce`. INVALID_ARGUMENT for bad
// piece_ends; a producer error is returned as it is (nothing is committed).
absl::Status WriteShardPieces(const std::string& step_dir, ShardManifest manifest,
                              absl::Span<const int64_t> piece_ends,
                              const ShardPieceProducer& produce);

// Checks the shard's size and CRC-32 against the manifest in a first streaming pass (DATA_LOSS
// naming the file and rank, before anything is consumed), then hands it to `consume` piece by
// piece. DATA_LOSS if the file's CRC differs in that second pass (changed while read).
absl::Status ReadShardPieces(const std::string& step_dir, const ShardManifest& manifest,
                             absl::Span<const int64_t> piece_ends,
                             const ShardPieceConsumer& consume);

// Reads and validates the manifest of `rank` in `step_dir`. NOT_FOUND if the rank has not reported;
// FAILED_PRECONDITION if the manifest is not a regular file (a FIFO, /dev/zero) or is larger
// than kMaxManifestBytes; DATA_LOSS naming the file if it does not parse (ManifestFromJson) or
// names another rank.
absl::StatusOr<ShardManifest> ReadManifest(const std::string& step_dir, int32_t rank);

// Reads the whole shard of `rank` and checks its size and CRC-32 against the manifest
// (ReadShardPieces with one piece per section). DATA_LOSS naming the file and rank on mismatch.
// Returns the raw floats of every section. For tests and tools: it holds the whole shard.
absl::StatusOr<std::vector<float>> ReadShardVerified(const std::string& step_dir,
                                                     const ShardManifest& manifest);

// Element offset of `section` (by name) inside the shard; NOT_FOUND if absent.
absl::StatusOr<int64_t> SectionOffset(const ShardManifest& manifest, const std::string& section);

// CRC-32 of a byte range, the same value as zlib's crc32 (CRC-32/ISO-HDLC, the shard format's
// checksum; zlib's crc32_combine combines it), chainable: crc = Crc32(crc, data, n); Crc32(0,
// nullptr, 0) == 0. Computed with ISA-L's crc32_gzip_refl (PCLMULQDQ). Thread-safe.
uint32_t Crc32(uint32_t crc, const void* data, size_t size_bytes);

}  // namespace loom::storage

#endif  // LOOM_STORAGE_CHECKPOINT_SHARD_FORMAT_H_
