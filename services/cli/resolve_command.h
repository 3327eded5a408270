// `loomctl resolve JOB.yaml [--json]`: offline (no service), what Loom will use for the job's
// DeepSpeed config: the "auto" values, optimizer and schedule a config written for Hugging
// Face's Trainer gets from the job's training section (spec/hf_trainer_config.h), each with where
// it came from, and the learning rate of every step.
#ifndef LOOM_SERVICES_CLI_RESOLVE_COMMAND_H_
#define LOOM_SERVICES_CLI_RESOLVE_COMMAND_H_

#include <string>

namespace loom::cli {

// Reads the job spec at `path` (YAML, as `loomctl submit`) and prints, for --num_ranks ranks
// (its resources.num_ranks):
//   text: one line per value Loom filled in, then the resolved deepspeed_config as JSON;
//   json: {"deepspeed_config": {...}, "resolved": ["..."], "learning_rates": [lr of step 0, ...]}
//         (learning_rates for min(training.steps, 100000) steps).
// Returns 0, 3 (INVALID_ARGUMENT: the model config or DeepSpeed config is refused; the message
// names the field, on stderr) or 5 (the file does not exist).
int RunResolve(const std::string& path, bool json);

}  // namespace loom::cli

#endif  // LOOM_SERVICES_CLI_RESOLVE_COMMAND_H_
