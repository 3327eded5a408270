// spec::StructToJson against the reference it replaces: protobuf's JSON printer
// (MessageToJsonString) followed by nlohmann's parser, on every kind of value and on the numbers
// where the printer's text decides integer or double (integral values with 15, 16 and 17
// digits, exponents, negative zero, tiny and huge values); then the two config parsers on both.
#include "spec/struct_json.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "spec/ds_config.h"
#include "spec/model_config.h"

namespace loom::spec {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;
using nlohmann::json;

json Reference(const Struct& s) {
  std::string text;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(s, &text).ok());
  return json::parse(text);
}

// Equal values and equal JSON types (an unsigned 3 and a double 3.0 compare equal in nlohmann,
// so the types are compared too, recursively through dump(): 3 vs 3.0).
void ExpectSameAsReference(const Struct& s) {
  absl::StatusOr<json> got = StructToJson(s, "cfg");
  ASSERT_TRUE(got.ok()) << got.status();
  const json want = Reference(s);
  EXPECT_EQ(got->dump(), want.dump());
  EXPECT_EQ(*got, want);
}

TEST(StructToJsonTest, EveryKindOfValueAsThePrinterAndParserGiveIt) {
  Struct s;
  auto& f = *s.mutable_fields();
  f["null"].set_null_value(google::protobuf::NULL_VALUE);
  f["bool"].set_bool_value(true);
  f["string"].set_string_value("h\xc3\xa9llo \"quoted\" \\ \n");
  f["int"].set_number_value(128);
  f["negative"].set_number_value(-3);
  f["double"].set_number_value(1e-3);
  Struct* inner = f["nested"].mutable_struct_value();
  (*inner->mutable_fields())["stage"].set_number_value(3);
  (*inner->mutable_fields())["empty"].mutable_struct_value();
  google::protobuf::ListValue* list = f["list"].mutable_list_value();
  list->add_values()->set_number_value(0.9);
  list->add_values()->set_string_value("x");
  list->add_values()->mutable_list_value();
  f["empty_list"].mutable_list_value();
  ExpectSameAsReference(s);
  EXPECT_TRUE((*StructToJson(s, "cfg"))["int"].is_number_unsigned());
  EXPECT_TRUE((*StructToJson(s, "cfg"))["negative"].is_number_integer());
  EXPECT_TRUE((*StructToJson(s, "cfg"))["double"].is_number_float());
  ExpectSameAsReference(Struct());
}

TEST(StructToJsonTest, NumbersBecomeIntegersExactlyWhenThePrinterWritesNoPointOrExponent) {
  for (double v : {0.0,
                   -0.0,
                   1.0,
                   -1.0,
                   0.5,
                   1e-5,
                   2.5e-7,
                   1e14,
                   123456789012345.0,
                   123456789012345.6,
                   // Either side of StructToJson's printer-free range (integral, |v| < 1e15).
                   999999999999999.0,
                   -999999999999999.0,
                   999999999999999.5,
                   1e15 + 2,
                   1e15,
                   1234567890123456.0,
                   12345678901234567.0,
                   9007199254740993.0,
                   1e16,
                   1e17,
                   1e21,
                   -1e15,
                   -1234567890123456.0,
                   4503599627370496.5,
                   0.1 + 0.2,
                   std::numeric_limits<double>::max(),
                   std::numeric_limits<double>::min(),
                   std::numeric_limits<double>::denorm_min(),
                   65504.0,
                   3e-45}) {
    SCOPED_TRACE(v);
    Struct s;
    (*s.mutable_fields())["x"].set_number_value(v);
    ExpectSameAsReference(s);
  }
}

TEST(StructToJsonTest, NonFiniteNumbersAreRejectedNamingThePath) {
  for (double v : {std::nan(""), std::numeric_limits<double>::infinity(),
                   -std::numeric_limits<double>::infinity()}) {
    Struct s;
    Value& list = (*s.mutable_fields())["zero_optimization"];
    (*list.mutable_struct_value()->mutable_fields())["ratio"].set_number_value(v);
    absl::StatusOr<json> got = StructToJson(s, "deepspeed_config");
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find("deepspeed_config.zero_optimization.ratio"),
              std::string::npos)
        << got.status();
  }
}

// A Value with no kind set (a client that built one by hand), as a field and as a list element:
// what the printer does with it (it leaves out such a field).
TEST(StructToJsonTest, AValueWithNoKindIsHandledAsThePrinterHandlesIt) {
  Struct field;
  (*field.mutable_fields())["unset"];
  (*field.mutable_fields())["set"].set_bool_value(false);
  Struct element;
  (*element.mutable_fields())["list"].mutable_list_value()->add_values();
  for (const Struct* s : {&field, &element}) {
    std::string text;
    const bool printed = google::protobuf::util::MessageToJsonString(*s, &text).ok();
    absl::StatusOr<json> got = StructToJson(*s, "cfg");
    ASSERT_EQ(got.ok(), printed) << text << " / " << got.status();
    if (printed) {
      EXPECT_EQ(got->dump(), json::parse(text).dump());
    }
  }
}

// The parsers give the same result (or the same error) on the converted value as on the text.
TEST(StructToJsonTest, ConfigParsersAgreeOnTextAndValue) {
  const std::string ds_text = R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 4, "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95],
                    "weight_decay": 0.01}},
      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
      "bf16": {"enabled": true}})";
  Struct ds;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ds_text, &ds).ok());
  for (int world : {1, 2, 0}) {
    SCOPED_TRACE(world);
    std::string printed;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(ds, &printed).ok());
    absl::StatusOr<DeepSpeedConfig> from_text = ParseDeepSpeedConfig(printed, world);
    absl::StatusOr<DeepSpeedConfig> from_value =
        ParseDeepSpeedConfigValue(*StructToJson(ds, "d"), world);
    ASSERT_EQ(from_text.status(), from_value.status());
    if (!from_text.ok()) continue;
    EXPECT_EQ(from_value->train_batch_size, from_text->train_batch_size);
    EXPECT_EQ(from_value->zero.stage, from_text->zero.stage);
    EXPECT_EQ(from_value->gradient_clipping, from_text->gradient_clipping);
    EXPECT_EQ(from_value->optimizer.lr, from_text->optimizer.lr);
  }
  Struct bad;
  (*bad.mutable_fields())["train_micro_batch_size_per_gpu"].set_number_value(1.5);
  std::string printed;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(bad, &printed).ok());
  EXPECT_EQ(ParseDeepSpeedConfigValue(*StructToJson(bad, "d"), 1).status(),
            ParseDeepSpeedConfig(printed, 1).status());

  const std::string model_text = R"({"model_type": "llama", "vocab_size": 256,
      "hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
      "rope_theta": 10000.0, "max_position_embeddings": 128})";
  Struct model;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(model_text, &model).ok());
  std::string model_printed;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(model, &model_printed).ok());
  absl::StatusOr<LlamaConfig> a = ParseLlamaConfig(model_printed);
  absl::StatusOr<LlamaConfig> b = ParseLlamaConfigValue(*StructToJson(model, "model.config"));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->vocab_size, a->vocab_size);
  EXPECT_EQ(b->hidden_size, a->hidden_size);
  EXPECT_EQ(b->rms_norm_eps, a->rms_norm_eps);
  EXPECT_EQ(b->rope_theta, a->rope_theta);
  EXPECT_EQ(b->num_key_value_heads, a->num_key_value_heads);
}

}  // namespace
}  // namespace loom::spec
