// `loomctl plan JOB.yaml [--json]`: offline (no service), the per-rank memory spec/memory_plan.h
// predicts for a job spec: one table per place (host, device, NVMe) with every term's bytes, its
// size in binary units and its formula, and the place's total (issue 48, first slice: no decision
// function or alternatives yet).
#ifndef LOOM_SERVICES_CLI_PLAN_COMMAND_H_
#define LOOM_SERVICES_CLI_PLAN_COMMAND_H_

#include <string>

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
int RunPlan(const std::string& path, bool json);

}  // namespace loom::cli

#endif  // LOOM_SERVICES_CLI_PLAN_COMMAND_H_
