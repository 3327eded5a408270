#include "worker/engine/offload/nvme_swapper.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "storage/checkpoint/shard_format.h"

namespace loom::engine::offload {

namespace {

int64_t RoundUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

}  // namespace

struct NvmeSwapper::Ring {
  io_uring ring;
  int inflight = 0;
  ~Ring() { io_uring_queue_exit(&ring); }
};

struct NvmeSwapper::Stream {
  std::string name, path;
  int fd = -1;
  bool direct = false;
  int64_t stride = 0;
  std::vector<int64_t> record_bytes;
  std::vector<uint64_t> checksums;
  std::vector<bool> written;
};

struct NvmeSwapper::Op {
  enum class State { kFree, kHeld, kReading, kRead, kWriting };
  State state = State::kFree;
  int stream = -1;
  int64_t record = -1;
  struct Chunk {
    int64_t offset = 0;  // within the record
    int64_t length = 0;  // remaining
    bool submitted_direct = false;
  };
  std::vector<Chunk> chunks;
  std::deque<int> pending;  // chunk indices waiting for a submission slot
  int remaining = 0;        // chunks not yet complete
  absl::Status error;
};

NvmeSwapper::NvmeSwapper(const NvmeSwapperOptions& options) : options_(options) {}

uint64_t NvmeSwapper::Checksum(const void* data, int64_t bytes) {
  // zlib's CRC-32, as for checkpoint shards (storage/checkpoint/shard_format.h), seeded with the
  // length so that a truncated record of zeros differs too.
  const uint64_t n = static_cast<uint64_t>(bytes);
  const uint32_t crc = storage::Crc32(storage::Crc32(0, &n, sizeof(n)), data, static_cast<size_t>(bytes));
  return (n << 32) ^ crc;
}

absl::StatusOr<std::unique_ptr<NvmeSwapper>> NvmeSwapper::Create(
    const NvmeSwapperOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("nvme_path: must not be empty");
  if (options.buffer_count < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer_count: ", options.buffer_count, " must be at least 1"));
  }
  if (options.buffer_bytes < kAlignment || options.buffer_bytes % kAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "buffer_size: ", options.buffer_bytes, " bytes is not a positive multiple of 4096"));
  }
  if (options.chunk_bytes < kAlignment || options.chunk_bytes % kAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size: ", options.chunk_bytes, " is not a multiple of 4096"));
  }
  if (options.queue_depth < 1) {
    return absl::InvalidArgumentError("queue_depth: must be at least 1");
  }
  std::unique_ptr<NvmeSwapper> s(new NvmeSwapper(options));
  RETURN_IF_ERROR(MakeDirs(options.dir));
  s->ring_ = std::make_unique<Ring>();
  int rc = io_uring_queue_init(static_cast<unsigned>(options.queue_depth), &s->ring_->ring, 0);
  if (rc < 0) {
    s->ring_.release();  // not initialised: do not call io_uring_queue_exit
    return ErrnoToStatus(-rc, absl::StrCat("io_uring_queue_init for ", options.dir));
  }
  for (int64_t i = 0; i < options.buffer_count; ++i) {
    void* mem = nullptr;
    if (posix_memalign(&mem, kAlignment, options.buffer_bytes) != 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "nvme swapper: cannot allocate buffer ", i, " of ", options.buffer_bytes, " bytes"));
    }
    s->buffers_.push_back(static_cast<char*>(mem));
    s->free_.push_back(static_cast<int>(options.buffer_count - 1 - i));
  }
  s->ops_.resize(options.buffer_count);
  return s;
}

NvmeSwapper::~NvmeSwapper() {
  if (ring_ != nullptr) {
    absl::Status st = Flush();
    if (!st.ok()) LOG(WARNING) << "nvme swapper: " << st;
  }
  for (Stream& s : streams_) {
    if (s.fd >= 0) ::close(s.fd);
    ::unlink(s.path.c_str());
  }
  for (char* b : buffers_) std::free(b);
}

absl::Status NvmeSwapper::Reopen(Stream& s) {
  LOG(WARNING) << "nvme swapper: O_DIRECT is not supported for " << s.path
               << " (EINVAL); using buffered I/O";
  int fd = ::open(s.path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", s.path));
  ::close(s.fd);
  s.fd = fd;
  s.direct = false;
  return absl::OkStatus();
}

absl::StatusOr<int> NvmeSwapper::AddStream(const std::string& name,
                                           const std::vector<int64_t>& record_bytes) {
  Stream s;
  s.name = name;
  s.path = absl::StrCat(options_.dir, "/", name, ".swp");
  for (int64_t b : record_bytes) {
    if (b < 0) return absl::InvalidArgumentError(absl::StrCat(s.path, ": negative record size"));
    s.stride = std::max(s.stride, RoundUp(b, kAlignment));
  }
  if (s.stride > options_.buffer_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        s.path, ": a record of ", s.stride, " bytes does not fit a buffer of buffer_size ",
        options_.buffer_bytes, " bytes"));
  }
  s.record_bytes = record_bytes;
  s.checksums.assign(record_bytes.size(), 0);
  s.written.assign(record_bytes.size(), false);
  const int flags = O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC;
  if (options_.direct_io) {
    s.fd = ::open(s.path.c_str(), flags | O_DIRECT, 0600);
    if (s.fd >= 0) {
      s.direct = true;
    } else if (errno == EINVAL) {
      LOG(WARNING) << "nvme swapper: O_DIRECT is not supported for " << s.path
                   << " (EINVAL); using buffered I/O";
    } else {
      return ErrnoToStatus(errno, absl::StrCat("open ", s.path));
    }
  }
  if (s.fd < 0) {
    s.fd = ::open(s.path.c_str(), flags, 0600);
    if (s.fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", s.path));
  }
  const int64_t size = s.stride * static_cast<int64_t>(record_bytes.size());
  if (::ftruncate(s.fd, size) != 0) {
    const int err = errno;
    ::close(s.fd);
    return ErrnoToStatus(err, absl::StrCat("ftruncate ", s.path, " to ", size, " bytes"));
  }
  streams_.push_back(std::move(s));
  return static_cast<int>(streams_.size() - 1);
}

char* NvmeSwapper::data(int buffer) const { return buffers_[buffer]; }
int64_t NvmeSwapper::record_bytes(int stream, int64_t record) const {
  return streams_[stream].record_bytes[record];
}
int64_t NvmeSwapper::num_records(int stream) const {
  return static_cast<int64_t>(streams_[stream].record_bytes.size());
}
std::string NvmeSwapper::path(int stream) const { return streams_[stream].path; }
bool NvmeSwapper::direct_io(int stream) const { return streams_[stream].direct; }

absl::StatusOr<int> NvmeSwapper::Acquire() {
  if (!deferred_write_error_.ok()) return deferred_write_error_;
  while (free_.empty()) {
    if (writes_in_flight_.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "nvme swapper (", options_.dir, "): all ", options_.buffer_count,
          " buffers are in use (raise buffer_count)"));
    }
    RETURN_IF_ERROR(Drive(writes_in_flight_.front()));
    if (!deferred_write_error_.ok()) return deferred_write_error_;
  }
  const int b = free_.back();
  free_.pop_back();
  ops_[b] = Op();
  ops_[b].state = Op::State::kHeld;
  return b;
}

void NvmeSwapper::Release(int buffer) {
  Op& op = ops_[buffer];
  if (op.state == Op::State::kHeld || op.state == Op::State::kRead) {
    op.state = Op::State::kFree;
    free_.push_back(buffer);
  }
}

absl::Status NvmeSwapper::Submit(int buffer, bool write, int stream, int64_t record) {
  if (stream < 0 || stream >= static_cast<int>(streams_.size()) || record < 0 ||
      record >= num_records(stream)) {
    return absl::InvalidArgumentError(
        absl::StrCat("nvme swapper: no record ", record, " in stream ", stream));
  }
  Op& op = ops_[buffer];
  if (op.state != Op::State::kHeld && op.state != Op::State::kRead) {
    return absl::FailedPreconditionError(
        absl::StrCat("nvme swapper: buffer ", buffer, " is not held by the caller"));
  }
  const Stream& s = streams_[stream];
  const int64_t bytes = RoundUp(s.record_bytes[record], kAlignment);
  op.stream = stream;
  op.record = record;
  op.error = absl::OkStatus();
  op.chunks.clear();
  op.pending.clear();
  for (int64_t off = 0; off < bytes; off += options_.chunk_bytes) {
    op.chunks.push_back({off, std::min(options_.chunk_bytes, bytes - off), false});
    op.pending.push_back(static_cast<int>(op.chunks.size() - 1));
  }
  op.remaining = static_cast<int>(op.chunks.size());
  op.state = write ? Op::State::kWriting : Op::State::kReading;
  if (op.remaining == 0) {  // empty record
    if (write) {
      op.state = Op::State::kFree;
      free_.push_back(buffer);
    } else {
      op.state = Op::State::kRead;
    }
    return absl::OkStatus();
  }
  if (write) writes_in_flight_.push_back(buffer);
  // Start as much as the ring takes now; the rest is submitted by later Drive calls.
  return Drive(-2);
}

absl::Status NvmeSwapper::ReadAsync(int stream, int64_t record, int buffer) {
  if (!deferred_write_error_.ok()) return deferred_write_error_;
  return Submit(buffer, /*write=*/false, stream, record);
}

absl::Status NvmeSwapper::WriteAsync(int stream, int64_t record, int buffer) {
  if (!deferred_write_error_.ok()) return deferred_write_error_;
  if (stream >= 0 && stream < static_cast<int>(streams_.size()) && record >= 0 &&
      record < num_records(stream)) {
    Stream& s = streams_[stream];
    s.checksums[record] =
        options_.verify_checksums ? Checksum(buffers_[buffer], s.record_bytes[record]) : 0;
    s.written[record] = true;
  }
  return Submit(buffer, /*write=*/true, stream, record);
}

absl::Status NvmeSwapper::WaitRead(int buffer) {
  Op& op = ops_[buffer];
  if (op.state == Op::State::kReading) RETURN_IF_ERROR(Drive(buffer));
  if (!op.error.ok()) return op.error;
  if (op.state != Op::State::kRead) {
    return absl::FailedPreconditionError(
        absl::StrCat("nvme swapper: buffer ", buffer, " has no read in flight"));
  }
  const Stream& s = streams_[op.stream];
  if (options_.verify_checksums && s.written[op.record]) {
    const uint64_t got = Checksum(buffers_[buffer], s.record_bytes[op.record]);
    if (got != s.checksums[op.record]) {
      return absl::DataLossError(absl::StrCat(
          s.path, ": record ", op.record, " (", s.record_bytes[op.record], " bytes at offset ",
          op.record * s.stride, ") is corrupt: checksum mismatch"));
    }
  }
  return absl::OkStatus();
}

absl::Status NvmeSwapper::Flush() {
  RETURN_IF_ERROR(Drive(-1));
  return deferred_write_error_;
}

absl::Status NvmeSwapper::Write(int stream, int64_t record, const void* src, int64_t bytes) {
  ASSIGN_OR_RETURN(int b, Acquire());
  std::memcpy(buffers_[b], src, bytes);
  RETURN_IF_ERROR(WriteAsync(stream, record, b));
  return Flush();
}

absl::Status NvmeSwapper::Read(int stream, int64_t record, void* dst, int64_t bytes) {
  ASSIGN_OR_RETURN(int b, Acquire());
  absl::Status st = ReadAsync(stream, record, b);
  if (st.ok()) st = WaitRead(b);
  if (st.ok()) std::memcpy(dst, buffers_[b], bytes);
  Release(b);
  return st;
}

// buffer >= 0: until that op is complete; -1: until nothing is in flight; -2: submit only.
absl::Status NvmeSwapper::Drive(int buffer) {
  io_uring* ring = &ring_->ring;
  while (true) {
    // Submit queued chunks of every op in buffer order while the ring has room.
    bool queued = false;
    for (size_t b = 0; b < ops_.size(); ++b) {
      Op& op = ops_[b];
      while (!op.pending.empty() && ring_->inflight < options_.queue_depth) {
        io_uring_sqe* sqe = io_uring_get_sqe(ring);
        if (sqe == nullptr) break;
        const int c = op.pending.front();
        op.pending.pop_front();
        Op::Chunk& ch = op.chunks[c];
        Stream& s = streams_[op.stream];
        const int64_t file_off = op.record * s.stride + ch.offset;
        char* mem = buffers_[b] + ch.offset;
        if (op.state == Op::State::kWriting) {
          io_uring_prep_write(sqe, s.fd, mem, static_cast<unsigned>(ch.length), file_off);
        } else {
          io_uring_prep_read(sqe, s.fd, mem, static_cast<unsigned>(ch.length), file_off);
        }
        ch.submitted_direct = s.direct;
        io_uring_sqe_set_data64(sqe, (static_cast<uint64_t>(b) << 32) | static_cast<uint32_t>(c));
        ++ring_->inflight;
        queued = true;
      }
      queued = queued || !op.pending.empty();
    }
    if (io_uring_sq_ready(ring) > 0) {
      const int rc = io_uring_submit(ring);
      if (rc < 0) return ErrnoToStatus(-rc, absl::StrCat("io_uring_submit (", options_.dir, ")"));
    }
    if (buffer == -2) return absl::OkStatus();
    if (buffer >= 0) {
      const Op::State st = ops_[buffer].state;
      if (st != Op::State::kReading && st != Op::State::kWriting) return absl::OkStatus();
    } else if (ring_->inflight == 0 && !queued) {
      return absl::OkStatus();
    }
    if (ring_->inflight == 0) continue;  // only queued chunks left: submit them
    RETURN_IF_ERROR(ReapOne());
  }
}

absl::Status NvmeSwapper::ReapOne() {
  io_uring* ring = &ring_->ring;
  io_uring_cqe* cqe = nullptr;
  int rc;
  do {
    rc = io_uring_wait_cqe(ring, &cqe);
  } while (rc == -EINTR);
  if (rc < 0) return ErrnoToStatus(-rc, absl::StrCat("io_uring_wait_cqe (", options_.dir, ")"));
  const uint64_t tag = io_uring_cqe_get_data64(cqe);
  const int res = cqe->res;
  io_uring_cqe_seen(ring, cqe);
  --ring_->inflight;
  const int b = static_cast<int>(tag >> 32);
  const int c = static_cast<int>(tag & 0xffffffffu);
  Op& op = ops_[b];
  Op::Chunk& ch = op.chunks[c];
  Stream& s = streams_[op.stream];
  const bool write = op.state == Op::State::kWriting;
  const char* verb = write ? "write" : "read";
  if (res == -EINVAL && ch.submitted_direct) {
    if (s.direct) RETURN_IF_ERROR(Reopen(s));
    op.pending.push_front(c);  // retry buffered
    return absl::OkStatus();
  }
  if (res == -EAGAIN || res == -EINTR) {
    op.pending.push_front(c);
    return absl::OkStatus();
  }
  auto drop_pending = [&] {  // after an error the op's unsent chunks are not sent
    op.remaining -= static_cast<int>(op.pending.size());
    op.pending.clear();
  };
  if (res < 0) {
    drop_pending();
    if (op.error.ok()) {
      op.error = ErrnoToStatus(-res, absl::StrCat(verb, " ", s.path, " record ", op.record,
                                               " at offset ", op.record * s.stride + ch.offset));
    }
  } else if (res == 0 || (res < ch.length && ch.submitted_direct && !write)) {
    drop_pending();
    if (op.error.ok()) {
      op.error = absl::DataLossError(absl::StrCat(
          s.path, ": short file: record ", op.record, " needs bytes up to offset ",
          op.record * s.stride + RoundUp(s.record_bytes[op.record], kAlignment), ", ", verb,
          " at offset ", op.record * s.stride + ch.offset, " returned ", res, " of ", ch.length,
          " bytes"));
    }
  } else if (res < ch.length) {  // short transfer: continue with the rest
    ch.offset += res;
    ch.length -= res;
    (write ? bytes_written_ : bytes_read_) += res;
    op.pending.push_front(c);
    return absl::OkStatus();
  } else {
    (write ? bytes_written_ : bytes_read_) += res;
  }
  if (--op.remaining > 0) return absl::OkStatus();
  return FinishOp(b);
}

absl::Status NvmeSwapper::FinishOp(int b) {
  Op& op = ops_[b];
  if (op.state == Op::State::kWriting) {
    for (auto it = writes_in_flight_.begin(); it != writes_in_flight_.end(); ++it) {
      if (*it == b) {
        writes_in_flight_.erase(it);
        break;
      }
    }
    if (!op.error.ok() && deferred_write_error_.ok()) deferred_write_error_ = op.error;
    op.state = Op::State::kFree;
    free_.push_back(b);
  } else {
    op.state = Op::State::kRead;
  }
  return absl::OkStatus();
}

}  // namespace loom::engine::offload
