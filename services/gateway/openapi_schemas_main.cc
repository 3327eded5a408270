// Prints the generated OpenAPI schemas of loom.v1.JobSpec and the messages it holds
// (openapi_schemas.h) as one JSON object, or with --write=PATH replaces them in the OpenAPI
// document at PATH (key order and formatting kept: 2-space indent, as the file is written):
//
//   bazel run //services/gateway:openapi_schemas -- --write=$PWD/services/gateway/openapi.json
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "proto/common.pb.h"
#include "services/gateway/openapi_schemas.h"

int main(int argc, char** argv) {
  const auto schemas = loom::gateway::MessageSchemas(loom::v1::JobSpec::descriptor());
  std::string write;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--write=", 0) == 0) {
      write = arg.substr(8);
    } else {
      std::fprintf(stderr, "usage: openapi_schemas [--write=OPENAPI_JSON]\n");
      return 2;
    }
  }
  if (write.empty()) {
    nlohmann::json out(schemas);
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::ifstream in(write);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::ordered_json doc = nlohmann::ordered_json::parse(text.str(), nullptr, false);
  if (doc.is_discarded() || !doc.contains("components")) {
    std::fprintf(stderr, "openapi_schemas: %s is not an OpenAPI document\n", write.c_str());
    return 1;
  }
  for (const auto& [name, schema] : schemas) {
    doc["components"]["schemas"][name] = nlohmann::ordered_json::parse(schema.dump());
  }
  std::ofstream out(write);
  out << doc.dump(2) << "\n";
  std::fprintf(stderr, "openapi_schemas: wrote %zu schemas into %s\n", schemas.size(),
               write.c_str());
  return out ? 0 : 1;
}
