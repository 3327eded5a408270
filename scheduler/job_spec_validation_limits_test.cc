// Admission limits (issue 18, "what must never be admitted"): job names, bounded free text, the
// whole spec's size and quoted numbers, each refused by ValidateJobSpec with INVALID_ARGUMENT
// naming the field. On the main branch before these checks every spec below was admitted.
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler/job_spec_validation.h"
#include "scheduler/job_spec_validation_limits.h"
#include "scheduler/test_job_spec.h"

namespace loom {
namespace {

using loom::v1::JobSpec;

JobSpecValidationOptions TestOptions() {
  JobSpecValidationOptions options;
  options.fortunes_dir = std::getenv("TEST_TMPDIR");  // exists; the corpus is not read
  return options;
}

void ExpectInvalid(const JobSpec& spec, const std::string& path, const std::string& detail) {
  absl::Status s = ValidateJobSpec(spec, TestOptions());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(std::string(s.message()).rfind(path + ": ", 0), 0u)
      << "want prefix '" << path << ": ': " << s;
  EXPECT_NE(s.message().find(detail), std::string::npos) << "want '" << detail << "': " << s;
}

void ExpectValid(const JobSpec& spec) {
  absl::Status s = ValidateJobSpec(spec, TestOptions());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(JobSpecLimitsTest, JobNamesAreRfc1123Labels) {
  JobSpec spec = ValidTestJobSpec();
  for (const std::string& good :
       std::vector<std::string>{"a", "tiny-llama", "run-2", "0abc", std::string(63, 'x'), ""}) {
    spec.set_name(good);
    ExpectValid(spec);
  }
  spec.set_name(std::string(64, 'x'));
  ExpectInvalid(spec, "name", "longer than 63 bytes");
  spec.set_name(std::string(10000, 'a'));
  ExpectInvalid(spec, "name", "10000 bytes");
  // A terminal escape that would recolour (or retitle) the terminal of whoever lists jobs.
  spec.set_name("\x1b[31mowned\x1b[0m");
  ExpectInvalid(spec, "name", "byte 0 is not a lowercase letter");
  spec.set_name("Tiny-Llama");
  ExpectInvalid(spec, "name", "byte 0 is not a lowercase letter");
  spec.set_name("tiny_llama");
  ExpectInvalid(spec, "name", "byte 4 is not");
  spec.set_name("tiny llama");
  ExpectInvalid(spec, "name", "byte 4 is not");
  spec.set_name("-tiny");
  ExpectInvalid(spec, "name", "starts or ends with '-'");
  spec.set_name("tiny-");
  ExpectInvalid(spec, "name", "starts or ends with '-'");
}

// Regression: two jobs with 3 MB names broke ListJobs for every user (4 MB gRPC limit).
TEST(JobSpecLimitsTest, ThreeMegabyteNameIsInvalidArgumentNotResourceExhausted) {
  JobSpec spec = ValidTestJobSpec();
  spec.set_name(std::string(3 << 20, 'a'));
  ExpectInvalid(spec, "name", "3145728 bytes");
}

TEST(JobSpecLimitsTest, FreeTextFieldsAreBounded) {
  JobSpec spec = ValidTestJobSpec();
  spec.set_queue(std::string(257, 'q'));
  ExpectInvalid(spec, "queue", "257 bytes, more than the 256 allowed");
  spec = ValidTestJobSpec();
  spec.mutable_dataset()->set_tokenizer(std::string(1 << 20, 'b'));
  ExpectInvalid(spec, "dataset.tokenizer", "1048576 bytes");
  spec = ValidTestJobSpec();
  spec.mutable_checkpoint()->set_best_metric(std::string(300, 'm'));
  ExpectInvalid(spec, "checkpoint.best_metric", "300 bytes");
  spec = ValidTestJobSpec();
  spec.mutable_dataset()->set_path(absl::StrCat("/", std::string(4096, 'p')));
  ExpectInvalid(spec, "dataset.path", "4097 bytes, more than the 4096 allowed");
  spec = ValidTestJobSpec();
  spec.mutable_model()->set_init_from(std::string(5000, 'p'));
  ExpectInvalid(spec, "model.init_from", "5000 bytes");
  spec = ValidTestJobSpec();
  (*spec.mutable_resources()->mutable_node_selector())["zone"] = std::string(300, 'z');
  ExpectInvalid(spec, "resources.node_selector.value", "300 bytes");
}

TEST(JobSpecLimitsTest, ControlCharactersAreRefused) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_dataset()->set_name("fortunes\n");
  ExpectInvalid(spec, "dataset.name", "control character at byte 8");
  spec = ValidTestJobSpec();
  spec.set_queue("default\x1b]0;pwned\x07");
  ExpectInvalid(spec, "queue", "control character at byte 7");
  spec = ValidTestJobSpec();
  spec.mutable_dataset()->set_path("/data/\xC2\x9B" "31m");  // U+009B, the 8-bit CSI
  ExpectInvalid(spec, "dataset.path", "control character at byte 6");
  spec = ValidTestJobSpec();
  (*spec.mutable_resources()->mutable_node_selector())["zo\x7Fne"] = "b";
  ExpectInvalid(spec, "resources.node_selector.key", "control character at byte 2");
}

TEST(JobSpecLimitsTest, WholeSpecIsBounded) {
  JobSpec spec = ValidTestJobSpec();
  // Every field within its own bound, but the free-form DeepSpeed config is huge.
  (*spec.mutable_deepspeed_config()->mutable_fields())["comment"].set_string_value(
      std::string(100000, 'c'));
  absl::Status s = ValidateJobSpec(spec, TestOptions());
  ExpectInvalid(spec, "spec", "more than the 65536 allowed (largest field: deepspeed_config");
  EXPECT_NE(s.code(), absl::StatusCode::kResourceExhausted);
  spec = ValidTestJobSpec();
  (*spec.mutable_model()->mutable_config()->mutable_fields())["notes"].set_string_value(
      std::string(70000, 'n'));
  ExpectInvalid(spec, "spec", "(largest field: model");
}

// Regression: `hidden_size: "64"` was silently read as 64.
TEST(JobSpecLimitsTest, QuotedNumbersInModelConfigAreRefused) {
  JobSpec spec = ValidTestJobSpec();
  (*spec.mutable_model()->mutable_config()->mutable_fields())["hidden_size"].set_string_value(
      "64");
  ExpectInvalid(spec, "model.config.hidden_size", "expected a number, got the string \"64\"");
  spec = ValidTestJobSpec();
  (*spec.mutable_model()->mutable_config()->mutable_fields())["rope_theta"].set_string_value(
      "1e4");
  ExpectInvalid(spec, "model.config.rope_theta", "expected a number");
  spec = ValidTestJobSpec();
  (*spec.mutable_model()->mutable_config()->mutable_fields())["tie_word_embeddings"]
      .set_string_value("true");
  ExpectInvalid(spec, "model.config.tie_word_embeddings", "expected true or false");
  // Keys the engine does not read keep their strings (a real config.json has several).
  spec = ValidTestJobSpec();
  (*spec.mutable_model()->mutable_config()->mutable_fields())["transformers_version"]
      .set_string_value("4.44.0");
  (*spec.mutable_model()->mutable_config()->mutable_fields())["torch_dtype"].set_string_value(
      "float32");
  ExpectValid(spec);
}

TEST(JobSpecLimitsTest, QuotedNumbersInDeepSpeedConfigAreRefused) {
  JobSpec spec = ValidTestJobSpec();
  (*spec.mutable_deepspeed_config()->mutable_fields())["train_micro_batch_size_per_gpu"]
      .set_string_value("4");
  ExpectInvalid(spec, "deepspeed_config.train_micro_batch_size_per_gpu",
                "expected a number, got the string \"4\"");
  spec = ValidTestJobSpec();
  (*(*spec.mutable_deepspeed_config()->mutable_fields())["optimizer"]
        .mutable_struct_value()
        ->mutable_fields())["params"]
      .mutable_struct_value()
      ->mutable_fields()
      ->at("lr")
      .set_string_value("1e-3");
  ExpectInvalid(spec, "deepspeed_config.optimizer.params.lr", "got the string \"1e-3\"");
}

// Issue 42 defect 2: a model.config nested 30 levels deep was admitted, and every later
// ListJobs as JSON failed ("Message too deep"). Both configs are bounded at kMaxConfigDepth,
// counting arrays too; an enum number the proto does not define is refused naming the field.
google::protobuf::Value Nested(int levels) {
  google::protobuf::Value v;
  v.set_number_value(1);
  for (int i = 0; i < levels; ++i) {
    google::protobuf::Value outer;
    if (i % 2 == 0) {
      (*outer.mutable_struct_value()->mutable_fields())["x"] = std::move(v);
    } else {
      *outer.mutable_list_value()->add_values() = std::move(v);
    }
    v = std::move(outer);
  }
  return v;
}

// INVALID_ARGUMENT whose message starts with `path_prefix` (the path of the first value too
// deep, under the field) and names the limit.
void ExpectTooDeep(const JobSpec& spec, const std::string& path_prefix) {
  absl::Status s = ValidateJobSpec(spec, TestOptions());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(std::string(s.message()).rfind(path_prefix, 0), 0u) << s;
  EXPECT_NE(s.message().find("nested deeper than 16 levels"), std::string::npos) << s;
}

TEST(JobSpecLimitsTest, ConfigNestingIsBounded) {
  JobSpec spec = ValidTestJobSpec();
  // model.config itself is level 1: the value holds kMaxConfigDepth - 1 more levels. Under a key
  // transformers writes (a dict of generation settings) and Loom accepts unread: an unknown key
  // would be refused for itself.
  auto& config = *spec.mutable_model()->mutable_config()->mutable_fields();
  config["task_specific_params"] = Nested(kMaxConfigDepth - 1);
  ExpectValid(spec);
  config["task_specific_params"] = Nested(kMaxConfigDepth);
  ExpectTooDeep(spec, "model.config.task_specific_params[0].x[0].x");
  config["task_specific_params"] = Nested(30);
  ExpectTooDeep(spec, "model.config.task_specific_params[0].x[0].x");
  spec = ValidTestJobSpec();
  (*spec.mutable_deepspeed_config()->mutable_fields())["zero_optimization"] = Nested(40);
  ExpectTooDeep(spec, "deepspeed_config.zero_optimization[0].x[0].x");  // arrays by index
}

TEST(JobSpecLimitsTest, UnknownEnumNumbersAreRefusedNamingTheField) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_resources()->set_accelerator(static_cast<loom::v1::AcceleratorKind>(77));
  ExpectInvalid(spec, "resources.accelerator", "77 is not a known loom.v1.AcceleratorKind");
}

}  // namespace
}  // namespace loom
