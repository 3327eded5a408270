// openapi.json's JobSpec and the schemas it holds are what the compiled proto descriptors say
// (openapi_schemas.h): a field added to proto/common.proto without regenerating fails here, with
// the command that regenerates. Also checks a few mappings by hand, against the protobuf JSON
// mapping's documented forms.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "proto/common.pb.h"
#include "services/gateway/openapi_schemas.h"
#include "tests/testing/subprocess.h"

namespace loom::gateway {
namespace {

using json = nlohmann::json;

TEST(OpenApiSchemasTest, OpenApiJsonHoldsTheGeneratedSchemas) {
  const json doc = json::parse(*ReadFile(testing::RunfilePath("services/gateway/openapi.json")));
  const auto schemas = MessageSchemas(loom::v1::JobSpec::descriptor());
  ASSERT_GE(schemas.size(), 6u);
  for (const auto& [name, schema] : schemas) {
    ASSERT_TRUE(doc["components"]["schemas"].contains(name)) << name;
    EXPECT_EQ(doc["components"]["schemas"][name], schema)
        << name << " differs from proto/common.proto; regenerate: bazel run "
        << "//services/gateway:openapi_schemas -- --write=$PWD/services/gateway/openapi.json";
  }
}

TEST(OpenApiSchemasTest, FieldsMapAsProtobufJsonWritesThem) {
  const auto schemas = MessageSchemas(loom::v1::JobSpec::descriptor());
  const json& spec = schemas.at("JobSpec");
  EXPECT_EQ(spec["properties"]["deepspeedConfig"],
            (json{{"type", "object"}, {"additionalProperties", true}}));  // Struct
  EXPECT_EQ(spec["properties"]["resources"], (json{{"$ref", "#/components/schemas/ResourceSpec"}}));
  EXPECT_EQ(spec["properties"]["maxRestarts"], (json{{"type", "integer"}, {"format", "int32"}}));
  const json& resources = schemas.at("ResourceSpec");
  EXPECT_EQ(resources["properties"]["numRanks"], (json{{"type", "integer"}, {"format", "int32"}}));
  EXPECT_EQ(resources["properties"]["accelerator"]["enum"][1], "ACCELERATOR_KIND_CPU");
  EXPECT_EQ(resources["properties"]["nodeSelector"],
            (json{{"type", "object"}, {"additionalProperties", {{"type", "string"}}}}));
  const json& training = schemas.at("TrainingSpec");
  EXPECT_EQ(training["properties"]["steps"]["oneOf"][0]["pattern"], "^-?[0-9]+$");  // int64
  EXPECT_EQ(training["properties"]["seed"]["oneOf"][0]["pattern"], "^[0-9]+$");     // uint64
  EXPECT_EQ(schemas.at("DatasetSpec")["properties"]["holdoutFraction"], (json{{"type", "number"}}));
}

}  // namespace
}  // namespace loom::gateway
