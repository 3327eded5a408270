// Tokenizers for language-model jobs: the byte tokenizer (ids 0..255, no special tokens; the
// default) and SentencePiece (Kudo & Richardson 2018, https://arxiv.org/abs/1808.06226) through
// Debian's libsentencepiece: a given tokenizer.model, or one trained on the job's corpus (BPE or
// unigram) before training starts and recorded beside the job's checkpoints so that a restart
// reuses it. Torch-free. SentencePiece runs in libloom_sentencepiece.so, loaded at first use
// (sentencepiece_shim.h says why); a binary that uses it needs that library in its runfiles
// (a data dependency of :tokenizer), beside it, or at $LOOM_SENTENCEPIECE_LIB.
//
// Thread-safety: a Tokenizer is immutable after construction; Encode is safe from any thread.
#ifndef LOOM_DATA_TOKENIZER_H_
#define LOOM_DATA_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::data {

namespace spm {
struct SpModel;
struct SpApi;
}

// The job spec's dataset.tokenizer fields (proto/common.proto DatasetSpec).
struct TokenizerOptions {
  std::string kind = "byte";      // "byte" or "sentencepiece"
  std::string model_path;         // sentencepiece: a tokenizer.model to use as is; empty: train
  int64_t vocab_size = 0;         // sentencepiece training: pieces in the trained model
  std::string model_type = "bpe"; // sentencepiece training: "bpe" or "unigram"
};

// File names of the recorded tokenizer, in the job's checkpoint directory and in an export
// directory (as in a Hugging Face Llama repository).
inline constexpr char kTokenizerModelFile[] = "tokenizer.model";
inline constexpr char kTokenizerConfigFile[] = "tokenizer_config.json";

class Tokenizer {
 public:
  // ids 0..255 are the bytes; no bos/eos/pad/unk.
  static std::shared_ptr<const Tokenizer> Byte();
  // A serialized SentencePiece ModelProto (the bytes of tokenizer.model). `source` names it in
  // errors. INVALID_ARGUMENT "<source>: not a SentencePiece model: ..." if it does not parse.
  static absl::StatusOr<std::shared_ptr<const Tokenizer>> FromSentencePiece(
      std::string serialized, absl::string_view source);

  bool is_byte() const { return model_ == nullptr; }
  int64_t vocab_size() const { return vocab_size_; }
  // Special token ids; -1 when the tokenizer has none (the byte tokenizer has none).
  int64_t bos_id() const { return bos_id_; }
  int64_t eos_id() const { return eos_id_; }
  int64_t pad_id() const { return pad_id_; }
  int64_t unk_id() const { return unk_id_; }

  // Token ids of UTF-8 `text` (for the byte tokenizer: its bytes, any text). No bos/eos added.
  // `where` ("file.txt", "data.jsonl:12") names the text in errors. SentencePiece requires valid
  // UTF-8: INVALID_ARGUMENT "<where>: invalid UTF-8 at byte offset N" otherwise.
  absl::Status Encode(absl::string_view text, absl::string_view where,
                      std::vector<int32_t>* out) const;
  // Text of `ids` (SentencePiece: its decoder; byte: the bytes). For tests and tools.
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const;

  // The serialized model (empty for the byte tokenizer).
  const std::string& serialized_model() const { return serialized_; }
  // A Hugging Face tokenizer_config.json for a Llama repository (LlamaTokenizer, the special
  // tokens as pieces and ids, model_max_length).
  std::string TokenizerConfigJson(int64_t model_max_length) const;

 private:
  Tokenizer() = default;
  const spm::SpApi* api_ = nullptr;  // libloom_sentencepiece.so (sentencepiece_shim.h)
  std::shared_ptr<const spm::SpModel> model_;
  std::string serialized_;
  int64_t vocab_size_ = 256;
  int64_t bos_id_ = -1, eos_id_ = -1, pad_id_ = -1, unk_id_ = -1;
  std::string bos_piece_, eos_piece_, pad_piece_, unk_piece_;
};

// Trains a SentencePiece model on `documents` (each document's lines are training sentences;
// SentencePieceTrainer, single-threaded and unshuffled so that the result is a function of the
// documents alone) with unk=0, bos=1, eos=2, pad=3 (Llama's unk/bos/eos ids; "<pad>" added),
// byte_fallback on, and `options.vocab_size` pieces. INVALID_ARGUMENT naming
// "dataset.vocab_size" / "dataset.model_type" for bad options or a corpus too small for the
// vocabulary.
absl::StatusOr<std::shared_ptr<const Tokenizer>> TrainSentencePiece(
    const std::vector<std::string>& documents, const TokenizerOptions& options);

// The job's tokenizer. byte: Tokenizer::Byte(). sentencepiece with model_path: that file.
// sentencepiece without: <record_dir>/tokenizer.model if it exists (a restart), otherwise trained
// on `documents` (see TrainSentencePiece). With a non-empty record_dir the model and its
// tokenizer_config.json (model_max_length) are written there (atomically, under an flock on
// <record_dir>/.tokenizer.lock, so that of several ranks sharing record_dir one trains and the
// others wait for it and load its file). Errors: NOT_FOUND "dataset.tokenizer_model: ...",
// INVALID_ARGUMENT from the above, I/O errors naming the file.
absl::StatusOr<std::shared_ptr<const Tokenizer>> PrepareTokenizer(
    const TokenizerOptions& options, const std::vector<std::string>& documents,
    const std::string& record_dir, int64_t model_max_length);

}  // namespace loom::data

#endif  // LOOM_DATA_TOKENIZER_H_
