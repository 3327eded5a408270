#include "worker/engine/corpus.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace loom::engine {

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::vector<std::string> SplitFortuneRecords(absl::string_view text) {
  std::vector<std::string> out;
  std::string current;
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  // A trailing newline yields a final empty piece that is not a line.
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  for (absl::string_view line : lines) {
    absl::string_view l = line;
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (l == "%") {
      if (!current.empty()) out.push_back(std::move(current));
      current.clear();
      continue;
    }
    absl::StrAppend(&current, line, "\n");
  }
  if (!current.empty()) out.push_back(std::move(current));
  return out;
}

namespace {

bool HasFortuneSeparators(absl::string_view text) {
  return absl::StartsWith(text, "%\n") || absl::StrContains(text, "\n%\n");
}

std::vector<std::string> SplitParagraphs(absl::string_view text) {
  std::vector<std::string> out;
  for (absl::string_view p : absl::StrSplit(text, "\n\n", absl::SkipWhitespace())) {
    out.push_back(absl::StrCat(p, "\n\n"));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ListCorpusFiles(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::NotFoundError(absl::StrCat("dataset.path: cannot open ", dir));
  std::vector<std::string> files;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (absl::EndsWith(name, ".dat") || absl::EndsWith(name, ".u8")) continue;
    std::string path = absl::StrCat(dir, "/", name);
    struct stat st;
    if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;  // skips symlinks
    files.push_back(path);
  }
  closedir(d);
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

// Raw corpora are read whole into memory; a FIFO, a device or a file over this size is refused
// instead of blocking or exhausting memory.
constexpr int64_t kMaxCorpusFileBytes = int64_t{4} << 30;

absl::StatusOr<Corpus> LoadCorpus(const CorpusOptions& options) {
  if (!(options.holdout_fraction > 0 && options.holdout_fraction <= 0.5)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.holdout_fraction: ", options.holdout_fraction, " is not in (0, 0.5]"));
  }
  struct stat st;
  if (stat(options.path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("dataset.path: ", options.path, " does not exist"));
  }
  std::vector<std::string> docs;
  if (S_ISDIR(st.st_mode)) {
    ASSIGN_OR_RETURN(std::vector<std::string> files, ListCorpusFiles(options.path));
    for (const std::string& f : files) {
      ASSIGN_OR_RETURN(std::string text, ReadRegularFile(f, kMaxCorpusFileBytes));
      for (std::string& r : SplitFortuneRecords(text)) docs.push_back(std::move(r));
    }
  } else {
    ASSIGN_OR_RETURN(std::string text, ReadRegularFile(options.path, kMaxCorpusFileBytes));
    docs = HasFortuneSeparators(text) ? SplitFortuneRecords(text) : SplitParagraphs(text);
  }
  Corpus c;
  const double threshold = options.holdout_fraction * 18446744073709551616.0;  // 2^64
  for (size_t i = 0; i < docs.size(); ++i) {
    const bool held = static_cast<double>(Mix64(i ^ 0x6c6f6f6dULL)) < threshold;
    std::vector<uint8_t>& dst = held ? c.heldout : c.train;
    dst.insert(dst.end(), docs[i].begin(), docs[i].end());
    (held ? c.heldout_documents : c.train_documents)++;
  }
  if (c.train_documents == 0 || c.heldout_documents == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dataset.path: ", options.path, " has ", docs.size(),
        " documents; the train/held-out split left one side empty"));
  }
  return c;
}

int64_t TrainWindowStart(uint64_t seed, int64_t step, int64_t micro_step, int64_t sample,
                         int64_t stream_len, int64_t window) {
  uint64_t h = Mix64(seed ^ 0x747261696eULL);
  h = Mix64(h ^ static_cast<uint64_t>(step));
  h = Mix64(h ^ static_cast<uint64_t>(micro_step));
  h = Mix64(h ^ static_cast<uint64_t>(sample));
  const uint64_t range = static_cast<uint64_t>(stream_len - window + 1);
  return static_cast<int64_t>(h % range);
}

int64_t EvalWindowStart(int64_t k, int64_t count, int64_t stream_len, int64_t window) {
  const int64_t span = stream_len - window;
  if (count <= 1) return 0;
  return static_cast<int64_t>((static_cast<__int128>(k) * span) / (count - 1));
}

}  // namespace loom::engine
