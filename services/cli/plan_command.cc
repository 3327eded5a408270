#include "services/cli/plan_command.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/cli/job_spec_yaml.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "services/cli/terminal_text.h"
#include "spec/memory_fit.h"
#include "spec/technique_choice.h"

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

absl::StatusOr<spec::NodeShape> ParseNodesFlag(const std::string& value,
                                               loom::v1::AcceleratorKind kind) {
  const std::vector<std::string> parts = absl::StrSplit(value, ':');
  spec::NodeShape node;
  node.kind = kind;
  double host_gib = 0, accelerator_gib = 0;  // decimals allowed: 0.75 for a 768 MiB cap
  if ((parts.size() != 3 && parts.size() != 4) || !absl::SimpleAtoi(parts[0], &node.count) ||
      !absl::SimpleAtoi(parts[1], &node.slots) || !absl::SimpleAtod(parts[2], &host_gib) ||
      (parts.size() == 4 && !absl::SimpleAtod(parts[3], &accelerator_gib)) || node.count < 1 ||
      node.slots < 1 || !(host_gib >= 0 && host_gib < 1e9) ||
      !(accelerator_gib >= 0 && accelerator_gib < 1e9)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--nodes: '", value,
        "' is not COUNT:SLOTS:HOST_GIB[:ACCELERATOR_GIB] with COUNT, SLOTS >= 1 (e.g. 2:1:24 "
        "for two 1-slot 24 GiB workers, 1:8:2048:80 for an HGX H100)"));
  }
  node.host_memory_bytes = std::llround(host_gib * (int64_t{1} << 30));
  node.accelerator_memory_bytes = std::llround(accelerator_gib * (int64_t{1} << 30));
  return node;
}

int RunPlan(const std::string& path, bool json, const std::string& nodes) {
  absl::StatusOr<loom::v1::JobSpec> spec = ReadJobSpecFile(path);
  if (!spec.ok()) return Refuse(spec.status());
  absl::StatusOr<spec::MemoryPlanInput> in = spec::MemoryPlanInputFromJobSpec(*spec);
  if (!in.ok()) return Refuse(in.status());
  absl::StatusOr<spec::RankMemoryPlan> plan = spec::PlanRankMemory(*in);
  if (!plan.ok()) return Refuse(plan.status());
  const loom::v1::AcceleratorKind kind =
      spec->resources().accelerator() == loom::v1::ACCELERATOR_KIND_UNSPECIFIED
          ? loom::v1::ACCELERATOR_KIND_CPU
          : spec->resources().accelerator();
  const int per_node = spec->resources().accelerators_per_node();
  std::optional<spec::NodeShape> node;
  absl::Status fit;
  std::optional<spec::TechniqueChoice> choice;
  if (!nodes.empty()) {
    absl::StatusOr<spec::NodeShape> parsed = ParseNodesFlag(nodes, kind);
    if (!parsed.ok()) return Refuse(parsed.status());
    node = *parsed;
    fit = spec::CheckJobFitsMemory(*in, kind, per_node, {*node});
    absl::StatusOr<spec::TechniqueChoice> c = spec::ChooseTechnique(*in, kind, per_node, {*node});
    if (!c.ok()) return Refuse(c.status());
    choice = *std::move(c);
  }
  if (json) {
    nlohmann::json out = {{"num_ranks", in->world_size},
                          {"cpu_rank", plan->cpu_rank},
                          {"host", PlaceJson(plan->host)},
                          {"device", PlaceJson(plan->device)},
                          {"nvme", PlaceJson(plan->nvme)},
                          // A node must hold a rank's total times (1 + this) to admit it.
                          {"admission_margin", spec::kAdmissionMargin}};
    if (choice.has_value()) {
      out["fits"] = fit.ok();
      if (!fit.ok()) {
        out["refusal"] = std::string(fit.message());
        // The refusal's suggestion as settings a script can write into the spec.
        if (std::optional<spec::MemorySuggestion> suggestion =
                spec::SuggestMemoryFit(*in, kind, per_node, {*node})) {
          out["suggestion"] = {{"change", suggestion->change},
                               {"settings", suggestion->settings},
                               {"host_bytes", suggestion->plan.host_bytes()},
                               {"device_bytes", suggestion->plan.device_bytes()}};
        }
      }
      out["technique"] = {{"name", spec::TechniqueName(choice->technique)},
                          {"why", choice->why},
                          {"settings", choice->settings}};
      nlohmann::json options = nlohmann::json::array();
      for (const spec::TechniqueOption& o : choice->options) {
        options.push_back({{"name", spec::TechniqueName(o.technique)},
                           {"fits", o.fits},
                           {"settings", o.settings},
                           {"host_bytes", o.plan.host_bytes()},
                           {"device_bytes", o.plan.device_bytes()},
                           {"cost", o.cost}});
      }
      out["technique"]["options"] = std::move(options);
    }
    std::printf("%s\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  std::printf("%s", FormatMemoryPlan(*plan, in->world_size, in->ds.zero.stage).c_str());
  if (choice.has_value()) {
    std::printf("\non %d node(s) of %d slot(s), %s host%s: %s\n", node->count, node->slots,
                spec::FormatBytes(node->host_memory_bytes).c_str(),
                node->accelerator_memory_bytes > 0
                    ? absl::StrCat(", ", spec::FormatBytes(node->accelerator_memory_bytes),
                                   " per accelerator")
                          .c_str()
                    : "",
                fit.ok() ? "fits" : TerminalSafe(std::string(fit.message())).c_str());
    std::printf("technique: %s (%s)\n", spec::TechniqueName(choice->technique),
                TerminalSafe(choice->why).c_str());
    for (const std::string& s : choice->settings) std::printf("  set %s\n", s.c_str());
    std::printf("\nthe techniques on these nodes (per rank with the settings each needs):\n");
    for (const spec::TechniqueOption& o : choice->options) {
      std::printf("  %-15s %-8s host %10s%s  %s\n", spec::TechniqueName(o.technique),
                  o.fits ? "fits" : "no room", spec::FormatBytes(o.plan.host_bytes()).c_str(),
                  o.plan.cpu_rank
                      ? ""
                      : absl::StrCat(", device ", spec::FormatBytes(o.plan.device_bytes())).c_str(),
                  o.cost.c_str());
    }
  }
  return 0;
}

}  // namespace loom::cli
