#include "data/token_stream.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace loom::data {

namespace {

inline int64_t Load(const uint8_t* p, int width) {
  if (width == 2) {
    return static_cast<int64_t>(p[0]) | (static_cast<int64_t>(p[1]) << 8);
  }
  return static_cast<int64_t>(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                              (static_cast<uint32_t>(p[2]) << 16) |
                              (static_cast<uint32_t>(p[3]) << 24));
}

}  // namespace

TokenStream::TokenStream(std::vector<int32_t> tokens) {
  auto owned = std::make_shared<const std::vector<int32_t>>(std::move(tokens));
  Segment s;
  s.data = reinterpret_cast<const uint8_t*>(owned->data());
  s.count = static_cast<int64_t>(owned->size());
  s.width = 4;  // host order; every Loom host is little-endian (x86_64, aarch64)
  s.keepalive = owned;
  *this = TokenStream(std::vector<Segment>{std::move(s)});
}

TokenStream::TokenStream(std::vector<Segment> segments) {
  for (Segment& s : segments) {
    if (s.count == 0) continue;
    starts_.push_back(size_);
    size_ += s.count;
    segments_.push_back(std::move(s));
  }
}

size_t TokenStream::SegmentOf(int64_t i) const {
  auto it = std::upper_bound(starts_.begin(), starts_.end(), i);
  return static_cast<size_t>(it - starts_.begin()) - 1;
}

int64_t TokenStream::operator[](int64_t i) const {
  const size_t k = SegmentOf(i);
  const Segment& s = segments_[k];
  return Load(s.data + (i - starts_[k]) * s.width, s.width);
}

void TokenStream::Copy(int64_t start, int64_t n, int64_t* dst) const {
  while (n > 0) {
    if (start >= size_) {  // past the end: zeros (see the header)
      std::fill(dst, dst + n, 0);
      return;
    }
    const size_t k = SegmentOf(start);
    const Segment& s = segments_[k];
    const int64_t off = start - starts_[k];
    const int64_t take = std::min(n, s.count - off);
    const uint8_t* p = s.data + off * s.width;
    for (int64_t j = 0; j < take; ++j) dst[j] = Load(p + j * s.width, s.width);
    dst += take;
    start += take;
    n -= take;
  }
}

std::vector<int64_t> TokenStream::Slice(int64_t start, int64_t n) const {
  std::vector<int64_t> out(static_cast<size_t>(n));
  Copy(start, n, out.data());
  return out;
}

TokenStream TokenStream::Sub(int64_t begin, int64_t end) const {
  std::vector<Segment> out;
  for (size_t k = 0; k < segments_.size(); ++k) {
    const int64_t lo = std::max(begin, starts_[k]);
    const int64_t hi = std::min(end, starts_[k] + segments_[k].count);
    if (lo >= hi) continue;
    Segment s = segments_[k];
    const int64_t skip = lo - starts_[k];
    s.data += skip * s.width;
    s.file_offset += skip * s.width;
    s.count = hi - lo;
    out.push_back(std::move(s));
  }
  return TokenStream(std::move(out));
}

std::string TokenStream::Locate(int64_t i) const {
  const size_t k = SegmentOf(i);
  const Segment& s = segments_[k];
  if (s.file.empty()) return absl::StrCat("token ", i);
  return absl::StrCat(s.file, " byte offset ", s.file_offset + (i - starts_[k]) * s.width);
}

bool operator==(const TokenStream& a, const TokenStream& b) {
  if (a.size_ != b.size_) return false;
  for (int64_t i = 0; i < a.size_; ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

}  // namespace loom::data
