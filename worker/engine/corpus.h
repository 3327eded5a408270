// Training corpus for language-model jobs: raw text documents, a byte-level tokenizer
// (tokens 0..255), a deterministic train/held-out split and deterministic sample windows.
// Torch-free.
//
// Determinism contract (what makes an N-rank ZeRO-3 run equal a 1-rank run): every sample is
// a window of `window` tokens whose start depends only on (seed, step, micro_step, global
// sample index) — never on the world size or rank. Rank r of N reads global samples
// [r*micro, (r+1)*micro) of each micro-step.
#ifndef LOOM_WORKER_ENGINE_CORPUS_H_
#define LOOM_WORKER_ENGINE_CORPUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::engine {

inline constexpr char kFortunesPath[] = "/usr/share/games/fortunes";

struct CorpusOptions {
  // A directory (every regular, non-symlink file not ending in .dat or .u8, in name order) or a
  // single text file.
  std::string path = kFortunesPath;
  // Fraction of documents held out for evaluation, in (0, 0.5].
  double holdout_fraction = 0.05;
};

struct Corpus {
  std::vector<uint8_t> train;    // byte tokens of the training documents, concatenated
  std::vector<uint8_t> heldout;  // byte tokens of the held-out documents, concatenated
  int64_t train_documents = 0;
  int64_t heldout_documents = 0;
};

// Splits text into records separated by lines containing only "%" (fortune format). Empty
// records are dropped. Each record keeps its trailing newline.
std::vector<std::string> SplitFortuneRecords(absl::string_view text);

// Loads the documents: fortune records; a single file without "%" separators is split into
// blank-line-separated paragraphs. Document i goes to held-out iff
// Mix64(i ^ 0x6c6f6f6d) / 2^64 < holdout_fraction (a fixed split, independent of the seed).
// Errors: NOT_FOUND (path), INVALID_ARGUMENT "dataset.holdout_fraction: ..." or
// FAILED_PRECONDITION when a side ends up empty.
absl::StatusOr<Corpus> LoadCorpus(const CorpusOptions& options);

// splitmix64 finaliser: a well-mixed 64-bit hash.
uint64_t Mix64(uint64_t x);

// Start of training sample `sample` (global index within the micro-step) of optimizer step
// `step` (0-based) and micro-step `micro_step`: uniform in [0, stream_len - window].
// Requires stream_len >= window.
int64_t TrainWindowStart(uint64_t seed, int64_t step, int64_t micro_step, int64_t sample,
                         int64_t stream_len, int64_t window);

// Start of held-out window k of `count` evenly spaced windows: k * (stream_len - window) /
// max(1, count - 1). Requires stream_len >= window.
int64_t EvalWindowStart(int64_t k, int64_t count, int64_t stream_len, int64_t window);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_CORPUS_H_
