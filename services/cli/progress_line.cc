#include "services/cli/progress_line.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom::cli {

std::string WithThousands(double value) {
  const std::string digits = absl::StrFormat("%.0f", value);
  const size_t start = digits[0] == '-' ? 1 : 0;
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > start && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

std::string ShortDuration(absl::Duration d) {
  const int64_t s = std::max<int64_t>(0, absl::ToInt64Seconds(d));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, (s % 86400) / 3600);
}

void ProgressRate::Observe(int64_t step, absl::Time now) {
  if (step <= 0) return;
  if (first_step_ < 0 || step < last_step_) {  // first sight, or a restart went back
    first_step_ = step;
    first_time_ = now;
  }
  last_step_ = step;
  last_time_ = now;
}

std::optional<absl::Duration> ProgressRate::Remaining(int64_t total_steps) const {
  if (first_step_ < 0 || last_step_ <= first_step_ || total_steps <= 0) return std::nullopt;
  const double per_step = absl::ToDoubleSeconds(last_time_ - first_time_) /
                          static_cast<double>(last_step_ - first_step_);
  return absl::Seconds(per_step * static_cast<double>(std::max<int64_t>(0, total_steps - last_step_)));
}

std::string ProgressText(const loom::v1::Job& job, absl::Time now,
                         std::optional<absl::Duration> remaining) {
  const loom::v1::Progress& p = job.progress();
  const int64_t total = job.spec().training().steps();
  std::string out = absl::StrCat("step ", p.step(), "/", total);
  if (total > 0) {
    absl::StrAppendFormat(&out, " (%d%%)", static_cast<int>(100 * p.step() / total));
  }
  if (p.step() > 0) absl::StrAppendFormat(&out, "  loss %.4f", p.loss());
  if (p.has_eval_loss()) {
    absl::StrAppendFormat(&out, "  held-out %.4f @%d", p.eval_loss(), p.eval_step());
  }
  if (p.tokens_per_second() > 0) {
    absl::StrAppend(&out, "  ", WithThousands(p.tokens_per_second()), " tokens/s");
  }
  if (job.has_start_time()) {
    const absl::Time start = absl::FromUnixSeconds(job.start_time().seconds()) +
                             absl::Nanoseconds(job.start_time().nanos());
    absl::StrAppend(&out, "  elapsed ", ShortDuration(now - start));
  }
  if (remaining.has_value()) absl::StrAppend(&out, "  ETA ", ShortDuration(*remaining));
  return out;
}

}  // namespace loom::cli
