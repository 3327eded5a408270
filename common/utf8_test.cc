#include "common/utf8.h"

#include <string>

#include "gtest/gtest.h"

namespace loom {
namespace {

constexpr size_t kNpos = absl::string_view::npos;

TEST(Utf8Test, DecodesTheRfc3629Examples) {
  // RFC 3629 §7: "A<NOT IDENTICAL TO><ALPHA>.", the Korean "hangugeo", the Japanese "nihongo"
  // and a U+233B4 (4-byte) character, with their code points.
  struct Case {
    std::string bytes;
    uint32_t code_point;
    int length;
  } cases[] = {{"A", 0x41, 1},
               {"\xE2\x89\xA2", 0x2262, 3},
               {"\xCE\x91", 0x391, 2},
               {"\xED\x95\x9C", 0xD55C, 3},
               {"\xE6\x97\xA5", 0x65E5, 3},
               {"\xF0\xA3\x8E\xB4", 0x233B4, 4}};
  for (const Case& c : cases) {
    uint32_t cp = 0;
    EXPECT_EQ(DecodeUtf8(c.bytes, 0, &cp), c.length) << c.bytes;
    EXPECT_EQ(cp, c.code_point) << c.bytes;
  }
}

TEST(Utf8Test, RefusesWhatRfc3629Forbids) {
  uint32_t cp = 0;
  EXPECT_EQ(DecodeUtf8("\x80", 0, &cp), 0);                 // stray continuation byte
  EXPECT_EQ(DecodeUtf8("\xC0\xAF", 0, &cp), 0);             // overlong '/'
  EXPECT_EQ(DecodeUtf8("\xE0\x80\xAF", 0, &cp), 0);         // overlong '/'
  EXPECT_EQ(DecodeUtf8("\xED\xA0\x80", 0, &cp), 0);         // surrogate U+D800
  EXPECT_EQ(DecodeUtf8("\xF4\x90\x80\x80", 0, &cp), 0);     // U+110000
  EXPECT_EQ(DecodeUtf8("\xFF", 0, &cp), 0);
  EXPECT_EQ(DecodeUtf8("\xE2\x89", 0, &cp), -1);            // cut off by the end
  EXPECT_EQ(DecodeUtf8("\xE2\x41\xA2", 0, &cp), 0);         // not a continuation byte
}

TEST(Utf8Test, FirstInvalidOffset) {
  EXPECT_EQ(FirstInvalidUtf8(""), kNpos);
  EXPECT_EQ(FirstInvalidUtf8("plain \xE2\x89\xA2 text"), kNpos);
  EXPECT_EQ(FirstInvalidUtf8("abc\xC0\xAF"), 3u);
  EXPECT_EQ(FirstInvalidUtf8("ab\xE2\x89"), 2u);
  EXPECT_EQ(FirstInvalidUtf8("ab\xE2\x89", /*allow_truncated_tail=*/true), kNpos);
  EXPECT_EQ(FirstInvalidUtf8("ab\xE2\x41", /*allow_truncated_tail=*/true), 2u);
  EXPECT_EQ(FirstInvalidUtf8(std::string("a\0b", 3)), kNpos);  // NUL is valid UTF-8
}

}  // namespace
}  // namespace loom
