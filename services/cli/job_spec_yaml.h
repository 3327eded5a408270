// Reading a job spec written in YAML (what `loomctl submit job.yaml` takes) into loom.v1.JobSpec.
//
// The YAML document mirrors JobSpec's fields with their proto names (snake_case); it is turned
// into JSON and parsed with protobuf's JSON mapping, so unknown fields are rejected by the same
// rules as the REST gateway. Two conveniences: `deepspeed_config` and `model.config` may be a
// path (relative to the YAML file) of a JSON file, so an existing ds_config.json or a Hugging
// Face config.json is used as is.
#ifndef LOOM_SERVICES_CLI_JOB_SPEC_YAML_H_
#define LOOM_SERVICES_CLI_JOB_SPEC_YAML_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/common.pb.h"

namespace loom::cli {

// Parses YAML text. `base_dir` resolves relative JSON file references. INVALID_ARGUMENT naming
// the file, the field and the problem (e.g. "job.yaml: unknown field 'trainig' in JobSpec").
absl::StatusOr<loom::v1::JobSpec> JobSpecFromYaml(const std::string& yaml_text,
                                                  const std::string& base_dir,
                                                  const std::string& file_name = "<spec>");

// Reads and parses a YAML file. INVALID_ARGUMENT naming the file if it cannot be read (missing,
// a directory, a FIFO or device, over 64 MiB) or is not UTF-8; files named by
// `deepspeed_config` / `model.config` obey the same rules.
absl::StatusOr<loom::v1::JobSpec> ReadJobSpecFile(const std::string& path);

}  // namespace loom::cli

#endif  // LOOM_SERVICES_CLI_JOB_SPEC_YAML_H_
