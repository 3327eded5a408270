// File: scheduler/job_spec_validation.h
//
// Admission-time validation of a JobSpec (docs/design/DESIGN.md "A job's path", step 1): unknown
// fields and inconsistent values are rejected with the offending field's path, before anything is
// persisted. The model config and the DeepSpeed config are checked by the engine's own torch-free
// parsers (//spec:model_config, //spec:ds_config), so the scheduler and the trainer agree on
// what is valid.
#ifndef LOOM_SCHEDULER_JOB_SPEC_VALIDATION_H_
#define LOOM_SCHEDULER_JOB_SPEC_VALIDATION_H_

#include <string>

#include "absl/status/status.h"
#include "proto/common.pb.h"
#include "scheduler/job_spec_validation_files.h"

namespace loom {

// Upper bounds that keep admitted jobs placeable and the scheduler's per-rank bookkeeping small:
// a gang larger than any real cluster, or more intra-op threads than any machine has, is a typo.
inline constexpr int32_t kMaxNumRanks = 65536;
inline constexpr int32_t kMaxThreadsPerRank = 1024;

struct JobSpecValidationOptions {
  // Where the built-in "fortunes" corpus lives when dataset.path is empty (Debian's `fortunes`
  // package installs it here).
  std::string fortunes_dir = "/usr/share/games/fortunes";
  // How much of a dataset.path corpus is read at submission (ValidateDatasetFiles).
  DatasetFileCheckOptions dataset_files;
};

// Checks the following and answers every problem found at once (common/problems.h: one
// INVALID_ARGUMENT, "<n> problems:" and a line each in this order, and the same list as its
// google.rpc.BadRequest payload; one problem reads "<path>: <what>" alone). A check that needs
// what a failed one reads is skipped: a model.config that does not parse skips the checks
// against its sizes, a bad num_ranks the DeepSpeed batch arithmetic, a spec too large all the
// rest; each field is named once, with its first problem.
//   * no unknown fields anywhere in the message ("<path>: unknown field number N");
//   * ValidateJobSpecLimits (job_spec_validation_limits.h): the name rule, bounded free text
//     without control characters, the whole spec's size, no quoted numbers in the configs;
//   * resources.num_ranks in [1, kMaxNumRanks]; resources.accelerator a known kind;
//   * model.config present and accepted by ParseLlamaConfig ("model.config.<field>: ...");
//   * model.init_from, if set: a directory with model.safetensors or its index whose tensor
//     shapes match model.config (ValidateInitFromShapes; only the headers are read);
//   * dataset.name or dataset.path present; a given path exists; name "fortunes" without a path
//     needs options.fortunes_dir to exist (FAILED_PRECONDITION: a cluster setup problem, not
//     the user's); other names need a path; tokenizer "" or "byte" (byte needs vocab_size >=
//     256); holdout_fraction 0 (default) or in (0, 0.5];
//   * training.steps >= 1; training.sequence_length in [2, max_position_embeddings];
//     eval_every_steps, eval_batches >= 0; threads_per_rank in [0, kMaxThreadsPerRank];
//   * dataset.path, if set: text files the trainer can split (ValidateDatasetFiles);
//   * deepspeed_config present and accepted by ParseDeepSpeedConfig for world size num_ranks
//     ("deepspeed_config.<key>: ...");
//   * the ALST keys (training.tiled_*, model.attn_implementation, model.attn_block_size,
//     training.activation_checkpoint_cpu_offload) by the trainer's parser, ValidateAlstKeys
//     (spec/engine_options_tiled.h), after the sequence-parallel preconditions;
//   * checkpoint.interval_steps >= 0; max_restarts >= 0.
// Errors: INVALID_ARGUMENT as above; the missing default corpus (FAILED_PRECONDITION) only when
// there is no INVALID_ARGUMENT problem. Reads the file system (dataset paths). Thread-safe.
absl::Status ValidateJobSpec(const loom::v1::JobSpec& spec,
                             const JobSpecValidationOptions& options);
inline absl::Status ValidateJobSpec(const loom::v1::JobSpec& spec) {
  return ValidateJobSpec(spec, JobSpecValidationOptions());
}

}  // namespace loom

#endif  // LOOM_SCHEDULER_JOB_SPEC_VALIDATION_H_
