#include "worker/trainer/trainer_events.h"

#include <cmath>
#include <limits>

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

// The printer and parser only: non-finite doubles are the mapping's "NaN" / "Infinity" strings
// and read back (the flat-JSON path they replaced wrote null and delivered 0). That the engine
// itself emits a diverged run's NaN loss and inf gradient norm, through its event builders and
// loom-trainer's stdout, is trainer_events_engine_test.
TEST(TrainerEventsTest, NonFiniteDoublesTravelAsTheMappingsStrings) {
  loom::TrainerEvent ev;
  ev.mutable_step()->set_step(7);
  ev.mutable_step()->set_loss(std::numeric_limits<double>::quiet_NaN());
  ev.mutable_step()->set_grad_norm(std::numeric_limits<double>::infinity());
  const std::string line = TrainerEventLine(ev);
  nlohmann::json j = nlohmann::json::parse(line);  // still plain JSON
  EXPECT_EQ(j["step"]["loss"], "NaN") << line;
  EXPECT_EQ(j["step"]["grad_norm"], "Infinity") << line;
  for (bool lenient : {false, true}) {
    absl::StatusOr<loom::TrainerEvent> back = ParseTrainerEventLine(line, lenient);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(std::isnan(back->step().loss()));
    EXPECT_EQ(back->step().grad_norm(), std::numeric_limits<double>::infinity());
    EXPECT_EQ(back->step().step(), 7);
  }
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
