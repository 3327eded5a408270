// ZeroProvider, stage-3 fetching: all-gathers, persistence, the prefetch trace, reuse-distance
// release and read-ahead hints to a PartitionSource (zero_provider.h).
#include <ATen/ATen.h>

#include <algorithm>

#include "worker/engine/zero/zero_common.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {

using zero_internal::Bytes;
using zero_internal::ThrowIfError;
using zero_internal::Wire;

std::map<size_t, ZeroProvider::Live>::iterator ZeroProvider::StartGather(size_t i) {
  const ZeroParam& p = params_[i];
  const int64_t n_ranks = collectives_->world_size();
  Live l;
  if (gather_views_shard_) {  // one rank, fp32: the shard is the whole parameter (p = n)
    l.full = p.shard.narrow(0, 0, p.numel).view(p.spec.shape);
    l.view = true;
    return live_.emplace(i, std::move(l)).first;
  }
  l.kind = p.persistent ? MemoryKind::kParams : MemoryKind::kBuffers;
  if (p.persistent) {  // kept for the whole step: counted as a parameter, not pooled
    l.buffer = at::empty({n_ranks * p.slice.partition_numel}, p.shard.options());
    memory_.Acquire(l.kind, Bytes(l.buffer));
  } else {  // the pool counts it (kBuffers in use, kCached idle)
    l.buffer = pool_.Get(n_ranks * p.slice.partition_numel, p.shard.scalar_type());
  }
  at::Tensor out = Wire(l.buffer);
  if (sources_partitions()) {  // offload_param: read the partition from its file
    l.input = options_.partition_source->Fetch(i);
    if (l.input.scalar_type() != p.shard.scalar_type()) l.input = l.input.to(p.shard.scalar_type());
    memory_.Acquire(MemoryKind::kBuffers, Bytes(l.input));  // released in Free
  } else {
    l.input = p.shard;
  }
  l.pending = collectives_->StartAllGather(Wire(l.input), out);
  l.full = l.buffer.narrow(0, 0, p.numel).view(p.spec.shape);
  if (!p.persistent) live_elems_ += p.numel;
  return live_.emplace(i, std::move(l)).first;
}

void ZeroProvider::Free(std::map<size_t, Live>::iterator it) {
  Live& l = it->second;
  if (l.prefetched_unused) prefetch_elems_ -= params_[it->first].numel;
  if (l.view) {  // nothing was allocated, counted or sent
    live_.erase(it);
    return;
  }
  absl::Status s = absl::OkStatus();
  if (l.pending) s = l.pending->Wait();
  const bool pooled = !params_[it->first].persistent;
  if (pooled) {
    live_elems_ -= params_[it->first].numel;
  } else {
    memory_.Release(l.kind, Bytes(l.buffer));
  }
  if (sources_partitions()) memory_.Release(MemoryKind::kBuffers, Bytes(l.input));
  at::Tensor buffer = std::move(l.buffer);
  live_.erase(it);  // drops the views (full) and the fetched input
  if (pooled) pool_.Put(std::move(buffer));
  ThrowIfError(s);
}

bool ZeroProvider::ReusedSoon(size_t i) const {
  int64_t distance = 0;
  for (size_t k = trace_pos_; k < trace_.size(); ++k) {
    if (trace_[k] == i) return true;
    distance += params_[trace_[k]].numel;
    if (distance > options_.max_reuse_distance) return false;
  }
  return false;
}

void ZeroProvider::IssuePrefetches() {
  if (options_.prefetch_bucket_size <= 0) return;
  size_t k = std::max(prefetch_pos_, trace_pos_);
  // File reads (offload_param nvme) of the partitions about to be gathered and of those after
  // them, as far as the read buffers go: they run in parallel with each other and with compute.
  auto read_ahead = [&](size_t from) {
    if (!sources_partitions()) return;
    for (size_t r = std::max(from, read_ahead_pos_); r < trace_.size(); ++r) {
      if (live_.count(trace_[r]) == 0 && !options_.partition_source->ReadAhead(trace_[r])) break;
      read_ahead_pos_ = r + 1;
    }
  };
  read_ahead(k);
  for (; k < trace_.size(); ++k) {
    const size_t j = trace_[k];
    auto live = live_.find(j);
    if (live != live_.end()) {
      // Persistent, prefetched or kept for reuse: it stays gathered until that use.
      if (params_[j].persistent || live->second.uses == 0) continue;
      // In use right now, and may be released before this later use: resume the scan here
      // after the release (then it is gathered again, or kept for reuse).
      break;
    }
    const ZeroParam& q = params_[j];
    if (prefetch_elems_ + q.numel > options_.prefetch_bucket_size) break;
    if (!q.persistent && live_elems_ + q.numel > options_.max_live_parameters) break;
    auto it = StartGather(j);
    it->second.prefetched_unused = true;
    prefetch_elems_ += q.numel;
  }
  prefetch_pos_ = k;
  read_ahead(k);  // refill the read buffers the gathers just took
}

void ZeroProvider::InvalidateTrace() {
  ++trace_invalidations_;
  // Every rank started the same prefetches (same trace, same order), so waiting for them all
  // keeps the collective sequences matched; the unused ones are dropped.
  for (auto it = live_.begin(); it != live_.end();) {
    auto next = std::next(it);
    if (it->second.prefetched_unused) Free(it);
    it = next;
  }
  trace_mode_ = TraceMode::kOff;
  trace_.clear();
  recording_.clear();
}

const at::Tensor& ZeroProvider::Acquire(ParamId i) {
  if (master_fence_) master_fence_(i);
  ZeroParam& p = params_[i];
  if (options_.stage < 3) {
    if (replicas_pending_ > 0) WaitReplica(i);  // RefreshParams' gather into it (stages 1/2)
    return p.replica;
  }
  const bool traced = in_micro_step_;
  if (traced && trace_mode_ == TraceMode::kRecord) {
    recording_.push_back(i);
  } else if (traced && trace_mode_ == TraceMode::kReplay) {
    if (trace_pos_ < trace_.size() && trace_[trace_pos_] == i) {
      ++trace_pos_;
    } else {
      InvalidateTrace();
    }
  }
  auto it = live_.find(i);
  if (it == live_.end()) {
    it = StartGather(i);
    ++on_demand_fetches_;
  }
  Live& l = it->second;
  if (l.pending) {
    absl::Status s = l.pending->Wait();
    l.pending.reset();
    ThrowIfError(s);
  }
  if (l.prefetched_unused) {
    l.prefetched_unused = false;
    prefetch_elems_ -= p.numel;
    ++prefetch_hits_;
  }
  ++l.uses;
  if (traced && trace_mode_ == TraceMode::kReplay) IssuePrefetches();
  return l.full;
}

void ZeroProvider::Release(ParamId i) {
  if (options_.stage < 3) return;
  auto it = live_.find(i);
  if (it == live_.end()) return;
  if (--it->second.uses > 0) return;
  if (params_[i].persistent) return;
  if (in_micro_step_ && trace_mode_ == TraceMode::kReplay && ReusedSoon(i)) return;
  Free(it);
}

void ZeroProvider::FreeGathered() {
  if (trace_mode_ == TraceMode::kReplay && trace_pos_ != trace_.size()) InvalidateTrace();
  for (auto it = live_.begin(); it != live_.end();) {
    auto next = std::next(it);
    if (!params_[it->first].persistent) {
      Free(it);
    } else if (it->second.pending) {  // the optimizer must not touch a shard still being sent
      absl::Status s = it->second.pending->Wait();
      it->second.pending.reset();
      ThrowIfError(s);
    }
    it = next;
  }
}

}  // namespace loom::engine
