#include "spec/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "spec/hf_trainer_config.h"
#include "spec/struct_json.h"

namespace loom::spec {

namespace {

// Saturating: an absurd spec (S = 1M eager attention) must give a huge number, not a negative.
int64_t Sat(double bytes) {
  if (!(bytes < 9.0e18)) return std::numeric_limits<int64_t>::max() / 4;
  return bytes <= 0 ? 0 : static_cast<int64_t>(bytes);
}

// The parameter table reduced to what the formulas need.
struct Shapes {
  int64_t psi = 0;        // Ψ
  int64_t part = 0;       // P = Σ ceil(n_i/N)
  int64_t padded = 0;     // Σ N·ceil(n_i/N) (the [N·p] buffers)
  int64_t n_max = 0;      // largest tensor
  int64_t part_max = 0;   // largest partition
  int64_t part_2d = 0;    // P over 2-D weights (ZenFlow's tensors)
  int64_t persistent = 0;      // elements of stage-3 persistent tensors, N·p each
  int64_t nonpersistent = 0;   // Ψ of the others (gathered on use)
};

Shapes ShapesOf(const LlamaConfig& model, int64_t n, int64_t persistence_threshold) {
  Shapes s;
  for (const ParamSpec& p : LlamaParamSpecs(model)) {
    const int64_t numel = p.numel();
    const int64_t part = (numel + n - 1) / n;
    s.psi += numel;
    s.part += part;
    s.padded += n * part;
    s.n_max = std::max(s.n_max, numel);
    s.part_max = std::max(s.part_max, part);
    if (p.shape.size() == 2) s.part_2d += part;
    if (numel <= persistence_threshold) {
      s.persistent += n * part;
    } else {
      s.nonpersistent += numel;
    }
  }
  return s;
}

int64_t RoundUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

class Builder {
 public:
  explicit Builder(bool cpu) { plan_.cpu_rank = cpu; }
  // On a CPU rank every place but NVMe is host memory.
  void Device(const std::string& name, int64_t bytes, const std::string& f, bool tracked) {
    Add(plan_.cpu_rank ? &plan_.host : &plan_.device, name, bytes, f, tracked);
  }
  void Host(const std::string& name, int64_t bytes, const std::string& f, bool tracked) {
    Add(&plan_.host, name, bytes, f, tracked);
  }
  void Nvme(const std::string& name, int64_t bytes, const std::string& f) {
    Add(&plan_.nvme, name, bytes, f, false);
  }
  // `offload` "cpu" -> host, "nvme" -> NVMe, else the device.
  void Placed(const std::string& offload, const std::string& name, int64_t bytes,
              const std::string& f, bool tracked) {
    if (offload == "nvme") return Nvme(name, bytes, f);
    if (offload == "cpu") return Host(name, bytes, f + "; offloaded to host", tracked);
    Device(name, bytes, f, tracked);
  }
  RankMemoryPlan Take() { return std::move(plan_); }

 private:
  static void Add(std::vector<MemoryTerm>* list, const std::string& name, int64_t bytes,
                  const std::string& f, bool tracked) {
    if (bytes <= 0) return;
    list->push_back({name, bytes, f, tracked});
  }
  RankMemoryPlan plan_;
};

// Parameters, gradients, optimizer states and the offload optimizer's buffers.
void ModelStates(const MemoryPlanInput& in, const Shapes& s, int64_t d, Builder* b) {
  const ZeroConfig& z = in.ds.zero;
  const int stage = z.stage;
  const int64_t n = in.world_size;
  const std::string& off_opt = z.offload_optimizer.device;
  const std::string& off_par = z.offload_param.device;
  const std::string src = " (zero_provider.cc Create)";
  // Parameters.
  if (stage < 3) {
    b->Device("parameters", d * s.psi,
              absl::StrCat(d, "Ψ = ", d, " x ", s.psi, ": full replica", src), true);
  } else {
    // One rank, fp32: a gathered tensor is a view of its shard (gather_views_shard_).
    const int64_t r = (n == 1 && d == 4) ? 0 : d * s.persistent;
    const std::string part_f =
        absl::StrCat(d, "P = ", d, " x ", s.part, ": this rank's partition", src);
    if (off_par == "nvme") {
      b->Nvme("parameter partition (swap file)", 4 * s.part,
              absl::StrCat("4P = 4 x ", s.part, " (offload_optimizer.cc param_partitions)"));
      b->Host("parameter swap buffers",
              std::max<int64_t>(1, z.offload_param.buffer_count > 0 ? z.offload_param.buffer_count
                                                                    : 5) *
                  RoundUp(4 * s.part_max, 4096),
              absl::StrCat("buffer_count x roundup(4 x largest partition ", s.part_max,
                           ", 4096) (offload_optimizer.cc)"),
              true);
    } else {
      b->Placed(off_par, "parameters", d * s.part, part_f, true);
    }
    b->Device("persistent parameters", r,
              absl::StrCat(d, " x N x Σ ceil(n_i/N) over tensors <= "
                              "stage3_param_persistence_threshold = ",
                           d, " x ", s.persistent, " (kept gathered, zero_fetch.cc)"),
              true);
  }
  // Gradients: always fp32 (zero_grads.cc EnsureGrad, NewLocalGrad).
  if (stage == 0) {
    b->Device("gradients", 4 * s.psi, absl::StrCat("4Ψ = 4 x ", s.psi, " (fp32)"), true);
  } else if (stage == 1) {
    b->Device("gradients", 4 * s.padded + 4 * s.part,
              absl::StrCat("4NP + 4P = 4 x ", s.padded, " + 4 x ", s.part,
                           " (fp32 [N·p] local accumulators and the partition, zero_grads.cc)"),
              true);
  } else if (!in.cpu_rank && (off_opt == "cpu" || off_opt == "nvme")) {
    // An accelerator rank with the optimizer offloaded keeps its fp32 gradient partition in
    // pinned host memory, where the CPU optimizer reads it (DeepSpeed's ZeRO-Offload layout,
    // stage_1_and_2.py / stage3.py; Loom's GPU engine is not built yet, issue 43).
    b->Host("gradients", 4 * s.part,
            absl::StrCat("4P = 4 x ", s.part,
                         " (fp32 partition in pinned host memory, ZeRO-Offload's layout)"),
            true);
  } else {
    b->Device("gradients", 4 * s.part,
              absl::StrCat("4P = 4 x ", s.part, " (fp32 partition, zero_grads.cc EnsureGrad)"),
              true);
  }
  // ZenFlow's overlap_step on one rank with an fp32 reduction: a second gradient buffer, so the
  // host thread reads step s's gradients through step s + 1's backward (ZeroOptions::
  // double_buffer_grads, trainer_setup.cc; gradient_buffers() says when it takes effect).
  const bool fp32_wire = in.ds.communication_data_type.empty()
                             ? !(in.ds.bf16_enabled || in.ds.fp16.enabled)
                             : in.ds.communication_data_type == "fp32";
  if (z.zenflow.enabled && z.zenflow.overlap_step && n == 1 && stage >= 1 &&
      z.contiguous_gradients && fp32_wire) {
    b->Device("second gradient buffer", 4 * s.part,
              absl::StrCat("4P = 4 x ", s.part,
                           " (ZenFlow overlap_step, one rank: zero_options.h double_buffer_grads)"),
              true);
  }
  // Optimizer states: Adam m and v in fp32, and the fp32 master when it is a separate tensor.
  const int64_t elems = stage == 0 ? s.psi : s.part;
  const char* e = stage == 0 ? "Ψ" : "P";
  bool master_separate = false;
  if (stage == 0 || stage == 3) master_separate = d != 4;
  if (stage == 1 || stage == 2) master_separate = !(n == 1 && d == 4);  // replica_views_master_
  // ZenFlow and SuperOffload keep Adam's state where offload_optimizer puts it (on a CPU rank
  // the same host memory): the CPU optimizer's moments are the model's (zenflow_pipeline.h,
  // super_offload_pipeline.h "State").
  const std::string& opt_place = off_opt;
  if (off_opt == "nvme") {
    b->Nvme("optimizer states (swap files)", 12 * elems,
            absl::StrCat("12", e, " = 12 x ", elems,
                         ": fp32 master, m, v streams (offload_optimizer.cc)"));
    const int64_t group = std::min(z.sub_group_size, elems);
    b->Host("optimizer swap buffers",
            (z.offload_optimizer.buffer_count > 0 ? z.offload_optimizer.buffer_count : 4) *
                RoundUp(4 * group, 4096),
            absl::StrCat("buffer_count x roundup(4 x min(sub_group_size, ", e, ") = ", group,
                         ", 4096) (offload_optimizer.cc)"),
            true);
  } else {
    b->Placed(opt_place, "optimizer states (Adam m, v)", 8 * elems,
              absl::StrCat("8", e, " = 8 x ", elems, " (fp32 exp_avg, exp_avg_sq)"), true);
    if (master_separate) {
      b->Placed(opt_place, "fp32 master weights", 4 * elems,
                absl::StrCat("4", e, " = 4 x ", elems,
                             " (separate from the parameters: 16-bit, or stages 1-2 on N > 1)"),
                true);
    }
  }
  if (z.zenflow.enabled) {
    // zenflow_pipeline.cc InitCpuCopies: an fp32 copy of every 2-D partition and two
    // accumulation buffers (double buffering) in host memory; selective moments on the device.
    b->Host("ZenFlow host buffers", 12 * s.part_2d,
            absl::StrCat("3 x 4 x P_2d = 12 x ", s.part_2d,
                         " (CPU copy + 2 gradient accumulators, zenflow_pipeline.cc)"),
            false);
    b->Device("ZenFlow selective moments", Sat(8.0 * z.zenflow.topk_ratio * s.part_2d),
              absl::StrCat("8 x topk_ratio x P_2d = 8 x ", z.zenflow.topk_ratio, " x ",
                           s.part_2d),
              false);
  }
  if (z.offload_optimizer.super_offload) {
    // super_offload_pipeline.cc: per CPU sub-group (the last `ratio` share) a snapshot of
    // master, m, v when a rollback can happen (clipping or fp16) and an unscaled-gradient slot
    // with fp16; counted as optimizer state (trainer_setup.cc).
    const bool exact = in.ds.gradient_clipping > 0 || in.ds.fp16.enabled;
    const int per = (exact && off_opt != "nvme" ? 3 : 0) + (in.ds.fp16.enabled ? 1 : 0);
    const double cpu_elems = z.offload_optimizer.ratio * static_cast<double>(elems);
    b->Host("SuperOffload rollback copies", Sat(4.0 * per * cpu_elems),
            absl::StrCat("4 x ", per, " x ratio x ", e, " = 4 x ", per, " x ",
                         z.offload_optimizer.ratio, " x ", elems),
            true);
  }
}

// Communication buffers (BufferPool: kBuffers in use, kCached idle; zero_grads.cc Flush).
void CommBuffers(const MemoryPlanInput& in, const Shapes& s, int64_t d, Builder* b) {
  const ZeroConfig& z = in.ds.zero;
  const int64_t n = in.world_size;
  const int64_t f = z.overlap_comm_effective() ? 2 : 1;  // buckets in flight (Flush)
  const int64_t bucket = std::min(s.padded, f * (z.reduce_bucket_size + s.n_max));
  const std::string bf =
      absl::StrCat("min(Σ N·p = ", s.padded, ", ", f, " x (reduce_bucket_size ",
                   z.reduce_bucket_size, " + n_max ", s.n_max, "))");
  if (z.stage == 0) {
    b->Device("all-reduce bucket", 4 * bucket, absl::StrCat("4 x ", bf, " (fp32, Flush)"), true);
    return;
  }
  const bool wire16 = in.ds.communication_data_type == "bf16" ||
                      in.ds.communication_data_type == "fp16" ||
                      (in.ds.communication_data_type.empty() && in.ds.bf16_enabled);
  // Stages 2-3 on one rank with an fp32 wire and no accumulation: the reduction is the identity
  // and each gradient is written straight into its partition (zero_grads.cc GradDestination,
  // identity_reduction(); a later micro-batch's gradient takes a pooled buffer).
  const bool identity =
      z.stage >= 2 && n == 1 && !wire16 && in.ds.gradient_accumulation_steps <= 1;
  if (!identity) {
    b->Device("largest-tensor temporary", 4 * s.n_max,
              absl::StrCat("4 x n_max = 4 x ", s.n_max), true);
  }
  if (z.stage == 1) return;  // its [N·p] accumulators are the gradients term
  const int64_t bucket_bytes = identity ? 0 : 4 * bucket;
  b->Device("reduce-scatter buckets", bucket_bytes,
            absl::StrCat("4 x ", bf, " (fp32 [N·p] gradient buffers, pooled)"), true);
  if (wire16) {
    b->Device("16-bit reduce-scatter copies", 2 * bucket + 2 * bucket / n,
              absl::StrCat("2 x bucket + 2 x bucket / N (communication_data_type 16-bit)"),
              true);
  } else if (n > 1 && in.ds.gradient_accumulation_steps > 1) {
    // The first reduction since ClearGrads lands in the gradient partition itself; later ones
    // (accumulation) in pooled [p] temporaries (zero_grads.cc Flush).
    b->Device("reduce-scatter outputs", 4 * bucket / n,
              "4 x bucket / N (fp32 partition temporaries, gradient accumulation)", true);
  }
  if (z.stage == 3 && !(n == 1 && d == 4)) {
    const int64_t live =
        std::min({s.nonpersistent, z.stage3_max_live_parameters,
                  s.n_max + z.stage3_prefetch_bucket_size});
    // Gathered in the forward and released layer by layer in the backward, while the backward
    // fills the buckets: the tracker's peak of the sum holds the larger of the two (measured,
    // worker/trainer:memory_plan_trainer_test), so only the excess over the buckets counts.
    b->Device("gathered parameters", std::max<int64_t>(0, d * live - bucket_bytes),
              absl::StrCat("max(0, ", d, " x min(non-persistent Ψ ", s.nonpersistent,
                           ", stage3_max_live_parameters ", z.stage3_max_live_parameters,
                           ", n_max + stage3_prefetch_bucket_size ",
                           s.n_max + z.stage3_prefetch_bucket_size,
                           ") - reduce-scatter buckets) (zero_fetch.cc)"),
              true);
  }
}

// Activations: what autograd keeps for the engine's ops, per decoder layer.
void Activations(const MemoryPlanInput& in, int64_t a, Builder* b) {
  const LlamaConfig& m = in.model;
  const double sp = static_cast<double>(in.ds.sequence_parallel_size);
  const double bsz =
      static_cast<double>(std::max<int64_t>(1, in.ds.train_micro_batch_size_per_gpu));
  const double seq = static_cast<double>(in.sequence_length);
  const double t = bsz * seq / sp;  // tokens this rank holds
  const double h = m.hidden_size, inter = m.intermediate_size, v = m.vocab_size;
  const double hq = m.num_attention_heads, hkv = m.num_key_value_heads, hd = m.head_dim();
  const double q = hq * hd, kv = hkv * hd, layers = m.num_hidden_layers;
  const bool eager = in.exec.attn_implementation == "eager";
  const bool rep = m.num_attention_heads != m.num_key_value_heads;
  // RmsNorm and Linear save their input (autograd_ops.cc): h_in, x1, h_mid, x2 = 4TH. RoPE
  // (x*cos + rotate(x)*sin) keeps x and rotate(x); the core keeps the rotated q, k and v:
  // 3Tq + 3Tkv + Tkv. o_proj keeps the reshaped attention output: Tq. SwiGLU keeps gate, silu,
  // up and their product: 4TI (none with tiled_mlp_compute: TiledMlp saves only x).
  double elems = 4 * t * h + 3 * t * q + 4 * t * kv + t * q;
  std::string f = "a x T x (4H + 4q + 4kv";
  double bytes_extra = 0;
  if (m.qk_norm()) {
    elems += t * q + t * kv;  // the normalised q and k (Qwen3)
    f += " + q + kv (q/k norm)";
  }
  if (eager) {
    // MaterializedCausalAttention: fp32 softmax output [B,Hq,S,S] (+ its cast in bf16) and, with
    // grouped-query attention, the repeated k and v instead of k and v.
    bytes_extra = bsz * (hq / sp) * seq * seq * (4 + (a == 2 ? 2 : 0));
    if (rep) elems += 2 * t * q - 2 * t * kv;
    f += ") + probabilities B x Hq/SP x S² x " + std::to_string(a == 2 ? 6 : 4);
  } else {
    // Blockwise (FlashAttention-2) core: its output and the fp32 logsumexp [B,Hq,S].
    elems += t * q;
    bytes_extra = 4 * t * hq;
    f += " + q) + 4 x T x Hq (logsumexp)";
  }
  if (!in.tiled.mlp) {
    elems += 4 * t * inter;
    f += " + a x 4TI (SwiGLU)";
  }
  const double per_layer = a * elems + bytes_extra;
  const std::string tokens =
      absl::StrCat("T = B x S / SP = ", bsz, " x ", in.sequence_length, " / ", sp, " = ", t);
  const bool ck = in.exec.activation_checkpointing;
  if (!ck) {
    b->Device("activations (all layers)", Sat(layers * per_layer),
              absl::StrCat("L x [", f, "] = ", layers, " x ", Sat(per_layer), "; ", tokens,
                           " (llama_model.cc Layer)"),
              false);
  } else {
    // activation_checkpoint.cc: each layer keeps only its input; backward recomputes one layer.
    const std::string ckf = absl::StrCat("L x a x T x H = ", layers, " x ", a, " x ", t, " x ", h,
                                         " (checkpointed layer inputs, activation_checkpoint.cc)");
    const double ck_bytes = layers * a * t * h;
    if (in.exec.activation_checkpoint_cpu_offload) {
      b->Host("checkpointed layer inputs", Sat(ck_bytes), ckf + "; cpu_checkpointing", true);
    } else {
      b->Device("checkpointed layer inputs", Sat(ck_bytes), ckf, false);
    }
    b->Device("recomputed layer activations", Sat(per_layer),
              absl::StrCat("one layer: ", f, "; ", tokens), false);
  }
  if (in.tiled.mlp) {
    const double tile = std::min(seq / sp, static_cast<double>(in.tiled.mlp_tile_size > 0
                                                                   ? in.tiled.mlp_tile_size
                                                                   : m.hidden_size));
    b->Device("tiled MLP tile", Sat(a * bsz * tile * 4 * inter),
              absl::StrCat("a x B x tile x 4I, tile = ", tile, " tokens (tiled_ops.h TiledMlp)"),
              false);
  }
  // Backward: one layer's incoming gradient, residual and MLP gradients in flight.
  b->Device("activation gradients (one layer)", Sat(a * t * (2 * h + 2 * inter)),
            "a x T x (2H + 2I) (autograd frees each gradient once consumed)", false);
  if (sp > 1) {
    b->Device("Ulysses all-to-all buffers", Sat(a * t * (2 * q + 2 * kv)),
              "a x T x (2q + 2kv) (ulysses_attention.cc: send and receive of q, k, v)", false);
  }
  // Logits and loss. FullLogitsLoss: fp32 logits and log-probabilities [T,V], and at the start of
  // backward the gradient of the log-probabilities (3 x 4TV), + the 16-bit logits before the cast.
  if (!in.tiled.logits_loss) {
    b->Device("logits and loss", Sat(t * v * (12 + (a == 2 ? 2 : 0))),
              absl::StrCat("T x V x ", a == 2 ? 14 : 12, " = ", t, " x ", v, " x ",
                           a == 2 ? 14 : 12,
                           " (fp32 logits, log-softmax and its gradient, llama_model.cc)"),
              false);
  } else {
    const double rows = in.tiled.logits_loss_tile_size > 0
                            ? static_cast<double>(in.tiled.logits_loss_tile_size)
                            : std::max(1.0, std::floor((64.0 * (1 << 20)) / (4 * v)));
    b->Device("tiled logits and loss", Sat(3 * 4 * std::min(rows, t) * v + 4 * v * h),
              absl::StrCat("3 x 4 x rows x V + 4VH, rows = ", std::min(rows, t),
                           " (one tile's fp32 logits, softmax, gradient; local fp32 dW; "
                           "tiled_ops.h TiledLogitsLoss)"),
              false);
  }
}

}  // namespace

int64_t RankMemoryPlan::Sum(const std::vector<MemoryTerm>& terms) {
  int64_t s = 0;
  for (const MemoryTerm& t : terms) s += t.bytes;
  return s;
}

int64_t RankMemoryPlan::tracked_bytes() const {
  int64_t s = 0;
  for (const auto* list : {&device, &host}) {
    for (const MemoryTerm& t : *list) s += t.tracked ? t.bytes : 0;
  }
  return s;
}

const MemoryTerm* RankMemoryPlan::Find(const std::string& name) const {
  for (const auto* list : {&device, &host, &nvme}) {
    for (const MemoryTerm& t : *list) {
      if (t.name == name) return &t;
    }
  }
  return nullptr;
}

absl::StatusOr<RankMemoryPlan> PlanRankMemory(const MemoryPlanInput& in) {
  if (in.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("resources.num_ranks: ", in.world_size, " is < 1"));
  }
  if (in.sequence_length < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.sequence_length: ", in.sequence_length, " is < 1"));
  }
  const int64_t sp = in.ds.sequence_parallel_size;
  if (sp < 1 || in.world_size % sp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "deepspeed_config.sequence_parallel_size: ", sp, " does not divide ", in.world_size));
  }
  if (in.model.num_hidden_layers < 1 || in.model.num_attention_heads < 1 ||
      in.model.num_key_value_heads < 1 || in.model.hidden_size < 1) {
    return absl::InvalidArgumentError("model.config: no layers, heads or hidden size");
  }
  const int64_t d = in.ds.bf16_enabled || in.ds.fp16.enabled ? 2 : 4;
  const Shapes s = ShapesOf(in.model, in.world_size,
                            in.ds.zero.stage == 3 ? in.ds.zero.stage3_param_persistence_threshold
                                                  : -1);
  Builder b(in.cpu_rank);
  if (in.cpu_rank) {
    b.Host("runtime (LibTorch process)", kCpuRuntimeFixedBytes,
           "measured VmRSS of a 0.15M-parameter job, 2026-12-07 (kCpuRuntimeFixedBytes)", false);
  } else {
    b.Device("CUDA context and workspaces", kAcceleratorContextBytes,
             "estimate, not measured (kAcceleratorContextBytes)", false);
    b.Host("runtime (LibTorch process)", kCpuRuntimeFixedBytes,
           "measured on a CPU rank (kCpuRuntimeFixedBytes)", false);
  }
  ModelStates(in, s, d, &b);
  CommBuffers(in, s, d, &b);
  Activations(in, d, &b);
  RankMemoryPlan plan = b.Take();
  if (in.cpu_rank) {
    // The teardown's rise overlaps the step's transients (freed by then): only its excess counts.
    int64_t transient = 0;
    for (const MemoryTerm& t : plan.host) {
      if (!t.tracked && t.name != "runtime (LibTorch process)") transient += t.bytes;
    }
    plan.host.push_back({"heap retention (glibc)", transient / kCpuHeapRetentionDivisor,
                         absl::StrCat("untracked transient terms ", transient, " / ",
                                      kCpuHeapRetentionDivisor,
                                      " (kCpuHeapRetentionDivisor, fitted)"),
                         false});
    if (kCpuTeardownBytes > transient) {
      plan.host.push_back({"process teardown beyond the step's transients",
                           kCpuTeardownBytes - transient,
                           absl::StrCat("max(0, 110 MiB - untracked transient terms ", transient,
                                        ") (kCpuTeardownBytes, measured)"),
                           false});
    }
  }
  return plan;
}

absl::StatusOr<MemoryPlanInput> MemoryPlanInputFromJobSpec(const loom::v1::JobSpec& spec) {
  MemoryPlanInput in;
  ASSIGN_OR_RETURN(nlohmann::json model_json,
                   StructToJson(spec.model().config(), "model.config"));
  ASSIGN_OR_RETURN(in.model, ParseLlamaConfigValue(model_json));
  in.world_size = std::max(1, spec.resources().num_ranks());
  ASSIGN_OR_RETURN(in.ds, ParseJobDeepSpeedConfig(spec, in.model.hidden_size, in.world_size));
  in.sequence_length = spec.training().sequence_length();
  RETURN_IF_ERROR(ParseTiledCompute(spec.training(), &in.tiled));
  RETURN_IF_ERROR(ParseModelExecution(spec, in.ds.activation_checkpointing, &in.exec));
  const loom::v1::AcceleratorKind kind = spec.resources().accelerator();
  in.cpu_rank = kind == loom::v1::ACCELERATOR_KIND_CPU ||
                kind == loom::v1::ACCELERATOR_KIND_UNSPECIFIED;
  return in;
}

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  const double tib = static_cast<double>(int64_t{1} << 40);
  if (b >= tib) return absl::StrFormat("%.2f TiB", b / tib);
  if (b >= double(1 << 30)) return absl::StrFormat("%.2f GiB", b / double(1 << 30));
  if (b >= double(1 << 20)) return absl::StrFormat("%.1f MiB", b / double(1 << 20));
  if (b >= double(1 << 10)) return absl::StrFormat("%.1f KiB", b / double(1 << 10));
  return absl::StrCat(bytes, " B");
}

}  // namespace loom::spec
