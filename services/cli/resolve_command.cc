#include "services/cli/resolve_command.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_split.h"
#include "services/cli/job_spec_yaml.h"
#include "services/cli/terminal_text.h"
#include "spec/ds_config.h"
#include "spec/hf_trainer_config.h"
#include "spec/model_config.h"
#include "spec/struct_json.h"

namespace loom::cli {
namespace {

int Refuse(const absl::Status& s) {
  std::fprintf(stderr, "loomctl resolve: %s\n", TerminalSafe(std::string(s.message())).c_str());
  return static_cast<int>(s.code());
}

}  // namespace

int RunResolve(const std::string& path, bool as_json) {
  absl::StatusOr<loom::v1::JobSpec> spec = ReadJobSpecFile(path);
  if (!spec.ok()) return Refuse(spec.status());
  absl::StatusOr<nlohmann::json> model_json =
      spec::StructToJson(spec->model().config(), "model.config");
  if (!model_json.ok()) return Refuse(model_json.status());
  absl::StatusOr<spec::LlamaConfig> model = spec::ParseLlamaConfigValue(*model_json);
  if (!model.ok()) return Refuse(model.status());
  const int world_size = std::max(1, spec->resources().num_ranks());
  nlohmann::json resolved;
  absl::StatusOr<spec::DeepSpeedConfig> ds =
      spec::ParseJobDeepSpeedConfig(*spec, model->hidden_size, world_size, &resolved);
  if (!ds.ok()) return Refuse(ds.status());
  if (as_json) {
    nlohmann::json lrs = nlohmann::json::array();
    const int64_t steps = std::min<int64_t>(spec->training().steps(), 100000);
    for (int64_t s = 0; s < steps; ++s) lrs.push_back(spec::LearningRateAtStep(*ds, s));
    const nlohmann::json out = {
        {"deepspeed_config", resolved}, {"resolved", ds->resolved}, {"learning_rates", lrs}};
    std::printf("%s\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  for (const std::string& note : ds->resolved) {
    std::printf("%s\n", TerminalSafe(note).c_str());
  }
  // Line by line: TerminalSafe escapes the newlines of the indented JSON too.
  for (absl::string_view line :
       absl::StrSplit(resolved.dump(2, ' ', false, nlohmann::json::error_handler_t::replace),
                      '\n')) {
    std::printf("%s\n", TerminalSafe(line).c_str());
  }
  return 0;
}

}  // namespace loom::cli
