// Dataset errors: the job's data is not usable the same way by any attempt of the job. It
// changed since the job first started (data/dataset_identity.h), or it is too small for the job
// (a side of the train/held-out split is empty, or shorter than a training window). Retrying
// cannot help, so loom-trainer exits with kTrainerExitDatasetError (66,
// worker/trainer/exit_codes.h) for it and the scheduler fails the job at once, with no restart
// (scheduler/restart_policy.h, reason "DatasetError").
//
// Representation: a FAILED_PRECONDITION status carrying the kDatasetErrorPayload payload, so
// that it passes unchanged through RETURN_IF_ERROR and the engine's status returns while other
// FAILED_PRECONDITION errors (a file that is not a regular file, ...) keep exit 1. The message
// must name the field and the file. Header only; thread-safe (pure functions).
#ifndef LOOM_DATA_DATASET_ERROR_H_
#define LOOM_DATA_DATASET_ERROR_H_

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace loom::data {

inline constexpr char kDatasetErrorPayload[] = "type.loom.dev/loom.DatasetError";

// FAILED_PRECONDITION `message`, marked as a dataset error.
inline absl::Status DatasetError(absl::string_view message) {
  absl::Status s = absl::FailedPreconditionError(message);
  s.SetPayload(kDatasetErrorPayload, absl::Cord("1"));
  return s;
}

// True for a status made by DatasetError (or carrying its payload).
inline bool IsDatasetError(const absl::Status& s) {
  return !s.ok() && s.GetPayload(kDatasetErrorPayload).has_value();
}

}  // namespace loom::data

#endif  // LOOM_DATA_DATASET_ERROR_H_
