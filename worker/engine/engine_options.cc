#include "worker/engine/engine_options.h"

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/engine/json_fields.h"

namespace loom::engine {

using nlohmann::json;

namespace {

absl::Status Invalid(const std::string& path, const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", msg));
}

const json& Section(const json& root, const char* key) {
  static const json kEmpty = json::object();
  auto it = root.find(key);
  if (it == root.end() || !it->is_object()) return kEmpty;
  return *it;
}

}  // namespace

absl::StatusOr<EngineOptions> ParseJobSpecJson(const std::string& json_text, int world_size) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return Invalid("spec", "not a JSON object");
  EngineOptions o;
  o.world_size = world_size;

  const json& model = Section(root, "model");
  auto cfg = model.find("config");
  if (cfg == model.end() || !cfg->is_object()) {
    return Invalid("model.config", "required object is missing");
  }
  o.model_config_json = cfg->dump();
  if (auto init = model.find("init_from"); init != model.end()) {
    if (!init->is_string()) return Invalid("model.init_from", "must be a string (a directory)");
    o.init_from = init->get<std::string>();
  }
  ASSIGN_OR_RETURN(o.model, ParseLlamaConfig(o.model_config_json));

  auto ds = root.find("deepspeed_config");
  if (ds == root.end() || !ds->is_object()) {
    return Invalid("deepspeed_config", "required object is missing");
  }
  ASSIGN_OR_RETURN(o.ds, ParseDeepSpeedConfig(ds->dump(), world_size));

  const json& dataset = Section(root, "dataset");
  ASSIGN_OR_RETURN(std::optional<std::string> name,
                   json_fields::OptString(dataset, "name", "dataset"));
  ASSIGN_OR_RETURN(std::optional<std::string> path,
                   json_fields::OptString(dataset, "path", "dataset"));
  if (path.has_value() && !path->empty()) {
    o.data.path = *path;
  } else if (!name.has_value() || name->empty() || *name == "fortunes") {
    o.data.path = kFortunesPath;
  } else {
    return Invalid("dataset.path", absl::StrCat("required for dataset \"", *name, "\""));
  }
  ASSIGN_OR_RETURN(std::optional<std::string> tok,
                   json_fields::OptString(dataset, "tokenizer", "dataset"));
  if (tok.has_value() && !tok->empty()) o.tokenizer = *tok;
  if (o.tokenizer != "byte" && o.tokenizer != "sentencepiece") {
    return Invalid("dataset.tokenizer",
                   absl::StrCat("\"", o.tokenizer, "\" is not byte or sentencepiece"));
  }
  o.data.tokenizer.kind = o.tokenizer;
  ASSIGN_OR_RETURN(std::optional<std::string> format,
                   json_fields::OptString(dataset, "format", "dataset"));
  if (format.has_value() && !format->empty()) o.data.format = *format;
  if (o.data.format != "text" && o.data.format != "jsonl" && o.data.format != "tokens") {
    return Invalid("dataset.format",
                   absl::StrCat("\"", o.data.format, "\" is not text, jsonl or tokens"));
  }
  ASSIGN_OR_RETURN(std::optional<std::string> text_field,
                   json_fields::OptString(dataset, "text_field", "dataset"));
  if (text_field.has_value() && !text_field->empty()) o.data.text_field = *text_field;
  ASSIGN_OR_RETURN(std::optional<std::string> token_dtype,
                   json_fields::OptString(dataset, "token_dtype", "dataset"));
  if (token_dtype.has_value() && !token_dtype->empty()) o.data.token_dtype = *token_dtype;
  if (o.data.token_dtype != "uint16" && o.data.token_dtype != "uint32") {
    return Invalid("dataset.token_dtype",
                   absl::StrCat("\"", o.data.token_dtype, "\" is not uint16 or uint32"));
  }
  ASSIGN_OR_RETURN(std::optional<std::string> tokenizer_model,
                   json_fields::OptString(dataset, "tokenizer_model", "dataset"));
  o.data.tokenizer.model_path = tokenizer_model.value_or("");
  ASSIGN_OR_RETURN(std::optional<int64_t> vocab,
                   json_fields::OptInt(dataset, "vocab_size", "dataset"));
  o.data.tokenizer.vocab_size = vocab.value_or(0);
  ASSIGN_OR_RETURN(std::optional<std::string> model_type,
                   json_fields::OptString(dataset, "model_type", "dataset"));
  if (model_type.has_value() && !model_type->empty()) o.data.tokenizer.model_type = *model_type;
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
  ASSIGN_OR_RETURN(std::optional<double> holdout,
                   json_fields::OptDouble(dataset, "holdout_fraction", "dataset"));
  if (holdout.has_value() && *holdout != 0) o.data.holdout_fraction = *holdout;
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

  const json& training = Section(root, "training");
  ASSIGN_OR_RETURN(std::optional<int64_t> steps,
                   json_fields::OptInt(training, "steps", "training"));
  o.steps = steps.value_or(0);
  if (o.steps < 1) return Invalid("training.steps", absl::StrCat(o.steps, " must be >= 1"));
  ASSIGN_OR_RETURN(std::optional<int64_t> seq,
                   json_fields::OptInt(training, "sequence_length", "training"));
  o.sequence_length = seq.value_or(0);
  if (o.sequence_length < 2 || o.sequence_length > o.model.max_position_embeddings) {
    return Invalid("training.sequence_length",
                   absl::StrCat(o.sequence_length, " is not in [2, max_position_embeddings ",
                                o.model.max_position_embeddings, "]"));
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> seed,
                   json_fields::OptInt(training, "seed", "training"));
  o.seed = static_cast<uint64_t>(seed.value_or(0));
  ASSIGN_OR_RETURN(std::optional<int64_t> every,
                   json_fields::OptInt(training, "eval_every_steps", "training"));
  o.eval_every_steps = every.value_or(0);
  if (o.eval_every_steps < 0) return Invalid("training.eval_every_steps", "must be >= 0");
  ASSIGN_OR_RETURN(std::optional<int64_t> eval_batches,
                   json_fields::OptInt(training, "eval_batches", "training"));
  o.eval_batches = eval_batches.value_or(0) == 0 ? 8 : *eval_batches;
  if (o.eval_batches < 1) return Invalid("training.eval_batches", "must be >= 1");
  ASSIGN_OR_RETURN(std::optional<int64_t> threads,
                   json_fields::OptInt(training, "threads_per_rank", "training"));
  o.threads_per_rank = static_cast<int>(threads.value_or(0) == 0 ? 1 : *threads);
  if (o.threads_per_rank < 1) return Invalid("training.threads_per_rank", "must be >= 1");

  const json& checkpoint = Section(root, "checkpoint");
  ASSIGN_OR_RETURN(std::optional<int64_t> interval,
                   json_fields::OptInt(checkpoint, "interval_steps", "checkpoint"));
  o.checkpoint_interval_steps = interval.value_or(0);
  if (o.checkpoint_interval_steps < 0) {
    return Invalid("checkpoint.interval_steps", "must be >= 0");
  }
  return o;
}

}  // namespace loom::engine
