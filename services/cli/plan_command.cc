#include "services/cli/plan_command.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/cli/job_spec_yaml.h"
#include "services/cli/terminal_text.h"

namespace loom::cli {
namespace {

int Refuse(const absl::Status& s) {
  std::fprintf(stderr, "loomctl plan: %s\n", TerminalSafe(std::string(s.message())).c_str());
  return static_cast<int>(s.code());
}

void AppendPlace(const std::string& title, const std::vector<spec::MemoryTerm>& terms,
                 std::string* out) {
  absl::StrAppend(out, title, "\n");
  absl::StrAppendFormat(out, "  %-36s %16s  %10s  %s\n", "TERM", "BYTES", "SIZE", "FORMULA");
  for (const spec::MemoryTerm& t : terms) {
    absl::StrAppendFormat(out, "  %-36s %16d  %10s  %s\n", TerminalSafe(t.name), t.bytes,
                          spec::FormatBytes(t.bytes), TerminalSafe(t.formula));
  }
  const int64_t total = spec::RankMemoryPlan::Sum(terms);
  absl::StrAppendFormat(out, "  %-36s %16d  %10s\n", "total", total, spec::FormatBytes(total));
}

nlohmann::json PlaceJson(const std::vector<spec::MemoryTerm>& terms) {
  nlohmann::json list = nlohmann::json::array();
  for (const spec::MemoryTerm& t : terms) {
    list.push_back({{"name", t.name}, {"bytes", t.bytes}, {"formula", t.formula}});
  }
  return {{"terms", list}, {"total_bytes", spec::RankMemoryPlan::Sum(terms)}};
}

}  // namespace

std::string FormatMemoryPlan(const spec::RankMemoryPlan& plan, int num_ranks, int zero_stage) {
  std::string out = absl::StrFormat(
      "per-rank memory plan: %d rank%s, ZeRO stage %d, %s\n", num_ranks, num_ranks == 1 ? "" : "s",
      zero_stage,
      plan.cpu_rank ? "CPU ranks (device memory is host memory)" : "accelerator ranks");
  AppendPlace("host memory per rank", plan.host, &out);
  if (!plan.device.empty()) AppendPlace("device memory per rank", plan.device, &out);
  if (!plan.nvme.empty()) AppendPlace("NVMe per rank", plan.nvme, &out);
  return out;
}

int RunPlan(const std::string& path, bool json) {
  absl::StatusOr<loom::v1::JobSpec> spec = ReadJobSpecFile(path);
  if (!spec.ok()) return Refuse(spec.status());
  absl::StatusOr<spec::MemoryPlanInput> in = spec::MemoryPlanInputFromJobSpec(*spec);
  if (!in.ok()) return Refuse(in.status());
  absl::StatusOr<spec::RankMemoryPlan> plan = spec::PlanRankMemory(*in);
  if (!plan.ok()) return Refuse(plan.status());
  if (json) {
    const nlohmann::json out = {{"num_ranks", in->world_size},
                                {"cpu_rank", plan->cpu_rank},
                                {"host", PlaceJson(plan->host)},
                                {"device", PlaceJson(plan->device)},
                                {"nvme", PlaceJson(plan->nvme)}};
    std::printf("%s\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  std::printf("%s", FormatMemoryPlan(*plan, in->world_size, in->ds.zero.stage).c_str());
  return 0;
}

}  // namespace loom::cli
