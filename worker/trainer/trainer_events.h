// The trainer -> worker event line protocol (proto/trainer_events.proto): writing a
// loom.TrainerEvent as one line of protobuf JSON, reading one back, and converting the engine's
// flat JSON events ({"event":"step","step":3,...}, worker/engine/engine.h EventCallback) into the
// message at the trainer boundary. Torch-free; all functions are pure and thread-safe.
#ifndef LOOM_WORKER_TRAINER_TRAINER_EVENTS_H_
#define LOOM_WORKER_TRAINER_TRAINER_EVENTS_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/trainer_events.pb.h"

namespace loom::trainer {

// One line (no trailing newline) of protobuf JSON: proto field names, every scalar field printed
// (an unset `optional` field is not), e.g. {"eval":{"step":"0","loss":5.54}}.
std::string TrainerEventLine(const loom::TrainerEvent& event);

// Parses one line written by TrainerEventLine with protobuf's JSON parser. A line that is not
// an event (not JSON, no kind set, or, unless `ignore_unknown_fields`, a field the schema does
// not have) is INVALID_ARGUMENT with protobuf's message naming the field.
absl::StatusOr<loom::TrainerEvent> ParseTrainerEventLine(const std::string& line,
                                                         bool ignore_unknown_fields);

// The engine's flat event {"event":"<kind>", <fields>} as a TrainerEvent: "event" names the
// oneof field, the other keys are that message's fields. Unknown kinds and unknown fields are
// INVALID_ARGUMENT (the engine and the .proto drifted apart). A non-finite double, which
// nlohmann json writes as null, arrives as 0.
absl::StatusOr<loom::TrainerEvent> TrainerEventFromEngineJson(const std::string& json_text);

}  // namespace loom::trainer

#endif  // LOOM_WORKER_TRAINER_TRAINER_EVENTS_H_
