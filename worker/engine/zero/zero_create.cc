// ZeroProvider::Create (zero_provider.h): option checks, then per parameter its partition
// layout (partition.h, the checkpoint layout), its initial values (ParamInit: seeded per
// parameter, or read from a Hugging Face export), the stage's copies (replica, shard, fp32
// master, Adam moments), PartitionSource::OnParamBuilt, and the memory accounting.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <exception>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/corpus.h"
#include "worker/engine/zero/zero_common.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {

using zero_internal::Bytes;

absl::StatusOr<std::unique_ptr<ZeroProvider>> ZeroProvider::Create(
    std::vector<spec::ParamSpec> specs, Collectives* collectives, const ParamInit& init,
    const ZeroOptions& options) {
  if (options.stage < 0 || options.stage > 3) {
    return absl::InvalidArgumentError(absl::StrCat("zero stage ", options.stage));
  }
  if (options.gradient_divide_factor < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient_divide_factor ", options.gradient_divide_factor, " is negative"));
  }
  const at::ScalarType comm = options.communication_dtype;
  if (comm != at::ScalarType::Undefined && comm != at::kFloat && comm != at::kBFloat16 &&
      comm != at::kHalf) {
    return absl::InvalidArgumentError(absl::StrCat(
        "communication_dtype ", c10::toString(comm), ": must be fp32, bf16 or fp16"));
  }
  if (options.stage == 0 && comm != at::ScalarType::Undefined && comm != at::kFloat) {
    return absl::InvalidArgumentError(absl::StrCat(
        "communication_dtype ", c10::toString(comm),
        " with stage 0: its gradient all-reduce is fp32 (16-bit needs stage 1-3)"));
  }
  std::unique_ptr<ZeroProvider> m(new ZeroProvider(std::move(specs), collectives, options));
  const int64_t n_ranks = collectives->world_size();
  const int64_t rank = collectives->rank();
  const int stage = options.stage;
  const at::ScalarType dt = options.param_dtype;
  const bool fp32 = dt == at::kFloat;
  const bool view = options.params_view_masters && fp32 && n_ranks == 1;
  m->replica_views_master_ = view && (stage == 1 || stage == 2);
  m->gather_views_shard_ = view && stage == 3 && !(options.partition_source != nullptr &&
                                                    options.partition_source->serves_partitions());
  try {
    at::NoGradGuard no_grad;
    m->anchor_ = at::empty({0}, at::kFloat).set_requires_grad(true);
    const std::vector<spec::ParamSpec>& all = m->specs_;
    m->params_.reserve(all.size());
    for (size_t i = 0; i < all.size(); ++i) {
      ZeroParam p;
      p.spec = all[i];
      p.numel = all[i].numel();
      p.slice = ComputePartition(p.numel, n_ranks, rank);
      const int64_t part_n = p.slice.partition_numel;
      // Stage 3 reads only this rank's slice; the others need the full tensor.
      const int64_t begin = stage == 3 ? p.slice.begin : 0;
      const int64_t count = stage == 3 ? p.slice.valid() : p.numel;
      at::Tensor src = at::zeros({stage == 3 ? part_n : p.numel}, at::kFloat);
      if (init.from != nullptr) {  // fine-tuning: read from the export
        absl::Status s = init.from->ReadRange(p.spec.name, p.spec.shape, begin, count,
                                              src.data_ptr<float>());
        if (!s.ok()) return s;
      } else {
        at::Tensor full;
        if (p.spec.kind == spec::ParamSpec::Kind::kNorm) {
          full = at::ones({p.numel}, at::kFloat);
        } else {
          at::Generator gen =
              at::detail::createCPUGenerator(data::Mix64(init.seed ^ data::Mix64(i + 1)));
          full = at::empty({p.numel}, at::kFloat);
          if (init.initializer_range > 0) {
            full.normal_(0.0, init.initializer_range, gen);
          } else {
            full.zero_();
          }
        }
        if (count > 0) src.narrow(0, 0, count).copy_(full.narrow(0, begin, count));
      }
      bool master_is_param = false;
      if (stage == 0) {
        p.master = src;
        p.replica = fp32 ? src.view(p.spec.shape) : src.to(dt).view(p.spec.shape);
        master_is_param = fp32;
        m->memory_.Acquire(MemoryKind::kParams, Bytes(p.replica));
      } else if (stage < 3) {
        p.master = at::zeros({part_n}, at::kFloat);
        if (p.slice.valid() > 0) {
          p.master.narrow(0, 0, p.slice.valid()).copy_(src.narrow(0, p.slice.begin,
                                                                   p.slice.valid()));
        }
        if (m->replica_views_master_) {  // one rank: the master is the whole parameter
          p.replica = p.master.view(p.spec.shape);
          master_is_param = true;
        } else {
          p.replica = src.to(dt).clone().view(p.spec.shape);
        }
        m->memory_.Acquire(MemoryKind::kParams, Bytes(p.replica));
      } else {
        p.master = src;
        p.shard = fp32 ? src : src.to(dt);
        p.persistent = p.numel <= options.param_persistence_threshold;
        master_is_param = fp32;
        m->memory_.Acquire(MemoryKind::kParams, Bytes(p.shard));
      }
      if (options.allocate_optimizer_state) {
        p.exp_avg = at::zeros_like(p.master);
        p.exp_avg_sq = at::zeros_like(p.master);
      }
      src.reset();
      if (options.partition_source != nullptr) {
        absl::Status hs = options.partition_source->OnParamBuilt(i, p);
        if (!hs.ok()) return hs;
        if (p.shard_offloaded) {  // offloaded: nothing resident
          m->memory_.Release(MemoryKind::kParams, Bytes(p.shard));
        }
      }
      m->memory_.Acquire(MemoryKind::kOptimizerStates,
                         Bytes(p.exp_avg) + Bytes(p.exp_avg_sq) +
                             (master_is_param || p.shard_offloaded ? 0 : Bytes(p.master)));
      m->params_.push_back(std::move(p));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("model init: ", e.what()));
  }
  const size_t n = m->params_.size();
  m->grad_expected_.assign(n, 0);
  m->grad_seen_.assign(n, 0);
  m->touched_.assign(n, 0);
  m->enqueued_.assign(n, 0);
  m->grad_written_.assign(n, 0);
  m->grad_out_.resize(n);
  m->grad_out_direct_.assign(n, 0);
  m->deferral_depth_.assign(n, 0);
  m->deferred_.resize(n);
  m->reductions_in_flight_.assign(n, 0);
  m->ready_raised_.assign(n, 0);
  m->memory_.ResetPeaks();
  return m;
}

}  // namespace loom::engine
