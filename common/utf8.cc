#include "common/utf8.h"

namespace loom {

int DecodeUtf8(absl::string_view s, size_t i, uint32_t* code_point) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    *code_point = c;
    return 1;
  }
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
  for (size_t k = 1; k <= extra; ++k) {
    if (i + k >= s.size()) return -1;
    const unsigned char cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3F);
  }
  // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8.
  if ((extra == 1 && cp < 0x80) || (extra == 2 && cp < 0x800) || (extra == 3 && cp < 0x10000) ||
      (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
    return 0;
  }
  *code_point = cp;
  return static_cast<int>(extra + 1);
}

size_t FirstInvalidUtf8(absl::string_view s, bool allow_truncated_tail) {
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cp = 0;
    const int n = DecodeUtf8(s, i, &cp);
    if (n > 0) {
      i += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && allow_truncated_tail) return absl::string_view::npos;
    return i;
  }
  return absl::string_view::npos;
}

}  // namespace loom
