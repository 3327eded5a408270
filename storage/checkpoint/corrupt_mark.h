// Marks on checkpoint step directories that failed verification (CRC-32 or size mismatch found
// after they were committed), so that listings, resume selection and consolidation of the newest
// committed step skip them. No LibTorch, no gRPC.
//
// The mark is <step dir>/corrupt.json:
//   {"reason": "<the verification error>", "marked_unix_s": T,
//    "files": {"rank_0.shard": {"ino": I, "size": S, "mtime_ns": M}, ...}}
// holding the identity (inode, size, mtime) of every rank shard and manifest of the step when it
// was marked. A mark is in force only while all of those files are unchanged: a rank that writes
// the step again (an attempt resumed from an earlier step passes it again) replaces its files by
// rename, which changes their inode, and so lifts the mark without anyone deleting it.
// Thread-compatible; several processes may mark the same step (the last write wins, atomically).
#ifndef LOOM_STORAGE_CHECKPOINT_CORRUPT_MARK_H_
#define LOOM_STORAGE_CHECKPOINT_CORRUPT_MARK_H_

#include <optional>
#include <string>

#include "absl/status/status.h"

namespace loom::storage {

inline constexpr char kCorruptMarkFile[] = "corrupt.json";

// Writes the mark into `step_dir` (atomically: temporary file + rename) with `reason`.
// NOT_FOUND if `step_dir` does not exist; other I/O errors as returned by the file system.
absl::Status MarkCheckpointCorrupt(const std::string& step_dir, const std::string& reason);

// The reason of a mark in force on `step_dir`, or nullopt if there is none, it is unreadable, or
// a file it covers changed since (a stale mark). Never fails.
std::optional<std::string> CorruptMarkReason(const std::string& step_dir);

}  // namespace loom::storage

#endif  // LOOM_STORAGE_CHECKPOINT_CORRUPT_MARK_H_
