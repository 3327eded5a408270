// UTF-8 validation (RFC 3629 §3-4): one decoder for the scheduler's admission checks, loomctl's
// YAML reader and its terminal escaping, which had a hand-written copy each. Written here because
// Debian 12's Abseil (20220623) has no UTF-8 validator and protobuf's is internal API.
// All functions are pure and thread-safe.
#ifndef LOOM_COMMON_UTF8_H_
#define LOOM_COMMON_UTF8_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace loom {

// Decodes the character starting at s[i] (i < s.size()). Returns its length in bytes (1-4) and
// sets *code_point; returns 0 if no valid UTF-8 sequence starts there (a stray continuation
// byte, an overlong form, a surrogate, a code point past U+10FFFF), or -1 if a valid sequence
// is cut off by the end of `s` (every byte up to the end is a fitting continuation byte).
int DecodeUtf8(absl::string_view s, size_t i, uint32_t* code_point);

// Offset of the first byte of `s` that does not start a valid UTF-8 sequence, or npos if all of
// `s` is valid. With `allow_truncated_tail`, a sequence cut off by the end of `s` is accepted
// (for a prefix of a file).
size_t FirstInvalidUtf8(absl::string_view s, bool allow_truncated_tail = false);

}  // namespace loom

#endif  // LOOM_COMMON_UTF8_H_
