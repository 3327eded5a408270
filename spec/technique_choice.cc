#include "spec/technique_choice.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "spec/sequence_parallel_config.h"

namespace loom::spec {
namespace {

struct Tried {
  bool fits = false;
  RankMemoryPlan plan;
};

Tried Try(const MemoryPlanInput& in, loom::v1::AcceleratorKind kind, int per_node,
          const std::vector<NodeShape>& nodes) {
  Tried t;
  absl::StatusOr<RankMemoryPlan> plan = PlanRankMemory(in);
  if (!plan.ok()) return t;
  t.fits = FitOnNodes(*plan, in.world_size, kind, per_node, nodes).fits;
  t.plan = *std::move(plan);
  return t;
}

constexpr char kCheckpointing[] = "deepspeed_config.activation_checkpointing: {}";

// `in` as it is, else with activation checkpointing (recomputing a third more of the forward
// pass is cheaper than the next row's communication or offload); `*in` and `*settings` get the
// checkpointing when it was needed.
Tried TryWithCheckpointing(MemoryPlanInput* in, std::vector<std::string>* settings,
                           loom::v1::AcceleratorKind kind, int per_node,
                           const std::vector<NodeShape>& nodes) {
  Tried t = Try(*in, kind, per_node, nodes);
  if (t.fits || in->exec.activation_checkpointing) return t;
  MemoryPlanInput checkpointed = *in;
  checkpointed.exec.activation_checkpointing = true;
  Tried c = Try(checkpointed, kind, per_node, nodes);
  if (!c.fits) return t;
  *in = checkpointed;
  settings->push_back(kCheckpointing);
  return c;
}

// The step's activation terms (memory_plan.cc's names) and the model states (the terms the
// trainer's MemoryTracker counts), over device and host.
int64_t ActivationBytes(const RankMemoryPlan& p) {
  int64_t sum = 0;
  for (const auto* list : {&p.device, &p.host}) {
    for (const MemoryTerm& t : *list) {
      if (absl::StartsWith(t.name, "activation") || absl::StartsWith(t.name, "logits") ||
          absl::StartsWith(t.name, "checkpointed")) {
        sum += t.bytes;
      }
    }
  }
  return sum;
}

// The most ranks one node of `kind` offers (the sequence-parallel group stays inside a node).
int LargestNodeSlots(loom::v1::AcceleratorKind kind, const std::vector<NodeShape>& nodes) {
  int slots = 0;
  for (const NodeShape& n : nodes) {
    if (n.kind == kind && n.count > 0) slots = std::max(slots, n.slots);
  }
  return slots;
}

// The largest sequence-parallel degree that divides the world size, fits one node and the
// model's heads (ValidateSequenceParallel's rules); 1 when none above 1 does.
int64_t UlyssesDegree(const MemoryPlanInput& in, int node_slots) {
  int64_t best = 1;
  for (int64_t p = 2; p <= std::min<int64_t>(in.world_size, std::max(1, node_slots)); ++p) {
    if (in.world_size % p != 0) continue;
    if (!CheckSequenceParallelHeads(in.model.num_attention_heads, in.model.num_key_value_heads, p)
             .ok()) {
      continue;
    }
    best = p;
  }
  return best;
}

TechniqueChoice Choice(Technique t, std::vector<std::string> settings, std::string why,
                       const MemoryPlanInput& in, RankMemoryPlan plan) {
  TechniqueChoice c;
  c.technique = t;
  c.settings = std::move(settings);
  c.why = std::move(why);
  c.input = in;
  c.plan = std::move(plan);
  return c;
}

}  // namespace

const char* TechniqueName(Technique t) {
  switch (t) {
    case Technique::kZero2: return "zero-2";
    case Technique::kZero3: return "zero-3";
    case Technique::kZero3ZenFlow: return "zero-3+zenflow";
    case Technique::kZero3Offload: return "zero-3+offload";
    case Technique::kAlst: return "alst";
    case Technique::kSuperOffload: return "superoffload";
    case Technique::kNoneFits: return "none";
  }
  return "none";
}

namespace {

// One row of the table evaluated on the nodes: the keys it sets, the job with them, its plan.
struct Row {
  Technique technique = Technique::kNoneFits;
  std::vector<std::string> settings;
  MemoryPlanInput input;
  Tried tried;
};

// What a row costs against DDP (ZeRO-2 communicates as much as DDP's all-reduce: ZeRO paper,
// Rajbhandari et al. 2020, §7), as `loomctl plan` lists the alternatives.
std::string CostOf(const Row& row) {
  std::string cost;
  switch (row.technique) {
    case Technique::kZero2:
      cost = "communication as DDP's (gradients reduce-scattered, parameters all-gathered once)";
      break;
    case Technique::kZero3:
      cost = "about 1.5x DDP's communication (parameters all-gathered in the forward and again "
             "in the backward)";
      break;
    case Technique::kZero3ZenFlow:
      cost = "ZeRO-3's communication, plus gradients to and weights from host memory every "
             "step; the CPU optimizer step overlaps the next steps (top-k columns updated on "
             "the device at once)";
      break;
    case Technique::kZero3Offload:
      cost = "ZeRO-3's communication, plus gradients to and weights from host memory every "
             "step, and a CPU optimizer step the device waits for";
      break;
    case Technique::kAlst:
      cost = absl::StrCat("an all-to-all of q, k, v and the attention output per layer over ",
                          row.input.ds.sequence_parallel_size,
                          " ranks; every layer recomputed in the backward");
      break;
    case Technique::kSuperOffload:
      cost = "the optimizer in Grace memory over NVLink-C2C; its CPU step runs speculatively "
             "beside the GPU's next step (rolled back when clipping or an overflow says so)";
      break;
    case Technique::kNoneFits:
      break;
  }
  if (row.technique != Technique::kAlst &&
      std::find(row.settings.begin(), row.settings.end(), kCheckpointing) != row.settings.end()) {
    absl::StrAppend(&cost, "; activation checkpointing: about 1/3 more forward compute");
  }
  return cost;
}

// Settings that turn the user's offload off where a row assumes none.
void WithoutOffload(const MemoryPlanInput& in, MemoryPlanInput* row,
                    std::vector<std::string>* settings) {
  if (in.ds.zero.offload_optimizer.device != "none") {
    settings->push_back("deepspeed_config.zero_optimization.offload_optimizer: {device: none}");
  }
  if (in.ds.zero.offload_param.device != "none") {
    settings->push_back("deepspeed_config.zero_optimization.offload_param: {device: none}");
  }
  row->ds.zero.offload_optimizer.device = "none";
  row->ds.zero.offload_param.device = "none";
}

TechniqueChoice Choose(const Row& row, std::string why) {
  return Choice(row.technique, row.settings, std::move(why), row.input, row.tried.plan);
}

}  // namespace

absl::StatusOr<TechniqueChoice> ChooseTechnique(const MemoryPlanInput& in,
                                                loom::v1::AcceleratorKind kind,
                                                int accelerators_per_node,
                                                const std::vector<NodeShape>& nodes) {
  absl::StatusOr<RankMemoryPlan> as_given = PlanRankMemory(in);
  if (!as_given.ok()) return as_given.status();
  const int k = accelerators_per_node;
  const bool sharded = in.world_size > 1;
  const std::string stage3 = "deepspeed_config.zero_optimization.stage: 3";
  const std::string offload_key =
      "deepspeed_config.zero_optimization.offload_optimizer: {device: cpu}";

  // Every row that applies to this job and these nodes, evaluated (the alternatives).
  std::vector<Row> rows;
  auto add = [&](Technique t, MemoryPlanInput input, std::vector<std::string> settings,
                 bool try_checkpointing) -> const Row& {
    Row row{t, std::move(settings), std::move(input), {}};
    row.tried = try_checkpointing
                    ? TryWithCheckpointing(&row.input, &row.settings, kind, k, nodes)
                    : Try(row.input, kind, k, nodes);
    rows.push_back(std::move(row));
    return rows.back();
  };

  MemoryPlanInput zero2 = in;
  zero2.ds.zero.stage = 2;
  std::vector<std::string> zero2_settings = {"deepspeed_config.zero_optimization.stage: 2"};
  WithoutOffload(in, &zero2, &zero2_settings);
  const Row at_zero2 = add(Technique::kZero2, zero2, zero2_settings, true);

  MemoryPlanInput zero3 = in;
  zero3.ds.zero.stage = 3;
  std::vector<std::string> zero3_settings = {stage3};
  WithoutOffload(in, &zero3, &zero3_settings);
  const Row at_zero3 = add(Technique::kZero3, zero3, zero3_settings, true);

  std::optional<Row> at_so;
  if (kind == loom::v1::ACCELERATOR_KIND_GH200) {
    MemoryPlanInput so = in;
    so.ds.zero.stage = 3;
    so.ds.zero.offload_optimizer.device = "cpu";
    so.ds.zero.offload_optimizer.super_offload = true;
    at_so = add(Technique::kSuperOffload, so,
                {stage3, "deepspeed_config.zero_optimization.offload_optimizer: {device: cpu, "
                         "super_offload: true}"},
                true);
  }

  std::optional<Row> at_alst;
  bool activations_dominate = false;
  if (in.sequence_length >= kLongSequenceTokens) {
    MemoryPlanInput alst = in;
    alst.ds.zero.stage = 3;
    alst.ds.sequence_parallel_size = UlyssesDegree(alst, LargestNodeSlots(kind, nodes));
    alst.tiled.mlp = true;
    alst.tiled.logits_loss = true;
    alst.exec.activation_checkpointing = true;
    alst.exec.activation_checkpoint_cpu_offload = !alst.cpu_rank;
    std::vector<std::string> settings = {stage3};
    if (alst.ds.sequence_parallel_size > 1) {
      settings.push_back(absl::StrCat("deepspeed_config.sequence_parallel_size: ",
                                      alst.ds.sequence_parallel_size));
    }
    settings.push_back("training.tiled_mlp_compute: true");
    settings.push_back("training.tiled_logits_loss: true");
    settings.push_back(alst.exec.activation_checkpoint_cpu_offload
                           ? "training.activation_checkpoint_cpu_offload: true"
                           : kCheckpointing);
    at_alst = add(Technique::kAlst, alst, settings, false);
    absl::StatusOr<RankMemoryPlan> plain = PlanRankMemory(zero3);
    activations_dominate = plain.ok() && ActivationBytes(*plain) > plain->tracked_bytes();
  }

  std::optional<Row> at_zf, at_offload;
  if (!in.cpu_rank) {
    MemoryPlanInput offload = in;
    offload.ds.zero.stage = 3;
    offload.ds.zero.offload_optimizer.device = "cpu";
    MemoryPlanInput zf = offload;
    zf.ds.zero.zenflow.enabled = true;
    zf.ds.zero.zenflow.topk_ratio = 0.1;
    zf.ds.zero.zenflow.update_interval = 4;
    zf.ds.zero.zenflow.overlap_step = true;
    at_zf = add(Technique::kZero3ZenFlow, zf,
                {stage3, offload_key,
                 "deepspeed_config.zero_optimization.zenflow: {topk_ratio: 0.1, update_interval: "
                 "4, overlap_step: true}"},
                true);
    at_offload = add(Technique::kZero3Offload, offload, {stage3, offload_key}, true);
  }

  absl::StatusOr<TechniqueChoice> chosen = [&]() -> TechniqueChoice {
    // 1. Superchips: Grace memory over NVLink-C2C is where SuperOffload keeps the optimizer.
    if (at_so && !at_zero2.tried.fits && at_so->tried.fits) {
      return Choose(*at_so,
                    "GH200: the model states do not fit HBM at ZeRO-2; SuperOffload keeps the "
                    "optimizer in Grace memory and overlaps its CPU step with the GPU");
    }
    // 2. Long sequences: activations, not model states, are what does not fit.
    if (at_alst && !at_zero2.tried.fits && activations_dominate && at_alst->tried.fits) {
      return Choose(*at_alst,
                    absl::StrCat(in.sequence_length,
                                 "-token sequences: activations outweigh the model states; ALST "
                                 "shards the sequence over ",
                                 at_alst->input.ds.sequence_parallel_size,
                                 " ranks and tiles the MLP and the loss"));
    }
    // 3-4. The model fits as it is sharded.
    if (at_zero2.tried.fits) {
      return Choose(at_zero2, "fits at ZeRO-2: no parameter all-gathers, the least communication");
    }
    if (sharded && at_zero3.tried.fits) {
      return Choose(at_zero3, "does not fit at ZeRO-2; ZeRO-3 shards the parameters too");
    }
    // 5. Accelerator ranks: the optimizer in host memory, without its stalls (ZenFlow), or
    // plain ZeRO-Offload when ZenFlow's own host buffers do not fit.
    if (at_zf && at_zf->tried.fits) {
      return Choose(*at_zf,
                    "does not fit the accelerators even at ZeRO-3; the optimizer goes to host "
                    "memory, and ZenFlow updates the important columns on the GPU at once and "
                    "the rest on the CPU, so the offload does not stall the step");
    }
    if (at_offload && at_offload->tried.fits) {
      return Choose(*at_offload,
                    "does not fit the accelerators even at ZeRO-3, and ZenFlow's host buffers "
                    "(12 bytes a parameter) do not fit the host: plain ZeRO-Offload");
    }
    // Nothing fits: the least a rank could need, to say how far off it is.
    MemoryPlanInput smallest = in;
    smallest.ds.zero.stage = 3;
    if (!in.cpu_rank) {
      smallest.ds.zero.offload_optimizer.device = "cpu";
      smallest.ds.zero.offload_param.device = "cpu";
    }
    smallest.exec.activation_checkpointing = true;
    const Tried least = Try(smallest, kind, k, nodes);
    return Choice(
        Technique::kNoneFits, {},
        absl::StrCat("no technique fits these nodes: with ZeRO-3",
                     in.cpu_rank ? "" : ", optimizer and parameter offload",
                     " and activation checkpointing a rank still needs ",
                     FormatBytes(WithAdmissionMargin(least.plan.host_bytes())), " of host",
                     in.cpu_rank ? ""
                                 : absl::StrCat(" and ",
                                                FormatBytes(WithAdmissionMargin(
                                                    least.plan.device_bytes())),
                                                " of device"),
                     " memory"),
        smallest, least.plan);
  }();
  for (const Row& row : rows) {
    if (row.technique == Technique::kZero3 && !sharded) continue;  // one rank: ZeRO-2's plan
    chosen->options.push_back(
        {row.technique, row.tried.fits, row.settings, row.tried.plan, CostOf(row)});
  }
  return chosen;
}

}  // namespace loom::spec
