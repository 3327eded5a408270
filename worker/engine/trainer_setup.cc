// The Trainer's set-up (trainer_impl.h): corpus, process groups, the ZeRO provider and the model
// over it, offload (ZeRO-Offload / ZeRO-Infinity), the optimizer pipeline (in-memory Adam,
// offload, ZenFlow or SuperOffload), checkpoint I/O and resume.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "data/dataset_error.h"
#include "data/dataset_identity.h"
#include "worker/engine/hf_weights.h"
#include "worker/engine/model/tiled_ops.h"
#include "worker/engine/model_execution.h"
#include "worker/engine/optim/in_memory_adam.h"
#include "worker/engine/optim/offload_pipeline.h"
#include "worker/engine/partition.h"
#include "worker/engine/trainer_impl.h"
#include "worker/engine/trainer_zero_options.h"
#include "worker/engine/zenflow_setup.h"

namespace loom::engine::internal {

Trainer::ScratchDirs::~ScratchDirs() {
  // rmdir removes only empty directories: a file someone else put there keeps its directory.
  for (auto it = made.rbegin(); it != made.rend(); ++it) ::rmdir(it->c_str());
}

absl::Status Trainer::SetUpOffload(ZeroOptions* z) {
  const spec::ZeroConfig& zc = o_.ds.zero;
  const spec::OffloadConfig& oo = zc.offload_optimizer;
  const spec::OffloadConfig& op = zc.offload_param;
  if (zc.zenflow.enabled) return absl::OkStatus();  // ZenFlow owns its host buffers
  if (oo.device == "none" && op.device != "nvme") {
    // offload_param "cpu" alone: on a CPU-only node the partitions are in host memory already.
    if (op.device == "cpu") LOG(INFO) << "offload_param cpu: parameters stay in host memory";
    return absl::OkStatus();
  }
  // SuperOffload with device "cpu": the moments stay with the model's partitions (host memory
  // on a CPU node); the SuperOffload pipeline (SetUpPipeline) steps them. With "nvme" the offload
  // optimizer below keeps every sub-group's state on files, cut by SuperOffload's sub-group
  // size, and the pipeline holds its speculative steps in that optimizer's swap buffers.
  // The stage and section combinations (offload needs stage 1-3, nvme parameters need the
  // optimizer offloaded, SuperOffload keeps parameters in memory) are refused by the spec
  // parser (spec/ds_config.cc), at submission and here alike.
  if (oo.super_offload && oo.device != "nvme") return absl::OkStatus();
  offload::OffloadOptimizerOptions oo_opts;
  const spec::OptimizerConfig& oc = o_.ds.optimizer;
  oo_opts.adam.beta1 = oc.beta1;
  oo_opts.adam.beta2 = oc.beta2;
  oo_opts.adam.eps = oc.eps;
  oo_opts.adam.weight_decay = oc.weight_decay;
  oo_opts.adam.decoupled_weight_decay = oc.decoupled_weight_decay;
  oo_opts.adam.bias_correction = oc.bias_correction;
  oo_opts.adam.threads = std::max(1, o_.threads_per_rank);
  oo_opts.sub_group_size = zc.sub_group_size;
  std::vector<int64_t> numels;
  int64_t partition_elems = 0;
  for (const spec::ParamSpec& spec : spec::LlamaParamSpecs(o_.model)) {
    numels.push_back(PartitionNumel(spec.numel(), coll_.world_size()));
    partition_elems += numels.back();
  }
  if (oo.super_offload) {
    super_choice_ = optim::ChooseSuperOffload(o_.ds, o_.threads_per_rank, partition_elems);
    oo_opts.sub_group_size = super_choice_.sub_group_size;
  }
  // Scratch files of this process only (two jobs, or two ranks on one node, never share them).
  auto scratch = [&](const std::string& nvme_path, const char* what) {
    const std::string root =
        absl::StrCat(nvme_path, "/loom_swap_", o_.job_id.empty() ? "job" : o_.job_id, "_pid",
                     ::getpid(), "_rank", coll_.rank());
    std::vector<std::string>& made = scratch_dirs_.made;
    if (std::find(made.begin(), made.end(), root) == made.end()) made.push_back(root);
    made.push_back(absl::StrCat(root, "/", what));
    return made.back();
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
                         [this] { return scaler_.scale(); }, offload_.get(), &super_choice_));
    super_ = super.get();
    pipeline_ = std::move(super);
    model_->memory().Acquire(MemoryKind::kOptimizerStates, super_->copy_bytes());
    LOG(INFO) << "superoffload: " << pipeline_->plan().num_sub_groups() << " sub-groups of "
              << super_choice_.sub_group_size << " elements ("
              << (super_choice_.sub_group_size_modelled ? "modelled" : "sub_group_size")
              << "), " << pipeline_->plan().num_sub_groups() - super_->first_cpu_sub_group()
              << " on the CPU, CpuAdam x" << super_choice_.cpu_threads << ", casting "
              << super_choice_.casting << ", " << super_->copy_bytes() << " rollback bytes";
    if (offload_ != nullptr) {
      const int64_t cpu_groups =
          pipeline_->plan().num_sub_groups() - super_->first_cpu_sub_group();
      const int64_t holdable = o_.ds.zero.offload_optimizer.buffer_count / 3;
      LOG(INFO) << "superoffload: optimizer state on NVMe; up to " << holdable
                << " sub-groups held in swap buffers per step (offload_optimizer.buffer_count / 3)";
      if (holdable < cpu_groups) {
        LOG(WARNING) << "superoffload: " << cpu_groups << " CPU sub-groups but buffer_count "
                     << o_.ds.zero.offload_optimizer.buffer_count << " holds " << holdable
                     << "; the others step after validation. Set buffer_count to "
                     << 3 * cpu_groups << " to speculate them all";
      }
    }
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

absl::Status Trainer::SetUp(int64_t* start_step) {
  // Caps ATen's intra-op pool and, through it, MKL's (the wheel's BLAS), so N ranks on N cores
  // do not oversubscribe the machine.
  at::set_num_threads(o_.threads_per_rank);
  data::CorpusOptions corpus_options = o_.data;
  // A SentencePiece tokenizer is recorded with the job.
  corpus_options.record_dir = o_.checkpoint_dir;
  corpus_options.rank = coll_.rank();
  corpus_options.world_size = coll_.world_size();
  // The data must be the data the job first started on (data/dataset_identity.h): recorded in
  // the checkpoint directory at the first start (rank 0 writes it), compared by every rank at
  // every later start, before the corpus is loaded. A change is a dataset error (exit 66, not
  // restarted) naming the file; every rank sees the same files, so every rank exits with it.
  if (!o_.checkpoint_dir.empty()) {
    ASSIGN_OR_RETURN(data::DatasetIdentityCheck check,
                     data::CheckOrRecordDatasetIdentity(corpus_options, o_.checkpoint_dir,
                                                        /*write=*/coll_.rank() == 0,
                                                        /*resuming=*/!o_.resume_from.empty()));
    if (check.verified || check.recorded) {
      LOG(INFO) << "dataset identity " << (check.verified ? "verified" : "recorded") << ": "
                << check.identity.files.size() << " file(s), " << check.identity.total_bytes()
                << " bytes hashed (SHA-256) in " << absl::FormatDuration(check.elapsed);
    }
    for (const std::string& w : check.warnings) {
      LOG(WARNING) << w;
      Emit(WarningEvent(w));
    }
  }
  ASSIGN_OR_RETURN(corpus_, data::LoadCorpus(corpus_options));
  const int64_t w = o_.sequence_length + 1;
  if (static_cast<int64_t>(corpus_.train.size()) < w ||
      static_cast<int64_t>(corpus_.heldout.size()) < w) {
    // A property of the data (for this job's sequence length): the same at every attempt, so a
    // dataset error, not retried. A file truncated under a job that recorded its identity is
    // refused above, naming what changed; this catches jobs from before that, and data too small
    // from the start.
    return data::DatasetError(absl::StrCat(
        "dataset.path: ", o_.data.path, ": training.sequence_length ", o_.sequence_length,
        " + 1 tokens do not fit the corpus (", corpus_.train.size(), " train, ",
        corpus_.heldout.size(), " held-out tokens)"));
  }
  std::unique_ptr<HfWeights> init;
  if (!o_.init_from.empty() && o_.resume_from.empty()) {  // a resume loads its own weights
    ASSIGN_OR_RETURN(init, HfWeights::Open(o_.init_from));
  }
  for (const std::string& w : o_.ds.resolved) Emit(WarningEvent(w));
  for (const std::string& w : o_.ds.warnings) Emit(WarningEvent(w));
  for (const std::string& w : o_.model.warnings) Emit(WarningEvent(w));
  scaler_ = LossScaler(o_.ds.fp16);
  if (o_.ds.sequence_parallel_size > 1) {  // Ulysses (issue 13, sequence_parallel.h)
    if (!o_.trajectory_dir.empty() || o_.test_rank_sequence_length > 0) {
      return absl::InvalidArgumentError(
          "deepspeed_config.sequence_parallel_size: --trajectory_dir and "
          "--test_rank_sequence_length are not supported with sequence parallelism");
    }
  }
  // Every job has its groups (P = 1 creates none, and no collective). The SequenceParallelRunner
  // backpropagates loss_r * n_r / N, so the group's local gradients sum to the sample's gradient
  // and the partition group's factor is D (the world size when P = 1): DeepSpeed #5248.
  ASSIGN_OR_RETURN(groups_, ProcessGroups::Create(coll_, o_.ds.sequence_parallel_size,
                                                  SequenceLoss::kShareOfSample));
  ZeroOptions zopts = ZeroOptionsFor(o_.ds, *groups_);
  // One rank, fp32: the parameters forward and backward read are views of the masters. Every
  // optimizer pipeline writes a master only where no forward or backward reads its parameter
  // (zero_provider.h says why for SuperOffload's speculative step and ZenFlow's CPU step).
  zopts.params_view_masters = true;
  // ZenFlow's host thread accumulates a step's gradients while the next forward runs; with a
  // second gradient buffer (one rank) also through the next backward (zenflow_setup.cc).
  const spec::ZenFlowConfig& zf = o_.ds.zero.zenflow;
  zopts.double_buffer_grads =
      zf.enabled && zf.overlap_step && !o_.test_zenflow_fused_accumulation;
  RETURN_IF_ERROR(SetUpOffload(&zopts));
  ASSIGN_OR_RETURN(model_, ZeroProvider::Create(spec::LlamaParamSpecs(o_.model), &coll_,
                                                {o_.seed, o_.model.initializer_range, init.get()},
                                                zopts));
  ASSIGN_OR_RETURN(llama_, LlamaModel::Create(o_.model, model_.get()));
  ApplyModelExecutionOptions(o_, llama_.get(), &model_->memory());  // attention core, checkpointing
  RETURN_IF_ERROR(InstallTiledCompute(o_.tiled, &coll_, llama_.get()));  // ALST (issue 13)
  if (o_.ds.sequence_parallel_size > 1) {
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
    if (zenflow_ != nullptr) {
      RETURN_IF_ERROR(LoadZenFlowState(*zenflow_, o_.resume_from, coll_.rank(), start));
    } else if (const std::string zf = ZenFlowStateFile(o_.resume_from, coll_.rank());
               ::access(zf.c_str(), F_OK) == 0) {
      // Allowed (a user may turn ZenFlow off to finish a run), but never silently: the masters
      // resume as saved, without the accumulated gradients of the unselected columns and any
      // CPU update not yet published.
      const std::string w = absl::StrCat(
          zf, ": this checkpoint holds ZenFlow state, and this run has no "
          "zero_optimization.zenflow: its host accumulators and any CPU update not yet applied "
          "are dropped");
      LOG(WARNING) << w;
      Emit(WarningEvent(w));
    }
  }
  if (start > o_.steps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training.steps: ", o_.steps, " is below the resumed checkpoint's step ", start));
  }
  *start_step = start;
  return absl::OkStatus();
}

}  // namespace loom::engine::internal
