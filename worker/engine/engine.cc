#include "worker/engine/engine.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "storage/checkpoint/shard_format.h"
#include "worker/engine/checkpoint_io.h"
#include "worker/engine/collectives.h"
#include "worker/engine/corpus.h"
#include "worker/engine/loss_scaler.h"
#include "worker/engine/offload/offload_optimizer.h"
#include "worker/engine/optim/in_memory_adam.h"
#include "worker/engine/optim/offload_pipeline.h"
#include "worker/engine/optim/optimizer_pipeline.h"
#include "worker/engine/optim/step_validation.h"
#include "worker/engine/optim/sub_groups.h"
#include "worker/engine/optim/super_offload_setup.h"
#include "worker/engine/partition.h"
#include "worker/engine/process_groups.h"
#include "worker/engine/sequence_parallel.h"
#include "worker/engine/trajectory.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/model/tiled_ops.h"
#include "worker/engine/model_execution.h"
#include "worker/engine/offload_partition_source.h"
#include "worker/engine/zero/partition_source.h"
#include "worker/engine/zero/zero_provider.h"
#include "worker/engine/zenflow_setup.h"

namespace loom::engine {

using nlohmann::json;

namespace {

void Check(const absl::Status& s) {
  if (!s.ok()) throw CollectiveError(s);
}

class Trainer : public GradReadyListener {
 public:
  Trainer(const EngineOptions& o, Collectives& coll, const EventCallback& emit,
          const std::atomic<bool>* stop, const std::atomic<bool>* checkpoint_stop)
      : o_(o), coll_(coll), emit_(emit), stop_(stop), checkpoint_stop_(checkpoint_stop) {}

  absl::Status Run();

 private:
  void Emit(json j) { emit_(j.dump()); }
  // [rows, seq+1] int64 windows of `stream` starting at `starts`.
  at::Tensor Windows(const TokenStream& stream, const std::vector<int64_t>& starts);
  double MeanAcrossRanks(double local);
  double Evaluate();
  // One optimizer step (0-based `step`): GAS micro-batches, overflow check (fp16), clip, Adam.
  // Returns the mean loss; *skipped when an fp16 overflow skipped the update.
  double TrainStep(int64_t step, double* grad_norm, double* lr, bool* skipped);
  // After the last micro-step: sub-group events, overflow check, global norm and clip, then the
  // pipeline's FinishStep (commit, or roll back on overflow). `step`: 0-based, as TrainStep's;
  // `scale`: this step's loss scale.
  void OptimizerStep(int64_t step, double scale, double* grad_norm, bool* skipped);
  // GradReadyListener: parameter i's reduced gradient partition is final for this step (the ZeRO
  // provider raises it as the last micro-step's reductions complete, during backward): raises
  // its sub-group's OnSubGroupReady once the whole sub-group is. Idempotent within a step, so
  // the sweep after FinishMicroStep marks the parameters the provider did not raise (no
  // gradient this step).
  void OnPartitionGradReady(ParamId i) override;
  // pipeline_ over the model's partitions: the offload optimizer's when offload_ is set, else
  // in-memory Adam cut by zero_optimization.sub_group_size.
  absl::Status SetUpPipeline();
  json MemoryFields();
  // SuperOffload's step-event fields (super_ set): this step's rollbacks and overlap, counters.
  json SuperOffloadFields();
  absl::Status SaveCheckpoint(int64_t step);
  // The optimizer step and the recorded losses of `step`, for a checkpoint of it.
  CheckpointMeta MetaAt(int64_t step) const;
  // (step, value) of the latest training loss and held-out loss, for checkpoint metrics.
  std::pair<int64_t, double> metric_step_loss_{-1, 0};
  std::pair<int64_t, double> metric_eval_loss_{-1, 0};
  // 0 = go on, 1 = checkpoint and stop, 2 = stop now; the same on every rank (all-reduce MAX).
  int StopAgreed();
  // ZeRO-Offload / ZeRO-Infinity (zero_optimization.offload_optimizer / offload_param): builds
  // offload_ and the model hooks that hand it each parameter as it is created.
  absl::Status SetUpOffload(ZeroOptions* z);
  // Offload's PartitionSource (null without offload); ZeroOptions::partition_source points here.
  std::unique_ptr<OffloadPartitionSource> partition_source_;

  const EngineOptions& o_;
  Collectives& coll_;
  const EventCallback& emit_;
  const std::atomic<bool>* stop_;
  const std::atomic<bool>* checkpoint_stop_;
  Corpus corpus_;
  // The parameter state (ZeRO stage 0-3 provider) and the Llama model written against it.
  std::unique_ptr<ZeroProvider> model_;
  std::unique_ptr<LlamaModel> llama_;
  int64_t optimizer_step_ = 0;
  LossScaler scaler_;
  std::unique_ptr<offload::OffloadOptimizer> offload_;  // null: optimizer state in memory
  std::unique_ptr<optim::OptimizerPipeline> pipeline_;   // every optimizer update goes here
  optim::ZenFlowPipeline* zenflow_ = nullptr;            // pipeline_ when ZenFlow runs
  std::optional<optim::SubGroupPlan> ready_;             // pipeline_'s cut: this step's readiness
  // SuperOffload (offload_optimizer.super_offload): pipeline_ itself, for its counters.
  optim::SuperOffloadPipeline* super_ = nullptr;
  optim::SuperOffloadChoice super_choice_;
  optim::SuperOffloadStats super_prev_;  // counters at the previous step event
  std::vector<char> marked_;  // per parameter: OnPartitionGradReady seen in this step
  std::unique_ptr<CheckpointIo> checkpoints_;
  double last_optimizer_s_ = 0;  // wall time of the last OptimizerStep
  double data_seconds_ = 0;  // wall seconds spent building input batches so far
  std::unique_ptr<TrajectoryRecorder> trajectory_;  // null unless o_.trajectory_dir is set
  // Ulysses sequence parallelism (issue 13; sequence_parallel.h), null when
  // sequence_parallel_size is 1: the named groups and the runner of the sharded micro-steps.
  std::unique_ptr<ProcessGroups> groups_;
  std::unique_ptr<SequenceParallelRunner> sp_;
  // Data-parallel rank and size: the samples a rank sees (the world without sequence parallelism).
  int64_t DataRank() const { return groups_ ? groups_->data_parallel().rank() : coll_.rank(); }
  int64_t DataRanks() const {
    return groups_ ? groups_->data_parallel_size() : coll_.world_size();
  }
};

absl::Status Trainer::SetUpOffload(ZeroOptions* z) {
  const ZeroConfig& zc = o_.ds.zero;
  const OffloadConfig& oo = zc.offload_optimizer;
  const OffloadConfig& op = zc.offload_param;
  if (zc.zenflow.enabled) return absl::OkStatus();  // ZenFlow owns its host buffers
  if (oo.device == "none" && op.device != "nvme") {
    // offload_param "cpu" alone: on a CPU-only node the partitions are in host memory already.
    if (op.device == "cpu") LOG(INFO) << "offload_param cpu: parameters stay in host memory";
    return absl::OkStatus();
  }
  const std::string zpath = "deepspeed_config.zero_optimization.";
  // SuperOffload: the moments stay with the model's partitions (host memory on a CPU node);
  // the SuperOffload pipeline (SetUpPipeline) steps them.
  if (oo.super_offload) return optim::CheckSuperOffloadJob(o_.ds);
  if (oo.device != "none" && oo.ratio != 1.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        zpath, "offload_optimizer.ratio: partial offload (", oo.ratio, ") is not supported yet"));
  }
  if (zc.stage == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(zpath, "offload_optimizer.device: offload needs ZeRO stage 1, 2 or 3"));
  }
  if (op.device == "nvme" && oo.device == "none") {
    // DeepSpeed keeps the fp32 master with the optimizer; here the optimizer must own it to
    // let the parameter partitions leave memory.
    return absl::InvalidArgumentError(absl::StrCat(
        zpath, "offload_param.device: parameter offload needs offload_optimizer too"));
  }
  offload::OffloadOptimizerOptions oo_opts;
  const OptimizerConfig& oc = o_.ds.optimizer;
  oo_opts.adam.beta1 = oc.beta1;
  oo_opts.adam.beta2 = oc.beta2;
  oo_opts.adam.eps = oc.eps;
  oo_opts.adam.weight_decay = oc.weight_decay;
  oo_opts.adam.decoupled_weight_decay = oc.decoupled_weight_decay;
  oo_opts.adam.bias_correction = oc.bias_correction;
  oo_opts.adam.threads = std::max(1, o_.threads_per_rank);
  oo_opts.sub_group_size = zc.sub_group_size;
  // Scratch files of this process only (two jobs, or two ranks on one node, never share them).
  auto scratch = [&](const std::string& nvme_path, const char* what) {
    return absl::StrCat(nvme_path, "/loom_swap_", o_.job_id.empty() ? "job" : o_.job_id, "_pid",
                        ::getpid(), "_rank", coll_.rank(), "/", what);
  };
  oo_opts.optimizer_nvme = oo.device == "nvme";
  if (oo_opts.optimizer_nvme) oo_opts.optimizer_dir = scratch(oo.nvme_path, "optimizer");
  oo_opts.optimizer_buffer_count = oo.buffer_count;
  oo_opts.pipeline_read = oo.pipeline_read;
  oo_opts.pipeline_write = oo.pipeline_write;
  oo_opts.params_nvme = op.device == "nvme";
  if (oo_opts.params_nvme) oo_opts.param_dir = scratch(op.nvme_path, "params");
  oo_opts.param_buffer_count = op.buffer_count;
  oo_opts.param_buffer_elements = op.buffer_size;
  oo_opts.aio_block_bytes = o_.ds.aio.block_size;
  oo_opts.aio_queue_depth = static_cast<int>(o_.ds.aio.queue_depth);
  std::vector<int64_t> numels;
  for (const ParamSpec& spec : LlamaParamSpecs(o_.model)) {
    numels.push_back(PartitionNumel(spec.numel(), coll_.world_size()));
  }
  ASSIGN_OR_RETURN(offload_, offload::OffloadOptimizer::Create(oo_opts, numels));
  z->allocate_optimizer_state = false;
  partition_source_ = std::make_unique<OffloadPartitionSource>(offload_.get(),
                                                               oo_opts.params_nvme, numels);
  z->partition_source = partition_source_.get();
  LOG(INFO) << "offload: optimizer " << oo.device << ", params " << op.device << ", "
            << offload_->num_sub_groups() << " sub-groups, CpuAdam "
            << offload::CpuAdam::IsaName(offload_->adam().isa()) << " x" << oo_opts.adam.threads
            << " threads, " << offload_->resident_bytes() << " resident bytes";
  return absl::OkStatus();
}

ZeroOptions ZeroOptionsFrom(const DeepSpeedConfig& ds) {
  ZeroOptions z;
  z.stage = ds.zero.stage;
  z.param_dtype = ds.bf16_enabled ? at::kBFloat16 : ds.fp16.enabled ? at::kHalf : at::kFloat;
  z.reduce_bucket_size = ds.zero.reduce_bucket_size;
  z.allgather_bucket_size = ds.zero.allgather_bucket_size;
  z.contiguous_gradients = ds.zero.contiguous_gradients;
  z.overlap_comm = ds.zero.overlap_comm_effective();
  z.prefetch_bucket_size = ds.zero.stage3_prefetch_bucket_size;
  z.param_persistence_threshold = ds.zero.stage3_param_persistence_threshold;
  z.max_live_parameters = ds.zero.stage3_max_live_parameters;
  z.max_reuse_distance = ds.zero.stage3_max_reuse_distance;
  return z;
}

at::Tensor Trainer::Windows(const TokenStream& stream, const std::vector<int64_t>& starts) {
  const int64_t w = o_.sequence_length + 1;
  at::Tensor out = at::empty({static_cast<int64_t>(starts.size()), w}, at::kLong);
  int64_t* dst = out.data_ptr<int64_t>();
  for (size_t i = 0; i < starts.size(); ++i) stream.Copy(starts[i], w, dst + i * w);
  return out;
}

double Trainer::MeanAcrossRanks(double local) {
  at::Tensor t = at::full({1}, local, at::kDouble);
  Check(coll_.AllReduce(t, ReduceOp::kSum));
  return t.item<double>() / coll_.world_size();
}

int Trainer::StopAgreed() {
  double local = 0;
  if (stop_ != nullptr && stop_->load()) {
    local = 2;
  } else if (checkpoint_stop_ != nullptr && checkpoint_stop_->load()) {
    local = 1;
  }
  at::Tensor flag = at::full({1}, local, at::kDouble);
  Check(coll_.AllReduce(flag, ReduceOp::kMax));
  return static_cast<int>(flag.item<double>());
}

double Trainer::Evaluate() {
  at::NoGradGuard no_grad;
  const int64_t micro = o_.ds.train_micro_batch_size_per_gpu;
  const int64_t n = DataRanks(), r = DataRank();
  const int64_t total = o_.eval_batches * micro * n;  // same for any N at a fixed global batch
  const int64_t len = corpus_.heldout.size(), w = o_.sequence_length + 1;
  double sum = 0;
  for (int64_t b = 0; b < o_.eval_batches; ++b) {
    std::vector<int64_t> starts;
    for (int64_t i = 0; i < micro; ++i) {
      starts.push_back(EvalWindowStart(b * micro * n + r * micro + i, total, len, w));
    }
    at::Tensor win = Windows(corpus_.heldout, starts);
    if (sp_ != nullptr) {  // the sequence-parallel group shares the window, 1/P each
      sum += sp_->EvalLoss(win.narrow(1, 0, o_.sequence_length),
                           win.narrow(1, 1, o_.sequence_length));
      continue;
    }
    if (o_.tiled.logits_loss) {  // through the tiled head: no [S, vocab] logits in eval either
      sum += llama_->Loss(win.narrow(1, 0, o_.sequence_length),
                          win.narrow(1, 1, o_.sequence_length)).loss.item<double>();
      continue;
    }
    at::Tensor logits = llama_->Forward(win.narrow(1, 0, o_.sequence_length)).to(at::kFloat);
    at::Tensor loss = torch::nn::functional::cross_entropy(
        logits.reshape({-1, o_.model.vocab_size}),
        win.narrow(1, 1, o_.sequence_length).reshape({-1}));
    sum += loss.item<double>();
  }
  return MeanAcrossRanks(sum / o_.eval_batches);
}

double Trainer::TrainStep(int64_t step, double* grad_norm, double* lr, bool* skipped) {
  const int64_t micro = o_.ds.train_micro_batch_size_per_gpu;
  const int64_t gas = o_.ds.gradient_accumulation_steps;
  const int64_t r = coll_.rank();
  const int64_t seq =
      o_.test_rank_sequence_length > 0 ? o_.test_rank_sequence_length : o_.sequence_length;
  const int64_t len = corpus_.train.size(), w = seq + 1;
  const std::vector<int64_t>* order =
      o_.test_layer_order_step == step + 1 ? &o_.test_layer_order : nullptr;
  const double scale = scaler_.scale();
  *lr = LearningRateAtStep(o_.ds, optimizer_step_);  // skipped steps do not advance the schedule
  // Opened before the last backward, so sub-group events raised during it land in this step.
  ready_->ResetReadiness();
  marked_.assign(model_->params().size(), 0);
  Check(pipeline_->BeginStep(optimizer_step_ + 1, *lr));
  double loss_sum = 0;
  for (int64_t m = 0; m < gas; ++m) {
    std::vector<int64_t> starts;
    for (int64_t i = 0; i < micro; ++i) {
      // Sequence parallelism: micro-step m of data rank d reads global sample (m*D + d)*micro + i
      // of the step, so (D, P=1, GAS) and (D/k, P=k, GAS*k) train on the same samples.
      starts.push_back(sp_ != nullptr ? TrainWindowStart(o_.seed, step, 0,
                                                         (m * DataRanks() + DataRank()) * micro + i,
                                                         len, w)
                                      : TrainWindowStart(o_.seed, step, m, r * micro + i, len, w));
    }
    const auto data_t0 = std::chrono::steady_clock::now();
    at::Tensor win = Windows(corpus_.train, starts);
    if (trajectory_ != nullptr) Check(trajectory_->AppendBatch(win.data_ptr<int64_t>(), micro, w));
    data_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - data_t0).count();
    model_->BeginMicroStep(m == gas - 1);
    at::Tensor loss;
    if (sp_ != nullptr) {  // this rank's shard; loss_r * n_r / N (sequence_parallel.h)
      SequenceParallelRunner::MicroStep ms =
          sp_->Loss(win.narrow(1, 0, seq), win.narrow(1, 1, seq), order);
      loss = ms.backprop;
      loss_sum += ms.loss;
    } else {
      loss = llama_->Loss(win.narrow(1, 0, seq), win.narrow(1, 1, seq), order).loss;
      loss_sum += loss.item<double>();
    }
    at::Tensor scaled = loss / static_cast<double>(gas);
    if (scale != 1.0) scaled = scaled * scale;  // fp16: DeepSpeed scales loss/GAS
    scaled.backward();
    model_->FinishMicroStep();
  }
  const double mean_loss = MeanAcrossRanks(loss_sum / gas);
  OptimizerStep(step, scale, grad_norm, skipped);
  return mean_loss;
}

void Trainer::OnPartitionGradReady(ParamId i) {
  if (marked_[i]) return;
  marked_[i] = 1;
  absl::StatusOr<int64_t> k = ready_->MarkParamReady(i);
  Check(k.status());
  if (*k >= 0) Check(pipeline_->OnSubGroupReady(*k));
}

void Trainer::OptimizerStep(int64_t step, double scale, double* grad_norm, bool* skipped) {
  at::NoGradGuard no_grad;
  *skipped = false;
  const std::vector<int64_t>& inject = o_.test_inject_inf_grad_steps;
  if (coll_.rank() == 0 &&
      std::find(inject.begin(), inject.end(), step + 1) != inject.end()) {
    ZeroParam& p = model_->params()[0];
    if (p.grad.defined()) p.grad.view({-1})[0] = std::numeric_limits<float>::infinity();
  }
  // The provider raised the parameters that got gradients as their reductions completed; the
  // rest (no gradient this step) are final too.
  for (size_t i = 0; i < model_->params().size(); ++i) OnPartitionGradReady(i);
  optim::ValidationInputs in;
  in.check_overflow = scaler_.enabled();
  in.loss_scale = scale;
  in.gradient_clipping = o_.ds.gradient_clipping;
  in.grads_partitioned = model_->grads_partitioned();
  absl::StatusOr<optim::StepValidation> v = optim::ValidateStep(
      coll_, in, [this] { return model_->any_nonfinite_grad(); },
      [this] { return model_->LocalGradSquaredNorm(); });
  Check(v.status());
  if (v->overflow) {
    Check(pipeline_->FinishStep(*v));  // rolls back: the step is skipped on every rank
    model_->ClearGrads();
    scaler_.Update(/*overflow=*/true);
    *skipped = true;
    *grad_norm = 0;
    return;
  }
  *grad_norm = v->grad_norm;
  const auto t_opt = std::chrono::steady_clock::now();
  Check(pipeline_->FinishStep(*v));
  ++optimizer_step_;
  last_optimizer_s_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_opt).count();
  model_->RefreshParams();
  model_->ClearGrads();
  scaler_.Update(/*overflow=*/false);
}

absl::Status Trainer::SetUpPipeline() {
  optim::PartitionSource source = [this](size_t i) {
    ZeroParam& p = model_->params()[i];
    return OptimizerPartition{p.master, p.grad, p.exp_avg, p.exp_avg_sq};
  };
  if (o_.ds.zero.zenflow.enabled) {
    // ZenFlow (zenflow_setup.h): selected columns every step, the rest on the CPU optimizer.
    const int64_t epoch = static_cast<int64_t>(corpus_.train.size()) /
                          std::max<int64_t>(1, o_.ds.train_batch_size * (o_.sequence_length + 1));
    ASSIGN_OR_RETURN(std::unique_ptr<optim::ZenFlowPipeline> zf,
                     MakeTrainerZenFlow(o_, coll_, *model_, epoch));
    zenflow_ = zf.get();
    pipeline_ = std::move(zf);
  } else if (o_.ds.zero.offload_optimizer.super_offload) {
    // SuperOffload: speculative CPU Adam per sub-group during backward, exact rollback/replay
    // (optim/super_offload_pipeline.h); its copies count as optimizer state.
    std::vector<int64_t> numels;
    for (const ZeroParam& p : model_->params()) numels.push_back(p.master.numel());
    ASSIGN_OR_RETURN(std::unique_ptr<optim::SuperOffloadPipeline> super,
                     optim::MakeSuperOffloadPipelineForJob(
                         o_.ds, o_.threads_per_rank, numels, std::move(source),
                         [this] { return scaler_.scale(); }, &super_choice_));
    super_ = super.get();
    pipeline_ = std::move(super);
    model_->memory().Acquire(MemoryKind::kOptimizerStates, super_->copy_bytes());
    LOG(INFO) << "superoffload: " << pipeline_->plan().num_sub_groups() << " sub-groups of "
              << super_choice_.sub_group_size << " elements ("
              << (super_choice_.sub_group_size_modelled ? "modelled" : "sub_group_size")
              << "), " << pipeline_->plan().num_sub_groups() - super_->first_cpu_sub_group()
              << " on the CPU, CpuAdam x" << super_choice_.cpu_threads << ", casting "
              << super_choice_.casting << ", " << super_->copy_bytes() << " rollback bytes";
  } else if (offload_ != nullptr) {
    // ZeRO-Offload: CpuAdam over the offloaded state, sub-group by sub-group (same math as
    // ApplyOptimizerStep up to FMA rounding; see offload/cpu_adam.h).
    pipeline_ = optim::MakeOffloadPipeline(offload_.get(), std::move(source));
  } else {
    std::vector<int64_t> numels;
    for (const ZeroParam& p : model_->params()) numels.push_back(p.master.numel());
    ASSIGN_OR_RETURN(optim::SubGroupPlan plan,
                     optim::SubGroupPlan::Create(numels, o_.ds.zero.sub_group_size));
    pipeline_ =
        optim::MakeInMemoryAdamPipeline(o_.ds.optimizer, std::move(plan), std::move(source));
  }
  ready_.emplace(pipeline_->plan());
  model_->set_grad_ready_listener(this);
  return absl::OkStatus();
}

CheckpointMeta Trainer::MetaAt(int64_t step) const {
  CheckpointMeta meta;
  meta.optimizer_step = optimizer_step_;
  if (metric_step_loss_.first == step) meta.metrics["train_loss"] = metric_step_loss_.second;
  if (metric_eval_loss_.first == step) meta.metrics["eval_loss"] = metric_eval_loss_.second;
  return meta;
}

json Trainer::MemoryFields() {
  MemoryTracker& m = model_->memory();
  return {{"param_bytes", m.peak(MemoryKind::kParams)},
          {"grad_bytes", m.peak(MemoryKind::kGrads)},
          {"optimizer_state_bytes", m.peak(MemoryKind::kOptimizerStates)},
          {"buffer_bytes", m.peak(MemoryKind::kBuffers)},
          {"cached_bytes", m.peak(MemoryKind::kCached)},
          {"peak_bytes", m.peak_total()}};
}

json Trainer::SuperOffloadFields() {
  const optim::SuperOffloadStats s = super_->stats(), p = super_prev_;
  super_prev_ = s;
  optim::SuperOffloadStats d;  // this step's share
  d.speculative_s = s.speculative_s - p.speculative_s;
  d.overlapped_s = s.overlapped_s - p.overlapped_s;
  d.finish_work_s = s.finish_work_s - p.finish_work_s;
  return {{"optimizer_rollbacks", s.step_rollbacks - p.step_rollbacks},
          {"speculated_sub_groups", s.speculated},
          {"speculation_hits", s.hits},
          {"rollbacks_overflow", s.rollbacks_overflow},
          {"rollbacks_clip", s.rollbacks_clip},
          {"replays", s.replays},
          {"optimizer_overlap_fraction", d.overlap_fraction()},
          {"optimizer_work_s", d.speculative_s + d.finish_work_s}};
}

absl::Status Trainer::SaveCheckpoint(int64_t step) {
  if (zenflow_ != nullptr) {  // before the shard, so a committed checkpoint has it
    RETURN_IF_ERROR(SaveZenFlowState(
        *zenflow_, absl::StrCat(o_.checkpoint_dir, "/", storage::StepDirName(step)),
        coll_.rank()));
  }
  RETURN_IF_ERROR(checkpoints_->WriteShards(o_.checkpoint_dir, step, MetaAt(step)));
  Emit({{"event", "checkpoint"},
        {"step", step},
        {"dir", absl::StrCat(o_.checkpoint_dir, "/", storage::StepDirName(step))}});
  return absl::OkStatus();
}

// Debian's LibTorch calls whatever BLAS the libblas.so.3 alternative provides (BLAS_INFO=generic),
// so at::set_num_threads does not reach it. With OpenBLAS (libopenblas0-pthread, installed by
// scripts/install_deps.sh; ~15x faster than the reference BLAS here) its own thread pool must be
// capped too, or N ranks on N cores oversubscribe the machine. Looked up at run time because the
// symbol exists only when the alternative is OpenBLAS.
static void LimitBlasThreads(int threads) {
  using SetThreads = void (*)(int);
  auto set = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set != nullptr) set(threads);
}

absl::Status Trainer::Run() {
  at::set_num_threads(o_.threads_per_rank);
  LimitBlasThreads(o_.threads_per_rank);
  CorpusOptions data = o_.data;
  data.record_dir = o_.checkpoint_dir;  // a SentencePiece tokenizer is recorded with the job
  data.rank = coll_.rank();
  data.world_size = coll_.world_size();
  ASSIGN_OR_RETURN(corpus_, LoadCorpus(data));
  const int64_t w = o_.sequence_length + 1;
  if (static_cast<int64_t>(corpus_.train.size()) < w ||
      static_cast<int64_t>(corpus_.heldout.size()) < w) {
    return absl::FailedPreconditionError(absl::StrCat(
        "training.sequence_length: ", o_.sequence_length, " + 1 tokens do not fit the corpus (",
        corpus_.train.size(), " train, ", corpus_.heldout.size(), " held-out tokens)"));
  }
  std::unique_ptr<HfWeights> init;
  if (!o_.init_from.empty() && o_.resume_from.empty()) {  // a resume loads its own weights
    ASSIGN_OR_RETURN(init, HfWeights::Open(o_.init_from));
  }
  for (const std::string& w : o_.ds.warnings) Emit({{"event", "warning"}, {"message", w}});
  scaler_ = LossScaler(o_.ds.fp16);
  ZeroOptions zopts = ZeroOptionsFrom(o_.ds);
  if (o_.ds.sequence_parallel_size > 1) {  // Ulysses (issue 13, sequence_parallel.h)
    if (!o_.trajectory_dir.empty() || o_.test_rank_sequence_length > 0) {
      return absl::InvalidArgumentError(
          "deepspeed_config.sequence_parallel_size: --trajectory_dir and "
          "--test_rank_sequence_length are not supported with sequence parallelism");
    }
    ASSIGN_OR_RETURN(groups_, ProcessGroups::Create(coll_, o_.ds.sequence_parallel_size));
    // The group's local gradients sum to the sample's gradient: average over data ranks only.
    zopts.gradient_divide_factor = groups_->data_parallel_size();
  }
  RETURN_IF_ERROR(SetUpOffload(&zopts));
  ASSIGN_OR_RETURN(model_, ZeroProvider::Create(LlamaParamSpecs(o_.model), &coll_,
                                                {o_.seed, o_.model.initializer_range, init.get()},
                                                zopts));
  ASSIGN_OR_RETURN(llama_, LlamaModel::Create(o_.model, model_.get()));
  ApplyModelExecutionOptions(o_, llama_.get(), &model_->memory());  // attention core, checkpointing
  RETURN_IF_ERROR(InstallTiledCompute(o_.tiled, &coll_, llama_.get()));  // ALST (issue 13)
  if (groups_ != nullptr) {
    ASSIGN_OR_RETURN(sp_, SequenceParallelRunner::Create(
                              llama_.get(), groups_->sequence_parallel().collectives,
                              o_.ds.seq_parallel_communication_bf16, MakeAttentionCore(o_)));
  }
  RETURN_IF_ERROR(SetUpPipeline());
  checkpoints_ = std::make_unique<CheckpointIo>(o_, coll_, *model_, *llama_, offload_.get(),
                                                scaler_);
  if (offload_ != nullptr) {
    // What the offload optimizer keeps in host memory (moments, master copies, swap buffers) is
    // this rank's memory too: on a CPU node it is the same RAM the model uses.
    model_->memory().Acquire(MemoryKind::kOptimizerStates, offload_->resident_bytes());
    model_->memory().ResetPeaks();
  }
  int64_t start = 0;
  if (!o_.resume_from.empty()) {
    RETURN_IF_ERROR(checkpoints_->Load(o_.resume_from, &start, &optimizer_step_));
    if (zenflow_ != nullptr) RETURN_IF_ERROR(LoadZenFlowState(*zenflow_, o_.resume_from, coll_.rank()));
  }
  if (start > o_.steps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training.steps: ", o_.steps, " is below the resumed checkpoint's step ", start));
  }
  json started = {{"event", "started"},
                  {"rank", coll_.rank()},
                  {"world_size", coll_.world_size()},
                  {"params", LlamaParamCount(o_.model)},
                  {"zero_stage", o_.ds.zero.stage},
                  {"partition_bytes", model_->partition_bytes()},
                  {"offload_optimizer", o_.ds.zero.offload_optimizer.device},
                  {"offload_param", o_.ds.zero.offload_param.device},
                  {"offload_resident_bytes", offload_ ? offload_->resident_bytes() : 0},
                  {"superoffload_copy_bytes", super_ ? super_->copy_bytes() : 0},
                  {"superoffload_casting", super_ ? super_choice_.casting : ""},
                  {"superoffload_sub_group_size", super_ ? super_choice_.sub_group_size : 0},
                  {"start_step", start}};
  started.update(MemoryFields());
  Emit(started);
  if (!o_.trajectory_dir.empty()) {
    const TrajectoryShape shape = TrajectoryShapeFor(o_, coll_.rank(), coll_.world_size(), start);
    ASSIGN_OR_RETURN(trajectory_, TrajectoryRecorder::Open(o_.trajectory_dir, shape));
    Check(coll_.Barrier());  // every rank checked the directory before anyone writes to it
    RETURN_IF_ERROR(checkpoints_->ExportTrajectoryWeights(
        *trajectory_, trajectory_->InitialShardsDir(), start, "initial_hf", MetaAt(start)));
  }
  LOG(INFO) << "rank " << coll_.rank() << "/" << coll_.world_size() << ": "
            << LlamaParamCount(o_.model) << " params, partition " << model_->partition_bytes()
            << " bytes, corpus " << corpus_.train.size() << "/" << corpus_.heldout.size()
            << " tokens, start step " << start;

  const double initial_eval = Evaluate();
  Emit({{"event", "eval"}, {"step", start}, {"loss", initial_eval}});
  double last_eval = initial_eval;
  int64_t last_checkpoint = o_.resume_from.empty() ? -1 : start;
  const int64_t global_tokens = o_.ds.train_batch_size * o_.sequence_length;

  for (int64_t s = start; s < o_.steps; ++s) {
    const int stop = StopAgreed();
    if (stop == 1 && !o_.checkpoint_dir.empty()) {
      // Graceful stop: a committed checkpoint of the steps done, then out.
      if (last_checkpoint != s) {
        RETURN_IF_ERROR(SaveCheckpoint(s));
        last_checkpoint = s;
      }
      Check(coll_.Barrier());  // every rank's shard is written
      Emit({{"event", "stopped"}, {"step", s}, {"checkpoint_step", s}});
      LOG(INFO) << "stopped gracefully after step " << s << " with a final checkpoint";
      return absl::OkStatus();
    }
    if (stop != 0) {
      Emit({{"event", "stopped"}, {"step", s}});
      return absl::CancelledError(absl::StrCat("stopped by signal before step ", s + 1));
    }
    model_->memory().ResetPeaks();
    const auto t0 = std::chrono::steady_clock::now();
    const double comm0 = coll_.blocked_seconds(), data0 = data_seconds_;
    const int64_t moved0 = coll_.elements_moved();
    double grad_norm = 0, lr = 0;
    bool skipped = false;
    const double loss_scale = scaler_.scale();
    const double loss = TrainStep(s, &grad_norm, &lr, &skipped);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MemoryTracker& mem = model_->memory();
    json ev = {{"event", "step"},
               {"step", s + 1},
               {"loss", loss},
               {"tokens_per_s", global_tokens / std::max(secs, 1e-9)},
               {"step_time_s", secs},
               {"optimizer_s", last_optimizer_s_},
               {"comm_bytes", coll_.bytes_communicated()},
               {"lr", lr},
               {"grad_norm", grad_norm},
               {"loss_scale", loss_scale},
               {"skipped", skipped},
               {"optimizer_step", optimizer_step_},
               {"gathered_bytes_between_steps", mem.current(MemoryKind::kBuffers)},
               {"param_reads_ahead", partition_source_ ? partition_source_->reads_ahead() : 0},
               {"peak_gathered_bytes", mem.peak(MemoryKind::kBuffers)},
               {"partition_bytes", model_->partition_bytes()},
               {"prefetch_hits", model_->prefetch_hits()},
               {"trace_invalidations", model_->trace_invalidations()},
               {"on_demand_fetches", model_->on_demand_fetches()},
               {"comm_s", coll_.blocked_seconds() - comm0},
               {"comm_elements", coll_.elements_moved() - moved0},
               {"data_s", data_seconds_ - data0}};
    ev.update(MemoryFields());
    if (zenflow_ != nullptr) ev.update(ZenFlowStepFields(*zenflow_));
    if (super_ != nullptr) ev.update(SuperOffloadFields());
    Emit(ev);
    // Progress in the rank's log every steps_per_print steps, as DeepSpeed prints it.
    if (o_.ds.steps_per_print > 0 && ((s + 1) % o_.ds.steps_per_print == 0 || s == start)) {
      LOG(INFO) << "step " << s + 1 << "/" << o_.steps << " loss " << loss << " lr " << lr
                << " grad_norm " << grad_norm << " step_time " << secs << " s, "
                << static_cast<int64_t>(global_tokens / std::max(secs, 1e-9)) << " tokens/s";
    }
    metric_step_loss_ = {s + 1, loss};
    if (trajectory_ != nullptr) trajectory_->RecordStep(s + 1, loss, lr, grad_norm, skipped);
    const bool last = s + 1 == o_.steps;
    if (!last && o_.eval_every_steps > 0 && (s + 1) % o_.eval_every_steps == 0) {
      last_eval = Evaluate();
      metric_eval_loss_ = {s + 1, last_eval};
      Emit({{"event", "eval"}, {"step", s + 1}, {"loss", last_eval}});
    }
    if (!last && !o_.checkpoint_dir.empty() && o_.checkpoint_interval_steps > 0 &&
        (s + 1) % o_.checkpoint_interval_steps == 0) {
      RETURN_IF_ERROR(SaveCheckpoint(s + 1));
      last_checkpoint = s + 1;
    }
  }
  if (zenflow_ != nullptr) zenflow_->Flush();  // the last CPU result into the final weights
  if (o_.steps > start) {
    last_eval = Evaluate();
    metric_eval_loss_ = {o_.steps, last_eval};
    Emit({{"event", "eval"}, {"step", o_.steps}, {"loss", last_eval}});
  }
  if (!o_.checkpoint_dir.empty() && last_checkpoint != o_.steps) {
    RETURN_IF_ERROR(SaveCheckpoint(o_.steps));
  }
  if (trajectory_ != nullptr) {
    RETURN_IF_ERROR(checkpoints_->ExportTrajectoryWeights(
        *trajectory_, trajectory_->FinalShardsDir(), o_.steps, "final_hf", MetaAt(o_.steps)));
    RETURN_IF_ERROR(trajectory_->Finish());
  }
  RETURN_IF_ERROR(checkpoints_->WriteFinalLogits(corpus_.heldout));
  Check(coll_.Barrier());
  Emit({{"event", "done"},
        {"step", o_.steps},
        {"initial_eval_loss", initial_eval},
        {"final_eval_loss", last_eval},
        {"collective_count", coll_.collective_count()},
        {"collective_hash", absl::StrCat(absl::Hex(coll_.collective_hash()))}});
  return absl::OkStatus();
}

}  // namespace

absl::Status RunTraining(const EngineOptions& options, Collectives& collectives,
                         const EventCallback& emit, const std::atomic<bool>* stop_requested,
                         const std::atomic<bool>* checkpoint_and_stop) {
  if (collectives.world_size() != options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("world_size: collectives have ",
                                                   collectives.world_size(), ", options ",
                                                   options.world_size));
  }
  Trainer trainer(options, collectives, emit, stop_requested, checkpoint_and_stop);
  try {
    return trainer.Run();
  } catch (const CollectiveError& e) {
    return e.status();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("libtorch: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("engine: ", e.what()));
  }
}

}  // namespace loom::engine
