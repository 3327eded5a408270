// File: spec/technique_choice.h
//
// Which memory technique a job should use (issue 48's "which technique when" table, written as a
// function): given the job (model, sequence, ranks, dtype as MemoryPlanInput) and the nodes it
// would run on, the first row whose configuration fits the nodes' memory (spec/memory_fit.h,
// with spec/memory_plan.h's prediction) wins:
//
//   1. GH200 superchip nodes, and the model states do not fit HBM at ZeRO-2: SuperOffload (ZeRO-3,
//      optimizer in Grace memory, speculative CPU steps; TECHNIQUES.md §4: 14-20B on one GH200,
//      70B on four).
//   2. A long sequence (>= kLongSequenceTokens) whose activations outweigh the model states:
//      ALST (Ulysses sequence parallelism over the node's ranks, tiled MLP and logits+loss,
//      activation checkpoints in host memory; TECHNIQUES.md §3: hundreds of thousands of tokens
//      on one node).
//   3. The model fits at ZeRO-2: ZeRO-2 (no parameter gathers: the cheapest communication;
//      DeepSpeed's advice for 7-13B models that fit).
//   4. It fits at ZeRO-3: ZeRO-3 (parameters sharded too).
//   5. Accelerator ranks whose states fit only with the optimizer in host memory: ZeRO-3 +
//      ZenFlow (offload_optimizer cpu with ZenFlow's stall-free selective updates; TECHNIQUES.md
//      §2: 70B-class models on one node), or plain ZeRO-Offload when ZenFlow's own host buffers
//      (12 bytes a parameter in Loom's pipeline) do not fit the host.
//   Otherwise nothing fits: the answer says so with the smallest need found.
// Rows 1 and 3-5 first try the configuration as it is, then with activation checkpointing
// (recomputing a third more of the forward is cheaper than the next row's cost).
//
// Each answer names the DeepSpeed keys to set (as a user writes them), the reason, and the plan
// with them applied. Torch-free and pure; thread-safe.
#ifndef LOOM_SPEC_TECHNIQUE_CHOICE_H_
#define LOOM_SPEC_TECHNIQUE_CHOICE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/common.pb.h"
#include "spec/memory_fit.h"
#include "spec/memory_plan.h"

namespace loom::spec {

// From here on a sequence counts as long (tokens per sample).
inline constexpr int64_t kLongSequenceTokens = 32768;

enum class Technique {
  kZero2,
  kZero3,
  kZero3ZenFlow,
  kZero3Offload,
  kAlst,
  kSuperOffload,
  kNoneFits
};

// "zero-2", "zero-3", "zero-3+zenflow", "zero-3+offload", "alst", "superoffload", "none".
const char* TechniqueName(Technique t);

// One row of the table on these nodes, as `loomctl plan` lists the alternatives.
struct TechniqueOption {
  Technique technique = Technique::kNoneFits;
  bool fits = false;
  std::vector<std::string> settings;
  RankMemoryPlan plan;
  // The expected cost against DDP, e.g. "about 1.5x DDP's communication (...)".
  std::string cost;
};

struct TechniqueChoice {
  Technique technique = Technique::kNoneFits;
  // The deepspeed_config / training keys that select it, e.g.
  // {"deepspeed_config.zero_optimization.stage: 2"}.
  std::vector<std::string> settings;
  std::string why;
  MemoryPlanInput input;  // the job with `settings` applied
  RankMemoryPlan plan;    // its plan (the smallest one tried when nothing fits)
  // Every row that applies to the job and the nodes (the chosen one included), in the table's
  // order of evaluation: ZeRO-2, ZeRO-3 (more than one rank), SuperOffload (GH200), ALST (long
  // sequences), ZeRO-3 + ZenFlow and + offload (accelerators).
  std::vector<TechniqueOption> options;
};

// The choice for `in` on `nodes` of `kind` (accelerators_per_node as the job's). Errors: those
// of PlanRankMemory for `in` itself.
absl::StatusOr<TechniqueChoice> ChooseTechnique(const MemoryPlanInput& in,
                                                loom::v1::AcceleratorKind kind,
                                                int accelerators_per_node,
                                                const std::vector<NodeShape>& nodes);

}  // namespace loom::spec

#endif  // LOOM_SPEC_TECHNIQUE_CHOICE_H_
