// TokenStream: a read-only sequence of token ids, either held in memory (tokenised text) or a
// view of memory-mapped flat token files (token_file.h). Copies share the underlying storage.
// Torch-free.
//
// Thread-safety: immutable after construction; all methods are safe from any thread.
#ifndef LOOM_DATA_TOKEN_STREAM_H_
#define LOOM_DATA_TOKEN_STREAM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom::data {

class TokenStream {
 public:
  // One contiguous run of tokens: `count` little-endian unsigned ids of `width` bytes (2 or 4)
  // at `data`, kept alive by `keepalive`; `file` and `file_offset` (bytes) locate it for errors.
  struct Segment {
    std::shared_ptr<const void> keepalive;
    const uint8_t* data = nullptr;
    int width = 4;
    int64_t count = 0;
    std::string file;
    int64_t file_offset = 0;
  };

  TokenStream() = default;
  explicit TokenStream(std::vector<int32_t> tokens);          // in memory
  explicit TokenStream(std::vector<Segment> segments);        // views (empty segments dropped)

  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Token i, 0 <= i < size().
  int64_t operator[](int64_t i) const;
  // Tokens [start, start + n) into dst (n int64s). Requires 0 <= start; positions at or past
  // size() read as 0 (never out of bounds).
  void Copy(int64_t start, int64_t n, int64_t* dst) const;
  std::vector<int64_t> Slice(int64_t start, int64_t n) const;
  // Tokens [begin, end) as a stream sharing this one's storage.
  TokenStream Sub(int64_t begin, int64_t end) const;
  // Where token i lives: "<file> byte offset <b>" (or "token <i>" for in-memory tokens).
  std::string Locate(int64_t i) const;

  const std::vector<Segment>& segments() const { return segments_; }

  // Element-wise equality (for tests).
  friend bool operator==(const TokenStream& a, const TokenStream& b);

 private:
  size_t SegmentOf(int64_t i) const;  // index into segments_ holding token i
  std::vector<Segment> segments_;
  std::vector<int64_t> starts_;       // starts_[k]: stream index of segments_[k]'s first token
  int64_t size_ = 0;
};

}  // namespace loom::data

#endif  // LOOM_DATA_TOKEN_STREAM_H_
