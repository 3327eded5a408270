#include "scheduler/job_spec_validation.h"

#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "scheduler/field_path.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/unknown_field_set.h"
#include "scheduler/job_spec_validation_files.h"
#include "scheduler/job_spec_validation_limits.h"
#include "spec/ds_config.h"
#include "spec/engine_options_tiled.h"
#include "spec/hf_trainer_config.h"
#include "spec/model_config.h"
#include "spec/sequence_parallel_config.h"
#include "spec/struct_json.h"

namespace loom {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;


// Walks `msg` and its set sub-messages; the first message with unknown fields (fields a newer
// client sent that this binary does not know) is reported with its path. Not into a
// google.protobuf.Struct (model.config, deepspeed_config): a well-known type whose schema does
// not change, whose keys the config parsers check, and whose map reflection copies every entry
// (docs/benchmarks.md "Control plane at cluster scale", the submission profile).
absl::Status CheckNoUnknownFields(const Message& msg, const std::string& path) {
  const Reflection* refl = msg.GetReflection();
  const google::protobuf::UnknownFieldSet& unknown = refl->GetUnknownFields(msg);
  if (!unknown.empty()) {
    std::vector<int> numbers;
    for (int i = 0; i < unknown.field_count(); ++i) numbers.push_back(unknown.field(i).number());
    return InvalidField(path.empty() ? "spec" : path,
                   absl::StrCat("unknown field number", numbers.size() > 1 ? "s " : " ",
                                absl::StrJoin(numbers, ", "), " (", msg.GetTypeName(), ")"));
  }
  if (msg.GetDescriptor() == google::protobuf::Struct::descriptor()) return absl::OkStatus();
  std::vector<const FieldDescriptor*> fields;
  refl->ListFields(msg, &fields);
  for (const FieldDescriptor* f : fields) {
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (f->is_repeated()) {
      for (int i = 0; i < refl->FieldSize(msg, f); ++i) {
        RETURN_IF_ERROR(CheckNoUnknownFields(refl->GetRepeatedMessage(msg, f, i),
                                             absl::StrCat(JoinFieldPath(path, f->name()), "[", i, "]")));
      }
    } else {
      RETURN_IF_ERROR(CheckNoUnknownFields(refl->GetMessage(msg, f), JoinFieldPath(path, f->name())));
    }
  }
  return absl::OkStatus();
}

// The engine's parsers already name fields "model.config.<field>"/"deepspeed_config.<key>";
// anything that does not start with `prefix` gets it prepended so every error names its path.
absl::Status WithPrefix(const absl::Status& s, absl::string_view prefix) {
  if (s.ok() || absl::StartsWith(s.message(), prefix)) return s;
  return absl::Status(s.code(), absl::StrCat(prefix, ": ", s.message()));
}


bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

absl::Status ValidateDataset(const loom::v1::DatasetSpec& d, const spec::LlamaConfig& model,
                             const JobSpecValidationOptions& options) {
  if (d.name().empty() && d.path().empty()) {
    return InvalidField("dataset", "dataset.name or dataset.path is required (e.g. name: fortunes)");
  }
  if (!d.path().empty()) {
    if (!PathExists(d.path())) {
      return InvalidField("dataset.path", absl::StrCat("'", d.path(), "' does not exist"));
    }
  } else if (d.name() == "fortunes") {
    if (!PathExists(options.fortunes_dir)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "dataset.name: the built-in corpus 'fortunes' needs ", options.fortunes_dir,
          ", which does not exist on the scheduler host (install Debian's fortunes package) or "
          "set dataset.path"));
    }
  } else {
    return InvalidField("dataset.name", absl::StrCat("'", d.name(),
                                                "' is not a built-in dataset (built-in: fortunes); "
                                                "set dataset.path to its files"));
  }
  const std::string tokenizer = d.tokenizer().empty() ? "byte" : d.tokenizer();
  if (tokenizer != "byte" && tokenizer != "sentencepiece") {
    return InvalidField("dataset.tokenizer",
                   absl::StrCat("unknown tokenizer '", d.tokenizer(),
                                "' (supported: byte, sentencepiece)"));
  }
  const std::string format = d.format().empty() ? "text" : d.format();
  if (format != "text" && format != "jsonl" && format != "tokens") {
    return InvalidField("dataset.format", absl::StrCat("unknown format '", d.format(),
                                                       "' (supported: text, jsonl, tokens)"));
  }
  if (!d.token_dtype().empty() && d.token_dtype() != "uint16" && d.token_dtype() != "uint32") {
    return InvalidField("dataset.token_dtype",
                        absl::StrCat("'", d.token_dtype(), "' is not uint16 or uint32"));
  }
  if (!d.tokenizer_model().empty() && !PathExists(d.tokenizer_model())) {
    return InvalidField("dataset.tokenizer_model",
                        absl::StrCat("'", d.tokenizer_model(), "' does not exist"));
  }
  if (tokenizer == "sentencepiece" && d.tokenizer_model().empty()) {
    if (format == "tokens") {
      return InvalidField("dataset.tokenizer_model",
                          "required for a token-file data set (it is already tokenized)");
    }
    if (!d.model_type().empty() && d.model_type() != "bpe" && d.model_type() != "unigram") {
      return InvalidField("dataset.model_type",
                          absl::StrCat("'", d.model_type(), "' is not bpe or unigram"));
    }
    if (d.vocab_size() < 8 || d.vocab_size() > model.vocab_size) {
      return InvalidField("dataset.vocab_size",
                          absl::StrCat("must be in [8, model.config.vocab_size ",
                                       model.vocab_size, "] to train a SentencePiece tokenizer, got ",
                                       d.vocab_size()));
    }
  }
  if (tokenizer == "byte" && format != "tokens" && model.vocab_size < 256) {
    return InvalidField("dataset.tokenizer",
                   absl::StrCat("the byte tokenizer needs model.config.vocab_size >= 256, got ",
                                model.vocab_size));
  }
  if (d.holdout_fraction() != 0.0 && !(d.holdout_fraction() > 0.0 && d.holdout_fraction() <= 0.5)) {
    return InvalidField("dataset.holdout_fraction",
                   absl::StrCat("must be in (0, 0.5], got ", d.holdout_fraction()));
  }
  return absl::OkStatus();
}

absl::Status ValidateTraining(const loom::v1::TrainingSpec& t, const spec::LlamaConfig& model) {
  if (t.steps() < 1) return InvalidField("training.steps", absl::StrCat("must be >= 1, got ", t.steps()));
  if (t.sequence_length() < 2 || t.sequence_length() > model.max_position_embeddings) {
    return InvalidField("training.sequence_length",
                   absl::StrCat("must be in [2, model.config.max_position_embeddings = ",
                                model.max_position_embeddings, "], got ", t.sequence_length()));
  }
  if (t.eval_every_steps() < 0) {
    return InvalidField("training.eval_every_steps",
                   absl::StrCat("must be >= 0, got ", t.eval_every_steps()));
  }
  if (t.eval_batches() < 0) {
    return InvalidField("training.eval_batches", absl::StrCat("must be >= 0, got ", t.eval_batches()));
  }
  if (t.threads_per_rank() < 0 || t.threads_per_rank() > kMaxThreadsPerRank) {
    return InvalidField("training.threads_per_rank",
                   absl::StrCat("must be in [0, ", kMaxThreadsPerRank, "], got ",
                                t.threads_per_rank()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobSpec(const loom::v1::JobSpec& spec,
                             const JobSpecValidationOptions& options) {
  RETURN_IF_ERROR(CheckNoUnknownFields(spec, ""));
  RETURN_IF_ERROR(ValidateJobSpecLimits(spec));

  const loom::v1::ResourceSpec& r = spec.resources();
  if (r.num_ranks() < 1 || r.num_ranks() > kMaxNumRanks) {
    return InvalidField("resources.num_ranks",
                   absl::StrCat("must be in [1, ", kMaxNumRanks, "], got ", r.num_ranks()));
  }
  if (!loom::v1::AcceleratorKind_IsValid(r.accelerator())) {
    return InvalidField("resources.accelerator", absl::StrCat("unknown kind ", r.accelerator()));
  }
  // The placement fields, checked as workers' inventories are (RegisterWorker): a value no node
  // can ever report would leave the job pending forever.
  if (!r.cpu_arch().empty() && r.cpu_arch() != "x86_64" && r.cpu_arch() != "aarch64") {
    return InvalidField("resources.cpu_arch",
                   absl::StrCat("must be x86_64 or aarch64 (or empty), got '",
                                absl::CEscape(r.cpu_arch().substr(0, 64)), "'"));
  }
  if (r.accelerator_memory_bytes() < 0) {
    return InvalidField("resources.accelerator_memory_bytes", "must be >= 0");
  }
  if (r.host_memory_bytes() < 0) return InvalidField("resources.host_memory_bytes", "must be >= 0");
  for (const auto& [key, value] : r.node_selector()) {
    if (key.empty() || key.size() > 63 || value.size() > 63) {
      return InvalidField("resources.node_selector",
                     absl::StrCat("keys must be 1-63 bytes and values at most 63 bytes (key '",
                                  absl::CEscape(key.substr(0, 64)), "')"));
    }
  }

  if (!spec.model().has_config()) {
    return InvalidField("model.config", "required (a Hugging Face Llama config.json object)");
  }
  // Converted in memory, not printed as JSON text and parsed again (spec/struct_json.h).
  ASSIGN_OR_RETURN(nlohmann::json model_json,
                   spec::StructToJson(spec.model().config(), "model.config"));
  absl::StatusOr<spec::LlamaConfig> model = spec::ParseLlamaConfigValue(model_json);
  if (!model.ok()) return WithPrefix(model.status(), "model.config");
  if (!spec.model().init_from().empty()) {
    const std::string& dir = spec.model().init_from();
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return InvalidField("model.init_from", absl::StrCat("'", dir, "' is not a directory"));
    }
    if (::access(absl::StrCat(dir, "/model.safetensors").c_str(), R_OK) != 0 &&
        ::access(absl::StrCat(dir, "/model.safetensors.index.json").c_str(), R_OK) != 0) {
      return InvalidField("model.init_from",
                     absl::StrCat("'", dir,
                                  "' holds neither model.safetensors nor "
                                  "model.safetensors.index.json (use loomctl consolidate)"));
    }
    RETURN_IF_ERROR(ValidateInitFromShapes(dir, *model));
  }

  RETURN_IF_ERROR(ValidateDataset(spec.dataset(), *model, options));
  RETURN_IF_ERROR(ValidateTraining(spec.training(), *model));
  if (!spec.dataset().path().empty() &&
      (spec.dataset().format().empty() || spec.dataset().format() == "text")) {
    RETURN_IF_ERROR(ValidateDatasetFiles(spec.dataset().path(), spec.dataset().holdout_fraction(),
                                         int64_t{spec.training().sequence_length()} + 1,
                                         options.dataset_files));
  }

  if (!spec.has_deepspeed_config()) {
    return InvalidField("deepspeed_config",
                   "required (a DeepSpeed ds_config.json object with at least "
                   "train_micro_batch_size_per_gpu, or \"auto\" and training.*)");
  }
  // Hugging Face Trainer configs ("auto", no optimizer or scheduler) resolve from training.*
  // (spec/hf_trainer_config.h), as the trainer will.
  absl::StatusOr<spec::DeepSpeedConfig> ds =
      spec::ParseJobDeepSpeedConfig(spec, model->hidden_size, r.num_ranks());
  if (!ds.ok()) {
    // The Trainer arguments' own errors name their training.* field.
    if (absl::StartsWith(ds.status().message(), "training.")) return ds.status();
    return WithPrefix(ds.status(), "deepspeed_config");
  }
  RETURN_IF_ERROR(spec::ValidateSequenceParallel(  // Ulysses (issue 13): heads, S % P
      model->num_attention_heads, model->num_key_value_heads, spec.training().sequence_length(),
      ds->sequence_parallel_size));
  // ALST keys (issue 13): training.tiled_*, model.attn_implementation / attn_block_size,
  // activation checkpointing; the trainer's own parser (engine_options_tiled.h).
  RETURN_IF_ERROR(spec::ValidateAlstKeys(spec, *ds));
  RETURN_IF_ERROR(spec::CheckPackDocuments(spec.dataset(), ds->train_micro_batch_size_per_gpu,
                                           *model));

  if (spec.checkpoint().interval_steps() < 0) {
    return InvalidField("checkpoint.interval_steps",
                   absl::StrCat("must be >= 0, got ", spec.checkpoint().interval_steps()));
  }
  if (spec.checkpoint().keep_last() < 0) {
    return InvalidField("checkpoint.keep_last",
                   absl::StrCat("must be >= 0 (0 keeps every checkpoint), got ",
                                spec.checkpoint().keep_last()));
  }
  if (spec.checkpoint().keep_best() < 0) {
    return InvalidField("checkpoint.keep_best",
                   absl::StrCat("must be >= 0, got ", spec.checkpoint().keep_best()));
  }
  const std::string& metric = spec.checkpoint().best_metric();
  if (!metric.empty() && metric != "eval_loss" && metric != "train_loss") {
    return InvalidField("checkpoint.best_metric",
                   absl::StrCat("'", metric, "' is not recorded (eval_loss or train_loss)"));
  }
  if (spec.max_restarts() < 0) {
    return InvalidField("max_restarts", absl::StrCat("must be >= 0, got ", spec.max_restarts()));
  }
  if (spec.max_infra_restarts() < -1) {
    return InvalidField("max_infra_restarts",
                   absl::StrCat("must be >= 0, or -1 for the scheduler's default; got ",
                                spec.max_infra_restarts()));
  }
  return absl::OkStatus();
}

}  // namespace loom
