#include "worker/trainer/trainer_events.h"

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

}  // namespace loom::trainer
