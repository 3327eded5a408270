// A thin, Abseil-free wrapper over Debian's libsentencepiece 0.1.97. Its public header declares
// `namespace absl { using std::string_view; }`, which collides with Debian's Abseil (built with
// ABSL_OPTION_USE_STD_STRING_VIEW 0, so absl::string_view is a class): no translation unit may
// include both. This header uses only the standard library; sentencepiece_shim.cc is the one
// file that includes <sentencepiece_processor.h>. Use worker/engine/data/tokenizer.h instead.
//
// Errors are returned as a non-empty message string ("" = success).
// Thread-safety: a loaded SpModel is immutable; Encode may be called from several threads.
#ifndef LOOM_WORKER_ENGINE_DATA_SENTENCEPIECE_SHIM_H_
#define LOOM_WORKER_ENGINE_DATA_SENTENCEPIECE_SHIM_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace loom::engine::spm {

struct SpModel;  // opaque: a loaded sentencepiece::SentencePieceProcessor

struct SpInfo {
  int vocab_size = 0;
  int unk_id = -1, bos_id = -1, eos_id = -1, pad_id = -1;  // -1: the model has none
  std::string unk_piece, bos_piece, eos_piece, pad_piece;
};

// Loads a serialized ModelProto (the bytes of a tokenizer.model file).
std::string Load(const std::string& serialized, std::shared_ptr<const SpModel>* model,
                 SpInfo* info);

// Encodes UTF-8 text into piece ids (no bos/eos added).
std::string Encode(const SpModel& model, const std::string& text, std::vector<int>* ids);

// Decodes piece ids into text.
std::string Decode(const SpModel& model, const std::vector<int>& ids, std::string* text);

// Trains a model on `sentences` (one training sentence each) with SentencePieceTrainer's
// key/value options (e.g. {"vocab_size", "4000"}, {"model_type", "bpe"}); writes the serialized
// ModelProto to *serialized.
std::string Train(const std::vector<std::string>& sentences,
                  const std::map<std::string, std::string>& options, std::string* serialized);

}  // namespace loom::engine::spm

#endif  // LOOM_WORKER_ENGINE_DATA_SENTENCEPIECE_SHIM_H_
