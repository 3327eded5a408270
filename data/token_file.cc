#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace loom::data {

namespace {

struct Mapping {
  void* addr = nullptr;
  size_t length = 0;
  ~Mapping() {
    if (addr != nullptr) ::munmap(addr, length);
  }
};

absl::StatusOr<TokenStream::Segment> MapOne(const std::string& file, int width) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ErrnoError("dataset.path: cannot open", file);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError("dataset.path: cannot stat", file);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset.path: ", file, " is not a regular file"));
  }
  if (st.st_size % width != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.path: ", file, ": size ", st.st_size,
        " bytes is not a multiple of the token width ", width, " (uint", width * 8,
        "); the last token starts at byte offset ", st.st_size - st.st_size % width));
  }
  TokenStream::Segment s;
  s.file = file;
  s.width = width;
  s.count = st.st_size / width;
  if (s.count == 0) return s;
  auto m = std::make_shared<Mapping>();
  m->length = static_cast<size_t>(st.st_size);
  m->addr = ::mmap(nullptr, m->length, PROT_READ, MAP_SHARED, fd, 0);
  if (m->addr == MAP_FAILED) {
    m->addr = nullptr;
    return ErrnoError("dataset.path: cannot mmap", file);
  }
  ::madvise(m->addr, m->length, MADV_RANDOM);  // windows are sampled at random offsets
  s.data = static_cast<const uint8_t*>(m->addr);
  s.keepalive = std::move(m);
  return s;
}

}  // namespace

absl::StatusOr<int> TokenWidthFromDtype(absl::string_view dtype) {
  if (dtype == "uint16") return 2;
  if (dtype == "uint32") return 4;
  return absl::InvalidArgumentError(
      absl::StrCat("dataset.token_dtype: \"", dtype, "\" is not uint16 or uint32"));
}

absl::StatusOr<std::vector<std::string>> ListTokenFiles(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("dataset.path: ", path, " does not exist"));
  }
  if (!S_ISDIR(st.st_mode)) return std::vector<std::string>{path};
  absl::StatusOr<std::vector<std::string>> listed = ListRegularFiles(
      path, [](absl::string_view name) { return absl::EndsWith(name, ".bin"); });
  if (!listed.ok()) {
    return absl::Status(listed.status().code(),
                        absl::StrCat("dataset.path: ", listed.status().message()));
  }
  if (listed->empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset.path: ", path, " holds no .bin token files"));
  }
  return listed;
}

absl::StatusOr<TokenStream> MapTokenFiles(const std::string& path, int width) {
  ASSIGN_OR_RETURN(const std::vector<std::string> files, ListTokenFiles(path));
  std::vector<TokenStream::Segment> segments;
  for (const std::string& f : files) {
    ASSIGN_OR_RETURN(TokenStream::Segment s, MapOne(f, width));
    segments.push_back(std::move(s));
  }
  return TokenStream(std::move(segments));
}

absl::Status ValidateTokenIds(const TokenStream& stream, int64_t begin, int64_t end,
                              int64_t vocab_size) {
  constexpr int64_t kChunk = 1 << 16;
  std::vector<int64_t> buf(kChunk);
  for (int64_t at = begin; at < end; at += kChunk) {
    const int64_t n = std::min(kChunk, end - at);
    stream.Copy(at, n, buf.data());
    for (int64_t j = 0; j < n; ++j) {
      if (buf[j] >= vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("dataset.path: ", stream.Locate(at + j), ": token id ", buf[j],
                         " >= vocab_size ", vocab_size));
      }
    }
  }
  return absl::OkStatus();
}

int64_t TokenHoldoutCut(const TokenStream& stream, double holdout_fraction, int64_t eos_id) {
  const int64_t n = stream.size();
  const int64_t cut = static_cast<int64_t>(static_cast<double>(n) * (1.0 - holdout_fraction));
  if (eos_id < 0 || cut <= 0) return std::max<int64_t>(cut, 0);
  const int64_t floor = std::max<int64_t>(0, cut - (int64_t{1} << 20));
  for (int64_t i = std::min(cut, n) - 1; i >= floor; --i) {
    if (stream[i] == eos_id) return i + 1;  // the EOS ends the last training document
  }
  return cut;
}

}  // namespace loom::data
