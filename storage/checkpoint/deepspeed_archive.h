// The zip archive that PyTorch's torch.save writes (zip-based serialisation since PyTorch 1.6):
// records "<archive>/data.pkl" (the pickled object), "<archive>/data/<key>" (one per storage, raw
// little-endian bytes, stored without compression) and "<archive>/version". This reader lists the
// records through zlib's minizip (Debian libminizip-dev: central directory, zip64) and hands out
// each stored record's byte offset in the file, so a storage of several GB is read with pread in
// bounded pieces and never loaded whole (as caffe2::serialize::PyTorchStreamReader::
// getRecordOffset would give; see deepspeed_pickle.h for why LibTorch is not linked here).
//
// Memory: the record names and offsets. Thread-safe after Open (ReadAt is pread on one fd).
// Errors name the archive's path:
//   NOT_FOUND         the file does not exist.
//   DATA_LOSS         not a complete zip archive (no central directory: truncated), or a record
//                     whose bytes extend past the end of the file, or a short read.
//   INVALID_ARGUMENT  a compressed record (PyTorch stores every record), or no "*/data.pkl".
#ifndef LOOM_STORAGE_CHECKPOINT_DEEPSPEED_ARCHIVE_H_
#define LOOM_STORAGE_CHECKPOINT_DEEPSPEED_ARCHIVE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::storage::deepspeed {

struct ArchiveRecord {
  int64_t offset = 0;  // byte offset of the record's data in the file
  int64_t size = 0;    // bytes
};

class TorchArchive {
 public:
  static absl::StatusOr<std::unique_ptr<TorchArchive>> Open(const std::string& path);
  ~TorchArchive();
  TorchArchive(const TorchArchive&) = delete;
  TorchArchive& operator=(const TorchArchive&) = delete;

  const std::string& path() const { return path_; }
  int64_t file_bytes() const { return file_bytes_; }
  // The archive's directory prefix ("zero_pp_rank_0_mp_rank_00_optim_states").
  const std::string& prefix() const { return prefix_; }
  // "<prefix>/<name>", or nullptr.
  const ArchiveRecord* Find(absl::string_view name) const;
  // The whole data.pkl record, at most `max_bytes` (INVALID_ARGUMENT if larger).
  absl::StatusOr<std::string> ReadPickle(int64_t max_bytes) const;
  // `size` bytes at `offset` into the file. DATA_LOSS naming the file on a short read.
  absl::Status ReadAt(int64_t offset, void* dst, size_t size) const;

 private:
  TorchArchive() = default;
  std::string path_;
  std::string prefix_;
  int fd_ = -1;
  int64_t file_bytes_ = 0;
  std::map<std::string, ArchiveRecord, std::less<>> records_;  // name without the prefix
};

}  // namespace loom::storage::deepspeed

#endif  // LOOM_STORAGE_CHECKPOINT_DEEPSPEED_ARCHIVE_H_
