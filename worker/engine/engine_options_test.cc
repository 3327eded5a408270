#include "worker/engine/engine_options.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "proto/common.pb.h"

namespace loom::engine {
namespace {

using ::loom::testing::StatusIs;

constexpr char kSpec[] = R"({
  "name": "tiny",
  "model": {"config": {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64}},
  "dataset": {"name": "fortunes", "tokenizer": "byte"},
  "deepspeed_config": {"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2,
                       "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
                       "zero_optimization": {"stage": 3}},
  "resources": {"num_ranks": 2},
  "training": {"steps": "12", "sequence_length": 32, "seed": "7", "eval_every_steps": "4"},
  "checkpoint": {"interval_steps": "6", "keep_last": 2}
})";

// kSpec with its first occurrence of `from` replaced by `to` (the test fails if it is absent).
std::string With(const std::string& from, const std::string& to) {
  std::string s = kSpec;
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

TEST(ParseJobSpecJsonTest, ReadsEveryFieldAndAcceptsInt64Strings) {
  absl::StatusOr<EngineOptions> o = ParseJobSpecJson(kSpec, 2);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->model.hidden_size, 64);
  EXPECT_EQ(o->ds.train_batch_size, 12);
  EXPECT_EQ(o->data.path, data::kFortunesPath);
  EXPECT_DOUBLE_EQ(o->data.holdout_fraction, 0.05);
  EXPECT_EQ(o->steps, 12);
  EXPECT_EQ(o->sequence_length, 32);
  EXPECT_EQ(o->seed, 7u);
  EXPECT_EQ(o->eval_every_steps, 4);
  EXPECT_EQ(o->eval_batches, 8);
  EXPECT_EQ(o->threads_per_rank, 1);
  EXPECT_EQ(o->checkpoint_interval_steps, 6);
  EXPECT_EQ(o->world_size, 2);
}

TEST(ParseJobSpecJsonTest, DatasetFormatAndSentencePieceFields) {
  auto with = [](const std::string& dataset) {
    return With("{\"name\": \"fortunes\", \"tokenizer\": \"byte\"}", dataset);
  };
  absl::StatusOr<EngineOptions> o = ParseJobSpecJson(
      with(R"({"path": "/d", "format": "jsonl", "text_field": "body", "tokenizer": "sentencepiece",
               "vocab_size": "200", "model_type": "unigram"})"),
      2);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->data.format, "jsonl");
  EXPECT_EQ(o->data.text_field, "body");
  EXPECT_EQ(o->data.tokenizer.kind, "sentencepiece");
  EXPECT_EQ(o->data.tokenizer.vocab_size, 200);
  EXPECT_EQ(o->data.tokenizer.model_type, "unigram");
  EXPECT_EQ(o->data.vocab_size, 256);
  EXPECT_EQ(o->data.eos_token_id, 2);
  EXPECT_EQ(o->data.model_max_length, 64);
  o = ParseJobSpecJson(
      with(R"({"path": "/d", "format": "tokens", "token_dtype": "uint32",
               "tokenizer": "sentencepiece", "tokenizer_model": "/t/tokenizer.model"})"),
      2);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->data.token_dtype, "uint32");
  EXPECT_EQ(o->data.tokenizer.model_path, "/t/tokenizer.model");
  EXPECT_THAT(ParseJobSpecJson(with(R"({"path": "/d", "format": "csv"})"), 2),
              StatusIs(absl::StatusCode::kInvalidArgument, "dataset.format"));
  EXPECT_THAT(ParseJobSpecJson(with(R"({"path": "/d", "format": "tokens", "token_dtype": "u8"})"), 2),
              StatusIs(absl::StatusCode::kInvalidArgument, "dataset.token_dtype"));
  EXPECT_THAT(ParseJobSpecJson(with(R"({"path": "/d", "tokenizer": "sentencepiece",
                                        "vocab_size": 1000})"), 2),
              StatusIs(absl::StatusCode::kInvalidArgument, "dataset.vocab_size"));
  EXPECT_THAT(ParseJobSpecJson(with(R"({"path": "/d", "tokenizer": "sentencepiece",
                                        "vocab_size": 100, "model_type": "wordpiece"})"), 2),
              StatusIs(absl::StatusCode::kInvalidArgument, "dataset.model_type"));
  EXPECT_THAT(ParseJobSpecJson(with(R"({"path": "/d", "format": "tokens",
                                        "tokenizer": "sentencepiece"})"), 2),
              StatusIs(absl::StatusCode::kInvalidArgument, "dataset.tokenizer_model"));
}

TEST(ParseJobSpecJsonTest, ErrorsNameTheField) {
  absl::StatusOr<EngineOptions> o =
      ParseJobSpecJson(With("\"sequence_length\": 32", "\"sequence_length\": 65"), 2);
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kInvalidArgument, "training.sequence_length: 65"));
  o = ParseJobSpecJson(With("\"steps\": \"12\"", "\"steps\": 0"), 2);
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kInvalidArgument, "training.steps"));
  o = ParseJobSpecJson(With("\"vocab_size\": 256", "\"vocab_size\": 100"), 2);
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kInvalidArgument, "model.config.vocab_size"));
  o = ParseJobSpecJson(With("\"tokenizer\": \"byte\"", "\"tokenizer\": \"bpe\""), 2);
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kInvalidArgument, "dataset.tokenizer"));
  o = ParseJobSpecJson(With("\"stage\": 3", "\"stage\": 3, \"foo\": 1"), 2);
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kInvalidArgument,
                          "deepspeed_config.zero_optimization.foo: unknown key"));
  o = ParseJobSpecJson(With("\"num_attention_heads\": 4", "\"num_attention_heads\": 5"), 2);
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kInvalidArgument, "model.config.hidden_size"));
}

// The path the worker takes: the JobSpec message it received, written as protobuf JSON
// (worker/rank_process.cc), read back by the trainer, gives the same options as the message.
TEST(ParseJobSpecJsonTest, WorkerJsonOfTheMessageGivesTheMessagesOptions) {
  loom::v1::JobSpec spec;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(kSpec, &spec).ok());
  spec.mutable_dataset()->set_holdout_fraction(0.25);
  spec.mutable_training()->set_eval_batches(3);
  spec.mutable_training()->set_threads_per_rank(2);
  spec.mutable_model()->set_init_from("/models/tiny_hf");
  std::string json;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(spec, &json, print).ok());
  absl::StatusOr<EngineOptions> from_json = ParseJobSpecJson(json, 2);
  absl::StatusOr<EngineOptions> from_message = EngineOptionsFromJobSpec(spec, 2);
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  ASSERT_TRUE(from_message.ok()) << from_message.status();
  for (const EngineOptions* o : {&*from_json, &*from_message}) {
    EXPECT_EQ(o->steps, 12);
    EXPECT_EQ(o->seed, 7u);
    EXPECT_DOUBLE_EQ(o->data.holdout_fraction, 0.25);
    EXPECT_EQ(o->eval_batches, 3);
    EXPECT_EQ(o->threads_per_rank, 2);
    EXPECT_EQ(o->init_from, "/models/tiny_hf");
    EXPECT_EQ(o->model.num_hidden_layers, 2);
    EXPECT_EQ(o->ds.zero.stage, 3);
    EXPECT_EQ(o->ds.gradient_accumulation_steps, 2);
  }
  // Keys sorted, whatever order the Struct map prints in (it goes into checkpoints and exports).
  EXPECT_EQ(from_json->model_config_json, from_message->model_config_json);
  EXPECT_EQ(from_json->model_config_json,
            R"({"hidden_size":64,"intermediate_size":128,"max_position_embeddings":64,)"
            R"("num_attention_heads":4,"num_hidden_layers":2,"vocab_size":256})");
  // lowerCamel names (protobuf's default JSON printing) are read too.
  json.clear();
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(spec, &json).ok());
  ASSERT_NE(json.find("\"sequenceLength\""), std::string::npos) << json;
  from_json = ParseJobSpecJson(json, 2);
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  EXPECT_EQ(from_json->sequence_length, 32);
}

// protobuf's parser, not a hand-written one, decides what a JobSpec is: a field the schema does
// not have, or a value of the wrong type, is refused naming the field.
TEST(ParseJobSpecJsonTest, UnknownFieldsAndWrongTypesAreRefusedNamingTheField) {
  absl::StatusOr<EngineOptions> o =
      ParseJobSpecJson(With("\"seed\": \"7\"", "\"seed\": \"7\", \"stpes\": 3"), 2);
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kInvalidArgument, "stpes"));
  o = ParseJobSpecJson(With("\"steps\": \"12\"", "\"steps\": \"twelve\""), 2);
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kInvalidArgument, "spec: "));
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kInvalidArgument, "steps"));
  o = ParseJobSpecJson(With("\"name\": \"tiny\",", "\"name\": \"tiny\", \"model\": 3,"), 2);
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kInvalidArgument, "spec: "));
  o = ParseJobSpecJson("[1, 2]", 2);
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kInvalidArgument, "spec: "));
  o = ParseJobSpecJson(With("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 2, "
                            "\"model_type\": \"gpt2\""), 2);
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kInvalidArgument,
                          "model.config.model_type: \"gpt2\" is not supported"));
  o = ParseJobSpecJson(With("\"deepspeed_config\"", "\"unused_config\""), 2);
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kInvalidArgument, "unused_config"));
  loom::v1::JobSpec no_ds;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(kSpec, &no_ds).ok());
  no_ds.clear_deepspeed_config();
  EXPECT_THAT(EngineOptionsFromJobSpec(no_ds, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, "deepspeed_config: required"));
}

// Issue 13: attention core and activation checkpointing keys.
TEST(ParseJobSpecJsonTest, AttentionCoreAndActivationCheckpointing) {
  absl::StatusOr<EngineOptions> o = ParseJobSpecJson(kSpec, 2);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->attn_implementation, "flash_attention_2");  // the default (docs/job-spec.md)
  EXPECT_EQ(o->attn_block_size, 128);
  EXPECT_FALSE(o->activation_checkpointing);
  EXPECT_FALSE(o->activation_checkpoint_cpu_offload);
  const std::string model = "\"max_position_embeddings\": 64}";
  o = ParseJobSpecJson(With(model, model + ", \"attn_implementation\": \"flash_attention_2\", "
                                           "\"attn_block_size\": 32"),
                       2);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->attn_implementation, "flash_attention_2");
  EXPECT_EQ(o->attn_block_size, 32);
  o = ParseJobSpecJson(With(model, model + ", \"attn_implementation\": \"eager\""), 2);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->attn_implementation, "eager");
  o = ParseJobSpecJson(With(model, model + ", \"attn_implementation\": \"sdpa\""), 2);
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kInvalidArgument, "model.attn_implementation"));
  o = ParseJobSpecJson(With(model, model + ", \"attn_block_size\": -4"), 2);
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kInvalidArgument, "model.attn_block_size: -4"));
  o = ParseJobSpecJson(
      With("\"zero_optimization\"", "\"activation_checkpointing\": {}, \"zero_optimization\""), 2);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->activation_checkpointing);
  EXPECT_FALSE(o->activation_checkpoint_cpu_offload);
  o = ParseJobSpecJson(With("\"seed\": \"7\"",
                            "\"seed\": \"7\", \"activation_checkpoint_cpu_offload\": true"),
                       2);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->activation_checkpointing);
  EXPECT_TRUE(o->activation_checkpoint_cpu_offload);
}

}  // namespace
}  // namespace loom::engine
