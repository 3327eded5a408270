#include "worker/engine/offload_partition_source.h"

#include <ATen/ATen.h>

#include "common/status_macros.h"
#include "worker/engine/model/param_access.h"

namespace loom::engine {

namespace {
void Check(const absl::Status& s) {
  if (!s.ok()) throw CollectiveError(s);
}
}  // namespace

absl::Status OffloadPartitionSource::OnParamBuilt(ParamId i, ZeroParam& p) {
  RETURN_IF_ERROR(offload_->InitParam(i, p.master.data_ptr<float>()));
  if (params_nvme_) {
    // The partition lives on file: master and shard become stride-0 placeholders of [p].
    at::Tensor ph = at::empty_strided({p.slice.partition_numel}, {0}, at::kFloat).zero_();
    p.master = ph;
    p.shard_offloaded = true;
    p.shard = p.shard.scalar_type() == at::kFloat
                  ? ph
                  : at::empty_strided({p.slice.partition_numel}, {0}, p.shard.options()).zero_();
  }
  return absl::OkStatus();
}

at::Tensor OffloadPartitionSource::Fetch(ParamId i) {
  at::Tensor t = at::empty({numels_[i]}, at::kFloat);
  auto it = read_ahead_.find(i);
  if (it != read_ahead_.end()) {  // started by ReadAhead: usually complete by now
    const int buffer = it->second;
    read_ahead_.erase(it);
    ++reads_ahead_;
    Check(offload_->FinishFetchParam(i, buffer, t.data_ptr<float>()));
  } else {
    Check(offload_->FetchParam(i, t.data_ptr<float>()));
  }
  return t;
}

bool OffloadPartitionSource::ReadAhead(ParamId i) {
  if (read_ahead_.count(i) != 0) return true;
  if (static_cast<int64_t>(read_ahead_.size()) + 1 >= offload_->param_buffer_count()) {
    return false;
  }
  absl::StatusOr<int> b = offload_->StartFetchParam(i);
  if (!b.ok()) return false;  // a real read error shows up in the fetch itself
  read_ahead_.emplace(i, *b);
  return true;
}

void OffloadPartitionSource::DropReadAhead() {
  for (const auto& [i, buffer] : read_ahead_) offload_->CancelFetchParam(buffer);
  read_ahead_.clear();
}

}  // namespace loom::engine
