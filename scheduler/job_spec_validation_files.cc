#include "scheduler/job_spec_validation_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "scheduler/field_path.h"
#include "common/utf8.h"
#include "common/status_macros.h"
#include "scheduler/job_spec_validation_limits.h"
#include "storage/safetensors/safetensors.h"
#include "data/corpus.h"

namespace loom {
namespace {


absl::Status DatasetError(absl::string_view what) { return InvalidField("dataset.path", what); }

struct CorpusFile {
  std::string path;
  int64_t size = 0;
};

// The files LoadCorpus reads for `path` (data/corpus.cc ListCorpusFiles): the same
// selection, in the same (name) order.
absl::StatusOr<std::vector<CorpusFile>> ListCorpusFiles(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      return DatasetError(absl::StrCat("'", path, "' does not exist"));
    }
    return DatasetError(absl::StrCat("cannot read '", path, "': ", std::strerror(errno)));
  }
  if (S_ISREG(st.st_mode)) return std::vector<CorpusFile>{{path, st.st_size}};
  if (!S_ISDIR(st.st_mode)) {
    return DatasetError(absl::StrCat("'", path,
                                     "' is neither a regular file nor a directory of text files"));
  }
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) {
    return DatasetError(absl::StrCat("cannot read directory '", path, "': ", std::strerror(errno)));
  }
  std::vector<CorpusFile> files;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (absl::EndsWith(name, ".dat") || absl::EndsWith(name, ".u8")) continue;
    const std::string file = absl::StrCat(path, "/", name);
    struct stat fst;
    if (::lstat(file.c_str(), &fst) != 0 || !S_ISREG(fst.st_mode)) continue;  // skips symlinks
    files.push_back({file, fst.st_size});
  }
  ::closedir(d);
  std::sort(files.begin(), files.end(),
            [](const CorpusFile& a, const CorpusFile& b) { return a.path < b.path; });
  if (files.empty()) {
    return DatasetError(absl::StrCat("directory '", path,
                                     "' holds no corpus files (regular files, not symlinks, not "
                                     "ending in .dat or .u8)"));
  }
  return files;
}

// The first `limit` bytes of `file` hold text: no NUL byte, valid UTF-8.
absl::Status SniffText(const CorpusFile& file, int64_t limit) {
  const int fd = ::open(file.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return DatasetError(absl::StrCat("cannot read '", file.path, "': ", std::strerror(errno)));
  }
  std::string buf(static_cast<size_t>(std::min(limit, file.size)), '\0');
  size_t got = 0;
  while (got < buf.size()) {
    const ssize_t n = ::pread(fd, &buf[got], buf.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return DatasetError(absl::StrCat("cannot read '", file.path, "': ", std::strerror(err)));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  buf.resize(got);
  if (const void* nul = std::memchr(buf.data(), '\0', buf.size()); nul != nullptr) {
    return DatasetError(absl::StrCat("'", file.path, "' is not text: NUL byte at offset ",
                                     static_cast<const char*>(nul) - buf.data()));
  }
  const bool cut = file.size > static_cast<int64_t>(buf.size());
  if (size_t bad = FirstInvalidUtf8(buf, /*allow_truncated_tail=*/cut); bad != std::string::npos) {
    return DatasetError(
        absl::StrCat("'", file.path, "' is not text: invalid UTF-8 at offset ", bad));
  }
  return absl::OkStatus();
}

bool IsRotaryBuffer(const std::string& name) {
  return absl::EndsWith(name, ".rotary_emb.inv_freq");
}

std::string Shape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::Status ValidateDatasetFiles(const std::string& path, double holdout_fraction,
                                  int64_t window_tokens, const DatasetFileCheckOptions& options) {
  ASSIGN_OR_RETURN(std::vector<CorpusFile> files, ListCorpusFiles(path));
  int64_t total = 0;
  for (const CorpusFile& f : files) {
    RETURN_IF_ERROR(SniffText(f, options.sniff_bytes));
    total += f.size;
  }
  if (total > options.max_split_check_bytes) return absl::OkStatus();
  // Small enough to split exactly as the trainer will (the same code).
  data::CorpusOptions corpus_options;
  corpus_options.path = path;
  if (holdout_fraction != 0) corpus_options.holdout_fraction = holdout_fraction;
  absl::StatusOr<data::Corpus> corpus = data::LoadCorpus(corpus_options);
  if (!corpus.ok()) {
    const std::string message(corpus.status().message());
    return absl::StartsWith(message, "dataset.") ? absl::InvalidArgumentError(message)
                                                 : DatasetError(message);
  }
  const int64_t train = static_cast<int64_t>(corpus->train.size());
  const int64_t heldout = static_cast<int64_t>(corpus->heldout.size());
  if (train < window_tokens || heldout < window_tokens) {
    return InvalidField("training.sequence_length",
                   absl::StrCat("a window of sequence_length + 1 = ", window_tokens,
                                " tokens does not fit the corpus at dataset.path '", path,
                                "' (", train, " train and ", heldout,
                                " held-out tokens after the hold-out split)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateInitFromShapes(const std::string& dir, const spec::LlamaConfig& config) {
  struct Entry {
    std::string dtype;
    std::vector<int64_t> shape;
    std::string file;
  };
  std::map<std::string, Entry> tensors;
  std::map<std::string, std::unique_ptr<safetensors::Reader>> readers;
  auto open = [&](const std::string& file) -> absl::StatusOr<const safetensors::Reader*> {
    auto it = readers.find(file);
    if (it != readers.end()) return it->second.get();
    absl::StatusOr<std::unique_ptr<safetensors::Reader>> r =
        safetensors::Reader::Open(absl::StrCat(dir, "/", file));
    if (!r.ok()) return InvalidField("model.init_from", r.status().message());
    return (readers[file] = std::move(*r)).get();
  };
  const std::string index_path = absl::StrCat(dir, "/model.safetensors.index.json");
  struct stat st;
  if (::stat(index_path.c_str(), &st) == 0) {
    absl::StatusOr<std::string> text = ReadRegularFile(index_path, 64 << 20);
    if (!text.ok()) return InvalidField("model.init_from", text.status().message());
    nlohmann::json index = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object()) {
      return InvalidField("model.init_from", absl::StrCat(index_path, ": no weight_map object"));
    }
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos) {
        return InvalidField("model.init_from", absl::StrCat(index_path, ": weight_map[\"", name,
                                                       "\"] is not a file name in ", dir));
      }
      ASSIGN_OR_RETURN(const safetensors::Reader* reader, open(file.get<std::string>()));
      const safetensors::TensorEntry* e = reader->Find(name);
      if (e == nullptr) {
        return InvalidField("model.init_from",
                       absl::StrCat(index_path, ": tensor '", name, "' is mapped to ",
                                    file.get<std::string>(), ", which does not hold it"));
      }
      tensors[name] = {e->dtype, e->shape, reader->path()};
    }
  } else {
    ASSIGN_OR_RETURN(const safetensors::Reader* reader, open("model.safetensors"));
    for (const safetensors::TensorEntry& e : reader->tensors()) {
      tensors[e.name] = {e.dtype, e.shape, reader->path()};
    }
  }

  std::set<std::string> implied;
  for (const spec::ParamSpec& p : spec::LlamaParamSpecs(config)) {
    implied.insert(p.name);
    auto it = tensors.find(p.name);
    if (it == tensors.end()) {
      return InvalidField("model.init_from",
                     absl::StrCat("tensor '", p.name, "' (shape ", Shape(p.shape),
                                  " for model.config) is missing from ", dir));
    }
    if (it->second.shape != p.shape) {
      return InvalidField("model.init_from",
                     absl::StrCat("tensor '", p.name, "' has shape ", Shape(it->second.shape),
                                  " in ", it->second.file, "; model.config implies ",
                                  Shape(p.shape)));
    }
    if (it->second.dtype != "F32" && it->second.dtype != "BF16") {
      return InvalidField("model.init_from", absl::StrCat("tensor '", p.name, "' is ",
                                                     it->second.dtype, " in ", it->second.file,
                                                     "; only F32 and BF16 are read"));
    }
  }
  // A layer the config does not have means the export is of a different (deeper) model.
  for (const auto& [name, entry] : tensors) {
    if (implied.count(name) || IsRotaryBuffer(name)) continue;
    if (absl::StartsWith(name, "model.layers.")) {
      return InvalidField("model.init_from",
                     absl::StrCat("tensor '", name, "' in ", entry.file,
                                  " is not part of the model model.config describes "
                                  "(num_hidden_layers ", config.num_hidden_layers, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace loom
