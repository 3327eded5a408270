// The tokenizer half of a Hugging Face Llama export: a job trained with a SentencePiece
// tokenizer records <checkpoint_dir>/tokenizer.model and tokenizer_config.json
// (data/tokenizer.h PrepareTokenizer); consolidation copies both beside
// config.json and writes the tokenizer's special token ids into config.json, so that the two
// agree. A byte-tokenizer job records neither and its export is unchanged. No LibTorch.
#ifndef LOOM_STORAGE_CHECKPOINT_TOKENIZER_EXPORT_H_
#define LOOM_STORAGE_CHECKPOINT_TOKENIZER_EXPORT_H_

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom {

// If <checkpoint_dir>/tokenizer.model exists: writes it and tokenizer_config.json into `staging`
// (fsynced) and sets config's bos_token_id, eos_token_id and pad_token_id from
// tokenizer_config.json's *_token_id fields (null ids are removed from config). Returns the
// names written (empty when the job has no recorded tokenizer). INVALID_ARGUMENT naming the file
// if tokenizer_config.json is missing or malformed; I/O errors naming the file.
absl::StatusOr<std::vector<std::string>> StageTokenizerFiles(const std::string& checkpoint_dir,
                                                             const std::string& staging,
                                                             nlohmann::json* config);

}  // namespace loom

#endif  // LOOM_STORAGE_CHECKPOINT_TOKENIZER_EXPORT_H_
