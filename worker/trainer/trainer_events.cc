#include "worker/trainer/trainer_events.h"

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace loom::trainer {

std::string TrainerEventLine(const loom::TrainerEvent& event) {
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  print.always_print_primitive_fields = true;
  print.add_whitespace = false;  // one line
  std::string line;
  // Cannot fail for a message without Any fields.
  (void)google::protobuf::util::MessageToJsonString(event, &line, print);
  return line;
}

absl::StatusOr<loom::TrainerEvent> ParseTrainerEventLine(const std::string& line,
                                                         bool ignore_unknown_fields) {
  google::protobuf::util::JsonParseOptions parse;
  parse.ignore_unknown_fields = ignore_unknown_fields;
  loom::TrainerEvent event;
  auto st = google::protobuf::util::JsonStringToMessage(line, &event, parse);
  if (!st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a trainer event: ", st.message().ToString()));
  }
  if (event.kind_case() == loom::TrainerEvent::KIND_NOT_SET) {
    return absl::InvalidArgumentError("not a trainer event: no event kind is set");
  }
  return event;
}

absl::StatusOr<loom::TrainerEvent> TrainerEventFromEngineJson(const std::string& json_text) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("engine event: not a JSON object");
  }
  auto kind = j.find("event");
  if (kind == j.end() || !kind->is_string()) {
    return absl::InvalidArgumentError("engine event: no \"event\" string");
  }
  const std::string name = kind->get<std::string>();
  j.erase(kind);
  nlohmann::json wrapped = nlohmann::json::object();
  wrapped[name] = std::move(j);
  absl::StatusOr<loom::TrainerEvent> event = ParseTrainerEventLine(
      wrapped.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
      /*ignore_unknown_fields=*/false);
  if (!event.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine event \"", name, "\": ", event.status().message()));
  }
  return event;
}

}  // namespace loom::trainer
