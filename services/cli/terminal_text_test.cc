#include "services/cli/terminal_text.h"

#include <string>

#include "gtest/gtest.h"

namespace loom::cli {
namespace {

TEST(TerminalSafeTest, PrintableTextPassesThrough) {
  EXPECT_EQ(TerminalSafe("tiny-llama 42 [ok] ~!@#$%^&*()"), "tiny-llama 42 [ok] ~!@#$%^&*()");
  EXPECT_EQ(TerminalSafe("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");  // é € 😀
  EXPECT_EQ(TerminalSafe(""), "");
}

TEST(TerminalSafeTest, ControlsAndEscapesAreShownNotExecuted) {
  EXPECT_EQ(TerminalSafe("\x1b]0;pwned\x07"), "\\x1b]0;pwned\\x07");  // OSC: window title
  EXPECT_EQ(TerminalSafe("\x1b[2J\x1b[H"), "\\x1b[2J\\x1b[H");        // clear screen
  EXPECT_EQ(TerminalSafe("a\nb\rc\td"), "a\\nb\\rc\\td");
  EXPECT_EQ(TerminalSafe(std::string("nul\0x", 5)), "nul\\x00x");
  EXPECT_EQ(TerminalSafe("del\x7f"), "del\\x7f");
  EXPECT_EQ(TerminalSafe("\xC2\x9B" "31m"), "\\u009b31m");  // 8-bit CSI (U+009B)
  EXPECT_EQ(TerminalSafe("\xC2\xA0"), "\xC2\xA0");          // U+00A0 is printable
}

TEST(TerminalSafeTest, InvalidUtf8AndBackslashes) {
  EXPECT_EQ(TerminalSafe("na\xEFve"), "na\\xefve");
  EXPECT_EQ(TerminalSafe("\xC0\x80"), "\\xc0\\x80");  // overlong NUL
  EXPECT_EQ(TerminalSafe("\xE2\x82"), "\\xe2\\x82");  // truncated
  // A literal backslash is doubled, so "\x1b" typed by a user is not mistaken for an escape.
  EXPECT_EQ(TerminalSafe("\\x1b"), "\\\\x1b");
}

TEST(TerminalSafeCutTest, CutsAtCharacterBoundaries) {
  EXPECT_EQ(TerminalSafeCut("short", 40), "short");
  EXPECT_EQ(TerminalSafeCut(std::string(10, 'a'), 10), std::string(10, 'a'));
  EXPECT_EQ(TerminalSafeCut(std::string(11, 'a'), 10), "aaaaaaa...");
  EXPECT_EQ(TerminalSafeCut(std::string(3 << 20, 'a'), 40), std::string(37, 'a') + "...");
  // An escape is never split.
  EXPECT_EQ(TerminalSafeCut("abcdef\x1b[31m", 10), "abcdef...");
  EXPECT_EQ(TerminalSafeCut("\xE2\x82\xAC\xE2\x82\xAC\xE2\x82\xAC", 8), "\xE2\x82\xAC...");
}

}  // namespace
}  // namespace loom::cli
