#include "worker/engine/offload/offload_optimizer.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace loom::engine::offload {

namespace {
int64_t RoundUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }
}  // namespace

OffloadOptimizer::OffloadOptimizer(const OffloadOptimizerOptions& options)
    : options_(options), adam_(options.adam) {}

absl::StatusOr<std::unique_ptr<OffloadOptimizer>> OffloadOptimizer::Create(
    const OffloadOptimizerOptions& options, const std::vector<int64_t>& partition_numels) {
  ASSIGN_OR_RETURN(optim::SubGroupPlan plan,
                   optim::SubGroupPlan::Create(partition_numels, options.sub_group_size));
  std::unique_ptr<OffloadOptimizer> o(new OffloadOptimizer(options));
  o->plan_.emplace(std::move(plan));
  o->numels_ = partition_numels;
  int64_t max_numel = 0;
  for (size_t i = 0; i < partition_numels.size(); ++i) {
    o->offsets_.push_back(o->plan_->partition_offset(i));
    max_numel = std::max(max_numel, partition_numels[i]);
  }
  o->total_ = o->plan_->total_numel();
  int64_t max_group = 0;
  for (const Group& g : o->plan_->sub_groups()) max_group = std::max(max_group, g.numel);

  if (options.optimizer_nvme) {
    if (options.optimizer_buffer_count < 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          "zero_optimization.offload_optimizer.buffer_count: ", options.optimizer_buffer_count,
          " is below 3 (fp32 master, exp_avg and exp_avg_sq of one sub-group)"));
    }
    if (options.pipeline_read && options.optimizer_buffer_count < 6) {
      LOG(WARNING) << "offload_optimizer.pipeline_read needs buffer_count >= 6 (two sub-groups "
                      "of 3 buffers); with "
                   << options.optimizer_buffer_count << " reads are not prefetched";
    }
    NvmeSwapperOptions so;
    so.dir = options.optimizer_dir;
    so.buffer_count = options.optimizer_buffer_count;
    so.buffer_bytes = std::max<int64_t>(NvmeSwapper::kAlignment,
                                        RoundUp(max_group * 4, NvmeSwapper::kAlignment));
    so.direct_io = options.direct_io;
    so.chunk_bytes = options.aio_block_bytes;
    so.queue_depth = options.aio_queue_depth;
    ASSIGN_OR_RETURN(o->opt_swapper_, NvmeSwapper::Create(so));
    std::vector<int64_t> bytes;
    for (const Group& g : o->plan_->sub_groups()) bytes.push_back(g.numel * 4);
    ASSIGN_OR_RETURN(o->s_master_, o->opt_swapper_->AddStream("fp32_master", bytes));
    ASSIGN_OR_RETURN(o->s_m_, o->opt_swapper_->AddStream("exp_avg", bytes));
    ASSIGN_OR_RETURN(o->s_v_, o->opt_swapper_->AddStream("exp_avg_sq", bytes));
  } else {
    o->exp_avg_.assign(o->total_, 0.f);
    o->exp_avg_sq_.assign(o->total_, 0.f);
    if (options.params_nvme) o->master_.assign(o->total_, 0.f);
  }
  if (options.params_nvme) {
    if (options.param_buffer_count < 1) {
      return absl::InvalidArgumentError(
          "zero_optimization.offload_param.buffer_count: must be at least 1");
    }
    if (options.param_buffer_elements < max_numel) {
      return absl::InvalidArgumentError(absl::StrCat(
          "zero_optimization.offload_param.buffer_size: ", options.param_buffer_elements,
          " elements is smaller than the largest parameter partition (", max_numel,
          " elements)"));
    }
    NvmeSwapperOptions so;
    so.dir = options.param_dir;
    so.buffer_count = options.param_buffer_count;
    so.buffer_bytes = std::max<int64_t>(NvmeSwapper::kAlignment,
                                        RoundUp(max_numel * 4, NvmeSwapper::kAlignment));
    so.direct_io = options.direct_io;
    so.chunk_bytes = options.aio_block_bytes;
    so.queue_depth = options.aio_queue_depth;
    ASSIGN_OR_RETURN(o->param_swapper_, NvmeSwapper::Create(so));
    std::vector<int64_t> bytes;
    for (int64_t n : partition_numels) bytes.push_back(n * 4);
    ASSIGN_OR_RETURN(o->s_param_, o->param_swapper_->AddStream("param_partitions", bytes));
  }
  return o;
}

int64_t OffloadOptimizer::resident_bytes() const {
  int64_t b = 4 * static_cast<int64_t>(master_.size() + exp_avg_.size() + exp_avg_sq_.size());
  for (const NvmeSwapper* s : {opt_swapper_.get(), param_swapper_.get()}) {
    if (s != nullptr) b += s->options().buffer_count * s->options().buffer_bytes;
  }
  return b;
}

int64_t OffloadOptimizer::nvme_bytes_read() const {
  return (opt_swapper_ ? opt_swapper_->bytes_read() : 0) +
         (param_swapper_ ? param_swapper_->bytes_read() : 0);
}
int64_t OffloadOptimizer::nvme_bytes_written() const {
  return (opt_swapper_ ? opt_swapper_->bytes_written() : 0) +
         (param_swapper_ ? param_swapper_->bytes_written() : 0);
}

absl::Status OffloadOptimizer::InitParam(size_t i, const float* values) {
  if (i >= numels_.size()) return absl::OutOfRangeError(absl::StrCat("parameter ", i));
  const int64_t n = numels_[i];
  if (options_.params_nvme) {
    RETURN_IF_ERROR(param_swapper_->Write(s_param_, static_cast<int64_t>(i), values, n * 4));
  }
  if (!options_.optimizer_nvme) {
    if (options_.params_nvme) std::memcpy(master_.data() + offsets_[i], values, n * 4);
    return absl::OkStatus();  // moments are zero already; else the model's tensor is the master
  }
  // Master records are whole sub-groups. Parameters arrive in model order, so the group being
  // filled stays in one buffer (read first: a record never written reads as zeros) and is
  // written when the next group starts or before anything else touches the files. Moments stay
  // unwritten, which reads as zeros.
  const int64_t record = plan_->sub_group_of(i);
  const Group* it = &plan_->sub_group(record);
  if (record != init_group_) {
    RETURN_IF_ERROR(FinishInit());
    ASSIGN_OR_RETURN(init_buf_, opt_swapper_->Acquire());
    init_group_ = record;
    absl::Status st = opt_swapper_->ReadAsync(s_master_, record, init_buf_);
    if (st.ok()) st = opt_swapper_->WaitRead(init_buf_);
    if (!st.ok()) {
      opt_swapper_->Release(init_buf_);
      init_buf_ = init_group_ = -1;
      return st;
    }
  }
  std::memcpy(opt_swapper_->floats(init_buf_) + (offsets_[i] - it->offset), values, n * 4);
  return absl::OkStatus();
}

absl::Status OffloadOptimizer::FinishInit() {
  if (init_buf_ < 0) return absl::OkStatus();
  const int b = init_buf_;
  const int64_t record = init_group_;
  init_buf_ = init_group_ = -1;
  RETURN_IF_ERROR(opt_swapper_->WriteAsync(s_master_, record, b));
  return opt_swapper_->Flush();
}

void OffloadOptimizer::UpdateGroup(const Group& g, int64_t t, double lr, float* master, float* m,
                                   float* v, const std::vector<const float*>& grads,
                                   CpuAdam& adam) {
  for (size_t i = g.first; i < g.last; ++i) {
    const int64_t off = offsets_[i] - g.offset;
    adam.Step(t, lr, master + off, grads[i], m + off, v + off, numels_[i]);
  }
}

absl::Status OffloadOptimizer::PublishGroup(const Group& g, const float* master,
                                            const std::vector<float*>& model_params) {
  for (size_t i = g.first; i < g.last; ++i) {
    const float* src = master + (offsets_[i] - g.offset);
    if (options_.params_nvme) {
      ASSIGN_OR_RETURN(int b, param_swapper_->Acquire());
      std::memcpy(param_swapper_->data(b), src, numels_[i] * 4);
      RETURN_IF_ERROR(param_swapper_->WriteAsync(s_param_, static_cast<int64_t>(i), b));
    } else if (model_params[i] != src) {
      std::memcpy(model_params[i], src, numels_[i] * 4);
    }
  }
  return absl::OkStatus();
}

absl::Status OffloadOptimizer::Step(int64_t t, double lr, const std::vector<float*>& model_params,
                                    const std::vector<const float*>& grads) {
  std::vector<int64_t> all(static_cast<size_t>(num_sub_groups()));
  for (size_t g = 0; g < all.size(); ++g) all[g] = static_cast<int64_t>(g);
  return StepGroups(all, t, lr, model_params, grads);
}

absl::Status OffloadOptimizer::StepGroups(const std::vector<int64_t>& groups, int64_t t,
                                          double lr, const std::vector<float*>& model_params,
                                          const std::vector<const float*>& grads) {
  RETURN_IF_ERROR(FinishInit());
  if (grads.size() != numels_.size() || model_params.size() != numels_.size()) {
    return absl::InvalidArgumentError("offload step: one gradient and parameter per partition");
  }
  for (int64_t gi : groups) {
    if (gi < 0 || gi >= num_sub_groups()) {
      return absl::OutOfRangeError(absl::StrCat("offload step: sub-group ", gi));
    }
  }
  if (!options_.optimizer_nvme) {
    for (int64_t gi : groups) {
      const Group& g = plan_->sub_group(gi);
      if (master_is_model()) {
        // The model's tensors are the master: update them in place, parameter by parameter.
        for (size_t i = g.first; i < g.last; ++i) {
          adam_.Step(t, lr, model_params[i], grads[i], exp_avg_.data() + offsets_[i],
                     exp_avg_sq_.data() + offsets_[i], numels_[i]);
        }
        continue;
      }
      float* master = master_.data() + g.offset;
      UpdateGroup(g, t, lr, master, exp_avg_.data() + g.offset, exp_avg_sq_.data() + g.offset,
                  grads, adam_);
      RETURN_IF_ERROR(PublishGroup(g, master, model_params));
    }
    return param_swapper_ ? param_swapper_->Flush() : absl::OkStatus();
  }

  // NVMe: per sub-group swap in (master, m, v) -> CpuAdam -> publish -> swap out, with the next
  // sub-group's reads in flight during this one's compute (pipeline_read) and this one's
  // writes in flight during the next one's (pipeline_write).
  NvmeSwapper& sw = *opt_swapper_;
  const int streams[3] = {s_master_, s_m_, s_v_};
  struct Slot {
    int buf[3] = {-1, -1, -1};
  };
  auto start_reads = [&](int64_t gi, Slot* slot) -> absl::Status {
    for (int k = 0; k < 3; ++k) {
      ASSIGN_OR_RETURN(slot->buf[k], sw.Acquire());
      RETURN_IF_ERROR(sw.ReadAsync(streams[k], gi, slot->buf[k]));
    }
    return absl::OkStatus();
  };
  const bool prefetch = options_.pipeline_read && options_.optimizer_buffer_count >= 6;
  const size_t n = groups.size();
  if (n == 0) return sw.Flush();
  Slot cur, next;
  RETURN_IF_ERROR(start_reads(groups[0], &cur));
  for (size_t j = 0; j < n; ++j) {
    const int64_t gi = groups[j];
    if (prefetch && j + 1 < n) RETURN_IF_ERROR(start_reads(groups[j + 1], &next));
    for (int k = 0; k < 3; ++k) RETURN_IF_ERROR(sw.WaitRead(cur.buf[k]));
    const Group& g = plan_->sub_group(gi);
    UpdateGroup(g, t, lr, sw.floats(cur.buf[0]), sw.floats(cur.buf[1]), sw.floats(cur.buf[2]),
                grads, adam_);
    RETURN_IF_ERROR(PublishGroup(g, sw.floats(cur.buf[0]), model_params));
    for (int k = 0; k < 3; ++k) RETURN_IF_ERROR(sw.WriteAsync(streams[k], gi, cur.buf[k]));
    if (!options_.pipeline_write) RETURN_IF_ERROR(sw.Flush());
    if (j + 1 < n) {
      if (prefetch) {
        cur = next;
      } else {
        RETURN_IF_ERROR(start_reads(groups[j + 1], &cur));
      }
    }
  }
  RETURN_IF_ERROR(sw.Flush());
  return param_swapper_ ? param_swapper_->Flush() : absl::OkStatus();
}

int64_t OffloadOptimizer::holdable_groups() const {
  return opt_swapper_ ? opt_swapper_->free_buffers() / 3 : 0;
}

absl::StatusOr<OffloadOptimizer::HeldGroup> OffloadOptimizer::StepGroupHeld(
    int64_t g, int64_t t, double lr, const std::vector<const float*>& grads, CpuAdam& adam) {
  if (!options_.optimizer_nvme) {
    return absl::FailedPreconditionError(
        "StepGroupHeld: the optimizer state is not on NVMe (offload_optimizer.device)");
  }
  if (g < 0 || g >= num_sub_groups()) {
    return absl::OutOfRangeError(absl::StrCat("StepGroupHeld: sub-group ", g));
  }
  if (grads.size() != numels_.size()) {
    return absl::InvalidArgumentError("StepGroupHeld: one gradient per partition");
  }
  RETURN_IF_ERROR(FinishInit());
  if (holdable_groups() < 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "StepGroupHeld: sub-group ", g, ": fewer than 3 swap buffers are free "
        "(zero_optimization.offload_optimizer.buffer_count ", options_.optimizer_buffer_count,
        ")"));
  }
  NvmeSwapper& sw = *opt_swapper_;
  const int streams[3] = {s_master_, s_m_, s_v_};
  HeldGroup h;
  absl::Status st;
  for (int k = 0; k < 3 && st.ok(); ++k) {
    absl::StatusOr<int> b = sw.Acquire();
    if (!b.ok()) {
      st = b.status();
      break;
    }
    h.buf[k] = *b;
    st = sw.ReadAsync(streams[k], g, h.buf[k]);
  }
  for (int k = 0; k < 3; ++k) {
    if (h.buf[k] < 0) continue;
    absl::Status w = sw.WaitRead(h.buf[k]);  // wait for every started read, even after an error
    if (st.ok()) st = w;
  }
  if (!st.ok()) {
    for (int k = 0; k < 3; ++k) {
      if (h.buf[k] >= 0) sw.Release(h.buf[k]);
    }
    return st;
  }
  h.group = g;
  UpdateGroup(plan_->sub_group(g), t, lr, sw.floats(h.buf[0]), sw.floats(h.buf[1]),
              sw.floats(h.buf[2]), grads, adam);
  return h;
}

absl::Status OffloadOptimizer::CommitHeldGroup(HeldGroup* h,
                                               const std::vector<float*>& model_params) {
  if (h->group < 0) return absl::FailedPreconditionError("CommitHeldGroup: nothing held");
  if (model_params.size() != numels_.size()) {
    return absl::InvalidArgumentError("CommitHeldGroup: one parameter per partition");
  }
  NvmeSwapper& sw = *opt_swapper_;
  const int streams[3] = {s_master_, s_m_, s_v_};
  const HeldGroup held = *h;
  *h = HeldGroup();
  absl::Status st = PublishGroup(plan_->sub_group(held.group), sw.floats(held.buf[0]),
                                 model_params);
  for (int k = 0; k < 3; ++k) {
    if (!st.ok()) {
      sw.Release(held.buf[k]);  // not written: the buffers must still go back to the pool
      continue;
    }
    st = sw.WriteAsync(streams[k], held.group, held.buf[k]);
  }
  return st;
}

void OffloadOptimizer::DropHeldGroup(HeldGroup* h) {
  if (h->group < 0) return;
  for (int k = 0; k < 3; ++k) opt_swapper_->Release(h->buf[k]);
  *h = HeldGroup();
}

absl::Status OffloadOptimizer::Flush() {
  RETURN_IF_ERROR(FinishInit());
  if (opt_swapper_) RETURN_IF_ERROR(opt_swapper_->Flush());
  return param_swapper_ ? param_swapper_->Flush() : absl::OkStatus();
}

absl::Status OffloadOptimizer::FetchParam(size_t i, float* dst) {
  if (!options_.params_nvme) {
    return absl::FailedPreconditionError("FetchParam: parameters are not offloaded to NVMe");
  }
  return param_swapper_->Read(s_param_, static_cast<int64_t>(i), dst, numels_[i] * 4);
}

absl::StatusOr<int> OffloadOptimizer::StartFetchParam(size_t i) {
  if (!options_.params_nvme) {
    return absl::FailedPreconditionError("StartFetchParam: parameters are not offloaded to NVMe");
  }
  if (i >= numels_.size()) return absl::OutOfRangeError(absl::StrCat("parameter ", i));
  ASSIGN_OR_RETURN(int b, param_swapper_->Acquire());
  absl::Status s = param_swapper_->ReadAsync(s_param_, static_cast<int64_t>(i), b);
  if (!s.ok()) {
    param_swapper_->Release(b);
    return s;
  }
  return b;
}

absl::Status OffloadOptimizer::FinishFetchParam(size_t i, int buffer, float* dst) {
  absl::Status s = param_swapper_->WaitRead(buffer);
  if (s.ok()) std::memcpy(dst, param_swapper_->data(buffer), numels_[i] * 4);
  param_swapper_->Release(buffer);
  return s;
}

void OffloadOptimizer::CancelFetchParam(int buffer) {
  (void)param_swapper_->WaitRead(buffer);  // the data is dropped; so is a read error
  param_swapper_->Release(buffer);
}

absl::Status OffloadOptimizer::ExportGroupSection(int64_t g, int which,
                                                  const std::vector<float*>& model_params,
                                                  float* dst) {
  RETURN_IF_ERROR(FinishInit());
  if (g < 0 || g >= num_sub_groups() || which < 0 || which > 2) {
    return absl::OutOfRangeError(absl::StrCat("sub-group ", g, " section ", which));
  }
  const Group& gr = plan_->sub_group(g);
  if (options_.optimizer_nvme) {
    const int streams[3] = {s_master_, s_m_, s_v_};
    return opt_swapper_->Read(streams[which], g, dst, gr.numel * 4);
  }
  if (which == 1 || which == 2) {
    const std::vector<float>& src = which == 1 ? exp_avg_ : exp_avg_sq_;
    std::memcpy(dst, src.data() + gr.offset, gr.numel * 4);
  } else if (master_is_model()) {
    for (size_t i = gr.first; i < gr.last; ++i) {
      std::memcpy(dst + (offsets_[i] - gr.offset), model_params[i], numels_[i] * 4);
    }
  } else {
    std::memcpy(dst, master_.data() + gr.offset, gr.numel * 4);
  }
  return absl::OkStatus();
}

absl::Status OffloadOptimizer::ImportGroupSection(int64_t g, int which,
                                                  const std::vector<float*>& model_params,
                                                  const float* src) {
  RETURN_IF_ERROR(FinishInit());
  if (g < 0 || g >= num_sub_groups() || which < 0 || which > 2) {
    return absl::OutOfRangeError(absl::StrCat("sub-group ", g, " section ", which));
  }
  const Group& gr = plan_->sub_group(g);
  if (options_.optimizer_nvme) {
    const int streams[3] = {s_master_, s_m_, s_v_};
    RETURN_IF_ERROR(opt_swapper_->Write(streams[which], g, src, gr.numel * 4));
  } else if (which == 1 || which == 2) {
    std::vector<float>& dst = which == 1 ? exp_avg_ : exp_avg_sq_;
    std::memcpy(dst.data() + gr.offset, src, gr.numel * 4);
  } else if (!master_.empty()) {
    std::memcpy(master_.data() + gr.offset, src, gr.numel * 4);
  }
  if (which != 0) return absl::OkStatus();
  for (size_t i = gr.first; i < gr.last; ++i) {
    const float* p = src + (offsets_[i] - gr.offset);
    if (options_.params_nvme) {
      RETURN_IF_ERROR(
          param_swapper_->Write(s_param_, static_cast<int64_t>(i), p, numels_[i] * 4));
    } else if (model_params[i] != nullptr) {
      std::memcpy(model_params[i], p, numels_[i] * 4);
    }
  }
  return absl::OkStatus();
}

absl::Status OffloadOptimizer::ExportState(const std::vector<float*>& model_params, float* master,
                                           float* exp_avg, float* exp_avg_sq) {
  float* outs[3] = {master, exp_avg, exp_avg_sq};
  for (int64_t g = 0; g < num_sub_groups(); ++g) {
    for (int k = 0; k < 3; ++k) {
      RETURN_IF_ERROR(ExportGroupSection(g, k, model_params, outs[k] + plan_->sub_group(g).offset));
    }
  }
  return absl::OkStatus();
}

absl::Status OffloadOptimizer::ImportState(const std::vector<float*>& model_params,
                                           const float* master, const float* exp_avg,
                                           const float* exp_avg_sq) {
  const float* ins[3] = {master, exp_avg, exp_avg_sq};
  for (int64_t g = 0; g < num_sub_groups(); ++g) {
    for (int k = 0; k < 3; ++k) {
      RETURN_IF_ERROR(ImportGroupSection(g, k, model_params, ins[k] + plan_->sub_group(g).offset));
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::engine::offload
