// Making text that came from users (job names, messages, log lines, node labels) safe to print
// on a terminal: control characters and terminal escape sequences are shown, not executed.
#ifndef LOOM_SERVICES_CLI_TERMINAL_TEXT_H_
#define LOOM_SERVICES_CLI_TERMINAL_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace loom::cli {

// `s` with every byte that could move the cursor, change colours, retitle the window or hide
// text replaced by a visible escape: C0 controls (including ESC, BEL, CR, LF and TAB) as \t, \n,
// \r or \xNN, DEL as \x7f, C1 controls (U+0080-U+009F, e.g. the 8-bit CSI) as \u0080-\u009f,
// invalid UTF-8 bytes as \xNN, and a backslash as \\ (so escapes cannot be forged). Printable
// ASCII and valid UTF-8 otherwise pass through unchanged. Thread-safe.
std::string TerminalSafe(absl::string_view s);

// TerminalSafe(s), cut to at most `max_chars` output bytes (at a character boundary) with "..."
// appended when cut; for table columns. max_chars >= 4.
std::string TerminalSafeCut(absl::string_view s, size_t max_chars);

}  // namespace loom::cli

#endif  // LOOM_SERVICES_CLI_TERMINAL_TEXT_H_
