// The identity of a job's data set, recorded with the job at its first start and checked at
// every later start (issue 42, defect 5): a restart must train on the corpus the job's
// checkpoints were trained on, or refuse with a dataset error (data/dataset_error.h) naming the
// file and what changed, instead of resuming the trajectory on other data.
//
// Recorded as <checkpoint dir>/dataset.identity.json (kDatasetIdentityFile), beside the job's
// tokenizer.model, written atomically by rank 0 when absent:
//   {"version": 1, "hash": "sha256", "dataset": {"path": P, "format": F},
//    "files": [{"field": "dataset.path", "path": "/data/x.txt", "size_bytes": 542789,
//               "mtime_ns": 1764927600123456789, "sha256": "<64 hex digits>"}, ...]}
// `files` lists every file LoadCorpus reads (CorpusFiles: load order) and then
// dataset.tokenizer_model when one is given (it is re-read at every start too).
//
// What counts as a change: a file added or removed, its size, or its SHA-256. A modification
// time that alone changed (the file was copied again, or touched) is reported as a warning and
// the job continues: the bytes, which are what training reads, are the recorded ones.
//
// Hash cost (why the whole file): SHA-256 through OpenSSL's libcrypto (already linked for
// bearer tokens; SHA-NI on these hosts: `openssl speed` 1.5 GB/s per core) costs a start about
// 0.75-1.2 s per GiB of corpus per rank (//data:dataset_identity_bench, page cache warm, this 2-core
// host: 542,789 bytes in 0.5-3 ms, 1 GiB in 0.79 s idle and 1.3 s under a build), the ranks of
// a node in parallel. For text and JSONL that is less than the load itself (which reads, splits
// and tokenises every byte). For flat token files, which are otherwise only memory-mapped, it is
// one sequential read of the corpus at start. Size and modification time alone would be free but are fooled by an
// in-place rewrite of the same length or a copy that keeps mtimes (cp -p, rsync -t); hashing
// sampled blocks misses a change between the samples. A start is rare next to the training it
// resumes, so the exact check is worth its cost.
//
// Thread-safety: plain functions over values; the files are only read, except the manifest,
// which CheckOrRecordDatasetIdentity writes when `write` is set (one rank per job does).
#ifndef LOOM_DATA_DATASET_IDENTITY_H_
#define LOOM_DATA_DATASET_IDENTITY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "data/corpus.h"

namespace loom::data {

inline constexpr char kDatasetIdentityFile[] = "dataset.identity.json";

struct DatasetFileIdentity {
  std::string field;       // the spec field that names it: "dataset.path" or
                           // "dataset.tokenizer_model"
  std::string path;        // as read ("<dataset.path>/<name>" for a directory's files)
  int64_t size_bytes = 0;
  int64_t mtime_ns = 0;    // st_mtim, nanoseconds since the Unix epoch
  std::string sha256;      // SHA-256 of the whole file, 64 lowercase hex digits
};

struct DatasetIdentity {
  std::string path;    // dataset.path as the spec gives it
  std::string format;  // dataset.format as the spec gives it ("" is text)
  std::vector<DatasetFileIdentity> files;
  int64_t total_bytes() const;
};

// Stats and hashes the files of `options` (see above). Reads each file once, sequentially, in
// 1 MiB pieces. Errors: CorpusFiles's (NOT_FOUND naming dataset.path, ...); NOT_FOUND
// "dataset.tokenizer_model: <path> does not exist"; FAILED_PRECONDITION for a file that is not a
// regular file; ErrnoError for I/O; INTERNAL if a file's size changed while it was hashed.
absl::StatusOr<DatasetIdentity> ComputeDatasetIdentity(const CorpusOptions& options);

// SHA-256 of the whole file at `path`, as 64 lowercase hex digits; `size_bytes` (optional) gets
// the bytes hashed. Errors as ComputeDatasetIdentity's.
absl::StatusOr<std::string> Sha256OfFile(const std::string& path, int64_t* size_bytes = nullptr);

// The manifest's JSON text (format above), and back. DatasetIdentityFromJson: INVALID_ARGUMENT
// "<source>: ..." for text that is not such a manifest (or another version).
std::string DatasetIdentityToJson(const DatasetIdentity& identity);
absl::StatusOr<DatasetIdentity> DatasetIdentityFromJson(absl::string_view text,
                                                        const std::string& source);

// OK when `current` has the files of `recorded`, with the same sizes and SHA-256 digests; then
// `notes` (optional) gets one line per file whose modification time alone changed. Otherwise a
// dataset error (DatasetError) listing the first three changes, each naming the field and the
// file: "dataset.path: /data/x.txt changed since the job first started: size 542789 -> 414383
// bytes, sha256 0a1b2c3d4e5f6a7b.. -> 99aa00bb11cc22dd.., modified <RFC 3339> -> <RFC 3339>",
// "... was removed ...", "... was added ...", then where the identity is recorded
// (`manifest_path`) and what the user can do.
absl::Status CompareDatasetIdentity(const DatasetIdentity& recorded,
                                    const DatasetIdentity& current,
                                    const std::string& manifest_path,
                                    std::vector<std::string>* notes = nullptr);

struct DatasetIdentityCheck {
  DatasetIdentity identity;           // the data as found now
  bool recorded = false;              // no manifest was there and this call wrote it
  bool verified = false;              // a manifest was there and the data matched it
  std::vector<std::string> warnings;  // for the job's events: mtime-only changes, and a resumed
                                      // job whose checkpoints predate the manifest
  absl::Duration elapsed;             // time spent listing, reading and hashing
};

// The check at a start of the job whose checkpoint directory is `record_dir` (non-empty).
// If <record_dir>/dataset.identity.json exists, computes the identity and compares (above);
// otherwise, with `write`, computes it and records it there (without `write`: does nothing and
// returns an empty identity) (MakeDirs, then WriteFileAtomically): a first start,
// or a job whose checkpoints were written before identities were recorded (then, when
// `resuming`, a warning says so; they stay resumable). Errors: a dataset error when the data
// changed, when the data set recorded can no longer be listed (removed, emptied), or when the
// manifest cannot be parsed (naming it: delete it to record the data as it is now); otherwise
// ComputeDatasetIdentity's (I/O, which a retry may cure) and the write's.
absl::StatusOr<DatasetIdentityCheck> CheckOrRecordDatasetIdentity(const CorpusOptions& options,
                                                                  const std::string& record_dir,
                                                                  bool write, bool resuming);

}  // namespace loom::data

#endif  // LOOM_DATA_DATASET_IDENTITY_H_
