// JSON Lines documents (https://jsonlines.org): one JSON object per line, the document's text
// in a named string field (e.g. {"text": "...", "id": 7}), as Hugging Face datasets and most
// data pipelines export them. Parsed with nlohmann::json. Torch-free; thread-safe.
#ifndef LOOM_DATA_JSONL_READER_H_
#define LOOM_DATA_JSONL_READER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::data {

// The `text_field` strings of `contents` (the bytes of `file`), in line order. Blank lines are
// skipped; other fields are ignored. Errors, INVALID_ARGUMENT, each "dataset.path: <file>:<line>:"
// (1-based line) then: "invalid UTF-8 at byte offset <b>" (offset in the file), "invalid JSON:
// ...", "not a JSON object", "no string field \"<text_field>\"".
absl::StatusOr<std::vector<std::string>> ParseJsonlDocuments(absl::string_view contents,
                                                             const std::string& file,
                                                             const std::string& text_field);

// The files a JSONL dataset.path names: itself, or a directory's regular non-symlink files
// ending in ".jsonl", in name order. NOT_FOUND / FAILED_PRECONDITION naming the path.
absl::StatusOr<std::vector<std::string>> ListJsonlFiles(const std::string& path);

}  // namespace loom::data

#endif  // LOOM_DATA_JSONL_READER_H_
