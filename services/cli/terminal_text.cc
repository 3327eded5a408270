#include "services/cli/terminal_text.h"

#include <cstdint>

#include "absl/strings/str_format.h"
#include "common/utf8.h"

namespace loom::cli {
namespace {

// Length of the valid multi-byte UTF-8 sequence starting at s[i] (2-4), or 0 if none starts
// there or it is a C1 control (escaped by the caller).
size_t Utf8SequenceLength(absl::string_view s, size_t i) {
  uint32_t cp = 0;
  const int n = DecodeUtf8(s, i, &cp);
  if (n < 2) return 0;
  if (cp >= 0x80 && cp <= 0x9F) return 0;
  return static_cast<size_t>(n);
}

// Appends the escaped form of the character at s[i]; returns the bytes it consumed.
size_t AppendOne(absl::string_view s, size_t i, std::string* out) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c == '\\') {
    out->append("\\\\");
    return 1;
  }
  if (c >= 0x20 && c < 0x7F) {
    out->push_back(static_cast<char>(c));
    return 1;
  }
  if (c == '\n') {
    out->append("\\n");
    return 1;
  }
  if (c == '\r') {
    out->append("\\r");
    return 1;
  }
  if (c == '\t') {
    out->append("\\t");
    return 1;
  }
  if (c < 0x80) {  // other C0 controls and DEL
    absl::StrAppendFormat(out, "\\x%02x", c);
    return 1;
  }
  if (c == 0xC2 && i + 1 < s.size()) {
    const unsigned char n = static_cast<unsigned char>(s[i + 1]);
    if (n >= 0x80 && n <= 0x9F) {
      absl::StrAppendFormat(out, "\\u%04x", n);
      return 2;
    }
  }
  if (size_t len = Utf8SequenceLength(s, i); len > 0) {
    out->append(s.data() + i, len);
    return len;
  }
  absl::StrAppendFormat(out, "\\x%02x", c);
  return 1;
}

}  // namespace

std::string TerminalSafe(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) i += AppendOne(s, i, &out);
  return out;
}

std::string TerminalSafeCut(absl::string_view s, size_t max_chars) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    std::string piece;
    const size_t used = AppendOne(s, i, &piece);
    if (out.size() + piece.size() > max_chars - 3) {
      // Does the rest fit without the "..."?
      std::string rest = TerminalSafe(s.substr(i, max_chars));
      if (i + max_chars >= s.size() && out.size() + rest.size() <= max_chars) return out + rest;
      return out + "...";
    }
    out += piece;
    i += used;
  }
  return out;
}

}  // namespace loom::cli
