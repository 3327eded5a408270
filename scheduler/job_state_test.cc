#include "scheduler/job_state.h"

#include <set>
#include <utility>

#include "gtest/gtest.h"

namespace loom {
namespace {

using loom::v1::JobPhase;

// The expected edge list, written out independently of the implementation's table.
const std::set<std::pair<JobPhase, JobPhase>> kExpectedAllowed = {
    {v1::JOB_PHASE_UNSPECIFIED, v1::JOB_PHASE_PENDING},
    {v1::JOB_PHASE_PENDING, v1::JOB_PHASE_ADMITTED},
    {v1::JOB_PHASE_PENDING, v1::JOB_PHASE_STARTING},
    {v1::JOB_PHASE_PENDING, v1::JOB_PHASE_FAILED},
    {v1::JOB_PHASE_PENDING, v1::JOB_PHASE_CANCELLED},
    {v1::JOB_PHASE_ADMITTED, v1::JOB_PHASE_PENDING},
    {v1::JOB_PHASE_ADMITTED, v1::JOB_PHASE_STARTING},
    {v1::JOB_PHASE_ADMITTED, v1::JOB_PHASE_FAILED},
    {v1::JOB_PHASE_ADMITTED, v1::JOB_PHASE_CANCELLED},
    {v1::JOB_PHASE_STARTING, v1::JOB_PHASE_PENDING},
    {v1::JOB_PHASE_RUNNING, v1::JOB_PHASE_PENDING},
    {v1::JOB_PHASE_STARTING, v1::JOB_PHASE_RUNNING},
    {v1::JOB_PHASE_STARTING, v1::JOB_PHASE_SUCCEEDED},
    {v1::JOB_PHASE_STARTING, v1::JOB_PHASE_RECOVERING},
    {v1::JOB_PHASE_STARTING, v1::JOB_PHASE_STOPPING},
    {v1::JOB_PHASE_STARTING, v1::JOB_PHASE_FAILED},
    {v1::JOB_PHASE_STARTING, v1::JOB_PHASE_CANCELLED},
    {v1::JOB_PHASE_RUNNING, v1::JOB_PHASE_SUCCEEDED},
    {v1::JOB_PHASE_RUNNING, v1::JOB_PHASE_RECOVERING},
    {v1::JOB_PHASE_RUNNING, v1::JOB_PHASE_STOPPING},
    {v1::JOB_PHASE_RUNNING, v1::JOB_PHASE_FAILED},
    {v1::JOB_PHASE_RUNNING, v1::JOB_PHASE_CANCELLED},
    {v1::JOB_PHASE_RECOVERING, v1::JOB_PHASE_PENDING},
    {v1::JOB_PHASE_RECOVERING, v1::JOB_PHASE_STARTING},
    {v1::JOB_PHASE_RECOVERING, v1::JOB_PHASE_STOPPING},
    {v1::JOB_PHASE_RECOVERING, v1::JOB_PHASE_FAILED},
    {v1::JOB_PHASE_RECOVERING, v1::JOB_PHASE_CANCELLED},
    {v1::JOB_PHASE_STOPPING, v1::JOB_PHASE_FAILED},
    {v1::JOB_PHASE_STOPPING, v1::JOB_PHASE_CANCELLED},
    // ResumeJob (issue 49).
    {v1::JOB_PHASE_FAILED, v1::JOB_PHASE_PENDING},
    {v1::JOB_PHASE_CANCELLED, v1::JOB_PHASE_PENDING},
};

std::vector<JobPhase> PhasesWithUnspecified() {
  std::vector<JobPhase> phases = {v1::JOB_PHASE_UNSPECIFIED};
  for (JobPhase p : AllJobPhases()) phases.push_back(p);
  return phases;
}

TEST(JobStateTest, EveryEdgeIsAllowedExactlyWhenListed) {
  int allowed = 0;
  int forbidden = 0;
  for (JobPhase from : PhasesWithUnspecified()) {
    for (JobPhase to : PhasesWithUnspecified()) {
      absl::Status s = Transition(from, to);
      if (kExpectedAllowed.count({from, to})) {
        EXPECT_TRUE(s.ok()) << JobPhaseName(from) << " -> " << JobPhaseName(to) << ": " << s;
        ++allowed;
      } else {
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition)
            << JobPhaseName(from) << " -> " << JobPhaseName(to);
        EXPECT_NE(s.message().find(std::string(JobPhaseName(from))), std::string::npos) << s;
        EXPECT_NE(s.message().find(std::string(JobPhaseName(to))), std::string::npos) << s;
        ++forbidden;
      }
    }
  }
  EXPECT_EQ(allowed, 31);
  EXPECT_EQ(forbidden, 10 * 10 - 31);
}

// Terminal phases are final except for ResumeJob's FAILED/CANCELLED -> PENDING.
TEST(JobStateTest, TerminalPhasesAreFinalExceptForResume) {
  for (JobPhase from : {v1::JOB_PHASE_SUCCEEDED, v1::JOB_PHASE_FAILED, v1::JOB_PHASE_CANCELLED}) {
    EXPECT_TRUE(IsTerminal(from));
    for (JobPhase to : PhasesWithUnspecified()) {
      absl::Status s = Transition(from, to);
      if (from != v1::JOB_PHASE_SUCCEEDED && to == v1::JOB_PHASE_PENDING) {
        EXPECT_TRUE(s.ok()) << JobPhaseName(from) << " -> PENDING: " << s;
        continue;
      }
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_NE(s.message().find("terminal"), std::string::npos) << s;
    }
  }
  EXPECT_EQ(Transition(v1::JOB_PHASE_SUCCEEDED, v1::JOB_PHASE_PENDING).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(JobStateTest, NonTerminalPhases) {
  for (JobPhase p : {v1::JOB_PHASE_UNSPECIFIED, v1::JOB_PHASE_PENDING, v1::JOB_PHASE_ADMITTED,
                     v1::JOB_PHASE_STARTING, v1::JOB_PHASE_RUNNING, v1::JOB_PHASE_RECOVERING,
                     v1::JOB_PHASE_STOPPING}) {
    EXPECT_FALSE(IsTerminal(p)) << JobPhaseName(p);
  }
}

TEST(JobStateTest, Names) {
  EXPECT_EQ(JobPhaseName(v1::JOB_PHASE_PENDING), "PENDING");
  EXPECT_EQ(JobPhaseName(v1::JOB_PHASE_CANCELLED), "CANCELLED");
  EXPECT_EQ(JobPhaseName(static_cast<JobPhase>(42)), "UNKNOWN");
  EXPECT_EQ(AllJobPhases().size(), 9u);
}

}  // namespace
}  // namespace loom
