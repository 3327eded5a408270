#include "data/tokenizer.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "data/sentencepiece_shim.h"

namespace loom::data {

namespace {

// tokenizer.model files are a few hundred KB; a vocabulary of 1M pieces is ~20 MB.
constexpr int64_t kMaxModelBytes = int64_t{256} << 20;

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Where libloom_sentencepiece.so may be: $LOOM_SENTENCEPIECE_LIB; the runfiles of the running
// binary or test (Bazel data dependency); beside the binary.
std::vector<std::string> ShimCandidates() {
  constexpr char kRel[] = "loom/data/libloom_sentencepiece.so";
  std::vector<std::string> out;
  if (const char* env = std::getenv("LOOM_SENTENCEPIECE_LIB")) out.push_back(env);
  for (const char* var : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    if (const char* d = std::getenv(var)) out.push_back(absl::StrCat(d, "/", kRel));
  }
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    const std::string self(exe, static_cast<size_t>(n));
    out.push_back(absl::StrCat(self, ".runfiles/", kRel));
    out.push_back(absl::StrCat(self.substr(0, self.rfind('/') + 1), "libloom_sentencepiece.so"));
  }
  return out;
}

// Loads libloom_sentencepiece.so once per process (never unloaded); see sentencepiece_shim.h for
// why it is dlopen-ed with RTLD_LOCAL | RTLD_DEEPBIND instead of linked.
absl::StatusOr<const spm::SpApi*> SentencePieceApi() {
  static std::once_flag once;
  static const spm::SpApi* api = nullptr;
  static std::string error;
  std::call_once(once, [] {
    std::string tried;
    for (const std::string& path : ShimCandidates()) {
      if (!Exists(path)) {
        absl::StrAppend(&tried, " ", path, " (absent)");
        continue;
      }
      void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (h == nullptr) {
        absl::StrAppend(&tried, " ", path, " (", ::dlerror(), ")");
        continue;
      }
      auto fn = reinterpret_cast<spm::SpApiFn>(::dlsym(h, spm::kSpApiSymbol));
      if (fn == nullptr) {
        absl::StrAppend(&tried, " ", path, " (no ", spm::kSpApiSymbol, ")");
        continue;
      }
      api = fn();
      return;
    }
    error = absl::StrCat("cannot load libloom_sentencepiece.so (set LOOM_SENTENCEPIECE_LIB); "
                         "tried:", tried);
  });
  if (api == nullptr) return absl::FailedPreconditionError(absl::StrCat("dataset.tokenizer: ", error));
  return api;
}

}  // namespace

std::shared_ptr<const Tokenizer> Tokenizer::Byte() {
  static const std::shared_ptr<const Tokenizer> kByte(new Tokenizer());
  return kByte;
}

absl::StatusOr<std::shared_ptr<const Tokenizer>> Tokenizer::FromSentencePiece(
    std::string serialized, absl::string_view source) {
  ASSIGN_OR_RETURN(const spm::SpApi* api, SentencePieceApi());
  std::shared_ptr<const spm::SpModel> model;
  spm::SpInfo info;
  std::string err = api->load(serialized, &model, &info);
  if (!err.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a SentencePiece model: ", err));
  }
  std::shared_ptr<Tokenizer> t(new Tokenizer());
  t->api_ = api;
  t->model_ = std::move(model);
  t->serialized_ = std::move(serialized);
  t->vocab_size_ = info.vocab_size;
  t->bos_id_ = info.bos_id;
  t->eos_id_ = info.eos_id;
  t->pad_id_ = info.pad_id;
  t->unk_id_ = info.unk_id;
  t->bos_piece_ = info.bos_piece;
  t->eos_piece_ = info.eos_piece;
  t->pad_piece_ = info.pad_piece;
  t->unk_piece_ = info.unk_piece;
  return std::shared_ptr<const Tokenizer>(std::move(t));
}

absl::Status Tokenizer::Encode(absl::string_view text, absl::string_view where,
                               std::vector<int32_t>* out) const {
  if (is_byte()) {
    for (unsigned char c : text) out->push_back(c);
    return absl::OkStatus();
  }
  if (size_t bad = FirstInvalidUtf8(text); bad != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": invalid UTF-8 at byte offset ", bad));
  }
  std::vector<int> ids;
  std::string err = api_->encode(*model_, std::string(text), &ids);
  if (!err.empty()) return absl::InternalError(absl::StrCat(where, ": SentencePiece: ", err));
  out->insert(out->end(), ids.begin(), ids.end());
  return absl::OkStatus();
}

absl::StatusOr<std::string> Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  if (is_byte()) {
    std::string s;
    for (int32_t id : ids) {
      if (id < 0 || id > 255) return absl::InvalidArgumentError(absl::StrCat("byte id ", id));
      s.push_back(static_cast<char>(id));
    }
    return s;
  }
  std::string text;
  std::string err = api_->decode(*model_, std::vector<int>(ids.begin(), ids.end()), &text);
  if (!err.empty()) return absl::InvalidArgumentError(absl::StrCat("SentencePiece: ", err));
  return text;
}

std::string Tokenizer::TokenizerConfigJson(int64_t model_max_length) const {
  nlohmann::json j = {
      {"tokenizer_class", "LlamaTokenizer"},
      {"model_max_length", model_max_length},
      {"add_bos_token", false},
      {"add_eos_token", false},
      {"clean_up_tokenization_spaces", false},
  };
  auto special = [&](const char* key, int64_t id, const std::string& piece) {
    if (id < 0) {
      j[key] = nullptr;
    } else {
      j[key] = piece;
    }
    j[absl::StrCat(key, "_id")] = id < 0 ? nlohmann::json(nullptr) : nlohmann::json(id);
  };
  special("bos_token", bos_id_, bos_piece_);
  special("eos_token", eos_id_, eos_piece_);
  special("pad_token", pad_id_, pad_piece_);
  special("unk_token", unk_id_, unk_piece_);
  return j.dump(2) + "\n";
}

absl::StatusOr<std::shared_ptr<const Tokenizer>> TrainSentencePiece(
    const std::vector<std::string>& documents, const TokenizerOptions& options) {
  if (options.vocab_size < 8 || options.vocab_size > 1000000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.vocab_size: ", options.vocab_size,
        " is not in [8, 1000000] (SentencePiece training needs a vocabulary size)"));
  }
  if (options.model_type != "bpe" && options.model_type != "unigram") {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.model_type: \"", options.model_type, "\" is not bpe or unigram"));
  }
  std::vector<std::string> sentences;
  for (const std::string& d : documents) {
    for (absl::string_view line : absl::StrSplit(d, '\n', absl::SkipWhitespace())) {
      sentences.emplace_back(line);
    }
  }
  const std::map<std::string, std::string> kwargs = {
      {"model_type", options.model_type},
      {"vocab_size", absl::StrCat(options.vocab_size)},
      {"character_coverage", "1.0"},
      {"byte_fallback", "true"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "3"},
      {"num_threads", "1"},
      {"shuffle_input_sentence", "false"},
      {"input_sentence_size", "0"},
      {"minloglevel", "1"},
  };
  ASSIGN_OR_RETURN(const spm::SpApi* api, SentencePieceApi());
  std::string serialized;
  std::string err = api->train(sentences, kwargs, &serialized);
  if (!err.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset.vocab_size: SentencePiece training failed: ", err));
  }
  return Tokenizer::FromSentencePiece(std::move(serialized), "trained tokenizer");
}

absl::StatusOr<std::shared_ptr<const Tokenizer>> PrepareTokenizer(
    const TokenizerOptions& options, const std::vector<std::string>& documents,
    const std::string& record_dir, int64_t model_max_length) {
  if (options.kind.empty() || options.kind == "byte") return Tokenizer::Byte();
  if (options.kind != "sentencepiece") {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.tokenizer: \"", options.kind, "\" is not byte or sentencepiece"));
  }
  auto record = [&](const Tokenizer& t) -> absl::Status {
    if (record_dir.empty()) return absl::OkStatus();
    // tokenizer.model last: its presence is what a restart looks for.
    RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(record_dir, "/", kTokenizerConfigFile),
                                        t.TokenizerConfigJson(model_max_length)));
    return WriteFileAtomically(absl::StrCat(record_dir, "/", kTokenizerModelFile),
                               t.serialized_model());
  };
  if (!options.model_path.empty()) {
    if (!Exists(options.model_path)) {
      return absl::NotFoundError(
          absl::StrCat("dataset.tokenizer_model: ", options.model_path, " does not exist"));
    }
    ASSIGN_OR_RETURN(std::string bytes, ReadRegularFile(options.model_path, kMaxModelBytes));
    ASSIGN_OR_RETURN(std::shared_ptr<const Tokenizer> t,
                     Tokenizer::FromSentencePiece(
                         std::move(bytes), absl::StrCat("dataset.tokenizer_model: ",
                                                        options.model_path)));
    if (!record_dir.empty()) {
      RETURN_IF_ERROR(MakeDirs(record_dir));
      RETURN_IF_ERROR(record(*t));
    }
    return t;
  }
  if (record_dir.empty()) return TrainSentencePiece(documents, options);

  RETURN_IF_ERROR(MakeDirs(record_dir));
  const std::string lock_path = absl::StrCat(record_dir, "/.tokenizer.lock");
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot open", lock_path);
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }  // closing releases the flock
  } unlock{fd};
  if (::flock(fd, LOCK_EX) != 0) return ErrnoError("cannot lock", lock_path);
  const std::string model_file = absl::StrCat(record_dir, "/", kTokenizerModelFile);
  if (Exists(model_file)) {  // recorded by another rank or by the run before a restart
    ASSIGN_OR_RETURN(std::string bytes, ReadRegularFile(model_file, kMaxModelBytes));
    return Tokenizer::FromSentencePiece(std::move(bytes), model_file);
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const Tokenizer> t, TrainSentencePiece(documents, options));
  RETURN_IF_ERROR(record(*t));
  return t;
}

}  // namespace loom::data
