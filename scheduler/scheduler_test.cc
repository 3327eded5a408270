// The scheduler core through its API: submission, listing, explain, gang placement, worker
// registration, id limits, metrics and options (scheduler_test_fixture.h).
#include "absl/strings/escaping.h"
#include "google/protobuf/util/message_differencer.h"
#include "scheduler/scheduler_test_fixture.h"

namespace loom {
namespace {

TEST_F(SchedulerTest, SubmitPersistsAPendingJob) {
  Job job = Submit(2);
  EXPECT_TRUE(std::regex_match(job.id(), std::regex("job-[0-9a-f]{8}"))) << job.id();
  EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(job.checkpoint_dir(), TmpDir() + "/ckpt/" + job.id());
  EXPECT_EQ(job.attempt(), 0);
  EXPECT_EQ(job.create_time().seconds(), absl::ToUnixSeconds(clock_.Now()));
  absl::StatusOr<JobRecord> stored = store_->GetJob(job.id());
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->phase, loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(stored->spec.resources().num_ranks(), 2);
  EXPECT_EQ(MetricValue(*registry_, "loom_jobs_submitted_total"), 1);
  EXPECT_EQ(MetricValue(*registry_, "loom_jobs", "phase", "PENDING"), 1);
  EXPECT_EQ(MetricValue(*registry_, "loom_jobs", "phase", "RUNNING"), 0);
  EXPECT_EQ(MetricSum(*registry_, "loom_job_phase_transitions_total", "to", "PENDING"), 1);
}

// The reply takes the stored record's spec by move (JobRecordToProto(JobRecord&&)) after the
// scheduler adopted its own copy: both hold the whole spec as submitted.
TEST_F(SchedulerTest, SubmissionReplyAndTheAdoptedJobBothHoldTheWholeSpec) {
  const loom::v1::JobSpec spec = TestJobSpecWithRanks(2);
  ASSERT_GT(spec.deepspeed_config().fields_size(), 0);
  absl::StatusOr<Job> reply = scheduler_->SubmitJob(spec);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(reply->spec(), spec));
  absl::StatusOr<Job> got = scheduler_->GetJob(reply->id());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(got->spec(), spec));
  JobRecord record;
  record.id = "job-x";
  record.spec = spec;
  record.rank_nodes = {"n0", "n1"};
  const loom::v1::Job copied = JobRecordToProto(record);
  const loom::v1::Job moved = JobRecordToProto(std::move(record));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(moved, copied));
}

TEST_F(SchedulerTest, InvalidSpecIsRejectedAndNotStored) {
  absl::StatusOr<Job> job = scheduler_->SubmitJob(TestJobSpecWithRanks(0));
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(job.status().message().find("resources.num_ranks"), std::string::npos);
  absl::StatusOr<std::vector<JobRecord>> all = store_->ListJobs();
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->empty());
  EXPECT_EQ(MetricValue(*registry_, "loom_jobs_submitted_total"), 0);
}

TEST_F(SchedulerTest, SubmissionWithARequestIdIsIdempotent) {
  loom::v1::JobSpec spec = TestJobSpecWithRanks(2);
  bool dedup = true;
  absl::StatusOr<Job> first = scheduler_->SubmitJob(spec, "client-7", &dedup);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(dedup);
  EXPECT_EQ(first->request_id(), "client-7");
  absl::StatusOr<Job> retry = scheduler_->SubmitJob(spec, "client-7", &dedup);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_TRUE(dedup);
  EXPECT_EQ(retry->id(), first->id());
  // The same id with another spec is a client bug, not a retry.
  loom::v1::JobSpec other = spec;
  other.mutable_training()->set_steps(spec.training().steps() + 1);
  absl::StatusOr<Job> clash = scheduler_->SubmitJob(other, "client-7");
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(clash.status().message().find(first->id()), std::string::npos) << clash.status();
  // Without a request id every call creates a job.
  absl::StatusOr<Job> a = scheduler_->SubmitJob(spec), b = scheduler_->SubmitJob(spec);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->id(), b->id());
  absl::StatusOr<std::vector<Job>> all = scheduler_->ListJobs(loom::v1::JOB_PHASE_UNSPECIFIED);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 3u);
  // A retry after a restart still finds the job (the id is persisted with it).
  scheduler_.reset();
  Start();
  absl::StatusOr<Job> after = scheduler_->SubmitJob(spec, "client-7", &dedup);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(dedup);
  EXPECT_EQ(after->id(), first->id());
  EXPECT_EQ(scheduler_->SubmitJob(spec, std::string(300, 'x')).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Issue 52 finding 6: a request id with a newline (or a space, a control or non-ASCII byte)
  // is refused naming the field; it was accepted and echoed into messages and logs.
  const std::vector<std::string> bad_ids = {"a\nb", "with space", "\x01x", "caf\xc3\xa9"};
  for (const std::string& id : bad_ids) {
    absl::Status s = scheduler_->SubmitJob(spec, id).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << absl::CEscape(id);
    EXPECT_EQ(s.message().rfind("request_id: ", 0), 0u) << s;
  }
  EXPECT_TRUE(scheduler_->SubmitJob(spec, "3f2b9a4e-0c1d-4e5f-8a7b-1c2d3e4f5a6b").ok());
}

// Issue 52 finding 6: an empty id is a bad request naming the field, not an unknown job.
TEST_F(SchedulerTest, EmptyIdsAreInvalidArgumentNotNotFound) {
  for (absl::Status s : {scheduler_->GetJob("").status(), scheduler_->CancelJob("").status(),
                         scheduler_->KillJob("").status(),
                         scheduler_->ExplainPending("").status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(s.message(), "job_id: required");
  }
  EXPECT_EQ(scheduler_->CordonNode("", "reason").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, ListJobsPagesWithTokensAndFilters) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    loom::v1::JobSpec spec = TestJobSpecWithRanks(1);
    spec.set_name(i % 2 == 0 ? absl::StrCat("sweep-", i) : absl::StrCat("other-", i));
    absl::StatusOr<Job> job = scheduler_->SubmitJob(spec);
    ASSERT_TRUE(job.ok());
    ids.push_back(job->id());
  }
  loom::v1::ListJobsRequest req;
  req.set_page_size(2);
  std::vector<std::string> seen;
  for (int page = 0; page < 10; ++page) {
    absl::StatusOr<loom::v1::ListJobsResponse> resp = scheduler_->ListJobsPage(req);
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_LE(resp->jobs_size(), 2);
    for (const Job& j : resp->jobs()) seen.push_back(j.id());
    if (resp->next_page_token().empty()) break;
    req.set_page_token(resp->next_page_token());
  }
  EXPECT_EQ(seen, ids);  // every job once, in submission order
  loom::v1::ListJobsRequest sweeps;
  sweeps.set_name_prefix("sweep-");
  absl::StatusOr<loom::v1::ListJobsResponse> only = scheduler_->ListJobsPage(sweeps);
  ASSERT_TRUE(only.ok());
  ASSERT_EQ(only->jobs_size(), 3);
  EXPECT_EQ(only->jobs(2).id(), ids[4]);
  EXPECT_TRUE(only->next_page_token().empty());
  loom::v1::ListJobsRequest bad;
  bad.set_page_token("not-a-token");
  EXPECT_EQ(scheduler_->ListJobsPage(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.set_page_token("");
  bad.set_page_size(-1);
  EXPECT_EQ(scheduler_->ListJobsPage(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

// Issue 52 finding 6: page sizes over the maximum are capped, not refused; page tokens are
// opaque (not "after:N"), refused with other filters or with bytes added, and "after:N" tokens
// a client forged are refused.
TEST_F(SchedulerTest, PageTokensAreOpaqueAndBoundToTheirFilters) {
  Register("node-a", 1);
  for (int i = 0; i < 4; ++i) {
    loom::v1::JobSpec spec = TestJobSpecWithRanks(1);
    spec.set_name(absl::StrCat("sweep-", i));
    ASSERT_TRUE(scheduler_->SubmitJob(spec).ok());
  }
  loom::v1::ListJobsRequest all;
  all.set_page_size(5000);
  absl::StatusOr<loom::v1::ListJobsResponse> capped = scheduler_->ListJobsPage(all);
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_EQ(capped->jobs_size(), 4);

  loom::v1::ListJobsRequest sweeps;
  sweeps.set_name_prefix("sweep-");
  sweeps.set_page_size(2);
  absl::StatusOr<loom::v1::ListJobsResponse> first = scheduler_->ListJobsPage(sweeps);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string token = first->next_page_token();
  ASSERT_FALSE(token.empty());
  std::string decoded;
  ASSERT_TRUE(absl::WebSafeBase64Unescape(token, &decoded));
  EXPECT_EQ(decoded.find("after:"), std::string::npos) << "a readable token: " << decoded;

  sweeps.set_page_token(token);
  absl::StatusOr<loom::v1::ListJobsResponse> second = scheduler_->ListJobsPage(sweeps);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->jobs_size(), 2);
  EXPECT_EQ(second->jobs(0).spec().name(), "sweep-2");

  loom::v1::ListJobsRequest other = sweeps;
  other.set_name_prefix("sweep-3");
  absl::Status s = scheduler_->ListJobsPage(other).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("page_token: issued for other filters"), std::string::npos) << s;
  other = sweeps;
  other.set_phase(loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(scheduler_->ListJobsPage(other).status().code(), absl::StatusCode::kInvalidArgument);

  // Bytes added to a real token (a field appended, then base64 again) and forged old-style ones.
  other = sweeps;
  other.set_page_token(absl::WebSafeBase64Escape(decoded + std::string("\x08\x01", 2)));
  s = scheduler_->ListJobsPage(other).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("page_token: not a token"), std::string::npos) << s;
  other.set_page_token(absl::WebSafeBase64Escape("after:1"));
  EXPECT_EQ(scheduler_->ListJobsPage(other).status().code(), absl::StatusCode::kInvalidArgument);
  other.set_page_token(token + "AAAA");
  EXPECT_EQ(scheduler_->ListJobsPage(other).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, ExplainPendingGivesReasonPositionAndBlockers) {
  Register("node-a", 1);
  Job running = Submit(1);
  Job second = Submit(1);
  Job third = Submit(1);
  loom::v1::JobSpec h200 = TestJobSpecWithRanks(8);
  h200.mutable_resources()->set_accelerator(loom::v1::ACCELERATOR_KIND_H200);
  absl::StatusOr<Job> big = scheduler_->SubmitJob(h200);
  ASSERT_TRUE(big.ok());
  Cycle();
  absl::StatusOr<loom::v1::ExplainPendingResponse> e = scheduler_->ExplainPending(third.id());
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(e->queue_position(), 2);
  ASSERT_EQ(e->jobs_ahead_size(), 1);
  EXPECT_EQ(e->jobs_ahead(0), second.id());
  EXPECT_EQ(e->reason(), "Queued");
  e = scheduler_->ExplainPending(big->id());
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->reason(), "Unschedulable");
  EXPECT_EQ(e->queue_position(), 1);
  EXPECT_NE(e->message().find("needs 8 h200 rank slots"), std::string::npos) << e->message();
  e = scheduler_->ExplainPending(running.id());
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(e->queue_position(), 0);
  EXPECT_EQ(scheduler_->ExplainPending("job-nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SchedulerTest, GetAndCancelUnknownJobAreNotFound) {
  EXPECT_EQ(scheduler_->GetJob("job-nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(scheduler_->CancelJob("job-nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SchedulerTest, ListJobsInSubmissionOrderWithPhaseFilter) {
  Register("node-a", 1);
  Job a = Submit(1);
  Job b = Submit(1);
  Job c = Submit(1);
  Cycle();  // a placed; b, c pending
  absl::StatusOr<std::vector<Job>> all = scheduler_->ListJobs(loom::v1::JOB_PHASE_UNSPECIFIED);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].id(), a.id());
  EXPECT_EQ((*all)[1].id(), b.id());
  EXPECT_EQ((*all)[2].id(), c.id());
  absl::StatusOr<std::vector<Job>> pending = scheduler_->ListJobs(loom::v1::JOB_PHASE_PENDING);
  ASSERT_TRUE(pending.ok());
  ASSERT_EQ(pending->size(), 2u);
  EXPECT_EQ((*pending)[0].id(), b.id());
  EXPECT_EQ((*pending)[1].id(), c.id());
}

// Backfill refused: the head (b) waits for a job with no runtime estimate (a is STARTING), so
// every free slot it could use is reserved for it and c, which would fit, must wait.
TEST_F(SchedulerTest, BackfillIsRefusedWhenTheHeadHasNoEstimate) {
  Register("node-a", 3);
  Job a = Submit(2);
  Job b = Submit(2);
  Job c = Submit(1);
  Cycle();
  EXPECT_EQ(Get(a.id()).phase(), loom::v1::JOB_PHASE_STARTING);
  Job b_now = Get(b.id());
  EXPECT_EQ(b_now.phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(b_now.reason(), "WaitingForSlots");
  EXPECT_EQ(b_now.message(), "needs 2 cpu rank slots; 1 of 3 are free");
  // c would fit in the free slot, but it is behind b.
  Job c_now = Get(c.id());
  EXPECT_EQ(c_now.phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(c_now.reason(), "Queued");
  EXPECT_EQ(c_now.message(), "waiting behind job " + b.id() +
                                 " (it holds a reservation; starting now would delay it)");

  a = Get(a.id());
  Beat("node-a", {Rank(a, 0, loom::v1::RANK_STATE_SUCCEEDED, 1234),
                  Rank(a, 1, loom::v1::RANK_STATE_SUCCEEDED)});
  EXPECT_EQ(Get(a.id()).phase(), loom::v1::JOB_PHASE_SUCCEEDED);
  Cycle();
  EXPECT_EQ(Get(b.id()).phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(Get(c.id()).phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(MetricValue(*registry_, "loom_rank_slots", "state", "used"), 3);
  EXPECT_EQ(MetricValue(*registry_, "loom_rank_slots", "state", "free"), 0);
}

TEST_F(SchedulerTest, GangIsAllOrNothing) {
  Register("node-a", 1);
  Register("node-b", 1);
  Job x = Submit(1);
  Cycle();
  x = Get(x.id());
  ASSERT_EQ(x.phase(), loom::v1::JOB_PHASE_STARTING);
  ASSERT_EQ(x.rank_nodes_size(), 1);
  EXPECT_EQ(x.rank_nodes(0), "node-a");

  Job y = Submit(2);
  Cycle();
  y = Get(y.id());
  EXPECT_EQ(y.phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(y.rank_nodes_size(), 0);
  EXPECT_EQ(y.attempt(), 0);
  // node-b has a free slot, but half a gang is never started.
  EXPECT_EQ(Beat("node-b").start_size(), 0);

  Beat("node-a", {Rank(x, 0, loom::v1::RANK_STATE_SUCCEEDED)});
  Cycle();
  y = Get(y.id());
  EXPECT_EQ(y.phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(y.attempt(), 1);
  ASSERT_EQ(y.rank_nodes_size(), 2);
  EXPECT_EQ(y.rank_nodes(0), "node-a");
  EXPECT_EQ(y.rank_nodes(1), "node-b");
}

// A node without a topology domain is its own domain: a gang that fits one node goes to the
// best-fitting one; one that does not is spread round-robin over nodes in id order.
TEST_F(SchedulerTest, RanksPackIntoOneNodeOrSpreadInIdOrder) {
  Register("node-b", 3);
  Register("node-a", 4);
  Job job = Submit(3);
  Cycle();
  job = Get(job.id());
  ASSERT_EQ(job.rank_nodes_size(), 3);
  EXPECT_EQ(job.rank_nodes(0), "node-b");  // 3 free: fits exactly
  EXPECT_EQ(job.rank_nodes(2), "node-b");
  Job wide = Submit(2);
  Register("node-c", 1);
  Cycle();
  wide = Get(wide.id());
  ASSERT_EQ(wide.rank_nodes_size(), 2);
  EXPECT_EQ(wide.rank_nodes(0), "node-a");  // 4 free: the only node with 2
  // Free now: node-a 2, node-c 1, node-d 2. Four ranks fit no single node: the fewest nodes
  // (most free first, ties by id) are node-a and node-d, filled round-robin.
  Register("node-d", 2);
  Job spread = Submit(4);
  Cycle();
  spread = Get(spread.id());
  ASSERT_EQ(spread.phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(std::vector<std::string>(spread.rank_nodes().begin(), spread.rank_nodes().end()),
            (std::vector<std::string>{"node-a", "node-d", "node-a", "node-d"}));
}

TEST_F(SchedulerTest, NeverFittingJobIsUnschedulableAndDoesNotBlockOthers) {
  Register("node-a", 1);
  Job big = Submit(2);
  loom::v1::JobSpec gpu_spec = TestJobSpecWithRanks(1);
  gpu_spec.mutable_resources()->set_accelerator(loom::v1::ACCELERATOR_KIND_H100);
  absl::StatusOr<Job> gpu = scheduler_->SubmitJob(gpu_spec);
  ASSERT_TRUE(gpu.ok());
  Job small = Submit(1);
  Cycle();
  Job big_now = Get(big.id());
  EXPECT_EQ(big_now.phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(big_now.reason(), "Unschedulable");
  EXPECT_EQ(big_now.message(),
            "needs 2 cpu rank slots; the 1 live cpu nodes offer 1 in total (register more "
            "workers)");
  Job gpu_now = Get(gpu->id());
  EXPECT_EQ(gpu_now.reason(), "Unschedulable");
  EXPECT_NE(gpu_now.message().find("needs 1 h100 rank slots; the 0 live h100 nodes offer 0"),
            std::string::npos)
      << gpu_now.message();
  EXPECT_EQ(Get(small.id()).phase(), loom::v1::JOB_PHASE_STARTING);

  // More capacity makes it schedulable.
  Register("node-b", 1);
  Beat("node-a", {Rank(Get(small.id()), 0, loom::v1::RANK_STATE_SUCCEEDED)});
  Cycle();
  EXPECT_EQ(Get(big.id()).phase(), loom::v1::JOB_PHASE_STARTING);
}

TEST_F(SchedulerTest, RegisterWorkerValidatesInventory) {
  loom::v1::NodeInventory inv;
  inv.set_slots(0);
  EXPECT_EQ(scheduler_->RegisterWorker("node-a", inv).status().code(),
            absl::StatusCode::kInvalidArgument);
  inv.set_slots(1);
  EXPECT_EQ(scheduler_->RegisterWorker("", inv).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Regression: slots = INT32_MAX was accepted; two such nodes overflowed the int slot totals, and
// one was enough to make placing a huge gang allocate without bound.
TEST_F(SchedulerTest, RegisterWorkerRefusesAbsurdSlotCounts) {
  loom::v1::NodeInventory inv;
  inv.set_slots(2147483647);
  absl::Status s = scheduler_->RegisterWorker("node-a", inv).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("inventory.slots: must be in [1, 1024], got 2147483647"),
            std::string::npos)
      << s;
  inv.set_slots(-5);
  EXPECT_EQ(scheduler_->RegisterWorker("node-a", inv).status().code(),
            absl::StatusCode::kInvalidArgument);
  inv.set_slots(kMaxSlotsPerNode);
  EXPECT_TRUE(scheduler_->RegisterWorker("node-a", inv).ok());
}

// Regression (break-it pass, 2026-12-05): a second daemon started with the --node_id of a live
// worker was accepted, and both ran the same attempt's rank (two trainers writing one checkpoint
// directory). The newest registration owns the node id: the earlier instance's heartbeats are
// refused (ABORTED) and it is never handed a rank again.
TEST_F(SchedulerTest, ANewInstanceOfANodeIdFencesTheEarlierOne) {
  loom::v1::NodeInventory inv;
  inv.set_slots(1);
  inv.set_address("addr-node-a");
  ASSERT_TRUE(scheduler_->RegisterWorker("node-a", inv, "instance-1").ok());
  auto beat = [&](const std::string& instance) {
    HeartbeatRequest req;
    req.set_node_id("node-a");
    req.set_instance_id(instance);
    return scheduler_->Heartbeat(req);
  };
  ASSERT_TRUE(beat("instance-1").ok());
  const Job job = Submit(1);
  Cycle();
  absl::StatusOr<HeartbeatResponse> first = beat("instance-1");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->start_size(), 1);  // instance 1 is told to start the rank
  inv.set_slots(4);
  ASSERT_TRUE(scheduler_->RegisterWorker("node-a", inv, "instance-2").ok());
  absl::StatusOr<HeartbeatResponse> fenced = beat("instance-1");
  EXPECT_EQ(fenced.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(fenced.status().message().find("was registered by another worker instance "
                                           "(instance-2); this instance (instance-1) is "
                                           "superseded"),
            std::string::npos)
      << fenced.status();
  EXPECT_TRUE(beat("instance-2").ok());
  EXPECT_EQ(beat("instance-1").status().code(), absl::StatusCode::kAborted);  // stays fenced
  // Workers that send no instance id (older builds) are not fenced.
  EXPECT_TRUE(beat("").ok());
  EXPECT_FALSE(Get(job.id()).id().empty());
}

TEST_F(SchedulerTest, OverlongCordonAndDrainReasonsAreRefused) {
  Register("node-a", 1);
  const std::string huge(kMaxAdminReasonBytes + 1, 'r');
  for (absl::Status s : {scheduler_->CordonNode("node-a", huge).status(),
                         scheduler_->DrainNode("node-a", huge).status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("reason: 1025 bytes, longer than 1024"), std::string::npos) << s;
  }
  EXPECT_TRUE(scheduler_->CordonNode("node-a", std::string(kMaxAdminReasonBytes, 'r')).ok());
}

// Regression: a 100 KB job id came back in the NOT_FOUND message, which exceeded gRPC's
// metadata limit: the client saw RESOURCE_EXHAUSTED. Over-long ids are INVALID_ARGUMENT with a
// short message; ids at the limit still get NOT_FOUND.
TEST_F(SchedulerTest, OverlongIdsAreInvalidWithShortMessages) {
  const std::string huge(100000, 'a');
  for (absl::Status s : {scheduler_->GetJob(huge).status(), scheduler_->CancelJob(huge).status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s.message().substr(0, 100);
    EXPECT_LT(s.message().size(), 200u);
    EXPECT_NE(s.message().find("job_id: 100000 bytes"), std::string::npos) << s;
  }
  EXPECT_EQ(scheduler_->GetJob(std::string(kMaxIdBytes, 'a')).status().code(),
            absl::StatusCode::kNotFound);
  HeartbeatRequest req;
  req.set_node_id(huge);
  absl::Status hb = scheduler_->Heartbeat(req).status();
  EXPECT_EQ(hb.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(hb.message().size(), 200u);
  loom::v1::NodeInventory inv;
  inv.set_slots(1);
  EXPECT_EQ(scheduler_->RegisterWorker(huge, inv).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, QueueWaitIsObservedWhenAJobIsPlaced) {
  Register("node-a", 1);
  Job a = Submit(1);
  Job b = Submit(1);
  // Let time pass in 8 s steps with heartbeats, so that node-a stays live.
  auto wait = [this](int steps) {
    for (int i = 0; i < steps; ++i) {
      clock_.Advance(absl::Seconds(8));
      Beat("node-a");
    }
  };
  wait(5);
  Cycle();  // a is placed after 40 s; b waits
  EXPECT_EQ(MetricValue(*registry_, "loom_job_queue_wait_seconds"), 1);
  a = Get(a.id());
  Beat("node-a", {Rank(a, 0, loom::v1::RANK_STATE_SUCCEEDED, 1234)});
  wait(15);
  Cycle();  // b is placed after 160 s
  EXPECT_EQ(Get(b.id()).phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(MetricValue(*registry_, "loom_job_queue_wait_seconds"), 2);
  for (const prometheus::MetricFamily& f : registry_->Collect()) {
    if (f.name != "loom_job_queue_wait_seconds") continue;
    EXPECT_DOUBLE_EQ(f.metric[0].histogram.sample_sum, 200);
    // Buckets 0.01 ... 5 15 30 60 120 300 ...: 40 s lands in le=60, 160 s in le=300.
    EXPECT_EQ(f.metric[0].histogram.bucket[10].cumulative_count, 0u);  // le=30
    EXPECT_EQ(f.metric[0].histogram.bucket[11].cumulative_count, 1u);  // le=60
    EXPECT_EQ(f.metric[0].histogram.bucket[12].cumulative_count, 1u);  // le=120
    EXPECT_EQ(f.metric[0].histogram.bucket[13].cumulative_count, 2u);  // le=300
  }
  // A job cancelled while pending did not wait for placement: not observed.
  Job c = Submit(1);
  ASSERT_TRUE(scheduler_->CancelJob(c.id()).ok());
  EXPECT_EQ(MetricValue(*registry_, "loom_job_queue_wait_seconds"), 2);
}

TEST_F(SchedulerTest, SchedulingCycleIsTimed) {
  Cycle();
  Cycle();
  EXPECT_EQ(MetricValue(*registry_, "loom_scheduling_cycle_seconds"), 2);
}

TEST_F(SchedulerTest, EveryPhaseGaugeIsPresentFromTheStart) {
  for (const char* phase : {"PENDING", "ADMITTED", "STARTING", "RUNNING", "RECOVERING",
                            "STOPPING", "SUCCEEDED", "FAILED", "CANCELLED"}) {
    EXPECT_EQ(MetricValue(*registry_, "loom_jobs", "phase", phase), 0) << phase;
  }
  EXPECT_EQ(MetricValue(*registry_, "loom_nodes", "state", "live"), 0);
  EXPECT_EQ(MetricValue(*registry_, "loom_rank_slots", "state", "free"), 0);
  Register("node-a", 3);
  EXPECT_EQ(MetricValue(*registry_, "loom_nodes", "state", "live"), 1);
  EXPECT_EQ(MetricValue(*registry_, "loom_rank_slots", "state", "free"), 3);
  Job job = Submit(2);
  Cycle();
  EXPECT_EQ(MetricValue(*registry_, "loom_jobs", "phase", "STARTING"), 1);
  EXPECT_EQ(MetricValue(*registry_, "loom_jobs", "phase", "PENDING"), 0);
  EXPECT_EQ(MetricSum(*registry_, "loom_job_phase_transitions_total", "from", "PENDING"), 1);
  EXPECT_EQ(MetricValue(*registry_, "loom_rank_slots", "state", "used"), 2);
  EXPECT_EQ(MetricValue(*registry_, "loom_rank_slots", "state", "free"), 1);
}

TEST(SchedulerOptionsTest, Validate) {
  SchedulerOptions o;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o.checkpoint_root = "/tmp/x";
  EXPECT_TRUE(o.Validate().ok());
  EXPECT_EQ(o.heartbeat_timeout, absl::Seconds(40));  // docs/scheduling.md "Node liveness"
  o.heartbeat_interval = absl::Seconds(40);
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(o.Validate().message().find("heartbeat_interval"), std::string::npos);
  o.heartbeat_interval = absl::Seconds(1);
  o.resume_lookup_wait = absl::Seconds(-1);
  EXPECT_NE(o.Validate().message().find("resume_lookup_wait"), std::string::npos);
  o.resume_lookup_wait = absl::Seconds(1);
  o.checkpoint_worker.retry_initial = absl::ZeroDuration();
  EXPECT_NE(o.Validate().message().find("checkpoint_worker.retry_initial"), std::string::npos);
}

}  // namespace
}  // namespace loom
