#include "worker/engine/engine_options.h"

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/accelerator_kind.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "proto/common.pb.h"
#include "spec/engine_options_tiled.h"
#include "spec/hf_trainer_config.h"
#include "spec/sequence_parallel_config.h"
#include "spec/struct_json.h"
#include "worker/engine/engine_options_model.h"

namespace loom::engine {

namespace {

absl::Status Invalid(const std::string& path, const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", msg));
}

}  // namespace

absl::StatusOr<EngineOptions> EngineOptionsFromJobSpec(const loom::v1::JobSpec& spec,
                                                       int world_size) {
  EngineOptions o;
  o.world_size = world_size;

  if (!spec.model().has_config()) return Invalid("model.config", "required object is missing");
  // Both configs are converted in memory (spec/struct_json.h), as submission validation does.
  ASSIGN_OR_RETURN(nlohmann::json model_json,
                   spec::StructToJson(spec.model().config(), "model.config"));
  // Written into checkpoints and exports: nlohmann's object is an ordered map, so the text's
  // keys are sorted and do not depend on the Struct's unspecified order.
  o.model_config_json = model_json.dump();
  o.init_from = spec.model().init_from();
  ASSIGN_OR_RETURN(o.model, spec::ParseLlamaConfigValue(model_json));

  if (!spec.has_deepspeed_config()) {
    return Invalid("deepspeed_config", "required object is missing");
  }
  // As submission validation does (spec/hf_trainer_config.h: "auto", the Trainer's optimizer
  // and schedule from training.*).
  ASSIGN_OR_RETURN(o.ds, spec::ParseJobDeepSpeedConfig(spec, o.model.hidden_size, world_size));

  const loom::v1::DatasetSpec& dataset = spec.dataset();
  if (!dataset.path().empty()) {
    o.data.path = dataset.path();
  } else if (dataset.name().empty() || dataset.name() == "fortunes") {
    o.data.path = data::kFortunesPath;
  } else {
    return Invalid("dataset.path", absl::StrCat("required for dataset \"", dataset.name(), "\""));
  }
  if (!dataset.tokenizer().empty()) o.tokenizer = dataset.tokenizer();
  if (o.tokenizer != "byte" && o.tokenizer != "sentencepiece") {
    return Invalid("dataset.tokenizer",
                   absl::StrCat("\"", o.tokenizer, "\" is not byte or sentencepiece"));
  }
  o.data.tokenizer.kind = o.tokenizer;
  if (!dataset.format().empty()) o.data.format = dataset.format();
  if (o.data.format != "text" && o.data.format != "jsonl" && o.data.format != "tokens") {
    return Invalid("dataset.format",
                   absl::StrCat("\"", o.data.format, "\" is not text, jsonl or tokens"));
  }
  if (!dataset.text_field().empty()) o.data.text_field = dataset.text_field();
  if (!dataset.token_dtype().empty()) o.data.token_dtype = dataset.token_dtype();
  if (o.data.token_dtype != "uint16" && o.data.token_dtype != "uint32") {
    return Invalid("dataset.token_dtype",
                   absl::StrCat("\"", o.data.token_dtype, "\" is not uint16 or uint32"));
  }
  o.data.tokenizer.model_path = dataset.tokenizer_model();
  o.data.tokenizer.vocab_size = dataset.vocab_size();
  if (!dataset.model_type().empty()) o.data.tokenizer.model_type = dataset.model_type();
  if (o.tokenizer == "sentencepiece" && o.data.tokenizer.model_path.empty()) {
    if (o.data.format == "tokens") {
      return Invalid("dataset.tokenizer_model",
                     "required for a token-file data set (it is already tokenized)");
    }
    if (o.data.tokenizer.model_type != "bpe" && o.data.tokenizer.model_type != "unigram") {
      return Invalid("dataset.model_type", absl::StrCat("\"", o.data.tokenizer.model_type,
                                                        "\" is not bpe or unigram"));
    }
    if (o.data.tokenizer.vocab_size < 8 ||
        o.data.tokenizer.vocab_size > o.model.vocab_size) {
      return Invalid("dataset.vocab_size",
                     absl::StrCat(o.data.tokenizer.vocab_size,
                                  " is not in [8, model.config.vocab_size ", o.model.vocab_size,
                                  "] (needed to train a SentencePiece tokenizer)"));
    }
  }
  if (dataset.holdout_fraction() != 0) o.data.holdout_fraction = dataset.holdout_fraction();
  if (!(o.data.holdout_fraction > 0 && o.data.holdout_fraction <= 0.5)) {
    return Invalid("dataset.holdout_fraction",
                   absl::StrCat(o.data.holdout_fraction, " is not in (0, 0.5]"));
  }
  if (o.tokenizer == "byte" && o.data.format != "tokens" && o.model.vocab_size < 256) {
    return Invalid("model.config.vocab_size",
                   absl::StrCat(o.model.vocab_size, " < 256 (the byte tokenizer needs 256)"));
  }
  o.data.vocab_size = o.model.vocab_size;
  o.data.bos_token_id = o.model.bos_token_id;
  o.data.eos_token_id = o.model.eos_token_id;
  o.data.model_max_length = o.model.max_position_embeddings;

  // "cpu", "h100", ... as users write them; an unknown number stays a number and is refused by
  // ResolveRankDevice (worker/engine/device.h), naming resources.accelerator.
  o.accelerator = spec.resources().accelerator() == loom::v1::ACCELERATOR_KIND_UNSPECIFIED
                      ? "cpu"
                      : AcceleratorKindName(spec.resources().accelerator());

  const loom::v1::TrainingSpec& training = spec.training();
  o.steps = training.steps();
  if (o.steps < 1) return Invalid("training.steps", absl::StrCat(o.steps, " must be >= 1"));
  o.sequence_length = training.sequence_length();
  if (o.sequence_length < 2 || o.sequence_length > o.model.max_position_embeddings) {
    return Invalid("training.sequence_length",
                   absl::StrCat(o.sequence_length, " is not in [2, max_position_embeddings ",
                                o.model.max_position_embeddings, "]"));
  }
  RETURN_IF_ERROR(spec::CheckModelConfigForSequenceLength(o.model, o.sequence_length,
                                                          o.ds.sequence_parallel_size));
  RETURN_IF_ERROR(spec::ValidateSequenceParallel(o.model.num_attention_heads,  // Ulysses (issue 13)
                                           o.model.num_key_value_heads, o.sequence_length,
                                           o.ds.sequence_parallel_size));
  o.seed = training.seed();
  o.eval_every_steps = training.eval_every_steps();
  if (o.eval_every_steps < 0) return Invalid("training.eval_every_steps", "must be >= 0");
  o.eval_batches = training.eval_batches() == 0 ? 8 : training.eval_batches();
  if (o.eval_batches < 1) return Invalid("training.eval_batches", "must be >= 1");
  o.threads_per_rank = training.threads_per_rank() == 0 ? 1 : training.threads_per_rank();
  if (o.threads_per_rank < 1) return Invalid("training.threads_per_rank", "must be >= 1");
  RETURN_IF_ERROR(spec::ParseTiledCompute(training, &o.tiled));

  RETURN_IF_ERROR(ModelExecutionOptionsFromJobSpec(spec, &o));  // issue 13
  // Packed samples (issue 13): the check the scheduler makes too (engine_options_tiled.h).
  RETURN_IF_ERROR(spec::CheckPackDocuments(spec.dataset(), o.ds.train_micro_batch_size_per_gpu,
                                           o.model));
  o.pack_documents = spec.dataset().pack_documents();

  o.checkpoint_interval_steps = spec.checkpoint().interval_steps();
  if (o.checkpoint_interval_steps < 0) {
    return Invalid("checkpoint.interval_steps", "must be >= 0");
  }
  return o;
}

absl::StatusOr<EngineOptions> ParseJobSpecJson(const std::string& json_text, int world_size) {
  loom::v1::JobSpec spec;
  google::protobuf::util::JsonParseOptions parse;
  parse.ignore_unknown_fields = false;  // a misspelt field is an error, not a silent default
  auto st = google::protobuf::util::JsonStringToMessage(json_text, &spec, parse);
  if (!st.ok()) return Invalid("spec", st.message().ToString());
  return EngineOptionsFromJobSpec(spec, world_size);
}

}  // namespace loom::engine
