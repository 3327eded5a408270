// Training corpus for language-model jobs: documents from a text directory/file or JSON Lines,
// tokenised by the byte tokenizer (tokens 0..255) or SentencePiece (data/tokenizer.h), or
// pre-tokenized flat token files (data/token_file.h, memory-mapped); a deterministic
// train/held-out split and deterministic sample windows. Torch-free.
//
// Determinism contract (what makes an N-rank ZeRO-3 run equal a 1-rank run): every sample is
// a window of `window` tokens whose start depends only on (seed, step, micro_step, global
// sample index) — never on the world size or rank. Rank r of N reads global samples
// [r*micro, (r+1)*micro) of each micro-step.
#ifndef LOOM_DATA_CORPUS_H_
#define LOOM_DATA_CORPUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/token_stream.h"
#include "data/tokenizer.h"

namespace loom::data {

inline constexpr char kFortunesPath[] = "/usr/share/games/fortunes";

struct CorpusOptions {
  // format "text": a directory (every regular, non-symlink file not ending in .dat or .u8, in
  // name order) or a single text file. "jsonl": a .jsonl file or a directory of them.
  // "tokens": a flat token file or a directory of .bin token files.
  std::string path = kFortunesPath;
  std::string format = "text";        // dataset.format: text | jsonl | tokens
  std::string text_field = "text";    // dataset.text_field (jsonl)
  std::string token_dtype = "uint16"; // dataset.token_dtype (tokens): uint16 | uint32
  // Fraction of documents (tokens: of tokens, cut at a document end) held out for evaluation,
  // in (0, 0.5].
  double holdout_fraction = 0.05;
  TokenizerOptions tokenizer;         // dataset.tokenizer, tokenizer_model, vocab_size, model_type
  // From model.config (0 / -1: not checked): every token id must be < vocab_size, and a
  // SentencePiece tokenizer's bos/eos ids must equal bos_token_id/eos_token_id. eos_token_id
  // also separates documents in token files.
  int64_t vocab_size = 0;
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  int64_t model_max_length = 0;       // max_position_embeddings, for tokenizer_config.json
  // Run-time: where a SentencePiece tokenizer is recorded (the job's checkpoint directory;
  // empty: not recorded), and this rank's share of a token file to validate.
  std::string record_dir;
  int rank = 0;
  int world_size = 1;
};

struct Corpus {
  TokenStream train;    // tokens of the training documents, concatenated
  TokenStream heldout;  // tokens of the held-out documents, concatenated
  // Documents per side (0 for token files, whose documents are not counted).
  int64_t train_documents = 0;
  int64_t heldout_documents = 0;
  std::shared_ptr<const Tokenizer> tokenizer;  // byte, or the job's SentencePiece model
  // Where documents start, for packed samples (dataset.pack_documents): text and jsonl record
  // the stream offset of every document's first token, ascending; token files record none and
  // mark each document's end by end_of_document_id (model.config.eos_token_id; -1 otherwise).
  std::vector<int64_t> train_document_starts;
  std::vector<int64_t> heldout_document_starts;
  int64_t end_of_document_id = -1;
};

// The documents of one side of a corpus, as PackedPositions reads them.
struct DocumentBoundaries {
  const std::vector<int64_t>* starts = nullptr;  // ascending document starts, or empty / null
  int64_t end_of_document_id = -1;               // used when `starts` is empty or null
};
DocumentBoundaries TrainBoundaries(const Corpus& c);
DocumentBoundaries HeldOutBoundaries(const Corpus& c);

// Position ids of tokens [start, start + n) of `stream` in a packed sample (Megatron-LM's
// --reset-position-ids): 0 at the window's first token and at every document start inside the
// window, the previous token's + 1 otherwise. A document starts at each offset in
// `b.starts`, or, when there are none, right after each b.end_of_document_id token (token
// files). Requires 0 <= start and n >= 0. Thread-safe (pure).
std::vector<int64_t> PackedPositions(const TokenStream& stream, const DocumentBoundaries& b,
                                     int64_t start, int64_t n);

// Splits text into records separated by lines containing only "%" (fortune format). Empty
// records are dropped. Each record keeps its trailing newline.
std::vector<std::string> SplitFortuneRecords(absl::string_view text);

// Loads the data set. Text: fortune records; a single file without "%" separators is split into
// blank-line-separated paragraphs. JSONL: one document per line. Document i goes to held-out iff
// Mix64(i ^ 0x6c6f6f6d) / 2^64 < holdout_fraction (a fixed split, independent of the seed).
// With SentencePiece every document is followed by the EOS id; the tokenizer is trained on the
// training documents only (PrepareTokenizer). Token files: see TokenHoldoutCut; rank r of N
// checks ids [r*n/N, (r+1)*n/N) of the n tokens (together the ranks check every token, and none
// reads the whole file).
// Errors (each naming the field and the file, with the byte offset or line where there is
// one): NOT_FOUND (path), INVALID_ARGUMENT "dataset.holdout_fraction: ...", invalid UTF-8
// (SentencePiece, JSONL) or JSON, a missing text field, a token id >= vocab_size, a token file
// size that is not a multiple of the token width, "model.config.vocab_size/bos_token_id/
// eos_token_id" disagreeing with the tokenizer; a dataset error (data/dataset_error.h) when a
// side of the split ends up empty.
absl::StatusOr<Corpus> LoadCorpus(const CorpusOptions& options);

// The files LoadCorpus reads for `options.path` and `options.format`, in the order it reads them
// (the single file, or the directory's files in name order: text skips *.dat and *.u8, jsonl
// takes *.jsonl, tokens *.bin; symbolic links and other non-regular entries are skipped).
// Errors as LoadCorpus's: NOT_FOUND naming dataset.path, FAILED_PRECONDITION for a directory
// without files of the format, INVALID_ARGUMENT for an unknown format.
absl::StatusOr<std::vector<std::string>> CorpusFiles(const CorpusOptions& options);

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

}  // namespace loom::data

#endif  // LOOM_DATA_CORPUS_H_
