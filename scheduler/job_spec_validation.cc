#include "scheduler/job_spec_validation.h"

#include <sys/stat.h>

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/problems.h"
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


// Walks `msg` and its set sub-messages; each message with unknown fields (fields a newer client
// sent that this binary does not know) is a problem naming its path. Not into a
// google.protobuf.Struct (model.config, deepspeed_config): a well-known type whose schema does
// not change, whose keys the config parsers check, and whose map reflection copies every entry
// (docs/benchmarks.md "Control plane at cluster scale", the submission profile).
void CheckNoUnknownFields(const Message& msg, const std::string& path, Problems* problems) {
  const Reflection* refl = msg.GetReflection();
  const google::protobuf::UnknownFieldSet& unknown = refl->GetUnknownFields(msg);
  if (!unknown.empty()) {
    std::vector<int> numbers;
    for (int i = 0; i < unknown.field_count(); ++i) numbers.push_back(unknown.field(i).number());
    problems->Add(path.empty() ? "spec" : path,
                  absl::StrCat("unknown field number", numbers.size() > 1 ? "s " : " ",
                               absl::StrJoin(numbers, ", "), " (", msg.GetTypeName(), ")"));
  }
  if (msg.GetDescriptor() == google::protobuf::Struct::descriptor()) return;
  std::vector<const FieldDescriptor*> fields;
  refl->ListFields(msg, &fields);
  for (const FieldDescriptor* f : fields) {
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (f->is_repeated()) {
      for (int i = 0; i < refl->FieldSize(msg, f); ++i) {
        CheckNoUnknownFields(refl->GetRepeatedMessage(msg, f, i),
                             absl::StrCat(JoinFieldPath(path, f->name()), "[", i, "]"), problems);
      }
    } else {
      CheckNoUnknownFields(refl->GetMessage(msg, f), JoinFieldPath(path, f->name()), problems);
    }
  }
}

// The engine's parsers already name fields "model.config.<field>"/"deepspeed_config.<key>";
// each problem of `s` whose path starts with none of `prefixes` gets the first prepended, so
// every problem names its path. Returns s.ok().
bool MergeWithPrefix(const absl::Status& s, std::initializer_list<absl::string_view> prefixes,
                     Problems* problems) {
  if (s.ok() || s.code() != absl::StatusCode::kInvalidArgument) return problems->Merge(s);
  for (Problem& p : ProblemsOf(s)) {
    bool named = false;
    for (absl::string_view prefix : prefixes) named = named || absl::StartsWith(p.path, prefix);
    if (!named) {
      p.what = p.path.empty() ? p.what : absl::StrCat(p.path, ": ", p.what);
      p.path = std::string(*prefixes.begin());
    }
    problems->Add(p.path, p.what);
  }
  return false;
}


bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// The dataset section's problems. `model` is null when model.config is unusable: the checks
// against its vocabulary are skipped. Returns false when the data set's files cannot be read
// (ValidateDatasetFiles is then skipped).
bool ValidateDataset(const loom::v1::DatasetSpec& d, const spec::LlamaConfig* model,
                     const JobSpecValidationOptions& options, Problems* problems) {
  const size_t before = problems->size();
  bool readable = true;
  if (d.name().empty() && d.path().empty()) {
    problems->Add("dataset", "dataset.name or dataset.path is required (e.g. name: fortunes)");
    readable = false;
  } else if (!d.path().empty()) {
    if (!PathExists(d.path())) {
      problems->Add("dataset.path", absl::StrCat("'", d.path(), "' does not exist"));
      readable = false;
    }
  } else if (d.name() == "fortunes") {
    if (!PathExists(options.fortunes_dir)) {
      problems->Merge(absl::FailedPreconditionError(absl::StrCat(
          "dataset.name: the built-in corpus 'fortunes' needs ", options.fortunes_dir,
          ", which does not exist on the scheduler host (install Debian's fortunes package) or "
          "set dataset.path")));
    }
  } else {
    problems->Add("dataset.name", absl::StrCat("'", d.name(),
                                               "' is not a built-in dataset (built-in: fortunes); "
                                               "set dataset.path to its files"));
  }
  const std::string tokenizer = d.tokenizer().empty() ? "byte" : d.tokenizer();
  if (tokenizer != "byte" && tokenizer != "sentencepiece") {
    problems->Add("dataset.tokenizer", absl::StrCat("unknown tokenizer '", d.tokenizer(),
                                                    "' (supported: byte, sentencepiece)"));
  }
  const std::string format = d.format().empty() ? "text" : d.format();
  if (format != "text" && format != "jsonl" && format != "tokens") {
    problems->Add("dataset.format", absl::StrCat("unknown format '", d.format(),
                                                 "' (supported: text, jsonl, tokens)"));
  }
  if (!d.token_dtype().empty() && d.token_dtype() != "uint16" && d.token_dtype() != "uint32") {
    problems->Add("dataset.token_dtype",
                  absl::StrCat("'", d.token_dtype(), "' is not uint16 or uint32"));
  }
  if (!d.tokenizer_model().empty() && !PathExists(d.tokenizer_model())) {
    problems->Add("dataset.tokenizer_model",
                  absl::StrCat("'", d.tokenizer_model(), "' does not exist"));
  }
  if (tokenizer == "sentencepiece" && d.tokenizer_model().empty()) {
    if (format == "tokens") {  // no tokenizer is trained: the fields below do not apply
      problems->Add("dataset.tokenizer_model",
                    "required for a token-file data set (it is already tokenized)");
    } else if (!d.model_type().empty() && d.model_type() != "bpe" && d.model_type() != "unigram") {
      problems->Add("dataset.model_type",
                    absl::StrCat("'", d.model_type(), "' is not bpe or unigram"));
    }
    if (format != "tokens" && model != nullptr &&
        (d.vocab_size() < 8 || d.vocab_size() > model->vocab_size)) {
      problems->Add("dataset.vocab_size",
                    absl::StrCat("must be in [8, model.config.vocab_size ", model->vocab_size,
                                 "] to train a SentencePiece tokenizer, got ", d.vocab_size()));
    }
  }
  if (model != nullptr && tokenizer == "byte" && format != "tokens" && model->vocab_size < 256) {
    problems->Add("dataset.tokenizer",
                  absl::StrCat("the byte tokenizer needs model.config.vocab_size >= 256, got ",
                               model->vocab_size));
  }
  if (d.holdout_fraction() != 0.0 && !(d.holdout_fraction() > 0.0 && d.holdout_fraction() <= 0.5)) {
    problems->Add("dataset.holdout_fraction",
                  absl::StrCat("must be in (0, 0.5], got ", d.holdout_fraction()));
  }
  return readable && problems->size() == before;
}

// The training section's problems (`model` null: the bound from max_position_embeddings is not
// checked). Returns false when training.sequence_length is unusable.
bool ValidateTraining(const loom::v1::TrainingSpec& t, const spec::LlamaConfig* model,
                      Problems* problems) {
  if (t.steps() < 1) problems->Add("training.steps", absl::StrCat("must be >= 1, got ", t.steps()));
  bool length_ok = true;
  if (model != nullptr && (t.sequence_length() < 2 ||
                           t.sequence_length() > model->max_position_embeddings)) {
    problems->Add("training.sequence_length",
                  absl::StrCat("must be in [2, model.config.max_position_embeddings = ",
                               model->max_position_embeddings, "], got ", t.sequence_length()));
    length_ok = false;
  } else if (t.sequence_length() < 2) {
    problems->Add("training.sequence_length",
                  absl::StrCat("must be >= 2, got ", t.sequence_length()));
    length_ok = false;
  }
  if (t.eval_every_steps() < 0) {
    problems->Add("training.eval_every_steps",
                  absl::StrCat("must be >= 0, got ", t.eval_every_steps()));
  }
  if (t.eval_batches() < 0) {
    problems->Add("training.eval_batches", absl::StrCat("must be >= 0, got ", t.eval_batches()));
  }
  if (t.threads_per_rank() < 0 || t.threads_per_rank() > kMaxThreadsPerRank) {
    problems->Add("training.threads_per_rank",
                  absl::StrCat("must be in [0, ", kMaxThreadsPerRank, "], got ",
                               t.threads_per_rank()));
  }
  return length_ok;
}

// Whether a problem ValidateJobSpecLimits named lies under `prefix` (then the section is not
// parsed: its problem is already named, and parsing would only repeat it).
bool AnyUnder(const std::vector<Problem>& problems, absl::string_view prefix) {
  for (const Problem& p : problems) {
    if (p.path == prefix || absl::StartsWith(p.path, absl::StrCat(prefix, "."))) return true;
  }
  return false;
}

// The deepspeed_config keys judged against the world size (ParseDeepSpeedConfig's batch
// arithmetic and sequence_parallel_size).
bool DependsOnWorldSize(absl::string_view path) {
  for (absl::string_view key : {"train_batch_size", "train_micro_batch_size_per_gpu",
                                "gradient_accumulation_steps", "sequence_parallel_size"}) {
    if (path == absl::StrCat("deepspeed_config.", key)) return true;
  }
  return path == "deepspeed_config";  // a message without a key path ("world_size: ...")
}

// resources.*: each field's problem. `selector_named`: ValidateJobSpecLimits named a problem of
// node_selector already.
void ValidateResources(const loom::v1::ResourceSpec& r, bool selector_named, Problems* problems) {
  if (r.num_ranks() < 1 || r.num_ranks() > kMaxNumRanks) {
    problems->Add("resources.num_ranks",
                  absl::StrCat("must be in [1, ", kMaxNumRanks, "], got ", r.num_ranks()));
  }
  if (!loom::v1::AcceleratorKind_IsValid(r.accelerator())) {
    problems->Add("resources.accelerator", absl::StrCat("unknown kind ", r.accelerator()));
  }
  // The placement fields, checked as workers' inventories are (RegisterWorker): a value no node
  // can ever report would leave the job pending forever.
  if (!r.cpu_arch().empty() && r.cpu_arch() != "x86_64" && r.cpu_arch() != "aarch64") {
    problems->Add("resources.cpu_arch",
                  absl::StrCat("must be x86_64 or aarch64 (or empty), got '",
                               absl::CEscape(r.cpu_arch().substr(0, 64)), "'"));
  }
  if (r.accelerator_memory_bytes() < 0) {
    problems->Add("resources.accelerator_memory_bytes", "must be >= 0");
  }
  if (r.host_memory_bytes() < 0) problems->Add("resources.host_memory_bytes", "must be >= 0");
  for (const auto& [key, value] : r.node_selector()) {
    if (selector_named) break;
    if (key.empty() || key.size() > 63 || value.size() > 63) {
      problems->Add("resources.node_selector",
                    absl::StrCat("keys must be 1-63 bytes and values at most 63 bytes (key '",
                                 absl::CEscape(key.substr(0, 64)), "')"));
    }
  }
}

// model.config and model.init_from; the parsed config, or nullopt when it is unusable.
std::optional<spec::LlamaConfig> ValidateModel(const loom::v1::JobSpec& spec, bool config_readable,
                                               Problems* problems) {
  if (!spec.model().has_config()) {
    problems->Add("model.config", "required (a Hugging Face Llama config.json object)");
    return std::nullopt;
  }
  if (!config_readable) return std::nullopt;  // ValidateJobSpecLimits named its problem
  // Converted in memory, not printed as JSON text and parsed again (spec/struct_json.h).
  absl::StatusOr<nlohmann::json> model_json =
      spec::StructToJson(spec.model().config(), "model.config");
  if (!problems->Merge(model_json.status())) return std::nullopt;
  absl::StatusOr<spec::LlamaConfig> model = spec::ParseLlamaConfigValue(*model_json);
  if (!MergeWithPrefix(model.status(), {"model.config"}, problems)) return std::nullopt;
  if (!spec.model().init_from().empty()) {
    const std::string& dir = spec.model().init_from();
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      problems->Add("model.init_from", absl::StrCat("'", dir, "' is not a directory"));
    } else if (::access(absl::StrCat(dir, "/model.safetensors").c_str(), R_OK) != 0 &&
               ::access(absl::StrCat(dir, "/model.safetensors.index.json").c_str(), R_OK) != 0) {
      problems->Add("model.init_from",
                    absl::StrCat("'", dir,
                                 "' holds neither model.safetensors nor "
                                 "model.safetensors.index.json (use loomctl consolidate)"));
    } else {
      problems->Merge(ValidateInitFromShapes(dir, *model));
    }
  }
  return *std::move(model);
}

void ValidateCheckpointAndRestarts(const loom::v1::JobSpec& spec, Problems* problems) {
  if (spec.checkpoint().interval_steps() < 0) {
    problems->Add("checkpoint.interval_steps",
                  absl::StrCat("must be >= 0, got ", spec.checkpoint().interval_steps()));
  }
  if (spec.checkpoint().keep_last() < 0) {
    problems->Add("checkpoint.keep_last",
                  absl::StrCat("must be >= 0 (0 keeps every checkpoint), got ",
                               spec.checkpoint().keep_last()));
  }
  if (spec.checkpoint().keep_best() < 0) {
    problems->Add("checkpoint.keep_best",
                  absl::StrCat("must be >= 0, got ", spec.checkpoint().keep_best()));
  }
  const std::string& metric = spec.checkpoint().best_metric();
  if (!metric.empty() && metric != "eval_loss" && metric != "train_loss") {
    problems->Add("checkpoint.best_metric",
                  absl::StrCat("'", metric, "' is not recorded (eval_loss or train_loss)"));
  }
  if (spec.max_restarts() < 0) {
    problems->Add("max_restarts", absl::StrCat("must be >= 0, got ", spec.max_restarts()));
  }
  if (!spec.technique().empty() && spec.technique() != "auto") {
    problems->Add("technique", absl::StrCat("'", spec.technique(),
                                            "': \"auto\" lets the scheduler choose; leave it out "
                                            "to use the deepspeed_config as written"));
  }
  if (spec.max_infra_restarts() < -1) {
    problems->Add("max_infra_restarts",
                  absl::StrCat("must be >= 0, or -1 for the scheduler's default; got ",
                               spec.max_infra_restarts()));
  }
}

}  // namespace

absl::Status ValidateJobSpec(const loom::v1::JobSpec& spec,
                             const JobSpecValidationOptions& options) {
  Problems problems;
  CheckNoUnknownFields(spec, "", &problems);
  const absl::Status limits = ValidateJobSpecLimits(spec);
  const std::vector<Problem> limit_problems = ProblemsOf(limits);
  problems.Merge(limits);
  // A spec too large is not read any further.
  if (spec.ByteSizeLong() > kMaxJobSpecBytes ||
      (!limits.ok() && limits.code() != absl::StatusCode::kInvalidArgument)) {
    return problems.ToStatus();
  }

  const loom::v1::ResourceSpec& r = spec.resources();
  ValidateResources(r, AnyUnder(limit_problems, "resources.node_selector"), &problems);
  const bool ranks_ok = r.num_ranks() >= 1 && r.num_ranks() <= kMaxNumRanks;

  const std::optional<spec::LlamaConfig> model =
      ValidateModel(spec, !AnyUnder(limit_problems, "model.config"), &problems);
  const spec::LlamaConfig* model_or_null = model.has_value() ? &*model : nullptr;

  const bool dataset_ok = ValidateDataset(spec.dataset(), model_or_null, options, &problems);
  const bool length_ok = ValidateTraining(spec.training(), model_or_null, &problems);
  if (dataset_ok && length_ok && model.has_value() && !spec.dataset().path().empty() &&
      (spec.dataset().format().empty() || spec.dataset().format() == "text")) {
    problems.Merge(ValidateDatasetFiles(spec.dataset().path(), spec.dataset().holdout_fraction(),
                                        int64_t{spec.training().sequence_length()} + 1,
                                        options.dataset_files));
  }

  std::optional<spec::DeepSpeedConfig> ds;
  if (!spec.has_deepspeed_config()) {
    problems.Add("deepspeed_config",
                 "required (a DeepSpeed ds_config.json object with at least "
                 "train_micro_batch_size_per_gpu, or \"auto\" and training.*)");
  } else if (!AnyUnder(limit_problems, "deepspeed_config")) {
    // Hugging Face Trainer configs ("auto", no optimizer or scheduler) resolve from training.*
    // (spec/hf_trainer_config.h), as the trainer will. Without a usable model config the
    // hidden size is a placeholder (1): it only sizes "auto" buckets, which no size can make
    // invalid. Without a usable num_ranks the world size is 1 and the keys the batch
    // arithmetic judges against it are not judged. So the DeepSpeed config's own problems are
    // still all named.
    absl::StatusOr<spec::DeepSpeedConfig> parsed = spec::ParseJobDeepSpeedConfig(
        spec, model.has_value() ? model->hidden_size : 1, ranks_ok ? r.num_ranks() : 1);
    Problems ds_problems;
    // The Trainer arguments' own errors name their training.* field.
    if (MergeWithPrefix(parsed.status(), {"deepspeed_config", "training."}, &ds_problems)) {
      if (ranks_ok) ds = *std::move(parsed);
    } else if (parsed.status().code() != absl::StatusCode::kInvalidArgument) {
      problems.Merge(parsed.status());
    } else {
      for (const Problem& p : ds_problems.problems()) {
        if (ranks_ok || !DependsOnWorldSize(p.path)) problems.Add(p.path, p.what);
      }
    }
  }
  if (model.has_value() && ds.has_value() && length_ok) {
    // Ulysses (issue 13): heads, S % P. Then the ALST keys (training.tiled_*,
    // model.attn_implementation / attn_block_size, activation checkpointing; the trainer's own
    // parser, engine_options_tiled.h), and document packing.
    if (problems.Merge(spec::ValidateSequenceParallel(
            model->num_attention_heads, model->num_key_value_heads,
            spec.training().sequence_length(), ds->sequence_parallel_size))) {
      problems.Merge(spec::ValidateAlstKeys(spec, *ds));
    }
    problems.Merge(spec::CheckPackDocuments(spec.dataset(), ds->train_micro_batch_size_per_gpu,
                                            *model));
    // What the model config allows at this length (Mistral's sliding window, LongRoPE under
    // sequence parallelism): said at submission, not by the trainer once placed.
    problems.Merge(spec::CheckModelConfigForSequenceLength(
        *model, spec.training().sequence_length(), ds->sequence_parallel_size));
  }

  ValidateCheckpointAndRestarts(spec, &problems);
  return problems.ToStatus();
}

}  // namespace loom
