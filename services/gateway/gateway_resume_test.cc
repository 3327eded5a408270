// POST /v1/jobs/{id}:resume (issue 49) over real HTTP on loopback against a real loom-scheduler
// with bearer tokens (GatewayClusterTest, gateway_test_cluster.h): the optional JSON body, and
// the HTTP status of each answer (200; 404 unknown or another tenant's; 400 FAILED_PRECONDITION
// for a job that has not ended or has no committed checkpoint, as for :kill).
#include <nlohmann/json.hpp>
#include <string>

#include "gtest/gtest.h"
#include "services/gateway/gateway_test_cluster.h"
#include "storage/checkpoint/checkpoint_test_util.h"

namespace loom::gateway {
namespace {

TEST_F(GatewayClusterTest, ResumeRoute) {
  const std::string id = Submit(kTeamA);
  ASSERT_FALSE(id.empty());
  const std::string resume = "/v1/jobs/" + id + ":resume";

  // PENDING (no nodes): not ended, nothing to resume.
  auto [pending_code, pending] = Call("POST", resume, kTeamA);
  EXPECT_EQ(pending_code, 400) << pending;
  EXPECT_EQ(pending["status"], "FAILED_PRECONDITION") << pending;
  EXPECT_NE(pending["message"].get<std::string>().find("is PENDING"), std::string::npos)
      << pending;
  auto [missing_code, missing] = Call("POST", "/v1/jobs/job-nope:resume", kTeamA);
  EXPECT_EQ(missing_code, 404) << missing;

  // Killed before any checkpoint: resuming would start over.
  auto [kill_code, killed] = Call("POST", "/v1/jobs/" + id + ":kill", kTeamA);
  ASSERT_EQ(kill_code, 200) << killed;
  const std::string checkpoint_dir = killed["checkpointDir"];
  ASSERT_FALSE(checkpoint_dir.empty()) << killed;
  auto [bare_code, bare] = Call("POST", resume, kTeamA);
  EXPECT_EQ(bare_code, 400) << bare;
  EXPECT_NE(bare["message"].get<std::string>().find(checkpoint_dir), std::string::npos) << bare;

  // A committed checkpoint at step 40 (written as a trainer does).
  storage::checkpoint_test::WriteCheckpoint(checkpoint_dir, 40, 1,
                                            storage::checkpoint_test::TestModel(), {0});
  // Another tenant's job does not exist for the caller; a body naming another job is refused.
  EXPECT_EQ(Call("POST", resume, kTeamB).first, 404);
  auto [mismatch_code, mismatch] = Call("POST", resume, kTeamA, R"({"jobId": "job-other"})");
  EXPECT_EQ(mismatch_code, 400) << mismatch;
  EXPECT_EQ(mismatch["status"], "INVALID_ARGUMENT") << mismatch;
  auto [typo_code, typo] = Call("POST", resume, kTeamA, R"({"waitForCapacitty": true})");
  EXPECT_EQ(typo_code, 400) << typo;

  auto [code, resumed] = Call("POST", resume, kTeamA, R"({"waitForCapacity": true})");
  ASSERT_EQ(code, 200) << resumed;
  EXPECT_EQ(resumed["id"], id);
  EXPECT_EQ(resumed["phase"], "JOB_PHASE_PENDING");
  EXPECT_EQ(resumed["reason"], "Resumed");
  EXPECT_EQ(resumed["progress"]["lastCheckpointStep"], "40");  // int64: a JSON string
  auto [get_code, job] = Call("GET", "/v1/jobs/" + id, kTeamA);
  EXPECT_EQ(get_code, 200) << job;
  EXPECT_EQ(job["phase"], "JOB_PHASE_PENDING");
  // Resumed already: PENDING again, so a second resume is refused.
  EXPECT_EQ(Call("POST", resume, kTeamA).first, 400);
}

}  // namespace
}  // namespace loom::gateway
