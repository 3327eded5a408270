#include "data/corpus.h"

#include <sys/stat.h>

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "data/dataset_error.h"
#include "data/jsonl_reader.h"
#include "data/token_file.h"

namespace loom::data {

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

// Raw corpora are read whole into memory; a FIFO, a device or a file over this size is refused
// instead of blocking or exhausting memory.
constexpr int64_t kMaxCorpusFileBytes = int64_t{4} << 30;

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
  absl::StatusOr<std::vector<std::string>> files =
      ListRegularFiles(dir, [](absl::string_view name) {
        return !absl::EndsWith(name, ".dat") && !absl::EndsWith(name, ".u8");  // fortune indexes
      });
  if (!files.ok()) return absl::NotFoundError(absl::StrCat("dataset.path: cannot open ", dir));
  return files;
}

}  // namespace

namespace {

absl::StatusOr<Corpus> LoadTokenFiles(const CorpusOptions& o) {
  ASSIGN_OR_RETURN(const int width, TokenWidthFromDtype(o.token_dtype));
  ASSIGN_OR_RETURN(TokenStream all, MapTokenFiles(o.path, width));
  Corpus c;
  c.tokenizer = Tokenizer::Byte();
  if (o.tokenizer.kind == "sentencepiece") {
    if (o.tokenizer.model_path.empty()) {
      return absl::InvalidArgumentError(
          "dataset.tokenizer_model: a token-file data set is already tokenized; name the "
          "tokenizer.model it was made with (or use tokenizer: byte)");
    }
    ASSIGN_OR_RETURN(c.tokenizer, PrepareTokenizer(o.tokenizer, {}, o.record_dir,
                                                   o.model_max_length));
  }
  if (o.vocab_size > 0) {
    const int64_t n = all.size();
    const int64_t begin = n * o.rank / std::max(1, o.world_size);
    const int64_t end = n * (o.rank + 1) / std::max(1, o.world_size);
    RETURN_IF_ERROR(ValidateTokenIds(all, begin, end, o.vocab_size));
  }
  const int64_t eos = c.tokenizer->is_byte() ? o.eos_token_id : c.tokenizer->eos_id();
  const int64_t cut = TokenHoldoutCut(all, o.holdout_fraction, eos);
  c.train = all.Sub(0, cut);
  c.heldout = all.Sub(cut, all.size());
  c.end_of_document_id = eos;
  if (c.train.empty() || c.heldout.empty()) {
    return DatasetError(absl::StrCat(
        "dataset.path: ", o.path, " has ", all.size(), " tokens; the hold-out split "
        "(holdout_fraction ", o.holdout_fraction, ") left the ",
        c.train.empty() ? "train" : "held-out", " side empty"));
  }
  return c;
}

struct Document {
  std::string text;
  std::string where;  // file, or file:line
};

absl::Status ReadTextDocuments(const CorpusOptions& o, bool need_utf8,
                               std::vector<Document>* docs) {
  auto check = [&](const std::string& file, const std::string& text) -> absl::Status {
    if (!need_utf8) return absl::OkStatus();
    if (size_t bad = FirstInvalidUtf8(text); bad != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset.path: ", file, ": invalid UTF-8 at byte offset ", bad));
    }
    return absl::OkStatus();
  };
  struct stat st;
  if (stat(o.path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("dataset.path: ", o.path, " does not exist"));
  }
  if (S_ISDIR(st.st_mode)) {
    ASSIGN_OR_RETURN(std::vector<std::string> files, ListCorpusFiles(o.path));
    for (const std::string& f : files) {
      ASSIGN_OR_RETURN(std::string text, ReadRegularFile(f, kMaxCorpusFileBytes));
      RETURN_IF_ERROR(check(f, text));
      for (std::string& r : SplitFortuneRecords(text)) docs->push_back({std::move(r), f});
    }
  } else {
    ASSIGN_OR_RETURN(std::string text, ReadRegularFile(o.path, kMaxCorpusFileBytes));
    RETURN_IF_ERROR(check(o.path, text));
    for (std::string& r : HasFortuneSeparators(text) ? SplitFortuneRecords(text)
                                                     : SplitParagraphs(text)) {
      docs->push_back({std::move(r), o.path});
    }
  }
  return absl::OkStatus();
}

absl::Status ReadJsonl(const CorpusOptions& o, std::vector<Document>* docs) {
  ASSIGN_OR_RETURN(std::vector<std::string> files, ListJsonlFiles(o.path));
  for (const std::string& f : files) {
    ASSIGN_OR_RETURN(std::string text, ReadRegularFile(f, kMaxCorpusFileBytes));
    ASSIGN_OR_RETURN(std::vector<std::string> texts,
                     ParseJsonlDocuments(text, f, o.text_field));
    for (std::string& t : texts) docs->push_back({std::move(t), f});
  }
  return absl::OkStatus();
}

absl::Status CheckTokenizerAgainstModel(const Tokenizer& t, const CorpusOptions& o) {
  if (o.vocab_size > 0 && t.vocab_size() > o.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.config.vocab_size: ", o.vocab_size, " < the tokenizer's ", t.vocab_size(),
        " tokens"));
  }
  if (t.is_byte()) return absl::OkStatus();
  if (o.bos_token_id >= 0 && t.bos_id() >= 0 && t.bos_id() != o.bos_token_id) {
    return absl::InvalidArgumentError(absl::StrCat("model.config.bos_token_id: ", o.bos_token_id,
                                                   " but the tokenizer's bos id is ", t.bos_id()));
  }
  if (o.eos_token_id >= 0 && t.eos_id() >= 0 && t.eos_id() != o.eos_token_id) {
    return absl::InvalidArgumentError(absl::StrCat("model.config.eos_token_id: ", o.eos_token_id,
                                                   " but the tokenizer's eos id is ", t.eos_id()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Corpus> LoadCorpus(const CorpusOptions& options) {
  if (!(options.holdout_fraction > 0 && options.holdout_fraction <= 0.5)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.holdout_fraction: ", options.holdout_fraction, " is not in (0, 0.5]"));
  }
  const std::string& format = options.format;
  if (format == "tokens") return LoadTokenFiles(options);
  if (!format.empty() && format != "text" && format != "jsonl") {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset.format: \"", format, "\" is not text, jsonl or tokens"));
  }
  const bool byte = options.tokenizer.kind.empty() || options.tokenizer.kind == "byte";
  std::vector<Document> docs;
  if (format == "jsonl") {
    RETURN_IF_ERROR(ReadJsonl(options, &docs));
  } else {
    RETURN_IF_ERROR(ReadTextDocuments(options, /*need_utf8=*/!byte, &docs));
  }
  std::vector<const Document*> train_docs, heldout_docs;
  const double threshold = options.holdout_fraction * 18446744073709551616.0;  // 2^64
  for (size_t i = 0; i < docs.size(); ++i) {
    const bool held = static_cast<double>(Mix64(i ^ 0x6c6f6f6dULL)) < threshold;
    (held ? heldout_docs : train_docs).push_back(&docs[i]);
  }
  if (train_docs.empty() || heldout_docs.empty()) {
    return DatasetError(absl::StrCat(
        "dataset.path: ", options.path, " has ", docs.size(),
        " documents; the train/held-out split left one side empty"));
  }
  Corpus c;
  c.train_documents = static_cast<int64_t>(train_docs.size());
  c.heldout_documents = static_cast<int64_t>(heldout_docs.size());
  std::vector<std::string> tokenizer_text;
  if (!byte && options.tokenizer.model_path.empty()) {
    for (const Document* d : train_docs) tokenizer_text.push_back(d->text);
  }
  ASSIGN_OR_RETURN(c.tokenizer, PrepareTokenizer(options.tokenizer, tokenizer_text,
                                                 options.record_dir, options.model_max_length));
  RETURN_IF_ERROR(CheckTokenizerAgainstModel(*c.tokenizer, options));
  const int64_t eos = c.tokenizer->eos_id();  // -1 (none) for the byte tokenizer
  auto encode = [&](const std::vector<const Document*>& side,
                    std::vector<int64_t>* starts) -> absl::StatusOr<TokenStream> {
    std::vector<int32_t> ids;
    for (const Document* d : side) {
      starts->push_back(static_cast<int64_t>(ids.size()));
      RETURN_IF_ERROR(c.tokenizer->Encode(d->text, d->where, &ids));
      if (eos >= 0) ids.push_back(static_cast<int32_t>(eos));
    }
    return TokenStream(std::move(ids));
  };
  ASSIGN_OR_RETURN(c.train, encode(train_docs, &c.train_document_starts));
  ASSIGN_OR_RETURN(c.heldout, encode(heldout_docs, &c.heldout_document_starts));
  return c;
}

absl::StatusOr<std::vector<std::string>> CorpusFiles(const CorpusOptions& options) {
  if (options.format == "tokens") return ListTokenFiles(options.path);
  if (options.format == "jsonl") return ListJsonlFiles(options.path);
  if (!options.format.empty() && options.format != "text") {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset.format: \"", options.format, "\" is not text, jsonl or tokens"));
  }
  struct stat st;
  if (stat(options.path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("dataset.path: ", options.path, " does not exist"));
  }
  if (!S_ISDIR(st.st_mode)) return std::vector<std::string>{options.path};
  return ListCorpusFiles(options.path);
}

DocumentBoundaries TrainBoundaries(const Corpus& c) {
  return {&c.train_document_starts, c.end_of_document_id};
}
DocumentBoundaries HeldOutBoundaries(const Corpus& c) {
  return {&c.heldout_document_starts, c.end_of_document_id};
}

std::vector<int64_t> PackedPositions(const TokenStream& stream, const DocumentBoundaries& b,
                                     int64_t start, int64_t n) {
  std::vector<int64_t> pos(static_cast<size_t>(n), 0);
  if (n == 0) return pos;
  if (b.starts != nullptr && !b.starts->empty()) {
    // The first recorded start after the window's first token, then walk both in order. An
    // empty document (a JSONL line with empty text) repeats the next one's start: skip every
    // start at or before the token.
    auto next = std::upper_bound(b.starts->begin(), b.starts->end(), start);
    for (int64_t i = 1; i < n; ++i) {
      bool document_starts = false;
      while (next != b.starts->end() && *next <= start + i) {
        document_starts = document_starts || *next == start + i;
        ++next;
      }
      pos[i] = document_starts ? 0 : pos[i - 1] + 1;
    }
    return pos;
  }
  const std::vector<int64_t> ids = stream.Slice(start, n);
  for (int64_t i = 1; i < n; ++i) {
    pos[i] = (b.end_of_document_id >= 0 && ids[i - 1] == b.end_of_document_id) ? 0 : pos[i - 1] + 1;
  }
  return pos;
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

}  // namespace loom::data
