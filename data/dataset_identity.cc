#include "data/dataset_identity.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "data/dataset_error.h"

namespace loom::data {

namespace {

using nlohmann::json;

constexpr int kManifestVersion = 1;
// A manifest lists a file per corpus file; 64 MiB is far beyond any real directory.
constexpr int64_t kMaxManifestBytes = int64_t{64} << 20;
constexpr size_t kReadBytes = size_t{1} << 20;
constexpr size_t kChangesShown = 3;

std::string ShortHash(const std::string& hex) { return absl::StrCat(hex.substr(0, 16), ".."); }

std::string Rfc3339(int64_t ns) {
  return absl::FormatTime(absl::RFC3339_full, absl::FromUnixNanos(ns), absl::UTCTimeZone());
}

std::string Key(const DatasetFileIdentity& f) { return absl::StrCat(f.field, "\n", f.path); }

}  // namespace

int64_t DatasetIdentity::total_bytes() const {
  int64_t n = 0;
  for (const DatasetFileIdentity& f : files) n += f.size_bytes;
  return n;
}

absl::StatusOr<std::string> Sha256OfFile(const std::string& path, int64_t* size_bytes) {
  // O_NONBLOCK: a FIFO named as the data set must not block the start (it is refused below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoError("cannot open", path);
  ScopedFd closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError("cannot stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  }
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (ctx == nullptr || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return absl::InternalError("libcrypto: cannot start a SHA-256 digest");
  }
  std::unique_ptr<char[]> buf(new char[kReadBytes]);
  int64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.get(), kReadBytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("cannot read", path);
    if (n == 0) break;
    if (EVP_DigestUpdate(ctx.get(), buf.get(), static_cast<size_t>(n)) != 1) {
      return absl::InternalError("libcrypto: SHA-256 update failed");
    }
    total += n;
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_len = 0;
  if (EVP_DigestFinal_ex(ctx.get(), digest, &digest_len) != 1) {
    return absl::InternalError("libcrypto: SHA-256 final failed");
  }
  if (total != st.st_size) {
    return absl::InternalError(absl::StrCat(path, ": its size changed while it was hashed (",
                                            st.st_size, " bytes at open, ", total, " read)"));
  }
  if (size_bytes != nullptr) *size_bytes = total;
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), digest_len));
}

namespace {

absl::StatusOr<DatasetFileIdentity> IdentifyFile(const std::string& field,
                                                 const std::string& path) {
  DatasetFileIdentity f;
  f.field = field;
  f.path = path;
  absl::StatusOr<std::string> sha = Sha256OfFile(path, &f.size_bytes);
  if (!sha.ok()) {
    return absl::Status(sha.status().code(), absl::StrCat(field, ": ", sha.status().message()));
  }
  f.sha256 = *std::move(sha);
  // The modification time after the read: what a later start compares with.
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoError(absl::StrCat(field, ": cannot stat"), path);
  f.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  return f;
}

}  // namespace

absl::StatusOr<DatasetIdentity> ComputeDatasetIdentity(const CorpusOptions& options) {
  DatasetIdentity id;
  id.path = options.path;
  id.format = options.format;
  ASSIGN_OR_RETURN(const std::vector<std::string> files, CorpusFiles(options));
  for (const std::string& file : files) {
    ASSIGN_OR_RETURN(DatasetFileIdentity f, IdentifyFile("dataset.path", file));
    id.files.push_back(std::move(f));
  }
  if (options.tokenizer.kind == "sentencepiece" && !options.tokenizer.model_path.empty()) {
    struct stat st;
    if (::stat(options.tokenizer.model_path.c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat("dataset.tokenizer_model: ",
                                              options.tokenizer.model_path, " does not exist"));
    }
    ASSIGN_OR_RETURN(DatasetFileIdentity f,
                     IdentifyFile("dataset.tokenizer_model", options.tokenizer.model_path));
    id.files.push_back(std::move(f));
  }
  return id;
}

std::string DatasetIdentityToJson(const DatasetIdentity& identity) {
  json files = json::array();
  for (const DatasetFileIdentity& f : identity.files) {
    files.push_back({{"field", f.field},
                     {"path", f.path},
                     {"size_bytes", f.size_bytes},
                     {"mtime_ns", f.mtime_ns},
                     {"sha256", f.sha256}});
  }
  json j = {{"version", kManifestVersion},
            {"hash", "sha256"},
            {"dataset", {{"path", identity.path}, {"format", identity.format}}},
            {"files", std::move(files)}};
  // Paths are bytes: replace what is not UTF-8 rather than throw.
  return j.dump(1, ' ', false, json::error_handler_t::replace) + "\n";
}

absl::StatusOr<DatasetIdentity> DatasetIdentityFromJson(absl::string_view text,
                                                        const std::string& source) {
  const json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", why));
  };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (!j.contains("version") || !j["version"].is_number_integer() ||
      j["version"].get<int64_t>() != kManifestVersion) {
    return bad(absl::StrCat("not a version ", kManifestVersion, " dataset identity"));
  }
  if (j.value("hash", std::string()) != "sha256") return bad("\"hash\" is not \"sha256\"");
  if (!j.contains("dataset") || !j["dataset"].is_object() || !j.contains("files") ||
      !j["files"].is_array()) {
    return bad("no \"dataset\" object or \"files\" array");
  }
  DatasetIdentity id;
  const json& d = j["dataset"];
  if (!d.contains("path") || !d["path"].is_string() || !d.contains("format") ||
      !d["format"].is_string()) {
    return bad("\"dataset\" needs string \"path\" and \"format\"");
  }
  id.path = d["path"].get<std::string>();
  id.format = d["format"].get<std::string>();
  for (const json& f : j["files"]) {
    if (!f.is_object()) return bad("a \"files\" entry is not an object");
    for (const char* key : {"field", "path", "sha256"}) {
      if (!f.contains(key) || !f[key].is_string()) {
        return bad(absl::StrCat("a \"files\" entry has no string \"", key, "\""));
      }
    }
    for (const char* key : {"size_bytes", "mtime_ns"}) {
      if (!f.contains(key) || !f[key].is_number_integer()) {
        return bad(absl::StrCat("a \"files\" entry has no integer \"", key, "\""));
      }
    }
    DatasetFileIdentity e;
    e.field = f["field"].get<std::string>();
    e.path = f["path"].get<std::string>();
    e.sha256 = f["sha256"].get<std::string>();
    e.size_bytes = f["size_bytes"].get<int64_t>();
    e.mtime_ns = f["mtime_ns"].get<int64_t>();
    if (e.sha256.size() != 64) return bad(absl::StrCat(e.path, ": \"sha256\" is not 64 hex digits"));
    id.files.push_back(std::move(e));
  }
  return id;
}

absl::Status CompareDatasetIdentity(const DatasetIdentity& recorded,
                                    const DatasetIdentity& current,
                                    const std::string& manifest_path,
                                    std::vector<std::string>* notes) {
  std::vector<std::string> changes;
  if (recorded.path != current.path || recorded.format != current.format) {
    changes.push_back(absl::StrCat("dataset.path: the job first started on ", recorded.path,
                                   " (format \"", recorded.format, "\"), this start names ",
                                   current.path, " (format \"", current.format, "\")"));
  }
  std::map<std::string, const DatasetFileIdentity*> now;
  for (const DatasetFileIdentity& f : current.files) now[Key(f)] = &f;
  std::map<std::string, const DatasetFileIdentity*> then;
  for (const DatasetFileIdentity& f : recorded.files) then[Key(f)] = &f;
  for (const DatasetFileIdentity& r : recorded.files) {
    auto it = now.find(Key(r));
    if (it == now.end()) {
      changes.push_back(absl::StrCat(r.field, ": ", r.path,
                                     " was removed since the job first started (it had ",
                                     r.size_bytes, " bytes, sha256 ", ShortHash(r.sha256), ")"));
      continue;
    }
    const DatasetFileIdentity& c = *it->second;
    const bool moved = r.mtime_ns != c.mtime_ns;
    if (r.size_bytes == c.size_bytes && r.sha256 == c.sha256) {
      if (moved && notes != nullptr) {
        notes->push_back(absl::StrCat(
            r.field, ": ", r.path, ": modification time changed since the job first started (",
            Rfc3339(r.mtime_ns), " -> ", Rfc3339(c.mtime_ns),
            ") but its size and SHA-256 are as recorded: training continues on the same data"));
      }
      continue;
    }
    std::string what = r.size_bytes == c.size_bytes
                           ? absl::StrCat("size ", r.size_bytes, " bytes (unchanged)")
                           : absl::StrCat("size ", r.size_bytes, " -> ", c.size_bytes, " bytes");
    absl::StrAppend(&what, ", sha256 ", ShortHash(r.sha256), " -> ", ShortHash(c.sha256));
    absl::StrAppend(&what, moved ? absl::StrCat(", modified ", Rfc3339(r.mtime_ns), " -> ",
                                                Rfc3339(c.mtime_ns))
                                 : ", modification time unchanged");
    changes.push_back(
        absl::StrCat(r.field, ": ", r.path, " changed since the job first started: ", what));
  }
  for (const DatasetFileIdentity& c : current.files) {
    if (then.count(Key(c)) == 0) {
      changes.push_back(absl::StrCat(c.field, ": ", c.path,
                                     " was added since the job first started (", c.size_bytes,
                                     " bytes)"));
    }
  }
  if (changes.empty()) return absl::OkStatus();
  const size_t shown = std::min(changes.size(), kChangesShown);
  std::string message = absl::StrJoin(changes.begin(), changes.begin() + shown, "; ");
  if (changes.size() > shown) {
    absl::StrAppend(&message, "; and ", changes.size() - shown, " more change(s)");
  }
  absl::StrAppend(&message, ". This job's checkpoints were trained on the data recorded in ",
                  manifest_path,
                  "; resuming on other data would not continue its training. Restore the "
                  "recorded files, or submit a new job (model.init_from can start it from an "
                  "export of this one)");
  return DatasetError(message);
}

absl::StatusOr<DatasetIdentityCheck> CheckOrRecordDatasetIdentity(const CorpusOptions& options,
                                                                  const std::string& record_dir,
                                                                  bool write, bool resuming) {
  const absl::Time t0 = absl::Now();
  const std::string manifest_path = absl::StrCat(record_dir, "/", kDatasetIdentityFile);
  absl::StatusOr<std::string> text = ReadRegularFile(manifest_path, kMaxManifestBytes);
  if (!text.ok() && text.status().code() != absl::StatusCode::kNotFound) return text.status();
  std::optional<DatasetIdentity> recorded;
  if (text.ok()) {
    absl::StatusOr<DatasetIdentity> parsed = DatasetIdentityFromJson(*text, manifest_path);
    if (!parsed.ok()) {
      return DatasetError(absl::StrCat(
          parsed.status().message(),
          ": the identity of the data this job first started on cannot be read, so the data "
          "cannot be checked; delete the file to record the data set as it is now"));
    }
    recorded = *std::move(parsed);
  }
  DatasetIdentityCheck check;
  // A first start: the rank that records does the work; the others have nothing to compare.
  if (!recorded.has_value() && !write) return check;
  absl::StatusOr<DatasetIdentity> current = ComputeDatasetIdentity(options);
  if (!current.ok()) {
    // The data set the job started on cannot be listed any more (removed, emptied, its
    // directory replaced by a file of another format...): the data changed. Other errors (a
    // permission, an I/O error) may be passing: left to the restart policy.
    const absl::StatusCode code = current.status().code();
    if (recorded.has_value() && (code == absl::StatusCode::kNotFound ||
                                 code == absl::StatusCode::kFailedPrecondition)) {
      return DatasetError(absl::StrCat(
          current.status().message(), " (the job first started on ", recorded->files.size(),
          " file(s), ", recorded->total_bytes(), " bytes, recorded in ", manifest_path,
          "): the data changed since the job first started; restore it, or submit a new job"));
    }
    return current.status();
  }
  check.identity = *std::move(current);
  if (recorded.has_value()) {
    RETURN_IF_ERROR(
        CompareDatasetIdentity(*recorded, check.identity, manifest_path, &check.warnings));
    check.verified = true;
  } else if (write) {
    RETURN_IF_ERROR(MakeDirs(record_dir));
    RETURN_IF_ERROR(WriteFileAtomically(manifest_path, DatasetIdentityToJson(check.identity)));
    check.recorded = true;
    if (resuming) {
      check.warnings.push_back(absl::StrCat(
          manifest_path, ": this job's checkpoints predate dataset identities; recorded the data "
          "set as it is now (", check.identity.files.size(), " file(s), ",
          check.identity.total_bytes(), " bytes): later restarts refuse other data, this one "
          "cannot tell whether the data changed before it"));
    }
  }
  check.elapsed = absl::Now() - t0;
  return check;
}

}  // namespace loom::data
