// A thin, Abseil-free wrapper over Debian's libsentencepiece 0.1.97, built as its own shared
// library (libloom_sentencepiece.so) and loaded with dlopen(RTLD_LOCAL | RTLD_DEEPBIND) by
// tokenizer.cc (LoadSentencePieceApi). Two reasons:
//   * libsentencepiece.so carries its own copy of protobuf-lite and exports its symbols; linked
//     into a process that also links libprotobuf (LibTorch, the scheduler's protos) whichever
//     copy comes first in the global symbol scope serves both, and libprotobuf's static
//     initialisers crash (SIGSEGV in ReflectionOps::FindInitializationErrors, measured here).
//     Loaded locally and deep-bound, each library keeps its own copy.
//   * its public header declares `namespace absl { using std::string_view; }`, which collides
//     with Debian's Abseil (ABSL_OPTION_USE_STD_STRING_VIEW 0): no translation unit may include
//     both, so this header uses only the standard library.
// Use data/tokenizer.h instead of this file.
//
// Errors are returned as a non-empty message string ("" = success).
// Thread-safety: a loaded SpModel is immutable; encode may be called from several threads.
#ifndef LOOM_DATA_SENTENCEPIECE_SHIM_H_
#define LOOM_DATA_SENTENCEPIECE_SHIM_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace loom::data::spm {

struct SpModel;  // opaque: a loaded sentencepiece::SentencePieceProcessor

struct SpInfo {
  int vocab_size = 0;
  int unk_id = -1, bos_id = -1, eos_id = -1, pad_id = -1;  // -1: the model has none
  std::string unk_piece, bos_piece, eos_piece, pad_piece;
};

// The library's entry points (function pointers, so that dlsym needs one C symbol only).
struct SpApi {
  // Loads a serialized ModelProto (the bytes of a tokenizer.model file).
  std::string (*load)(const std::string& serialized, std::shared_ptr<const SpModel>* model,
                      SpInfo* info);
  // Encodes UTF-8 text into piece ids (no bos/eos added).
  std::string (*encode)(const SpModel& model, const std::string& text, std::vector<int>* ids);
  // Decodes piece ids into text.
  std::string (*decode)(const SpModel& model, const std::vector<int>& ids, std::string* text);
  // Trains a model on `sentences` (one training sentence each) with SentencePieceTrainer's
  // key/value options (e.g. {"vocab_size", "4000"}, {"model_type", "bpe"}); writes the
  // serialized ModelProto to *serialized.
  std::string (*train)(const std::vector<std::string>& sentences,
                       const std::map<std::string, std::string>& options,
                       std::string* serialized);
};

// The C symbol libloom_sentencepiece.so exports.
inline constexpr char kSpApiSymbol[] = "loom_sentencepiece_api";
using SpApiFn = const SpApi* (*)();

}  // namespace loom::data::spm

#endif  // LOOM_DATA_SENTENCEPIECE_SHIM_H_
