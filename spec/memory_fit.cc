#include "spec/memory_fit.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/accelerator_kind.h"

namespace loom::spec {
namespace {

const MemoryTerm& Largest(const std::vector<MemoryTerm>& terms) {
  static const MemoryTerm* const kNone = new MemoryTerm();
  const MemoryTerm* best = kNone;
  for (const MemoryTerm& t : terms) {
    if (t.bytes > best->bytes) best = &t;
  }
  return *best;
}

// Slots of the job's kind in all (how far "more ranks" may go).
int SlotsOfKind(loom::v1::AcceleratorKind kind, const std::vector<NodeShape>& nodes) {
  int slots = 0;
  for (const NodeShape& n : nodes) {
    if (n.kind == kind && n.count > 0) slots += std::max(0, n.slots) * n.count;
  }
  return slots;
}

struct Candidate {
  std::string change;
  MemoryPlanInput in;
  std::vector<std::string> settings;  // "PATH: VALUE" (spec/job_spec_settings.h)
};

constexpr char kStage2[] = "deepspeed_config.zero_optimization.stage: 2";
constexpr char kStage3[] = "deepspeed_config.zero_optimization.stage: 3";
constexpr char kCheckpointing[] = "deepspeed_config.activation_checkpointing: {}";

// The candidate changes of `in`, cheapest first (see memory_fit.h).
std::vector<Candidate> Candidates(const MemoryPlanInput& in, int max_ranks) {
  std::vector<Candidate> out;
  if (in.ds.zero.stage < 2 && in.world_size > 1) {
    Candidate c{kStage2, in, {kStage2}};
    c.in.ds.zero.stage = 2;
    out.push_back(std::move(c));
  }
  const bool can_stage3 = in.ds.zero.stage < 3 && in.world_size > 1;
  const bool can_checkpoint = !in.exec.activation_checkpointing;
  if (can_stage3) {
    Candidate c{kStage3, in, {kStage3}};
    c.in.ds.zero.stage = 3;
    out.push_back(std::move(c));
  }
  if (can_checkpoint) {
    Candidate c{absl::StrCat(kCheckpointing, " (checkpoint every decoder layer)"), in,
                {kCheckpointing}};
    c.in.exec.activation_checkpointing = true;
    out.push_back(std::move(c));
  }
  const int64_t micro = in.ds.train_micro_batch_size_per_gpu;
  const int64_t gas = std::max<int64_t>(1, in.ds.gradient_accumulation_steps);
  for (int64_t b = micro / 2; b >= 1 && micro % b == 0; b /= 2) {
    Candidate c{absl::StrCat("deepspeed_config.train_micro_batch_size_per_gpu: ", b,
                             " with gradient_accumulation_steps: ", gas * (micro / b),
                             " (the same global batch)"),
                in,
                {absl::StrCat("deepspeed_config.train_micro_batch_size_per_gpu: ", b),
                 absl::StrCat("deepspeed_config.gradient_accumulation_steps: ",
                              gas * (micro / b))}};
    c.in.ds.train_micro_batch_size_per_gpu = b;
    c.in.ds.gradient_accumulation_steps = gas * (micro / b);
    out.push_back(std::move(c));
    if (b == 1) break;
  }
  if (can_stage3 && can_checkpoint) {
    Candidate c{absl::StrCat(kStage3, " and ", kCheckpointing), in, {kStage3, kCheckpointing}};
    c.in.ds.zero.stage = 3;
    c.in.exec.activation_checkpointing = true;
    out.push_back(std::move(c));
  }
  // More ranks shard the model states (stage 3 for all three of them).
  for (int n = in.world_size * 2; n <= max_ranks; n *= 2) {
    Candidate c{absl::StrCat("resources.num_ranks: ", n,
                             in.ds.zero.stage < 3 ? " with deepspeed_config.zero_optimization.stage: 3"
                                                  : "",
                             " (train_batch_size, if set, becomes micro-batch x "
                             "gradient_accumulation_steps x ",
                             n, ")"),
                in,
                {absl::StrCat("resources.num_ranks: ", n), kStage3}};
    c.in.world_size = n;
    c.in.ds.zero.stage = 3;
    out.push_back(std::move(c));
  }
  if (!in.cpu_rank) {
    if (in.ds.zero.offload_optimizer.device == "none" && in.ds.zero.stage >= 1) {
      constexpr char kOffload[] =
          "deepspeed_config.zero_optimization.offload_optimizer: {device: cpu}";
      Candidate c{kOffload, in, {kOffload}};
      c.in.ds.zero.offload_optimizer.device = "cpu";
      out.push_back(std::move(c));
    }
    if (in.ds.zero.offload_param.device == "none") {
      Candidate c{"deepspeed_config.zero_optimization: {stage: 3, offload_optimizer: {device: "
                  "cpu}, offload_param: {device: cpu}}",
                  in,
                  {kStage3, "deepspeed_config.zero_optimization.offload_optimizer: {device: cpu}",
                   "deepspeed_config.zero_optimization.offload_param: {device: cpu}"}};
      c.in.ds.zero.stage = 3;
      c.in.ds.zero.offload_optimizer.device = "cpu";
      c.in.ds.zero.offload_param.device = "cpu";
      out.push_back(std::move(c));
    }
  }
  return out;
}

// Every change at once: the least memory a rank could need on these nodes.
MemoryPlanInput Smallest(const MemoryPlanInput& in, int max_ranks) {
  MemoryPlanInput s = in;
  if (s.world_size > 1 || max_ranks > 1) s.ds.zero.stage = 3;
  s.exec.activation_checkpointing = true;
  const int64_t micro = s.ds.train_micro_batch_size_per_gpu;
  if (micro > 1) {
    s.ds.gradient_accumulation_steps = std::max<int64_t>(1, s.ds.gradient_accumulation_steps) * micro;
    s.ds.train_micro_batch_size_per_gpu = 1;
  }
  for (int n = s.world_size * 2; n <= max_ranks; n *= 2) s.world_size = n;
  if (!s.cpu_rank) {
    s.ds.zero.offload_optimizer.device = "cpu";
    s.ds.zero.offload_param.device = "cpu";
  }
  return s;
}

}  // namespace

int64_t WithAdmissionMargin(int64_t bytes) {
  return static_cast<int64_t>(std::ceil(static_cast<double>(bytes) * (1.0 + kAdmissionMargin)));
}

MemoryFit FitOnNodes(const RankMemoryPlan& plan, int num_ranks, loom::v1::AcceleratorKind kind,
                     int accelerators_per_node, const std::vector<NodeShape>& nodes) {
  MemoryFit fit;
  const int64_t host_need = WithAdmissionMargin(plan.host_bytes());
  const int64_t device_need = plan.cpu_rank ? 0 : WithAdmissionMargin(plan.device_bytes());
  bool any = false;
  bool device_binds = false;
  int64_t host_room = 0;
  int64_t device_room = 0;
  for (const NodeShape& node : nodes) {
    if (node.kind != kind || node.count <= 0 || node.slots <= 0) continue;
    any = true;
    int held = node.slots;
    if (!plan.cpu_rank && node.accelerator_memory_bytes > 0) {
      device_room = std::max(device_room, node.accelerator_memory_bytes);
      if (device_need > node.accelerator_memory_bytes) held = 0;
    }
    if (node.host_memory_bytes > 0 && host_need > 0) {
      host_room = std::max(host_room, node.host_memory_bytes);
      held = static_cast<int>(std::min<int64_t>(held, node.host_memory_bytes / host_need));
    }
    if (accelerators_per_node > 0) {
      held = node.slots >= accelerators_per_node && held >= accelerators_per_node
                 ? accelerators_per_node
                 : 0;
    }
    fit.ranks_held += held * node.count;
  }
  if (!plan.cpu_rank && device_room > 0 && device_need > device_room) device_binds = true;
  fit.fits = !any || fit.ranks_held >= num_ranks;
  if (fit.fits) return fit;
  if (device_binds) {
    fit.place = "device";
    fit.need_bytes = device_need;
    fit.room_bytes = device_room;
    fit.largest = Largest(plan.device);
  } else {
    fit.place = "host";
    fit.need_bytes = host_need;
    fit.room_bytes = host_room;
    fit.largest = Largest(plan.host);
  }
  return fit;
}

std::optional<MemorySuggestion> SuggestMemoryFit(const MemoryPlanInput& in,
                                                 loom::v1::AcceleratorKind kind,
                                                 int accelerators_per_node,
                                                 const std::vector<NodeShape>& nodes) {
  for (Candidate& c : Candidates(in, SlotsOfKind(kind, nodes))) {
    absl::StatusOr<RankMemoryPlan> plan = PlanRankMemory(c.in);
    if (!plan.ok()) continue;  // e.g. a rank count the sequence-parallel degree does not divide
    if (FitOnNodes(*plan, c.in.world_size, kind, accelerators_per_node, nodes).fits) {
      return MemorySuggestion{std::move(c.change), *std::move(plan), c.in.world_size,
                              std::move(c.settings)};
    }
  }
  return std::nullopt;
}

absl::Status CheckJobFitsMemory(const MemoryPlanInput& in, loom::v1::AcceleratorKind kind,
                                int accelerators_per_node, const std::vector<NodeShape>& nodes) {
  absl::StatusOr<RankMemoryPlan> plan = PlanRankMemory(in);
  if (!plan.ok()) return plan.status();
  const MemoryFit fit = FitOnNodes(*plan, in.world_size, kind, accelerators_per_node, nodes);
  if (fit.fits) return absl::OkStatus();
  const std::string name = AcceleratorKindName(kind);
  std::string why = absl::StrCat(
      "memory: ", in.world_size, " ", name, " rank", in.world_size == 1 ? "" : "s",
      " would run out of memory: one rank needs ", FormatBytes(fit.need_bytes), " of ", fit.place,
      " memory (the plan's ",
      FormatBytes(fit.place == "device" ? plan->device_bytes() : plan->host_bytes()), " with ",
      static_cast<int>(kAdmissionMargin * 100), "% margin; largest term: ", fit.largest.name, " ",
      FormatBytes(fit.largest.bytes), "), and the ", name, " nodes hold ",
      fit.ranks_held, " such rank", fit.ranks_held == 1 ? "" : "s", " (the roomiest has ",
      FormatBytes(fit.room_bytes), fit.place == "device" ? " per accelerator)" : ")", ". ");
  if (std::optional<MemorySuggestion> s = SuggestMemoryFit(in, kind, accelerators_per_node, nodes)) {
    absl::StrAppend(&why, "Would fit: ", s->change, " (then ",
                    FormatBytes(WithAdmissionMargin(fit.place == "device" ? s->plan.device_bytes()
                                                                 : s->plan.host_bytes())),
                    " per rank with the margin). ");
  } else {
    const MemoryPlanInput smallest = Smallest(in, SlotsOfKind(kind, nodes));
    absl::StatusOr<RankMemoryPlan> least = PlanRankMemory(smallest);
    absl::StrAppend(&why, "No change found fits these nodes");
    if (least.ok()) {
      absl::StrAppend(&why, ": even with ZeRO stage 3, activation checkpointing, micro-batch 1",
                      smallest.cpu_rank ? "" : ", optimizer and parameter offload", " and ",
                      smallest.world_size, " ranks a rank needs ",
                      FormatBytes(WithAdmissionMargin(fit.place == "device" ? least->device_bytes()
                                                                   : least->host_bytes())));
    }
    absl::StrAppend(&why, ". Use a smaller model or nodes with more memory. ");
  }
  absl::StrAppend(&why,
                  "Or submit with wait_for_capacity to queue for nodes that are coming "
                  "(loomctl plan JOB.yaml prints every term)");
  return absl::FailedPreconditionError(why);
}

}  // namespace loom::spec
