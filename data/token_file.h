// Pre-tokenized flat token files, as nanoGPT's prepare.py (np.uint16 .bin) and Megatron-style
// pipelines write them: little-endian unsigned ids of 2 (uint16) or 4 (uint32) bytes, no header,
// documents separated by the EOS id. The files are memory-mapped read-only (MAP_SHARED,
// MADV_RANDOM), never read whole: a rank touches only the pages of the windows it trains on and
// the slice of the file it validates (ValidateTokenIds). Torch-free.
#ifndef LOOM_DATA_TOKEN_FILE_H_
#define LOOM_DATA_TOKEN_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/token_stream.h"

namespace loom::data {

// "uint16" -> 2, "uint32" -> 4; INVALID_ARGUMENT "dataset.token_dtype: ..." otherwise.
absl::StatusOr<int> TokenWidthFromDtype(absl::string_view dtype);

// The files `path` names as a token data set: itself, or a directory's regular, non-symlink
// files ending in ".bin", in name order. NOT_FOUND if path does not exist, FAILED_PRECONDITION
// for a directory without .bin files; errors name dataset.path.
absl::StatusOr<std::vector<std::string>> ListTokenFiles(const std::string& path);

// Maps `path`: one file, or a directory whose regular, non-symlink files ending in ".bin" are
// concatenated in name order. Errors (each naming the file): NOT_FOUND if path does not exist,
// INVALID_ARGUMENT "dataset.path: <file>: size S bytes is not a multiple of the token width W",
// FAILED_PRECONDITION for a directory without .bin files or a file that is not a regular file,
// I/O errors from open/mmap.
absl::StatusOr<TokenStream> MapTokenFiles(const std::string& path, int width);

// Checks that tokens [begin, end) of `stream` are < vocab_size. INVALID_ARGUMENT
// "dataset.path: <file> byte offset <b>: token id <t> >= vocab_size <V>" for the first that is
// not. Reads only that range.
absl::Status ValidateTokenIds(const TokenStream& stream, int64_t begin, int64_t end,
                              int64_t vocab_size);

// The train/held-out cut of a token stream of n tokens: the held-out side is the tail after the
// last EOS at or before n * (1 - holdout_fraction) (searching back at most 1M tokens; without an
// EOS there, exactly that position), so that no document straddles the cut when the files mark
// documents. eos_id < 0: exactly that position. Reads at most the searched range.
int64_t TokenHoldoutCut(const TokenStream& stream, double holdout_fraction, int64_t eos_id);

}  // namespace loom::data

#endif  // LOOM_DATA_TOKEN_FILE_H_
