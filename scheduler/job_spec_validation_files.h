// File: scheduler/job_spec_validation_files.h
//
// Admission checks that read the files a spec names: the dataset (is it text the trainer can
// split?) and the fine-tuning export (do its tensor shapes match model.config?). Each reads as
// little as the answer needs and is independent of who may name which path (tenancy confinement
// is a separate check that callers run alongside these).
#ifndef LOOM_SCHEDULER_JOB_SPEC_VALIDATION_FILES_H_
#define LOOM_SCHEDULER_JOB_SPEC_VALIDATION_FILES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "spec/model_config.h"

namespace loom {

struct DatasetFileCheckOptions {
  // Bytes at the start of every corpus file checked for NUL bytes and invalid UTF-8.
  int64_t sniff_bytes = 64 * 1024;
  // Corpora whose files total at most this many bytes are also split exactly as the trainer
  // splits them (engine::LoadCorpus), so an empty train or held-out side, or a side shorter than
  // one training window, is refused at submission. Larger corpora are only sniffed.
  int64_t max_split_check_bytes = 16 << 20;
};

// `path` as the trainer reads it (data/corpus.h): one regular text file, or a directory
// whose corpus files are its regular, non-symlink entries not ending in .dat or .u8. Checks:
//   * path exists and is a regular file or a directory (not a FIFO or device);
//   * a directory holds at least one corpus file;
//   * every corpus file is readable, and its first sniff_bytes bytes hold no NUL byte and are
//     valid UTF-8 ("dataset.path: '/bin/ls' is not text: NUL byte at offset 7");
//   * for a corpus up to max_split_check_bytes: the train/held-out split with
//     `holdout_fraction` (0 = the trainer's default, 0.05) leaves both sides non-empty and each
//     at least `window_tokens` (= training.sequence_length + 1) byte tokens long.
// Errors: INVALID_ARGUMENT whose message starts with "dataset.path" (or
// "training.sequence_length" for a corpus shorter than one window) and names the file.
// Reads the file system; thread-safe.
absl::Status ValidateDatasetFiles(const std::string& path, double holdout_fraction,
                                  int64_t window_tokens,
                                  const DatasetFileCheckOptions& options = {});

// `dir` as HfWeights reads it for model.init_from: model.safetensors, or the shards named by
// model.safetensors.index.json. Reads only the safetensors headers and compares them with
// spec::LlamaParamSpecs(config): every tensor the config implies must be present with that
// shape and dtype F32 or BF16, and no other model.layers.N tensor may be present (a deeper
// export than the config). "lm_head.weight" alongside tied embeddings and rotary inv_freq
// buffers are ignored, as the trainer ignores them.
// Errors: INVALID_ARGUMENT starting "model.init_from" naming the tensor (or the malformed
// file). Reads the file system; thread-safe.
absl::Status ValidateInitFromShapes(const std::string& dir, const spec::LlamaConfig& config);

}  // namespace loom

#endif  // LOOM_SCHEDULER_JOB_SPEC_VALIDATION_FILES_H_
