// `loomctl plan JOB.yaml [--nodes=COUNT:SLOTS:HOST_GIB[:ACCELERATOR_GIB]] [--json]`: offline (no
// service), the per-rank memory spec/memory_plan.h predicts for a job spec: one table per place
// (host, device, NVMe) with every term's bytes, its size in binary units and its formula, and the
// place's total. With --nodes (nodes of the job's accelerator kind, e.g. 2:1:24 for two 1-slot
// 24 GiB workers, 1:8:2048:80 for an HGX H100), also whether the job fits them as admission
// would judge it (spec/memory_fit.h) and the technique the decision table picks
// (spec/technique_choice.h) with the keys to set (issue 48).
#ifndef LOOM_SERVICES_CLI_PLAN_COMMAND_H_
#define LOOM_SERVICES_CLI_PLAN_COMMAND_H_

#include <string>

#include "absl/status/statusor.h"
#include "spec/memory_fit.h"
#include "spec/memory_plan.h"

namespace loom::cli {

// The text tables of `plan` for a job of `num_ranks` ranks, e.g.
//   per-rank memory plan: 2 ranks, ZeRO stage 3, CPU ranks (device memory is host memory)
//   host memory per rank
//     TERM                                   BYTES        SIZE  FORMULA
//     parameters                            357312   348.9 KiB  2P = 2 x 178656: ...
//     total                              542180352   517.1 MiB
// A place with no term is left out, except host. Term names and formulas are printed through
// TerminalSafe. Pure; thread-safe.
std::string FormatMemoryPlan(const spec::RankMemoryPlan& plan, int num_ranks, int zero_stage);

// Reads the job spec at `path` (YAML, as `loomctl submit`) and prints FormatMemoryPlan, or with
// `json` {"num_ranks": N, "cpu_rank": b, "host": {"terms": [{"name", "bytes", "formula"}],
// "total_bytes": n}, "device": {...}, "nvme": {...}}. Returns 0, 3 (INVALID_ARGUMENT: the spec
// is refused, the message on stderr names the field) or the status code of reading the file.
// `nodes`: the --nodes value ("" = none); INVALID_ARGUMENT (exit 3) "--nodes: ..." when malformed.
int RunPlan(const std::string& path, bool json, const std::string& nodes = "");

// Parses --nodes for nodes of `kind`. INVALID_ARGUMENT naming the flag.
absl::StatusOr<spec::NodeShape> ParseNodesFlag(const std::string& value,
                                               loom::v1::AcceleratorKind kind);

}  // namespace loom::cli

#endif  // LOOM_SERVICES_CLI_PLAN_COMMAND_H_
