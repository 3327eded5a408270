// DeepSpeed configs written for Hugging Face's Trainer, as the Trainer reads them
// (transformers' integrations/deepspeed.py, HfTrainerDeepSpeedConfig; optimization.py): the
// "auto" values, a config without an optimizer, and one without a scheduler. The Trainer's
// arguments are the job's training section (loom.v1.TrainingSpec fields 50-62, the
// TrainingArguments names and defaults); docs/job-spec.md "Hugging Face Trainer configs".
//
//   * "auto" is replaced where HfTrainerDeepSpeedConfig replaces it:
//       train_micro_batch_size_per_gpu      per_device_train_batch_size (8)
//       gradient_accumulation_steps         gradient_accumulation_steps (1)
//       train_batch_size                    data-parallel size * the two above
//       gradient_clipping                   max_grad_norm (1.0)
//       optimizer.params.lr / betas / eps / weight_decay
//                                           learning_rate (5e-5), [adam_beta1, adam_beta2]
//                                           ([0.9, 0.999]), adam_epsilon (1e-8), weight_decay (0)
//       scheduler.params.warmup_min_lr      0
//       scheduler.params.warmup_max_lr      learning_rate
//       scheduler.params.total_num_steps    training.steps
//       scheduler.params.warmup_num_steps   max(1, warm-up steps) (warmup_steps / warmup_ratio)
//       fp16.enabled / bf16.enabled         fp16 / bf16 (false)
//       zero_optimization.reduce_bucket_size              hidden_size^2
//       zero_optimization.stage3_prefetch_bucket_size     int(0.9 * hidden_size^2)
//       zero_optimization.stage3_param_persistence_threshold  10 * hidden_size
//     Any other "auto" is refused naming it. A training field that was given and contradicts an
//     explicit DeepSpeed value is refused naming both (the Trainer refuses every mismatch, even
//     against its own defaults; Loom only when the user gave both, so a plain DeepSpeed config
//     keeps its values).
//   * No "optimizer" section: the Trainer's AdamW (torch.optim.AdamW semantics: decoupled weight
//     decay) with the arguments above. The Trainer exempts biases and norm weights from weight
//     decay; Loom decays every parameter, so weight_decay > 0 there gets a warning saying so.
//   * No "scheduler" section, in a config written for the Trainer (it has an "auto", or has no
//     optimizer, or the job gives a Trainer argument): lr_scheduler_type ("linear") over
//     training.steps with the warm-up above, transformers' LambdaLR lambdas. Otherwise DeepSpeed's
//     behaviour: a constant learning rate.
//
// Every value filled in is recorded in DeepSpeedConfig::resolved ("deepspeed_config.<key>:
// \"auto\" -> 5e-05 (training.learning_rate, the Trainer's default)"); the trainer emits them
// as warning events. Pure and thread-safe.
#ifndef LOOM_SPEC_HF_TRAINER_CONFIG_H_
#define LOOM_SPEC_HF_TRAINER_CONFIG_H_

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/common.pb.h"
#include "spec/ds_config.h"

namespace loom::spec {

// Replaces the "auto" values of `ds` (a deepspeed_config object) and adds the Trainer's
// optimizer if it has none, as described above, for `training` and a model of `hidden_size`
// with `dp_size` data-parallel ranks. Appends one note per value filled in to *notes. Sets
// *trainer_mode when the config was written for the Trainer (see above).
// Errors: INVALID_ARGUMENT naming the key ("deepspeed_config.optimizer.params.lr: 0.0001
// contradicts training.learning_rate 0.0003", "training.warmup_ratio: must be in [0, 1)", ...).
absl::Status ResolveHfTrainerValues(const loom::v1::TrainingSpec& training, int64_t hidden_size,
                                    int dp_size, nlohmann::json* ds,
                                    std::vector<std::string>* notes, bool* trainer_mode);

// The deepspeed_config of `spec` for `world_size` ranks and a model of `hidden_size`:
// StructToJson, ResolveHfTrainerValues, ParseDeepSpeedConfigValue, then the Trainer's scheduler
// when the config is in Trainer mode and has none. Notes land in DeepSpeedConfig::resolved.
// Errors: those of the three steps, naming the key.
absl::StatusOr<DeepSpeedConfig> ParseJobDeepSpeedConfig(const loom::v1::JobSpec& spec,
                                                        int64_t hidden_size, int world_size);

// The same, also returning the resolved JSON (what `loomctl resolve` prints).
absl::StatusOr<DeepSpeedConfig> ParseJobDeepSpeedConfig(const loom::v1::JobSpec& spec,
                                                        int64_t hidden_size, int world_size,
                                                        nlohmann::json* resolved_json);

}  // namespace loom::spec

#endif  // LOOM_SPEC_HF_TRAINER_CONFIG_H_
