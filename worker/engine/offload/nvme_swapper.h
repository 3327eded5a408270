// ZeRO-Infinity-style swapping of tensors between a bounded pool of aligned host buffers and
// files on an NVMe (or any) filesystem, with io_uring.
//
// Algorithm source: Rajbhandari et al., "ZeRO-Infinity: Breaking the GPU Memory Wall for
// Extreme Scale Deep Learning" (SC'21), §5 (infinity offload engine: NVMe state per rank,
// bandwidth-centric partitioning) and §6.2 (overlap-centric design: prefetch the next
// sub-group's state while the current one computes, write the previous one back); DeepSpeed's
// deepspeed/runtime/swap_tensor/{partitioned_optimizer_swapper.py,
// pipelined_optimizer_swapper.py, partitioned_param_swapper.py (AsyncPartitionedParameterSwapper),
// async_swapper.py} and csrc/aio (libaio; block_size 1 MiB, queue_depth 8).
// docs/design/TECHNIQUES.md §1.8.
//
// Layout: each *stream* (e.g. "exp_avg") is one file <dir>/<name>.swp holding a fixed number of
// *records* (one per sub-group); record i lives at offset i * stride, stride = the largest
// record rounded up to 4096 bytes, so that every transfer is 4 KiB-aligned in offset, length and
// memory (O_DIRECT's requirement). Files are sized with ftruncate at creation and deleted when
// the swapper is destroyed: they are scratch space, never a checkpoint.
//
// I/O: O_DIRECT when the filesystem accepts it; if open() or the first transfer fails with
// EINVAL the file is reopened buffered and a warning is logged. Every record transfer is split
// into chunks of `chunk_bytes`, submitted to one io_uring of `queue_depth` entries; short
// transfers are resubmitted for the remainder; end of file before a record's end is an error.
// Integrity: a CRC-32 (zlib) of each record's payload, combined with its length, is kept in memory at write time and
// verified after every read (DATA_LOSS on mismatch); a record never written reads as zeros.
// All errors name the file (and record).
//
// Buffers: `buffer_count` buffers of `buffer_bytes` bytes (4096-aligned), allocated once.
// Acquire() hands out a free one; when none is free it waits for the oldest in-flight write to
// finish and reuses its buffer. Not thread-safe: one caller thread (the optimizer step); the
// kernel performs the I/O asynchronously while that thread computes.
#ifndef LOOM_WORKER_ENGINE_OFFLOAD_NVME_SWAPPER_H_
#define LOOM_WORKER_ENGINE_OFFLOAD_NVME_SWAPPER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::engine::offload {

struct NvmeSwapperOptions {
  std::string dir;               // created if missing; files <dir>/<stream>.swp
  int64_t buffer_count = 4;      // pool size (offload_optimizer.buffer_count)
  int64_t buffer_bytes = 0;      // each buffer; >= every record's stride
  bool direct_io = true;         // try O_DIRECT first
  int queue_depth = 8;           // io_uring entries (aio.queue_depth)
  int64_t chunk_bytes = 1 << 20; // per submitted read/write (aio.block_size), multiple of 4096
  bool verify_checksums = true;
};

class NvmeSwapper {
 public:
  static constexpr int64_t kAlignment = 4096;

  // Errors: INVALID_ARGUMENT for bad options; the errno of mkdir / io_uring setup otherwise.
  static absl::StatusOr<std::unique_ptr<NvmeSwapper>> Create(const NvmeSwapperOptions& options);
  ~NvmeSwapper();  // waits for in-flight I/O, frees buffers, deletes the stream files
  NvmeSwapper(const NvmeSwapper&) = delete;
  NvmeSwapper& operator=(const NvmeSwapper&) = delete;

  // Creates the file of a stream with records of the given byte sizes. Returns its id.
  // Errors: INVALID_ARGUMENT if a record's stride exceeds buffer_bytes; the errno of
  // open/ftruncate naming the file.
  absl::StatusOr<int> AddStream(const std::string& name, const std::vector<int64_t>& record_bytes);

  // A free buffer from the pool (waits for the oldest in-flight write if none is free).
  // FAILED_PRECONDITION if every buffer is held by the caller or an unfinished read.
  absl::StatusOr<int> Acquire();
  // Returns a buffer (not in flight) to the pool.
  void Release(int buffer);
  // Buffers Acquire can hand out now without waiting for a write.
  int64_t free_buffers() const { return static_cast<int64_t>(free_.size()); }
  // The buffer's memory: buffer_bytes bytes, 4096-aligned.
  char* data(int buffer) const;
  float* floats(int buffer) const { return reinterpret_cast<float*>(data(buffer)); }

  // Starts reading record `record` of `stream` into `buffer`; WaitRead completes it.
  absl::Status ReadAsync(int stream, int64_t record, int buffer);
  // Waits for the buffer's read; verifies length and checksum. The buffer stays acquired.
  absl::Status WaitRead(int buffer);
  // Starts writing `buffer` to record `record` of `stream` (checksum taken now). The buffer
  // goes back to the pool when the write completes; the caller must not touch it afterwards.
  absl::Status WriteAsync(int stream, int64_t record, int buffer);
  // Waits until no I/O is in flight; returns the first write error, if any.
  absl::Status Flush();

  // Synchronous helpers (acquire a buffer, transfer, release).
  absl::Status Write(int stream, int64_t record, const void* src, int64_t bytes);
  absl::Status Read(int stream, int64_t record, void* dst, int64_t bytes);

  int64_t record_bytes(int stream, int64_t record) const;
  int64_t num_records(int stream) const;
  std::string path(int stream) const;
  bool direct_io(int stream) const;
  const NvmeSwapperOptions& options() const { return options_; }
  // Bytes read / written by this swapper so far.
  int64_t bytes_read() const { return bytes_read_; }
  int64_t bytes_written() const { return bytes_written_; }

  // The checksum used for records (exposed for tests).
  static uint64_t Checksum(const void* data, int64_t bytes);

 private:
  struct Stream;
  struct Op;
  struct Ring;
  explicit NvmeSwapper(const NvmeSwapperOptions& options);
  absl::Status Submit(int buffer, bool write, int stream, int64_t record);
  // Pushes queued chunks into the ring and reaps completions until op `buffer` is done
  // (buffer >= 0) or nothing is in flight (buffer < 0).
  absl::Status Drive(int buffer);
  absl::Status ReapOne();
  absl::Status FinishOp(int buffer);
  absl::Status Reopen(Stream& s);

  NvmeSwapperOptions options_;
  std::unique_ptr<Ring> ring_;
  std::vector<Stream> streams_;
  std::vector<char*> buffers_;
  std::vector<Op> ops_;              // one per buffer
  std::vector<int> free_;            // free buffer ids
  std::deque<int> writes_in_flight_; // oldest first
  int64_t bytes_read_ = 0, bytes_written_ = 0;
  absl::Status deferred_write_error_;
};

}  // namespace loom::engine::offload

#endif  // LOOM_WORKER_ENGINE_OFFLOAD_NVME_SWAPPER_H_
