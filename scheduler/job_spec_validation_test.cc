#include "scheduler/job_spec_validation.h"

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/problems.h"
#include "gtest/gtest.h"
#include "scheduler/test_job_spec.h"
#include "spec/engine_options_tiled.h"

namespace loom {
namespace {

using loom::v1::JobSpec;

// Options whose fortunes corpus is a directory under $TEST_TMPDIR (hermetic: the test does not
// depend on the host having the fortunes package).
JobSpecValidationOptions TestOptions() {
  JobSpecValidationOptions options;
  options.fortunes_dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/fortunes");
  EXPECT_TRUE(MakeDirs(options.fortunes_dir).ok());
  return options;
}

// Expects INVALID_ARGUMENT whose message starts with `path` and contains `detail`.
void ExpectInvalid(const JobSpec& spec, const std::string& path, const std::string& detail = "") {
  absl::Status s = ValidateJobSpec(spec, TestOptions());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(std::string(s.message()).rfind(path, 0), 0u) << "want prefix '" << path << "': " << s;
  EXPECT_NE(s.message().find(detail), std::string::npos) << "want '" << detail << "': " << s;
}

google::protobuf::Value Num(double v) {
  google::protobuf::Value value;
  value.set_number_value(v);
  return value;
}

TEST(JobSpecValidationTest, ReferenceSpecIsValid) {
  absl::Status s = ValidateJobSpec(ValidTestJobSpec(), TestOptions());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(JobSpecValidationTest, UnsupportedModelTypeIsRefusedNamingTheField) {
  JobSpec spec = ValidTestJobSpec();
  google::protobuf::Value type;
  type.set_string_value("qwen3_moe");
  (*spec.mutable_model()->mutable_config()->mutable_fields())["model_type"] = type;
  ExpectInvalid(spec, "model.config.model_type",
                "\"qwen3_moe\" is not supported (supported: llama, qwen2, qwen3, mistral)");
  type.set_string_value("llama");
  (*spec.mutable_model()->mutable_config()->mutable_fields())["model_type"] = type;
  absl::Status s = ValidateJobSpec(spec, TestOptions());
  EXPECT_TRUE(s.ok()) << s;
}

// Qwen2 is a supported family; its sliding-window attention is not, and is refused at
// submission naming the field.
TEST(JobSpecValidationTest, Qwen2IsAcceptedAndItsSlidingWindowRefused) {
  JobSpec spec = ValidTestJobSpec();
  auto& fields = *spec.mutable_model()->mutable_config()->mutable_fields();
  fields["model_type"].set_string_value("qwen2");
  fields["use_sliding_window"].set_bool_value(false);
  absl::Status s = ValidateJobSpec(spec, TestOptions());
  EXPECT_TRUE(s.ok()) << s;
  fields["use_sliding_window"].set_bool_value(true);
  ExpectInvalid(spec, "model.config.use_sliding_window", "true is not supported");
}

// Mistral's sliding window shorter than the sequence (windowed attention is not implemented) is
// refused at submission; it used to pass and fail in the trainer once placed.
TEST(JobSpecValidationTest, MistralSlidingWindowShorterThanTheSequenceIsRefusedAtSubmission) {
  JobSpec spec = ValidTestJobSpec();
  auto& fields = *spec.mutable_model()->mutable_config()->mutable_fields();
  fields["model_type"].set_string_value("mistral");
  fields["sliding_window"] = Num(spec.training().sequence_length());
  absl::Status s = ValidateJobSpec(spec, TestOptions());
  EXPECT_TRUE(s.ok()) << s;  // every key within the window: full causal attention
  fields["sliding_window"] = Num(spec.training().sequence_length() - 1);
  ExpectInvalid(spec, "model.config.sliding_window",
                absl::StrCat("is shorter than training.sequence_length ",
                             spec.training().sequence_length()));
}

TEST(JobSpecValidationTest, InitFromMustBeAnExportDirectory) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_model()->set_init_from("/nonexistent/export");
  ExpectInvalid(spec, "model.init_from", "is not a directory");
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/empty_export";
  ASSERT_TRUE(MakeDirs(dir).ok());
  spec.mutable_model()->set_init_from(dir);
  ExpectInvalid(spec, "model.init_from", "holds neither model.safetensors");
  // A file that is not safetensors is refused naming it (matching exports:
  // job_spec_validation_files_test.cc).
  ASSERT_TRUE(WriteFileAtomically(dir + "/model.safetensors", "x").ok());
  ExpectInvalid(spec, "model.init_from", "model.safetensors");
}

TEST(JobSpecValidationTest, RetentionFields) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_checkpoint()->set_keep_last(-1);
  ExpectInvalid(spec, "checkpoint.keep_last", "got -1");
  spec.mutable_checkpoint()->set_keep_last(2);
  spec.mutable_checkpoint()->set_keep_best(-2);
  ExpectInvalid(spec, "checkpoint.keep_best", "got -2");
  spec.mutable_checkpoint()->set_keep_best(1);
  spec.mutable_checkpoint()->set_best_metric("accuracy");
  ExpectInvalid(spec, "checkpoint.best_metric", "is not recorded");
  spec.mutable_checkpoint()->set_best_metric("train_loss");
  EXPECT_TRUE(ValidateJobSpec(spec, TestOptions()).ok());
}

TEST(JobSpecValidationTest, ZeroRanks) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_resources()->set_num_ranks(0);
  ExpectInvalid(spec, "resources.num_ranks", "got 0");
}

// Regression: num_ranks = 2^31-1 was admitted; once a node claimed that many slots, placement
// built a 2^31-entry vector and the scheduler died of bad_alloc (and again after every restart).
TEST(JobSpecValidationTest, AbsurdRankCountIsRefused) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_resources()->set_num_ranks(2147483647);
  ExpectInvalid(spec, "resources.num_ranks", "must be in [1, 65536], got 2147483647");
  spec.mutable_resources()->set_num_ranks(kMaxNumRanks + 1);
  ExpectInvalid(spec, "resources.num_ranks", "got 65537");
}

// Regression: threads_per_rank 100000 was admitted and only failed (or thrashed) in the trainer.
TEST(JobSpecValidationTest, AbsurdThreadCountIsRefused) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_training()->set_threads_per_rank(100000);
  ExpectInvalid(spec, "training.threads_per_rank", "must be in [0, 1024], got 100000");
}

TEST(JobSpecValidationTest, UnknownAccelerator) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_resources()->set_accelerator(static_cast<loom::v1::AcceleratorKind>(99));
  ExpectInvalid(spec, "resources.accelerator", "99");
}

TEST(JobSpecValidationTest, PlacementFieldsNoNodeCouldMatch) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_resources()->set_cpu_arch("arm64");
  ExpectInvalid(spec, "resources.cpu_arch", "arm64");
  spec = ValidTestJobSpec();
  spec.mutable_resources()->set_cpu_arch("aarch64");
  EXPECT_TRUE(ValidateJobSpec(spec, TestOptions()).ok());
  spec.mutable_resources()->set_host_memory_bytes(-1);
  ExpectInvalid(spec, "resources.host_memory_bytes");
  spec = ValidTestJobSpec();
  spec.mutable_resources()->set_accelerator_memory_bytes(-5);
  ExpectInvalid(spec, "resources.accelerator_memory_bytes");
  spec = ValidTestJobSpec();
  (*spec.mutable_resources()->mutable_node_selector())[""] = "x";
  ExpectInvalid(spec, "resources.node_selector");
  spec = ValidTestJobSpec();
  (*spec.mutable_resources()->mutable_node_selector())["zone"] = std::string(64, 'a');
  ExpectInvalid(spec, "resources.node_selector", "zone");
}

TEST(JobSpecValidationTest, NegativeAndZeroSteps) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_training()->set_steps(-5);
  ExpectInvalid(spec, "training.steps", "got -5");
  spec.mutable_training()->set_steps(0);
  ExpectInvalid(spec, "training.steps", "got 0");
}

TEST(JobSpecValidationTest, SequenceLengthBounds) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_training()->set_sequence_length(1);
  ExpectInvalid(spec, "training.sequence_length", "got 1");
  spec.mutable_training()->set_sequence_length(129);
  ExpectInvalid(spec, "training.sequence_length", "max_position_embeddings = 128");
  spec.mutable_training()->set_sequence_length(128);
  EXPECT_TRUE(ValidateJobSpec(spec, TestOptions()).ok());
  spec.mutable_training()->set_sequence_length(2);
  EXPECT_TRUE(ValidateJobSpec(spec, TestOptions()).ok());
}

TEST(JobSpecValidationTest, OtherTrainingCounts) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_training()->set_eval_every_steps(-1);
  ExpectInvalid(spec, "training.eval_every_steps");
  spec = ValidTestJobSpec();
  spec.mutable_training()->set_eval_batches(-1);
  ExpectInvalid(spec, "training.eval_batches");
  spec = ValidTestJobSpec();
  spec.mutable_training()->set_threads_per_rank(-2);
  ExpectInvalid(spec, "training.threads_per_rank");
}

TEST(JobSpecValidationTest, MissingDataset) {
  JobSpec spec = ValidTestJobSpec();
  spec.clear_dataset();
  ExpectInvalid(spec, "dataset", "dataset.name or dataset.path is required");
}

TEST(JobSpecValidationTest, DatasetPathMustExist) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_dataset()->set_path(absl::StrCat(std::getenv("TEST_TMPDIR"), "/no-such-corpus"));
  ExpectInvalid(spec, "dataset.path", "no-such-corpus' does not exist");
  // An existing directory must also hold a corpus (job_spec_validation_files_test.cc).
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/corpus");
  ASSERT_TRUE(MakeDirs(dir).ok());
  std::string text;
  for (int i = 0; i < 200; ++i) absl::StrAppend(&text, "fortune number ", i, " is a long one\n%\n");
  ASSERT_TRUE(WriteFileAtomically(dir + "/fortunes", text).ok());
  spec.mutable_dataset()->set_path(dir);
  EXPECT_TRUE(ValidateJobSpec(spec, TestOptions()).ok());
}

TEST(JobSpecValidationTest, FortunesWithoutItsDefaultDirectory) {
  JobSpecValidationOptions options;
  options.fortunes_dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/not-installed");
  absl::Status s = ValidateJobSpec(ValidTestJobSpec(), options);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("dataset.name"), std::string::npos) << s;
  EXPECT_NE(s.message().find("not-installed"), std::string::npos) << s;
}

TEST(JobSpecValidationTest, UnknownBuiltInDatasetNeedsPath) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_dataset()->set_name("wikitext");
  ExpectInvalid(spec, "dataset.name", "'wikitext' is not a built-in dataset");
}

TEST(JobSpecValidationTest, TokenizerAndHoldout) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_dataset()->set_tokenizer("bpe");
  ExpectInvalid(spec, "dataset.tokenizer", "'bpe'");
  spec = ValidTestJobSpec();
  (*spec.mutable_model()->mutable_config()->mutable_fields())["vocab_size"] = Num(100);
  ExpectInvalid(spec, "dataset.tokenizer", "vocab_size >= 256, got 100");
  spec = ValidTestJobSpec();
  spec.mutable_dataset()->set_holdout_fraction(0.7);
  ExpectInvalid(spec, "dataset.holdout_fraction", "(0, 0.5]");
  spec.mutable_dataset()->set_holdout_fraction(0.5);
  EXPECT_TRUE(ValidateJobSpec(spec, TestOptions()).ok());
}

TEST(JobSpecValidationTest, DataFormatAndSentencePieceFields) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_dataset()->set_format("parquet");
  ExpectInvalid(spec, "dataset.format", "'parquet'");
  spec = ValidTestJobSpec();
  spec.mutable_dataset()->set_format("tokens");
  spec.mutable_dataset()->set_token_dtype("int8");
  ExpectInvalid(spec, "dataset.token_dtype", "'int8'");
  spec = ValidTestJobSpec();
  spec.mutable_dataset()->set_tokenizer("sentencepiece");
  ExpectInvalid(spec, "dataset.vocab_size", "got 0");  // neither a model nor a size to train
  spec.mutable_dataset()->set_vocab_size(100000);       // more than model.config.vocab_size
  ExpectInvalid(spec, "dataset.vocab_size", "got 100000");
  spec.mutable_dataset()->set_vocab_size(200);
  spec.mutable_dataset()->set_model_type("wordpiece");
  ExpectInvalid(spec, "dataset.model_type", "'wordpiece'");
  spec.mutable_dataset()->set_model_type("unigram");
  EXPECT_TRUE(ValidateJobSpec(spec, TestOptions()).ok());
  spec.mutable_dataset()->set_tokenizer_model("/nonexistent/tokenizer.model");
  ExpectInvalid(spec, "dataset.tokenizer_model", "does not exist");
  spec = ValidTestJobSpec();
  spec.mutable_dataset()->set_tokenizer("sentencepiece");
  spec.mutable_dataset()->set_format("tokens");
  ExpectInvalid(spec, "dataset.tokenizer_model", "already tokenized");
}

TEST(JobSpecValidationTest, ModelConfigRequired) {
  JobSpec spec = ValidTestJobSpec();
  spec.clear_model();
  ExpectInvalid(spec, "model.config", "required");
}

TEST(JobSpecValidationTest, HeadsNotDivisibleByKvHeads) {
  JobSpec spec = ValidTestJobSpec();
  (*spec.mutable_model()->mutable_config()->mutable_fields())["num_key_value_heads"] = Num(3);
  ExpectInvalid(spec, "model.config.num_attention_heads", "num_key_value_heads");
}

TEST(JobSpecValidationTest, ModelConfigMissingField) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_model()->mutable_config()->mutable_fields()->erase("hidden_size");
  ExpectInvalid(spec, "model.config.hidden_size");
}

TEST(JobSpecValidationTest, DeepSpeedConfigRequired) {
  JobSpec spec = ValidTestJobSpec();
  spec.clear_deepspeed_config();
  ExpectInvalid(spec, "deepspeed_config", "required");
}

TEST(JobSpecValidationTest, UnknownDeepSpeedKey) {
  JobSpec spec = ValidTestJobSpec();
  (*spec.mutable_deepspeed_config()->mutable_fields())["train_batch_sise"] = Num(8);
  ExpectInvalid(spec, "deepspeed_config.train_batch_sise", "unknown");
}

TEST(JobSpecValidationTest, UnknownNestedDeepSpeedKey) {
  JobSpec spec = ValidTestJobSpec();
  auto& zero = (*spec.mutable_deepspeed_config()->mutable_fields())["zero_optimization"];
  (*zero.mutable_struct_value()->mutable_fields())["stagee"] = Num(3);
  ExpectInvalid(spec, "deepspeed_config.zero_optimization.stagee", "unknown");
}

TEST(JobSpecValidationTest, DeepSpeedBatchArithmeticUsesWorldSize) {
  JobSpec spec = ValidTestJobSpec();
  // 4 micro * 1 GAS * 2 ranks = 8, not 12.
  (*spec.mutable_deepspeed_config()->mutable_fields())["train_batch_size"] = Num(12);
  ExpectInvalid(spec, "deepspeed_config");
  (*spec.mutable_deepspeed_config()->mutable_fields())["train_batch_size"] = Num(8);
  EXPECT_TRUE(ValidateJobSpec(spec, TestOptions()).ok());
}

TEST(JobSpecValidationTest, NegativeCheckpointIntervalAndRestarts) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_checkpoint()->set_interval_steps(-1);
  ExpectInvalid(spec, "checkpoint.interval_steps", "got -1");
  spec = ValidTestJobSpec();
  spec.set_max_restarts(-3);
  ExpectInvalid(spec, "max_restarts", "got -3");
  spec.set_max_restarts(0);
  spec.set_max_infra_restarts(-2);
  ExpectInvalid(spec, "max_infra_restarts", "got -2");
  spec.set_max_infra_restarts(-1);
  EXPECT_TRUE(ValidateJobSpec(spec, TestOptions()).ok());
  spec.set_max_restarts(2);
  EXPECT_TRUE(ValidateJobSpec(spec, TestOptions()).ok());
}

TEST(JobSpecValidationTest, UnknownProtoFieldsAreNamed) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_training()->GetReflection()->MutableUnknownFields(spec.mutable_training())
      ->AddVarint(99, 1);
  ExpectInvalid(spec, "training", "unknown field number 99");

  JobSpec top = ValidTestJobSpec();
  top.GetReflection()->MutableUnknownFields(&top)->AddVarint(42, 7);
  ExpectInvalid(top, "spec", "unknown field number 42");

  // A Struct config's own unknown fields are named too (the walk stops at the Struct, not
  // before it).
  JobSpec ds = ValidTestJobSpec();
  google::protobuf::Struct* cfg = ds.mutable_deepspeed_config();
  cfg->GetReflection()->MutableUnknownFields(cfg)->AddVarint(9, 1);
  ExpectInvalid(ds, "deepspeed_config", "unknown field number 9");
}

TEST(JobSpecValidationTest, UnknownFieldsSurviveTheWire) {
  // A newer client's field arrives as unknown bytes after parsing.
  JobSpec spec = ValidTestJobSpec();
  std::string wire = spec.SerializeAsString();
  // Field 77 (varint) on the resources sub-message is easier to inject on the top level:
  // tag = (77 << 3) | 0 = 616 -> varint 0xE8 0x04, value 1.
  wire += std::string("\xE8\x04\x01", 3);
  JobSpec parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  ExpectInvalid(parsed, "spec", "unknown field number 77");
}

// Ulysses sequence parallelism (issue 13): every precondition refused at submission, naming the
// field (the reference spec: 4 heads, 2 KV heads, 2 ranks, sequence_length 64).
TEST(JobSpecValidationTest, SequenceParallelPreconditions) {
  auto with = [](const std::vector<std::pair<std::string, double>>& ds,
                 const std::vector<std::pair<std::string, double>>& model) {
    JobSpec spec = ValidTestJobSpec();
    for (const auto& [k, v] : ds) (*spec.mutable_deepspeed_config()->mutable_fields())[k] = Num(v);
    for (const auto& [k, v] : model) {
      (*spec.mutable_model()->mutable_config()->mutable_fields())[k] = Num(v);
    }
    return spec;
  };
  EXPECT_TRUE(ValidateJobSpec(with({{"sequence_parallel_size", 2}}, {}), TestOptions()).ok());
  ExpectInvalid(with({{"sequence_parallel_size", 3}}, {}),
                "deepspeed_config.sequence_parallel_size", "does not divide the world size 2");
  ExpectInvalid(with({{"sequence_parallel_size", 2}}, {{"num_attention_heads", 1},
                                                      {"num_key_value_heads", 1}}),
                "model.config.num_attention_heads", "sequence_parallel_size 2");
  ExpectInvalid(with({{"sequence_parallel_size", 2}},
                     {{"hidden_size", 48}, {"num_attention_heads", 6}, {"num_key_value_heads", 3}}),
                "model.config.num_key_value_heads", "3");
  JobSpec odd = with({{"sequence_parallel_size", 2}}, {});
  odd.mutable_training()->set_sequence_length(63);
  ExpectInvalid(odd, "training.sequence_length", "not divisible by");
  JobSpec longer = with({{"sequence_parallel_size", 2}}, {});
  longer.mutable_training()->set_sequence_length(256);
  ExpectInvalid(longer, "training.sequence_length", "max_position_embeddings = 128], got 256");
}

// dataset.pack_documents (packed samples, issue 13): one packed sample per micro-batch, and a
// token-file data set needs the EOS id that marks its document ends.
TEST(JobSpecValidationTest, PackDocumentsNeedsMicroBatchOneAndAnEosForTokenFiles) {
  JobSpec spec = ValidTestJobSpec();  // train_micro_batch_size_per_gpu 4
  spec.mutable_dataset()->set_pack_documents(true);
  ExpectInvalid(spec, "dataset.pack_documents",
                "needs deepspeed_config.train_micro_batch_size_per_gpu 1, got 4");
  (*spec.mutable_deepspeed_config()->mutable_fields())["train_micro_batch_size_per_gpu"] = Num(1);
  absl::Status s = ValidateJobSpec(spec, TestOptions());
  EXPECT_TRUE(s.ok()) << s;
  spec.mutable_dataset()->set_pack_documents(false);  // off: any micro-batch
  (*spec.mutable_deepspeed_config()->mutable_fields())["train_micro_batch_size_per_gpu"] = Num(4);
  s = ValidateJobSpec(spec, TestOptions());
  EXPECT_TRUE(s.ok()) << s;

  loom::v1::DatasetSpec tokens;
  tokens.set_format("tokens");
  tokens.set_pack_documents(true);
  loom::spec::LlamaConfig model;
  model.vocab_size = 256;
  model.eos_token_id = 2;
  model.eos_token_id_set = true;
  EXPECT_TRUE(loom::spec::CheckPackDocuments(tokens, 1, model).ok());
  // Regression (break-it pass, 2026-12-05): the default id 2 stood in for a missing key, and an
  // id outside the vocabulary (it never occurs: no document ends) was taken.
  model.eos_token_id_set = false;
  const absl::Status no_eos = loom::spec::CheckPackDocuments(tokens, 1, model);
  EXPECT_EQ(no_eos.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(no_eos.message())
                .find("dataset.pack_documents: a token-file data set marks document ends by "
                      "model.config.eos_token_id, which is not set"),
            std::string::npos)
      << no_eos;
  model.eos_token_id_set = true;
  for (int64_t bad : {int64_t{-1}, int64_t{256}, int64_t{100000}}) {
    model.eos_token_id = bad;
    const absl::Status outside = loom::spec::CheckPackDocuments(tokens, 1, model);
    EXPECT_NE(std::string(outside.message())
                  .find(absl::StrCat(bad, " is not a token id of vocab_size 256")),
              std::string::npos)
        << outside;
  }
  loom::v1::DatasetSpec text = tokens;
  text.set_format("text");  // text: documents end where the text says, the id is not needed
  EXPECT_TRUE(loom::spec::CheckPackDocuments(text, 1, model).ok());
}

// ALST's tiled-compute, attention-core and checkpointing keys (issue 13) are refused at
// submission, naming the field, by the trainer's own parser (ValidateAlstKeys).
TEST(JobSpecValidationTest, AlstKeysAreValidatedAtSubmission) {
  JobSpec ok = ValidTestJobSpec();
  ok.mutable_training()->set_tiled_mlp_compute(true);
  ok.mutable_training()->set_tiled_mlp_tile_size(16);
  ok.mutable_training()->set_tiled_logits_loss(true);
  ok.mutable_training()->set_tiled_logits_loss_tile_size(0);
  ok.mutable_training()->set_activation_checkpoint_cpu_offload(true);
  ok.mutable_model()->set_attn_implementation("flash_attention_2");
  ok.mutable_model()->set_attn_block_size(24);
  absl::Status s = ValidateJobSpec(ok, TestOptions());
  EXPECT_TRUE(s.ok()) << s;

  JobSpec spec = ValidTestJobSpec();
  spec.mutable_training()->set_tiled_mlp_tile_size(-1);
  spec.mutable_training()->set_tiled_mlp_compute(true);
  ExpectInvalid(spec, "training.tiled_mlp_tile_size", "-1 must be >= 0");
  spec = ValidTestJobSpec();
  spec.mutable_training()->set_tiled_mlp_tile_size(32);  // switch off: a typo, not ignored
  ExpectInvalid(spec, "training.tiled_mlp_tile_size", "tiled_mlp_compute is false");
  spec = ValidTestJobSpec();
  spec.mutable_training()->set_tiled_logits_loss(true);
  spec.mutable_training()->set_tiled_logits_loss_tile_size(-5);
  ExpectInvalid(spec, "training.tiled_logits_loss_tile_size", "-5 must be >= 0");
  spec = ValidTestJobSpec();
  spec.mutable_training()->set_tiled_logits_loss_tile_size(128);
  ExpectInvalid(spec, "training.tiled_logits_loss_tile_size", "tiled_logits_loss is false");
  spec = ValidTestJobSpec();
  spec.mutable_model()->set_attn_implementation("sdpa");
  ExpectInvalid(spec, "model.attn_implementation", "\"sdpa\" is not eager or flash_attention_2");
  spec = ValidTestJobSpec();
  spec.mutable_model()->set_attn_block_size(-3);
  ExpectInvalid(spec, "model.attn_block_size", "-3 must be >= 1");

  // deepspeed_config.activation_checkpointing: unknown keys, wrong types, unsupported values.
  auto with_ac = [](const std::string& key, const google::protobuf::Value& v) {
    JobSpec j = ValidTestJobSpec();
    google::protobuf::Value section;
    (*section.mutable_struct_value()->mutable_fields())[key] = v;
    (*j.mutable_deepspeed_config()->mutable_fields())["activation_checkpointing"] = section;
    return j;
  };
  google::protobuf::Value yes;
  yes.set_bool_value(true);
  s = ValidateJobSpec(with_ac("cpu_checkpointing", yes), TestOptions());
  EXPECT_TRUE(s.ok()) << s;
  ExpectInvalid(with_ac("cpu_chekpointing", yes),
                "deepspeed_config.activation_checkpointing.cpu_chekpointing", "unknown");
  ExpectInvalid(with_ac("cpu_checkpointing", Num(1)),
                "deepspeed_config.activation_checkpointing.cpu_checkpointing");
  ExpectInvalid(with_ac("partition_activations", yes),
                "deepspeed_config.activation_checkpointing.partition_activations");
  google::protobuf::Value no;
  no.set_bool_value(false);
  JobSpec contradiction = with_ac("cpu_checkpointing", no);
  s = ValidateJobSpec(contradiction, TestOptions());
  EXPECT_TRUE(s.ok()) << s;
  contradiction.mutable_training()->set_activation_checkpoint_cpu_offload(true);
  ExpectInvalid(contradiction, "training.activation_checkpoint_cpu_offload",
                "contradicts deepspeed_config.activation_checkpointing.cpu_checkpointing: false");

  // A sequence longer than max_position_embeddings: both numbers in the message.
  spec = ValidTestJobSpec();
  spec.mutable_training()->set_sequence_length(129);
  ExpectInvalid(spec, "training.sequence_length", "max_position_embeddings = 128], got 129");
}

// Issue 47, "One answer with every problem": independent mistakes in five sections come back in
// one INVALID_ARGUMENT, each naming its field, in spec order.
TEST(JobSpecValidationTest, EveryIndependentMistakeIsNamedInOneAnswer) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_resources()->set_num_ranks(0);
  (*spec.mutable_model()->mutable_config()->mutable_fields())["num_attention_heads"] = Num(0);
  spec.mutable_training()->set_steps(0);
  auto& ds = *spec.mutable_deepspeed_config()->mutable_fields();
  ds["gradient_clippping"] = Num(1.0);  // a misspelling
  google::protobuf::Value fp16;
  (*fp16.mutable_struct_value()->mutable_fields())["enabled"].set_bool_value(false);
  (*fp16.mutable_struct_value()->mutable_fields())["auto_cast"].set_bool_value(true);
  ds["fp16"] = fp16;  // a DeepSpeed feature Loom does not implement

  const absl::Status s = ValidateJobSpec(spec, TestOptions());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  std::vector<std::string> paths;
  for (const Problem& p : ProblemsOf(s)) paths.push_back(p.path);
  EXPECT_EQ(paths, (std::vector<std::string>{
                       "resources.num_ranks", "model.config.num_attention_heads",
                       "training.steps", "deepspeed_config.gradient_clippping",
                       "deepspeed_config.fp16.auto_cast"}));
  EXPECT_EQ(s.message(),
            "5 problems:\n"
            "  resources.num_ranks: must be in [1, 65536], got 0\n"
            "  model.config.num_attention_heads: 0 must be positive\n"
            "  training.steps: must be >= 1, got 0\n"
            "  deepspeed_config.gradient_clippping: unknown key (did you mean "
            "gradient_clipping?)\n"
            "  deepspeed_config.fp16.auto_cast: fp16 auto_cast is not supported yet");
}

// One mistake reads exactly as it did when validation stopped at the first.
TEST(JobSpecValidationTest, OneMistakeReadsAsBefore) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_resources()->set_num_ranks(0);
  const absl::Status s = ValidateJobSpec(spec, TestOptions());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "resources.num_ranks: must be in [1, 65536], got 0");
}

// A model.config that does not parse skips only what needs it: the sequence length bound from
// max_position_embeddings and the byte tokenizer's vocabulary; the rest is still checked.
TEST(JobSpecValidationTest, AnUnusableModelConfigSkipsOnlyItsDependentChecks) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_model()->mutable_config()->mutable_fields()->erase("vocab_size");
  spec.mutable_training()->set_sequence_length(1 << 20);  // past any max_position_embeddings
  spec.mutable_checkpoint()->set_keep_last(-1);
  const absl::Status s = ValidateJobSpec(spec, TestOptions());
  std::vector<std::string> paths;
  for (const Problem& p : ProblemsOf(s)) paths.push_back(p.path);
  EXPECT_EQ(paths,
            (std::vector<std::string>{"model.config.vocab_size", "checkpoint.keep_last"}));
}

}  // namespace
}  // namespace loom
