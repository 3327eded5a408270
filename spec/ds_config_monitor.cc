// The monitor blocks of a DeepSpeed config (deepspeed/monitor/config.py): tensorboard and
// csv_monitor act (spec/ds_config.h MonitorConfig); wandb is accepted with a warning (comet too,
// with the harmless keys of ds_config_keys.cc).
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "spec/ds_config_internal.h"

namespace loom::spec::ds_config_internal {
namespace {

// A path that stays inside the directory it is joined to: relative, no "..".
bool StaysInside(const std::string& path) {
  if (!path.empty() && path[0] == '/') return false;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "..") return false;
  }
  return true;
}

absl::Status ParseBlock(const json& root, const std::string& key, MonitorBlock* b) {
  ASSIGN_OR_RETURN(const json* block, OptObject(root, key, kRoot));
  if (block == nullptr) return absl::OkStatus();
  const std::string path = Join(kRoot, key);
  RETURN_IF_ERROR(CheckKeys(*block, path, {"enabled", "output_path", "job_name"}));
  RETURN_IF_ERROR(ReadBool(*block, "enabled", path, &b->enabled));
  RETURN_IF_ERROR(ReadString(*block, "output_path", path, &b->output_path));
  RETURN_IF_ERROR(ReadString(*block, "job_name", path, &b->job_name));
  if (!StaysInside(b->output_path)) {
    return Invalid(Join(path, "output_path"),
                   absl::StrCat("'", b->output_path,
                                "' leaves the job's directory: Loom writes the monitor's files "
                                "under <checkpoint dir>/<output_path>/<job_name>, so give a "
                                "relative path without '..' (e.g. \"ds_logs/\")"));
  }
  if (b->job_name.empty() || !StaysInside(b->job_name) ||
      b->job_name.find('/') != std::string::npos) {
    return Invalid(Join(path, "job_name"),
                   absl::StrCat("'", b->job_name, "' is not a directory name"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseMonitors(const json& root, DeepSpeedConfig* c) {
  RETURN_IF_ERROR(ParseBlock(root, "tensorboard", &c->monitor.tensorboard));
  RETURN_IF_ERROR(ParseBlock(root, "csv_monitor", &c->monitor.csv_monitor));
  WarnIgnored(root, kRoot, {"wandb"},
              "a hosted experiment tracker Loom does not call; use tensorboard or csv_monitor "
              "(written into the job's directory)",
              &c->warnings);
  return absl::OkStatus();
}

}  // namespace loom::spec::ds_config_internal
