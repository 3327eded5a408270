// File: spec/yaml_scalar.h
//
// One YAML scalar as the JSON value a job document means by it (YAML 1.2 core schema): plain
// (unquoted) scalars that read as integers, numbers, booleans or null become those JSON types,
// quoted ones stay strings. Shared by the job document reader (services/cli/job_spec_yaml.h) and
// the settings that `technique: auto` writes into a spec (spec/job_spec_settings.h), so both read
// "2", "true" and "{device: cpu}" alike. Pure and thread-safe.
#ifndef LOOM_SPEC_YAML_SCALAR_H_
#define LOOM_SPEC_YAML_SCALAR_H_

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

namespace loom::spec {

// `node` must be a scalar (node.IsScalar()).
nlohmann::json YamlScalarToJson(const YAML::Node& node);

}  // namespace loom::spec

#endif  // LOOM_SPEC_YAML_SCALAR_H_
