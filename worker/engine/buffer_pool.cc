#include "worker/engine/buffer_pool.h"

#include <ATen/ATen.h>

namespace loom::engine {

namespace {
int64_t Bytes(const at::Tensor& t) { return static_cast<int64_t>(t.nbytes()); }
}  // namespace

BufferPool::~BufferPool() {
  // Buffers still handed out are their holders' to free; the idle ones go now.
  if (idle_bytes_ != 0) Account(0, -idle_bytes_);
}

void BufferPool::Account(int64_t in_use, int64_t idle) {
  in_use_bytes_ += in_use;
  idle_bytes_ += idle;
  if (on_bytes_) on_bytes_(in_use, idle);
}

at::Tensor BufferPool::Get(int64_t numel, at::ScalarType dtype) {
  const Key key{static_cast<int>(dtype), numel};
  auto it = idle_.find(key);
  if (it != idle_.end() && !it->second.empty()) {
    at::Tensor t = std::move(it->second.back().t);
    it->second.pop_back();
    Account(Bytes(t), -Bytes(t));
    return t;
  }
  at::Tensor t = at::empty({numel}, at::TensorOptions().dtype(dtype));
  Account(Bytes(t), 0);
  return t;
}

void BufferPool::Put(at::Tensor t) {
  if (!t.defined()) return;
  if (t.storage().use_count() > 1 || !t.is_contiguous() || t.storage_offset() != 0) {
    Account(-Bytes(t), 0);  // someone else keeps it: it leaves the pool
    return;
  }
  const Key key{static_cast<int>(t.scalar_type()), t.numel()};
  Account(-Bytes(t), Bytes(t));
  idle_[key].push_back(Idle{std::move(t), true});
}

void BufferPool::Trim() {
  for (auto it = idle_.begin(); it != idle_.end();) {
    std::vector<Idle> keep;
    for (Idle& b : it->second) {
      if (b.used) {
        b.used = false;
        keep.push_back(std::move(b));
      } else {
        Account(0, -Bytes(b.t));
      }
    }
    it->second = std::move(keep);
    it = it->second.empty() ? idle_.erase(it) : std::next(it);
  }
}

}  // namespace loom::engine
