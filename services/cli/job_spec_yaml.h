// Reading a job spec written in YAML (what `loomctl submit job.yaml` takes, and what the REST
// gateway's POST /v1/jobs takes as its "spec") into loom.v1.JobSpec.
//
// The YAML document mirrors JobSpec's fields with their proto names (snake_case); it is turned
// into JSON and parsed with protobuf's JSON mapping, so unknown fields are rejected by the same
// rules as the REST gateway. Two conveniences: `deepspeed_config` and `model.config` may be a
// path (relative to the YAML file) of a JSON file, so an existing ds_config.json or a Hugging
// Face config.json is used as is.
#ifndef LOOM_SERVICES_CLI_JOB_SPEC_YAML_H_
#define LOOM_SERVICES_CLI_JOB_SPEC_YAML_H_

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/common.pb.h"

namespace loom::cli {

// Parses YAML text. `base_dir` resolves relative JSON file references. INVALID_ARGUMENT naming
// the file, the field and the problem (e.g. "job.yaml: unknown field 'trainig' in JobSpec").
absl::StatusOr<loom::v1::JobSpec> JobSpecFromYaml(const std::string& yaml_text,
                                                  const std::string& base_dir,
                                                  const std::string& file_name = "<spec>");

// Where the files a document names (deepspeed_config, model.config given as a path) come from:
// `uploaded` when set (the REST gateway: the files sent with the request, by the path written in
// the document; a path not among them is INVALID_ARGUMENT naming the field and the path), else
// the file system, relative paths from `base_dir` (loomctl).
struct SpecFiles {
  std::string base_dir = ".";
  const std::map<std::string, std::string>* uploaded = nullptr;
};

// The conveniences of the job document that loomctl and the REST gateway both take (issue 49:
// one document), applied in place to its JSON form: `deepspeed_config` and `model.config` given
// as a path are replaced by the JSON object of that file (from `files`), and a short accelerator
// kind ("cpu", "h200") becomes its enum name. INVALID_ARGUMENT naming the field (a file missing,
// unreadable or not a JSON object; an unknown kind).
absl::Status ApplyDocumentConveniences(nlohmann::json& spec, const SpecFiles& files);

// JobSpecFromYaml with the files a document names read from `files`.
absl::StatusOr<loom::v1::JobSpec> JobSpecFromYaml(const std::string& yaml_text,
                                                  const SpecFiles& files,
                                                  const std::string& file_name);

// Reads and parses a YAML file. INVALID_ARGUMENT naming the file if it cannot be read (missing,
// a directory, a FIFO or device, over 64 MiB) or is not UTF-8; files named by
// `deepspeed_config` / `model.config` obey the same rules.
absl::StatusOr<loom::v1::JobSpec> ReadJobSpecFile(const std::string& path);

}  // namespace loom::cli

#endif  // LOOM_SERVICES_CLI_JOB_SPEC_YAML_H_
