// Admission by memory through the Scheduler facade (issue 48; spec/memory_fit.h): a job whose
// ranks would run out of memory on every registered node is refused at submission with the
// cheapest change that fits, the change applied is admitted, a job queued for capacity says why
// in ExplainPending, and nodes that report no memory refuse nothing. `technique: auto`: the
// scheduler writes the chosen technique's keys into the spec, records the choice on the job (and
// across a restart), answers a retry of the same request with the same job, and refuses, saying
// why, when nothing fits or no node reports the memory to choose against.
#include <string>

#include "common/file_util.h"

#include "gtest/gtest.h"
#include "scheduler/scheduler_test_fixture.h"
#include "spec/memory_fit.h"
#include "spec/memory_plan.h"

namespace loom {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

class SchedulerMemoryTest : public SchedulerTest {
 protected:
  void RegisterCpuNode(const std::string& node, int slots, int64_t host_memory_bytes) {
    loom::v1::NodeInventory inv;
    inv.set_accelerator(loom::v1::ACCELERATOR_KIND_CPU);
    inv.set_slots(slots);
    inv.set_hostname(node);
    inv.set_address(absl::StrCat("addr-", node));
    inv.set_host_memory_bytes(host_memory_bytes);
    ASSERT_TRUE(scheduler_->RegisterWorker(node, inv).ok());
  }
};

void SetModel(loom::v1::JobSpec* spec, int hidden, int intermediate, int layers, int heads,
              int kv_heads, int vocab) {
  auto& f = *spec->mutable_model()->mutable_config()->mutable_fields();
  f["hidden_size"].set_number_value(hidden);
  f["intermediate_size"].set_number_value(intermediate);
  f["num_hidden_layers"].set_number_value(layers);
  f["num_attention_heads"].set_number_value(heads);
  f["num_key_value_heads"].set_number_value(kv_heads);
  f["vocab_size"].set_number_value(vocab);
}

void SetZeroStage(loom::v1::JobSpec* spec, int stage) {
  (*(*spec->mutable_deepspeed_config()->mutable_fields())["zero_optimization"]
        .mutable_struct_value()
        ->mutable_fields())["stage"]
      .set_number_value(stage);
}

// One rank's host bytes as the planner predicts them, with the admission margin.
int64_t HostNeed(const loom::v1::JobSpec& spec) {
  absl::StatusOr<spec::MemoryPlanInput> in = spec::MemoryPlanInputFromJobSpec(spec);
  EXPECT_TRUE(in.ok()) << in.status();
  if (!in.ok()) return 0;
  absl::StatusOr<spec::RankMemoryPlan> plan = spec::PlanRankMemory(*in);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? static_cast<int64_t>(plan->host_bytes() * (1 + spec::kAdmissionMargin)) + 1
                   : 0;
}

// Issue 48's example: a full-size Qwen2.5-7B job on two 24 GiB CPU workers.
TEST_F(SchedulerMemoryTest, A7BModelOnTwo24GiBWorkersIsRefusedAndExplainedWhenQueued) {
  RegisterCpuNode("node-a", 1, 24 * kGiB);
  RegisterCpuNode("node-b", 1, 24 * kGiB);
  loom::v1::JobSpec spec = TestJobSpecWithRanks(2);
  SetModel(&spec, 3584, 18944, 28, 28, 4, 152064);
  absl::StatusOr<Job> refused = SubmitWaitingForAnswer(spec, false);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  const std::string message(refused.status().message());
  EXPECT_EQ(message.rfind("memory: 2 cpu ranks would run out of memory: one rank needs ", 0), 0u)
      << message;
  EXPECT_NE(message.find("No change found fits these nodes"), std::string::npos) << message;
  EXPECT_NE(message.find("the roomiest has 24.00 GiB"), std::string::npos) << message;
  EXPECT_EQ(scheduler_->DryRunSubmission(spec, "default", false).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // Queued for capacity that may come: admitted, and ExplainPending says what blocks it.
  // It is not placed on nodes it would run out of memory on.
  absl::StatusOr<Job> queued = SubmitWaitingForAnswer(spec, true);
  ASSERT_TRUE(queued.ok()) << queued.status();
  Cycle();
  EXPECT_EQ(Get(queued->id()).phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(Get(queued->id()).reason(), "Unschedulable");
  absl::StatusOr<loom::v1::ExplainPendingResponse> why = scheduler_->ExplainPending(queued->id());
  ASSERT_TRUE(why.ok()) << why.status();
  EXPECT_NE(why->message().find("the predicted memory of a rank (host "), std::string::npos)
      << why->message();
  EXPECT_NE(why->message().find("memory: 2 cpu ranks would run out of memory"), std::string::npos)
      << why->message();
}

// Placement puts no more of a job's ranks on a node than its memory holds.
TEST_F(SchedulerMemoryTest, RanksThatFitANodeOnlyOneAtATimeAreSpreadOverNodes) {
  loom::v1::JobSpec spec = TestJobSpecWithRanks(2);
  SetModel(&spec, 768, 2048, 12, 12, 4, 32000);
  const int64_t need = HostNeed(spec);
  ASSERT_GT(need, 0);
  RegisterCpuNode("node-a", 2, need + need / 2);  // two slots, memory for one rank
  absl::StatusOr<Job> job = SubmitWaitingForAnswer(spec, true);
  ASSERT_TRUE(job.ok()) << job.status();
  Cycle();
  EXPECT_EQ(Get(job->id()).phase(), loom::v1::JOB_PHASE_PENDING);
  RegisterCpuNode("node-b", 2, need + need / 2);
  Cycle();
  const Job placed = Get(job->id());
  ASSERT_EQ(placed.phase(), loom::v1::JOB_PHASE_STARTING);
  ASSERT_EQ(placed.rank_nodes_size(), 2);
  EXPECT_NE(placed.rank_nodes(0), placed.rank_nodes(1));
}

TEST_F(SchedulerMemoryTest, TheSuggestedChangeAppliedIsAdmitted) {
  // ~110M parameters at ZeRO stage 2: every rank holds all the fp32 weights.
  loom::v1::JobSpec spec = TestJobSpecWithRanks(2);
  SetModel(&spec, 768, 2048, 12, 12, 4, 32000);
  SetZeroStage(&spec, 2);
  loom::v1::JobSpec stage3 = spec;
  SetZeroStage(&stage3, 3);
  ASSERT_LT(HostNeed(stage3), HostNeed(spec));
  const int64_t room = (HostNeed(stage3) + HostNeed(spec)) / 2;
  RegisterCpuNode("node-a", 1, room);
  RegisterCpuNode("node-b", 1, room);

  absl::StatusOr<Job> refused = SubmitWaitingForAnswer(spec, false);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find(
                "Would fit: deepspeed_config.zero_optimization.stage: 3 (then "),
            absl::string_view::npos)
      << refused.status();
  absl::StatusOr<Job> admitted = SubmitWaitingForAnswer(stage3, false);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  Cycle();
  EXPECT_EQ(Get(admitted->id()).phase(), loom::v1::JOB_PHASE_STARTING);
}

// Host memory is packed across jobs: a 2-slot node with memory for one rank of this job runs
// one such job at a time, and the second says why it waits; a node with room takes it.
TEST_F(SchedulerMemoryTest, RanksOfDifferentJobsShareANodesMemory) {
  loom::v1::JobSpec spec = TestJobSpecWithRanks(1);
  SetModel(&spec, 768, 2048, 12, 12, 4, 32000);
  SetZeroStage(&spec, 2);
  const int64_t need = HostNeed(spec);
  RegisterCpuNode("node-a", 2, need + need / 2);
  absl::StatusOr<Job> first = SubmitWaitingForAnswer(spec, false);
  absl::StatusOr<Job> second = SubmitWaitingForAnswer(spec, false);
  ASSERT_TRUE(first.ok() && second.ok()) << first.status() << second.status();
  Cycle();
  EXPECT_EQ(Get(first->id()).phase(), loom::v1::JOB_PHASE_STARTING);
  const Job waiting = Get(second->id());
  EXPECT_EQ(waiting.phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(waiting.reason(), "WaitingForMemory") << waiting.message();
  EXPECT_NE(waiting.message().find("the nodes with free slots have room for 0 of them"),
            std::string::npos)
      << waiting.message();

  RegisterCpuNode("node-b", 2, need + need / 2);
  Cycle();
  const Job placed = Get(second->id());
  EXPECT_EQ(placed.phase(), loom::v1::JOB_PHASE_STARTING) << placed.message();
  ASSERT_EQ(placed.rank_nodes_size(), 1);
  EXPECT_EQ(placed.rank_nodes(0), "node-b");
}

TEST_F(SchedulerMemoryTest, NodesThatReportNoMemoryRefuseNothing) {
  RegisterCpuNode("node-a", 1, 0);
  RegisterCpuNode("node-b", 1, 0);
  loom::v1::JobSpec spec = TestJobSpecWithRanks(2);
  SetModel(&spec, 3584, 18944, 28, 28, 4, 152064);
  EXPECT_TRUE(SubmitWaitingForAnswer(spec, false).ok());
}

// The ZeRO stage of `spec`'s deepspeed_config (-1 when it sets none).
int ZeroStage(const loom::v1::JobSpec& spec) {
  const auto& ds = spec.deepspeed_config().fields();
  auto zero = ds.find("zero_optimization");
  if (zero == ds.end()) return -1;
  auto stage = zero->second.struct_value().fields().find("stage");
  return stage == zero->second.struct_value().fields().end()
             ? -1
             : static_cast<int>(stage->second.number_value());
}

loom::v1::JobSpec AutoJob() {
  // ~110M parameters: every ZeRO-2 rank holds all the fp32 weights and Adam's moments.
  loom::v1::JobSpec spec = TestJobSpecWithRanks(2);
  SetModel(&spec, 768, 2048, 12, 12, 4, 32000);
  SetZeroStage(&spec, 0);
  spec.set_technique("auto");
  return spec;
}

TEST_F(SchedulerMemoryTest, TechniqueAutoWritesZeroStage2WhereItFitsAndRecordsIt) {
  loom::v1::JobSpec stage2 = AutoJob();
  SetZeroStage(&stage2, 2);
  RegisterCpuNode("node-a", 1, 2 * HostNeed(stage2));
  RegisterCpuNode("node-b", 1, 2 * HostNeed(stage2));
  const std::string db = TmpDir() + "/technique_auto.db";
  std::remove(db.c_str());
  RestartOnSqlite(db);
  RegisterCpuNode("node-a", 1, 2 * HostNeed(stage2));
  RegisterCpuNode("node-b", 1, 2 * HostNeed(stage2));

  absl::StatusOr<Job> job = scheduler_->SubmitJob(AutoJob(), "req-auto-1");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->technique().name(), "zero-2");
  ASSERT_EQ(job->technique().settings_size(), 1);
  EXPECT_EQ(job->technique().settings(0), "deepspeed_config.zero_optimization.stage: 2");
  EXPECT_EQ(ZeroStage(job->spec()), 2);  // what the trainer will read
  EXPECT_EQ(job->spec().technique(), "auto");
  EXPECT_EQ(job->technique().planned_rank_host_bytes(),
            static_cast<int64_t>(HostNeed(stage2) / (1 + spec::kAdmissionMargin)))
      << "the plan of the spec as written with stage 2 (HostNeed's margin taken off)";

  // A retry of the same request (the spec as the user wrote it) is the same job.
  bool deduplicated = false;
  absl::StatusOr<Job> retry = scheduler_->SubmitJob(AutoJob(), "req-auto-1", &deduplicated);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_TRUE(deduplicated);
  EXPECT_EQ(retry->id(), job->id());
  loom::v1::JobSpec other = AutoJob();
  other.mutable_training()->set_steps(other.training().steps() + 1);
  EXPECT_EQ(scheduler_->SubmitJob(other, "req-auto-1").status().code(),
            absl::StatusCode::kAlreadyExists);

  // The choice is part of the job's stored state.
  RestartOnSqlite(db);
  const Job reloaded = Get(job->id());
  EXPECT_EQ(reloaded.technique().name(), "zero-2");
  EXPECT_EQ(ZeroStage(reloaded.spec()), 2);
}

TEST_F(SchedulerMemoryTest, TechniqueAutoTakesStage3WhenOnlyThatFits) {
  loom::v1::JobSpec stage2 = AutoJob();
  SetZeroStage(&stage2, 2);
  loom::v1::JobSpec stage2_checkpointed = stage2;
  (*stage2_checkpointed.mutable_deepspeed_config()->mutable_fields())["activation_checkpointing"]
      .mutable_struct_value();
  loom::v1::JobSpec stage3 = AutoJob();
  SetZeroStage(&stage3, 3);
  const int64_t room = HostNeed(stage3) + (HostNeed(stage3) >> 6);
  ASSERT_LT(room, HostNeed(stage2_checkpointed)) << "ZeRO-2 must not fit, even checkpointed";
  RegisterCpuNode("node-a", 1, room);
  RegisterCpuNode("node-b", 1, room);

  absl::StatusOr<Job> job = SubmitWaitingForAnswer(AutoJob(), false);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->technique().name(), "zero-3") << job->technique().why();
  EXPECT_EQ(ZeroStage(job->spec()), 3);
  Cycle();
  EXPECT_EQ(Get(job->id()).phase(), loom::v1::JOB_PHASE_STARTING);

  // A dry run says what it would choose.
  absl::StatusOr<loom::v1::SubmitJobResponse> dry =
      scheduler_->DryRunSubmission(AutoJob(), "default", false);
  ASSERT_TRUE(dry.ok()) << dry.status();
  ASSERT_GE(dry->notes_size(), 1);
  EXPECT_EQ(dry->notes(0).rfind("technique: auto chose zero-3: ", 0), 0u) << dry->notes(0);
}

TEST_F(SchedulerMemoryTest, TechniqueAutoRefusesWhenNothingFitsOrNoMemoryIsKnown) {
  // The Qwen2.5-7B on two 24 GiB CPU workers: no technique fits.
  RegisterCpuNode("node-a", 1, 24 * kGiB);
  RegisterCpuNode("node-b", 1, 24 * kGiB);
  loom::v1::JobSpec big = AutoJob();
  SetModel(&big, 3584, 18944, 28, 28, 4, 152064);
  absl::StatusOr<Job> refused = SubmitWaitingForAnswer(big, true);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_EQ(refused.status().message().rfind("technique: auto: no technique fits the registered "
                                             "cpu nodes: ",
                                             0),
            0u)
      << refused.status();

  // Nodes that report no memory give nothing to choose against.
  scheduler_.reset();
  store_ = std::make_unique<InMemoryJobStore>();
  Start();
  RegisterCpuNode("node-a", 1, 0);
  absl::StatusOr<Job> blind = SubmitWaitingForAnswer(AutoJob(), true);
  ASSERT_EQ(blind.status().code(), absl::StatusCode::kFailedPrecondition) << blind.status();
  EXPECT_EQ(blind.status().message().rfind("technique: auto chooses against the memory of the "
                                           "registered nodes, and no registered cpu node",
                                           0),
            0u)
      << blind.status();

  loom::v1::JobSpec typo = AutoJob();
  typo.set_technique("zero-3");
  absl::StatusOr<Job> invalid = SubmitWaitingForAnswer(typo, true);
  ASSERT_EQ(invalid.status().code(), absl::StatusCode::kInvalidArgument) << invalid.status();
  EXPECT_NE(invalid.status().message().find("technique: 'zero-3'"), absl::string_view::npos)
      << invalid.status();
}

}  // namespace
}  // namespace loom
