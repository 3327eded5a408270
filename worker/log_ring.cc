#include "worker/log_ring.h"

#include "absl/strings/str_cat.h"

namespace loom::worker {

void LogRing::Add(absl::string_view stream, absl::string_view text) {
  loom::v1::RankLogLine line;
  line.set_stream(std::string(stream));
  if (text.size() > kMaxRankLogLineBytes) {
    line.set_text(absl::StrCat(text.substr(0, kMaxRankLogLineBytes - 14), "...[truncated]"));
  } else {
    line.set_text(std::string(text));
  }
  absl::MutexLock lock(&mu_);
  line.set_sequence(next_sequence_++);
  lines_.push_back(std::move(line));
  while (lines_.size() > capacity_) lines_.pop_front();
}

std::vector<loom::v1::RankLogLine> LogRing::After(int64_t after, size_t max_lines,
                                                  size_t max_bytes) const {
  std::vector<loom::v1::RankLogLine> out;
  absl::MutexLock lock(&mu_);
  if (lines_.empty() || max_lines == 0) return out;
  const int64_t first = lines_.front().sequence();
  size_t i = after < first ? 0 : static_cast<size_t>(after - first + 1);
  size_t bytes = 0;
  for (; i < lines_.size() && out.size() < max_lines; ++i) {
    bytes += lines_[i].text().size();
    if (!out.empty() && bytes > max_bytes) break;
    out.push_back(lines_[i]);
  }
  return out;
}

int64_t LogRing::last_sequence() const {
  absl::MutexLock lock(&mu_);
  return next_sequence_ - 1;
}

}  // namespace loom::worker
