// AdmissionPassGate on its own (admission_pass_gate.h): no store, no clock; `now` is passed in.
// Each expected kind is worked out by hand from the rules in the header.
#include "scheduler/admission_pass_gate.h"

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace loom {

// Readable kinds in failure messages (found by gtest through ADL: the enum's namespace).
inline void PrintTo(AdmissionPassStats::Kind kind, std::ostream* os) {
  static const char* const kNames[] = {"kNone", "kSkipped", "kPartial", "kFull"};
  *os << kNames[static_cast<int>(kind)];
}

namespace {

using Kind = AdmissionPassStats::Kind;

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

// Runs the pass Choose asked for (a no-op when skipped), deciding about `considered` of `waiting`.
Kind Cycle(AdmissionPassGate& gate, absl::Time now, int considered = 1, int waiting = 1,
           uint64_t ranks = 0, std::map<std::string, std::string> resume = {},
           std::vector<absl::Time> not_before = {}) {
  const Kind kind = gate.Choose(ranks, std::move(resume), now);
  if (kind == Kind::kSkipped) {
    gate.NoteSkipped(waiting);
  } else {
    gate.NotePass(kind, considered, waiting, not_before, now);
  }
  return kind;
}

TEST(AdmissionPassGateTest, FirstPassRunsThenNothingChangedSkips) {
  AdmissionPassGate gate(/*queue_depth=*/10, absl::Seconds(10));
  EXPECT_EQ(gate.last_pass().kind, Kind::kNone);
  EXPECT_EQ(Cycle(gate, kT0), Kind::kFull);  // no pass yet, and no full pass ever
  EXPECT_EQ(Cycle(gate, kT0 + absl::Seconds(1)), Kind::kSkipped);
  EXPECT_EQ(gate.last_pass().kind, Kind::kSkipped);
  EXPECT_EQ(gate.last_pass().waiting, 1);
  EXPECT_EQ(gate.last_pass().considered, 0);
}

TEST(AdmissionPassGateTest, EachInputChangeRunsOnePass) {
  AdmissionPassGate gate(10, absl::Seconds(100));
  ASSERT_EQ(Cycle(gate, kT0), Kind::kFull);
  absl::Time now = kT0;
  auto next = [&]() { return now += absl::Seconds(1); };
  gate.NoteJobChanged();
  EXPECT_EQ(Cycle(gate, next()), Kind::kPartial) << "a job change; the full pass is not due";
  EXPECT_EQ(Cycle(gate, next()), Kind::kSkipped);
  gate.NoteNodeChanged();
  EXPECT_EQ(Cycle(gate, next()), Kind::kPartial);
  EXPECT_EQ(Cycle(gate, next()), Kind::kSkipped);
  EXPECT_EQ(Cycle(gate, next(), 1, 1, /*ranks=*/7), Kind::kPartial) << "a new rank generation";
  EXPECT_EQ(Cycle(gate, next(), 1, 1, 7), Kind::kSkipped);
  EXPECT_EQ(Cycle(gate, next(), 1, 1, 7, {{"j1", ""}}), Kind::kPartial) << "a new resume answer";
  EXPECT_EQ(Cycle(gate, next(), 1, 1, 7, {{"j1", ""}}), Kind::kSkipped);
  EXPECT_EQ(Cycle(gate, next(), 1, 1, 7, {{"j1", "store down"}}), Kind::kPartial);
}

// A node becoming unreachable, or reachable again, changes what a pass may place: each forces
// one pass; marking an already unreachable node again, or a reachable one reachable, does not.
TEST(AdmissionPassGateTest, ReachabilityChangesForceAPass) {
  AdmissionPassGate gate(10, absl::Seconds(100));
  ASSERT_EQ(Cycle(gate, kT0), Kind::kFull);
  absl::Time now = kT0;
  auto next = [&]() { return now += absl::Seconds(1); };

  EXPECT_FALSE(gate.NoteReachable("n0")) << "n0 was never unreachable";
  EXPECT_EQ(Cycle(gate, next()), Kind::kSkipped);

  EXPECT_TRUE(gate.NoteUnreachable("n0"));
  EXPECT_TRUE(gate.IsUnreachable("n0"));
  EXPECT_EQ(Cycle(gate, next()), Kind::kPartial) << "n0 became unreachable";
  EXPECT_FALSE(gate.NoteUnreachable("n0")) << "already unreachable";
  EXPECT_EQ(Cycle(gate, next()), Kind::kSkipped);

  EXPECT_TRUE(gate.NoteReachable("n0"));
  EXPECT_FALSE(gate.IsUnreachable("n0"));
  EXPECT_EQ(Cycle(gate, next()), Kind::kPartial) << "n0 is reachable again";
  EXPECT_EQ(Cycle(gate, next()), Kind::kSkipped);

  // Lost: leaves the set without a change of its own (the caller notes the node's change).
  ASSERT_TRUE(gate.NoteUnreachable("n1"));
  EXPECT_EQ(Cycle(gate, next()), Kind::kPartial);
  gate.ForgetNode("n1");
  EXPECT_FALSE(gate.IsUnreachable("n1"));
  EXPECT_EQ(Cycle(gate, next()), Kind::kSkipped);

  // A reload: nobody unreachable, and a node change.
  ASSERT_TRUE(gate.NoteUnreachable("n2"));
  EXPECT_EQ(Cycle(gate, next()), Kind::kPartial);
  gate.ResetNodes();
  EXPECT_FALSE(gate.IsUnreachable("n2"));
  EXPECT_EQ(Cycle(gate, next()), Kind::kPartial);
  EXPECT_FALSE(gate.NoteReachable("n2")) << "the reload already cleared it";
  EXPECT_EQ(Cycle(gate, next()), Kind::kSkipped);
}

TEST(AdmissionPassGateTest, TheEarliestBackoffExpiryAheadWakesThePass) {
  AdmissionPassGate gate(10, absl::Seconds(100));
  const std::vector<absl::Time> not_before = {
      kT0 - absl::Seconds(1),  // already expired: no wake
      kT0 + absl::Seconds(5), kT0 + absl::Seconds(3), absl::InfinitePast()};
  ASSERT_EQ(Cycle(gate, kT0, 1, 1, 0, {}, not_before), Kind::kFull);
  EXPECT_EQ(Cycle(gate, kT0 + absl::Seconds(2)), Kind::kSkipped);
  EXPECT_EQ(gate.Choose(0, {}, kT0 + absl::Seconds(3) - absl::Microseconds(1)), Kind::kSkipped);
  // At the earliest expiry (t0+3s); that pass saw no backoff ahead, so t0+5s wakes nothing.
  EXPECT_EQ(Cycle(gate, kT0 + absl::Seconds(3)), Kind::kPartial);
  EXPECT_EQ(Cycle(gate, kT0 + absl::Seconds(5)), Kind::kSkipped);
}

TEST(AdmissionPassGateTest, ACutOffPassLeavesTheRestForTheNextFullPass) {
  AdmissionPassGate gate(/*queue_depth=*/2, absl::Seconds(10));
  ASSERT_EQ(Cycle(gate, kT0, /*considered=*/5, /*waiting=*/5), Kind::kFull);
  gate.NoteJobChanged();
  EXPECT_EQ(Cycle(gate, kT0 + absl::Seconds(1), 2, 5), Kind::kPartial) << "2 of 5 considered";
  EXPECT_EQ(gate.last_pass().considered, 2);
  EXPECT_EQ(gate.last_pass().waiting, 5);
  // Nothing changed, but the last pass was cut off: it waits only for the full interval.
  EXPECT_EQ(Cycle(gate, kT0 + absl::Seconds(9), 2, 5), Kind::kSkipped);
  EXPECT_EQ(Cycle(gate, kT0 + absl::Seconds(10), 5, 5), Kind::kFull);
  EXPECT_EQ(Cycle(gate, kT0 + absl::Seconds(30), 5, 5), Kind::kSkipped) << "not cut off";
}

TEST(AdmissionPassGateTest, DepthZeroMakesEveryPassFull) {
  AdmissionPassGate gate(/*queue_depth=*/0, absl::Seconds(10));
  ASSERT_EQ(Cycle(gate, kT0), Kind::kFull);
  gate.NoteJobChanged();
  EXPECT_EQ(Cycle(gate, kT0 + absl::Milliseconds(1)), Kind::kFull);
  EXPECT_EQ(Cycle(gate, kT0 + absl::Milliseconds(2)), Kind::kSkipped);
}

TEST(AdmissionPassGateTest, ResumeSummaryKeepsOnlyErrors) {
  EXPECT_EQ(AdmissionPassGate::ResumeSummary(absl::OkStatus()), "");
  EXPECT_EQ(AdmissionPassGate::ResumeSummary(absl::NotFoundError("no checkpoint")), "");
  EXPECT_EQ(AdmissionPassGate::ResumeSummary(absl::UnavailableError("store down")), "store down");
}

}  // namespace
}  // namespace loom
