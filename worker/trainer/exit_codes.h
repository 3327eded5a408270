// Exit codes of loom-trainer (worker/trainer/main.cc) that mean something to the scheduler
// (scheduler/restart_policy.h). The values follow BSD's sysexits.h, so that they do not collide
// with the 1 and 2 that runtimes and shells use for any error, nor with 128 + signal.
//   0   done, or stopped gracefully (SIGUSR1)
//   1   runtime error (collective failure, I/O, LibTorch): retried within the restart budget
//   65  kTrainerExitDataError: a checkpoint the rank reads failed its size or CRC-32 check
//       (DATA_LOSS). Deterministic for that checkpoint: the scheduler charges the infra budget,
//       not the user's, and the next attempt's resume point is verified (and the step skipped).
//   66  kTrainerExitDatasetError: the job's data set is not usable the same way by any attempt
//       (data/dataset_error.h): it changed since the job first started (a file's size or
//       SHA-256 differs from <checkpoint dir>/dataset.identity.json, a file was added or
//       removed; data/dataset_identity.h), or it is too small for the job (a side of the
//       train/held-out split is empty or shorter than training.sequence_length + 1 tokens).
//       Deterministic: the job fails at once, with no restart (reason "DatasetError").
//       Distinct from 65, whose checkpoint damage a verified resume point can route around.
//   78  kTrainerExitConfigError: the spec, its model/dataset/DeepSpeed configuration or the flags
//       are invalid (INVALID_ARGUMENT), e.g. model.init_from shapes that do not match
//       model.config. Deterministic: the job fails at once, with no restart.
//   143 stopped by SIGTERM/SIGINT at a step boundary.
// Header only; no dependencies.
#ifndef LOOM_WORKER_TRAINER_EXIT_CODES_H_
#define LOOM_WORKER_TRAINER_EXIT_CODES_H_

namespace loom {

inline constexpr int kTrainerExitDataError = 65;    // EX_DATAERR
inline constexpr int kTrainerExitDatasetError = 66; // EX_NOINPUT: the input is not the job's
inline constexpr int kTrainerExitConfigError = 78;  // EX_CONFIG

}  // namespace loom

#endif  // LOOM_WORKER_TRAINER_EXIT_CODES_H_
