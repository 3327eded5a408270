#include "services/cli/terminal_text.h"

#include <cstdint>

#include "absl/strings/str_format.h"

namespace loom::cli {
namespace {

// Length of the valid UTF-8 sequence starting at s[i] (2-4), or 0 if none starts there.
size_t Utf8SequenceLength(absl::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t extra;
  uint32_t cp;
  if ((c & 0xE0) == 0xC0) {
    extra = 1;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    extra = 2;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    extra = 3;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + extra >= s.size()) return 0;
  for (size_t k = 1; k <= extra; ++k) {
    const unsigned char cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3F);
  }
  if ((extra == 1 && cp < 0x80) || (extra == 2 && cp < 0x800) || (extra == 3 && cp < 0x10000) ||
      (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
    return 0;
  }
  if (cp >= 0x80 && cp <= 0x9F) return 0;  // C1 control: escaped by the caller
  return extra + 1;
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
