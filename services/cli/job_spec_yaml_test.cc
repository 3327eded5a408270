#include "services/cli/job_spec_yaml.h"

#include <sys/stat.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::cli {
namespace {

using ::loom::testing::StatusIs;

constexpr char kSpec[] = R"(
name: tiny
model:
  config:
    vocab_size: 256
    hidden_size: 64
    rms_norm_eps: 1.0e-5
    tie_word_embeddings: true
dataset:
  name: fortunes
  holdout_fraction: 0.05
deepspeed_config:
  train_micro_batch_size_per_gpu: 4
  gradient_clipping: 1.0
  optimizer:
    type: AdamW
    params: {lr: 0.001, betas: [0.9, 0.95]}
  zero_optimization: {stage: 3}
resources: {num_ranks: 2, accelerator: cpu}
training: {steps: 20, sequence_length: 64, seed: 7}
checkpoint: {interval_steps: 10}
)";

TEST(JobSpecYamlTest, ParsesEveryField) {
  auto spec = JobSpecFromYaml(kSpec, ".");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "tiny");
  EXPECT_EQ(spec->model().config().fields().at("vocab_size").number_value(), 256);
  EXPECT_DOUBLE_EQ(spec->model().config().fields().at("rms_norm_eps").number_value(), 1e-5);
  EXPECT_TRUE(spec->model().config().fields().at("tie_word_embeddings").bool_value());
  EXPECT_EQ(spec->dataset().name(), "fortunes");
  EXPECT_DOUBLE_EQ(spec->dataset().holdout_fraction(), 0.05);
  const auto& ds = spec->deepspeed_config().fields();
  EXPECT_EQ(ds.at("optimizer").struct_value().fields().at("type").string_value(), "AdamW");
  EXPECT_EQ(ds.at("optimizer").struct_value().fields().at("params").struct_value().fields()
                .at("betas").list_value().values(1).number_value(),
            0.95);
  EXPECT_EQ(ds.at("zero_optimization").struct_value().fields().at("stage").number_value(), 3);
  EXPECT_EQ(spec->resources().num_ranks(), 2);
  EXPECT_EQ(spec->resources().accelerator(), loom::v1::ACCELERATOR_KIND_CPU);
  EXPECT_EQ(spec->training().steps(), 20);
  EXPECT_EQ(spec->training().seed(), 7u);
  EXPECT_EQ(spec->checkpoint().interval_steps(), 10);
}

TEST(JobSpecYamlTest, UnknownTopLevelFieldIsNamed) {
  auto spec = JobSpecFromYaml(absl::StrCat(kSpec, "trainig: {steps: 3}\n"), ".", "job.yaml");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find("job.yaml: trainig: unknown field in JobSpec"),
            std::string::npos)
      << spec.status();
}

TEST(JobSpecYamlTest, UnknownNestedFieldIsNamedWithPath) {
  std::string text = kSpec;
  text.replace(text.find("seed: 7"), 7, "seed: 7, stpes: 4");
  auto spec = JobSpecFromYaml(text, ".");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find("training.stpes: unknown field in TrainingSpec"),
            std::string::npos)
      << spec.status();
}

TEST(JobSpecYamlTest, WrongTypeIsInvalidArgument) {
  std::string text = kSpec;
  text.replace(text.find("steps: 20"), 9, "steps: many");
  auto spec = JobSpecFromYaml(text, ".");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
}

// Regression: a ~600-byte file of nested aliases made `loomctl submit` grow to 3.2 GB and hang
// (each level multiplies by ten: 10^9 scalars once expanded).
TEST(JobSpecYamlTest, BillionLaughsIsRefusedQuickly) {
  std::string text = "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n";
  for (char c = 'b'; c <= 'i'; ++c) {
    const char prev = static_cast<char>(c - 1);
    absl::StrAppend(&text, std::string(1, c), ": &", std::string(1, c), " [");
    for (int k = 0; k < 10; ++k) absl::StrAppend(&text, k ? "," : "", "*", std::string(1, prev));
    absl::StrAppend(&text, "]\n");
  }
  absl::StrAppend(&text, "name: laughs\n");
  ASSERT_LT(text.size(), 700u);
  const absl::Time start = absl::Now();
  auto spec = JobSpecFromYaml(text, ".", "laughs.yaml");
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  const std::string msg(spec.status().message());
  EXPECT_EQ(msg.rfind("laughs.yaml: the document expands to more than 100000 nodes", 0), 0u) << msg;
  EXPECT_NE(msg.find("80 aliases (*name), the first at line 2"), std::string::npos) << msg;
}

// A single alias of a small mapping is fine (and expands as YAML says).
TEST(JobSpecYamlTest, SmallAliasExpands) {
  auto spec = JobSpecFromYaml(
      "x: &opt {type: AdamW, params: {lr: 0.001}}\n", ".", "alias.yaml");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);  // x is unknown
  EXPECT_NE(spec.status().message().find("x: unknown field"), std::string::npos) << spec.status();
  spec = JobSpecFromYaml(absl::StrCat(kSpec, "queue: &q default\nname: *q\n"), ".");
  // `name` appears twice now: the duplicate key is named.
  EXPECT_NE(spec.status().message().find("name: duplicate key"), std::string::npos)
      << spec.status();
}

// Regression: a quoted number was coerced by protobuf's JSON parser (steps: "20" read as 20).
TEST(JobSpecYamlTest, QuotedNumberForANumericFieldIsRefused) {
  std::string text = kSpec;
  text.replace(text.find("steps: 20"), 9, "steps: \"20\"");
  auto spec = JobSpecFromYaml(text, ".", "job.yaml");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  EXPECT_EQ(spec.status().message(),
            "job.yaml: training.steps: expected a number, got the string \"20\" (write it without "
            "quotes)");
  text = kSpec;
  text.replace(text.find("num_ranks: 2"), 12, "num_ranks: '2'");
  spec = JobSpecFromYaml(text, ".", "job.yaml");
  EXPECT_NE(spec.status().message().find("resources.num_ranks: expected a number"),
            std::string::npos)
      << spec.status();
  text = kSpec;
  text.replace(text.find("holdout_fraction: 0.05"), 22, "holdout_fraction: \"0.05\"");
  spec = JobSpecFromYaml(text, ".", "job.yaml");
  EXPECT_NE(spec.status().message().find("dataset.holdout_fraction: expected a number"),
            std::string::npos)
      << spec.status();
  // The same document as JSON (what `loomctl submit spec.json` reads).
  spec = JobSpecFromYaml(R"({"name": "j", "training": {"steps": "20"}})", ".", "job.json");
  EXPECT_NE(spec.status().message().find("training.steps: expected a number"), std::string::npos)
      << spec.status();
}

TEST(JobSpecYamlTest, MalformedYamlIsInvalidArgument) {
  auto spec = JobSpecFromYaml("name: [unclosed\n", ".", "bad.yaml");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find("bad.yaml: invalid YAML"), std::string::npos);
}

// Regression (break-it pass, 2026-12-05): a second YAML document was dropped without a word,
// and both spellings of one field (num_ranks and numRanks) were taken, one silently winning.
TEST(JobSpecYamlTest, SecondDocumentAndBothSpellingsOfAFieldAreRefused) {
  auto two = JobSpecFromYaml(std::string(kSpec) + "---\nname: second\n", ".", "two.yaml");
  EXPECT_EQ(two.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(two.status().message().find("two.yaml: a job spec file holds one YAML document, "
                                        "found 2"),
            std::string::npos)
      << two.status();
  EXPECT_TRUE(JobSpecFromYaml(std::string("---\n") + kSpec, ".", "one.yaml").ok());
  std::string both = kSpec;
  both.replace(both.find("{num_ranks: 2,"), 14, "{num_ranks: 1, numRanks: 2,");
  auto dup = JobSpecFromYaml(both, ".", "dup.yaml");
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dup.status().message().find("resources.num_ranks: duplicate of resources.numRanks"),
            std::string::npos)
      << dup.status();
}

TEST(JobSpecYamlTest, DeepSpeedConfigFromJsonFile) {
  std::string dir = std::getenv("TEST_TMPDIR");
  ASSERT_TRUE(WriteFileAtomically(absl::StrCat(dir, "/ds_config.json"),
                                  R"({"train_micro_batch_size_per_gpu": 8,
                                      "zero_optimization": {"stage": 3}})")
                  .ok());
  auto spec = JobSpecFromYaml("name: x\ndeepspeed_config: ds_config.json\n", dir);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->deepspeed_config().fields().at("train_micro_batch_size_per_gpu").number_value(),
            8);
  auto missing = JobSpecFromYaml("name: x\ndeepspeed_config: nope.json\n", dir);
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("deepspeed_config: cannot read"), std::string::npos);
}

TEST(JobSpecYamlTest, UnknownAcceleratorIsInvalidArgument) {
  auto spec = JobSpecFromYaml("resources: {accelerator: tpu}\n", ".", "j.yaml");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  EXPECT_EQ(spec.status().message(),
            "j.yaml: resources.accelerator: unknown kind 'tpu' (want cpu, h100, h200 or gh200)");
}

TEST(JobSpecYamlTest, ExampleJobOfTheReadmeParses) {
  auto spec = ReadJobSpecFile(
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/loom/examples/fortunes-llama/job.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->resources().num_ranks(), 2);
  EXPECT_EQ(spec->model().config().fields().at("hidden_size").number_value(), 384);
  EXPECT_EQ(spec->deepspeed_config()
                .fields().at("zero_optimization").struct_value().fields().at("stage").number_value(),
            3);
}

TEST(JobSpecYamlTest, SentencePieceExampleParses) {
  auto spec = ReadJobSpecFile(absl::StrCat(std::getenv("TEST_SRCDIR"),
                                           "/loom/examples/fortunes-sentencepiece/job.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->dataset().tokenizer(), "sentencepiece");
  EXPECT_EQ(spec->dataset().vocab_size(), 4000);
  EXPECT_EQ(spec->dataset().model_type(), "bpe");
  EXPECT_EQ(spec->model().config().fields().at("vocab_size").number_value(), 4000);
}

TEST(JobSpecYamlTest, QuotedNumbersStayStrings) {
  auto spec = JobSpecFromYaml("name: \"123\"\n", ".");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "123");
}

// Regression: a non-UTF-8 byte used to reach nlohmann::json::dump(), which threw and aborted
// loomctl (exit 134) instead of refusing the spec.
TEST(JobSpecYamlTest, NonUtf8TextIsInvalidArgumentWithPosition) {
  auto spec = JobSpecFromYaml("name: ok\ndataset: {name: \"a\xff\xfe\"}\n", ".", "job.yaml");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  EXPECT_NE(spec.status().message().find("job.yaml: not UTF-8 text (invalid byte at line 2, "
                                         "column 19)"),
            std::string::npos)
      << spec.status();
  // Overlong encodings and surrogates are not UTF-8 either; real multi-byte text is fine.
  EXPECT_THAT(JobSpecFromYaml("name: \"\xc0\xaf\"\n", "."),
              StatusIs(absl::StatusCode::kInvalidArgument, "not UTF-8 text"));
  EXPECT_THAT(JobSpecFromYaml("name: \"\xed\xa0\x80\"\n", "."),
              StatusIs(absl::StatusCode::kInvalidArgument, "not UTF-8 text"));
  auto good = JobSpecFromYaml("name: \"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"\n", ".");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->name(), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
}

// Regression: a directory given as the spec file was INTERNAL (loomctl exit 13), not
// INVALID_ARGUMENT.
TEST(JobSpecYamlTest, DirectoryAsSpecFileIsInvalidArgument) {
  std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/spec_dir.yaml");
  ASSERT_TRUE(MakeDirs(dir).ok());
  auto spec = ReadJobSpecFile(dir);
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  EXPECT_NE(spec.status().message().find("spec_dir.yaml is a directory"), std::string::npos)
      << spec.status();
  auto missing = ReadJobSpecFile(absl::StrCat(dir, "/nope.yaml"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument) << missing.status();
}

// Regression: `deepspeed_config: /dev/zero` read forever (until out of memory) and a FIFO
// blocked loomctl for good.
TEST(JobSpecYamlTest, DeviceOrFifoAsJsonFileIsRefusedAtOnce) {
  std::string dir = std::getenv("TEST_TMPDIR");
  auto zero = JobSpecFromYaml("name: x\ndeepspeed_config: /dev/zero\n", dir, "job.yaml");
  ASSERT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument) << zero.status();
  EXPECT_NE(zero.status().message().find("job.yaml: deepspeed_config: cannot read '/dev/zero'"),
            std::string::npos)
      << zero.status();
  ASSERT_EQ(::mkfifo(absl::StrCat(dir, "/config.fifo").c_str(), 0600), 0);
  auto fifo = JobSpecFromYaml("name: x\nmodel: {config: config.fifo}\n", dir, "job.yaml");
  ASSERT_EQ(fifo.status().code(), absl::StatusCode::kInvalidArgument) << fifo.status();
  EXPECT_NE(fifo.status().message().find("not a regular file"), std::string::npos)
      << fifo.status();
}

// Non-UTF-8 bytes inside an inlined JSON file are refused, not thrown.
TEST(JobSpecYamlTest, NonUtf8InsideJsonFileIsInvalidArgument) {
  std::string dir = std::getenv("TEST_TMPDIR");
  ASSERT_TRUE(WriteFileAtomically(absl::StrCat(dir, "/bad_utf8.json"),
                                  "{\"model_type\": \"\xff\"}")
                  .ok());
  auto spec = JobSpecFromYaml("name: x\nmodel: {config: bad_utf8.json}\n", dir, "job.yaml");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  EXPECT_NE(spec.status().message().find("model.config"), std::string::npos) << spec.status();
}

}  // namespace
}  // namespace loom::cli
