#include "worker/trainer/trainer_events.h"

#include <nlohmann/json.hpp>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::trainer {
namespace {

using ::loom::testing::StatusIs;

TEST(TrainerEventsTest, LineIsOneLineOfProtobufJsonAndParsesBack) {
  loom::TrainerEvent ev;
  loom::TrainerEvent::Step* step = ev.mutable_step();
  step->set_step(3);
  step->set_loss(5.125);
  step->set_peak_bytes(int64_t{1} << 40);
  const std::string line = TrainerEventLine(ev);
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  // Independent reader: plain JSON. Proto field names, int64 as strings, every scalar printed.
  nlohmann::json j = nlohmann::json::parse(line);
  ASSERT_TRUE(j.contains("step")) << line;
  EXPECT_EQ(j["step"]["step"], "3");
  EXPECT_EQ(j["step"]["loss"], 5.125);
  EXPECT_EQ(j["step"]["peak_bytes"], "1099511627776");
  EXPECT_EQ(j["step"]["skipped"], false);
  EXPECT_EQ(j["step"]["comm_s"], 0);
  absl::StatusOr<loom::TrainerEvent> back = ParseTrainerEventLine(line, false);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), ev.SerializeAsString());
}

TEST(TrainerEventsTest, OptionalCheckpointStepIsPrintedOnlyWhenSet) {
  loom::TrainerEvent ev;
  ev.mutable_stopped()->set_step(4);
  EXPECT_EQ(nlohmann::json::parse(TrainerEventLine(ev))["stopped"].count("checkpoint_step"), 0u)
      << TrainerEventLine(ev);
  ev.mutable_stopped()->set_checkpoint_step(4);
  nlohmann::json j = nlohmann::json::parse(TrainerEventLine(ev));
  EXPECT_EQ(j["stopped"]["checkpoint_step"], "4");
}

TEST(TrainerEventsTest, EngineJsonBecomesTheMessage) {
  absl::StatusOr<loom::TrainerEvent> ev = TrainerEventFromEngineJson(
      R"({"event":"done","step":6,"initial_eval_loss":5.5,"final_eval_loss":4.25,)"
      R"("collective_count":120,"collective_hash":"9f3a"})");
  ASSERT_TRUE(ev.ok()) << ev.status();
  ASSERT_TRUE(ev->has_done());
  EXPECT_EQ(ev->done().step(), 6);
  EXPECT_EQ(ev->done().initial_eval_loss(), 5.5);
  EXPECT_EQ(ev->done().final_eval_loss(), 4.25);
  EXPECT_EQ(ev->done().collective_count(), 120);
  EXPECT_EQ(ev->done().collective_hash(), "9f3a");

  ev = TrainerEventFromEngineJson(R"({"event":"stopped","step":2,"checkpoint_step":2})");
  ASSERT_TRUE(ev.ok()) << ev.status();
  EXPECT_TRUE(ev->stopped().has_checkpoint_step());
  ev = TrainerEventFromEngineJson(R"({"event":"stopped","step":2})");
  ASSERT_TRUE(ev.ok()) << ev.status();
  EXPECT_FALSE(ev->stopped().has_checkpoint_step());
  // nlohmann json writes a non-finite double as null: it arrives unset (0), not as an error.
  ev = TrainerEventFromEngineJson(R"({"event":"eval","step":0,"loss":null})");
  ASSERT_TRUE(ev.ok()) << ev.status();
  EXPECT_EQ(ev->eval().loss(), 0);
}

// A field or kind the engine emits that the .proto does not have is a drift: refused, naming it.
TEST(TrainerEventsTest, EngineDriftIsRefusedNamingTheField) {
  EXPECT_THAT(TrainerEventFromEngineJson(R"({"event":"step","step":1,"new_counter":3})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "new_counter"));
  EXPECT_THAT(TrainerEventFromEngineJson(R"({"event":"teleport","step":1})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "teleport"));
  EXPECT_THAT(TrainerEventFromEngineJson(R"({"event":"step","step":"one"})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "engine event \"step\""));
  EXPECT_THAT(TrainerEventFromEngineJson(R"({"step":1})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "no \"event\""));
  EXPECT_THAT(TrainerEventFromEngineJson("not json"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a JSON object"));
}

TEST(TrainerEventsTest, ReaderRefusesNonEventsAndMayIgnoreUnknownFields) {
  EXPECT_THAT(ParseTrainerEventLine("{}", true),
              StatusIs(absl::StatusCode::kInvalidArgument, "no event kind"));
  EXPECT_THAT(ParseTrainerEventLine("I0101 glog line", true),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a trainer event"));
  const std::string newer = R"({"eval":{"step":"2","loss":4.5,"perplexity":90.0}})";
  EXPECT_THAT(ParseTrainerEventLine(newer, false),
              StatusIs(absl::StatusCode::kInvalidArgument, "perplexity"));
  absl::StatusOr<loom::TrainerEvent> ev = ParseTrainerEventLine(newer, true);
  ASSERT_TRUE(ev.ok()) << ev.status();
  EXPECT_EQ(ev->eval().step(), 2);
  EXPECT_EQ(ev->eval().loss(), 4.5);
}

}  // namespace
}  // namespace loom::trainer
