// File: spec/job_spec_settings.h
//
// Writing settings such as "deepspeed_config.zero_optimization.stage: 3" into a job spec: the
// form in which spec/technique_choice.h names the keys of a technique, so that `technique: auto`
// (JobSpec.technique) can apply its choice to the spec the trainer will read, and a user reads
// the same text in `loomctl plan` and on the job.
//
// A setting is "PATH: VALUE". PATH is dotted, in the job document's field names (JobSpec's proto
// names; inside deepspeed_config and model.config, the JSON keys): the value replaces what is at
// PATH, and the objects on the way are created when absent. VALUE is one YAML value, flow style
// ("3", "true", "{}", "{device: cpu, super_offload: true}"), read as the job document reads YAML
// (spec/yaml_scalar.h).
//
// Errors: INVALID_ARGUMENT naming the setting when it has no ": ", its VALUE is not YAML, a key on
// the way is not an object, or the result is not a JobSpec (an unknown field, a wrong type); the
// spec is left unchanged then. Pure and thread-safe.
#ifndef LOOM_SPEC_JOB_SPEC_SETTINGS_H_
#define LOOM_SPEC_JOB_SPEC_SETTINGS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/common.pb.h"

namespace loom::spec {

absl::Status ApplyJobSpecSettings(const std::vector<std::string>& settings,
                                  loom::v1::JobSpec* spec);

}  // namespace loom::spec

#endif  // LOOM_SPEC_JOB_SPEC_SETTINGS_H_
