// The trainer -> worker event line protocol (proto/trainer_events.proto): writing a
// loom.TrainerEvent (the engine builds them, worker/engine/engine.h EventCallback) as one line of
// protobuf JSON, and reading one back. Torch-free; both functions are pure and thread-safe.
#ifndef LOOM_WORKER_TRAINER_TRAINER_EVENTS_H_
#define LOOM_WORKER_TRAINER_TRAINER_EVENTS_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/trainer_events.pb.h"

namespace loom::trainer {

// One line (no trailing newline) of protobuf JSON: proto field names, every scalar field printed
// (an unset `optional` field is not), e.g. {"eval":{"step":"0","loss":5.54}}. A non-finite
// double is printed as the mapping's string "NaN", "Infinity" or "-Infinity".
std::string TrainerEventLine(const loom::TrainerEvent& event);

// Parses one line written by TrainerEventLine with protobuf's JSON parser. A line that is not
// an event (not JSON, no kind set, or, unless `ignore_unknown_fields`, a field the schema does
// not have) is INVALID_ARGUMENT with protobuf's message naming the field.
absl::StatusOr<loom::TrainerEvent> ParseTrainerEventLine(const std::string& line,
                                                         bool ignore_unknown_fields);

}  // namespace loom::trainer

#endif  // LOOM_WORKER_TRAINER_TRAINER_EVENTS_H_
