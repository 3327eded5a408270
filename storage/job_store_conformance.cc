#include "storage/job_store_conformance.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/file_util.h"
#include "google/protobuf/util/message_differencer.h"

namespace loom {

void JobStoreConformanceTest::SetUp() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  dir_ = absl::StrCat(tmp ? tmp : "/tmp", "/",
                      absl::StrReplaceAll(std::string(info->test_suite_name()), {{"/", "_"}}),
                      "_", absl::StrReplaceAll(std::string(info->name()), {{"/", "_"}}));
  ASSERT_TRUE(MakeDirs(dir_).ok());
  store_ = GetParam().make(dir_);
  ASSERT_NE(store_, nullptr);
}

JobRecord SampleJob(const std::string& id, int64_t sequence) {
  JobRecord job;
  job.id = id;
  job.sequence = sequence;
  job.spec.set_name(absl::StrCat("name-", id));
  job.spec.mutable_resources()->set_num_ranks(2);
  job.spec.mutable_training()->set_steps(20);
  (*job.spec.mutable_model()->mutable_config()->mutable_fields())["hidden_size"]
      .set_number_value(64);
  job.phase = loom::v1::JOB_PHASE_RUNNING;
  job.failure_class = loom::v1::FAILURE_CLASS_INFRA;
  job.reason = "SomeReason";
  job.message = "some message with 'quotes' and \"double quotes\"";
  job.create_time = absl::FromUnixMicros(1700000000123456);
  job.start_time = absl::FromUnixMicros(1700000001000000);
  job.end_time = absl::FromUnixMicros(1700000002000000);
  job.attempt = 3;
  job.progress.set_step(7);
  job.progress.set_total_steps(20);
  job.progress.set_loss(2.5);
  job.checkpoint_dir = absl::StrCat("/ckpt/", id);
  job.rendezvous_port = 29500;
  job.request_id = absl::StrCat("req-", id);
  job.tenant = "team-a";
  job.state.set_user_restarts(1);
  job.state.set_infra_restarts(2);
  job.state.set_not_before_us(1700000009000000);
  job.state.add_suspect_nodes("node-x");
  return job;
}

NodeRecord SampleNode(const std::string& id, int slots) {
  NodeRecord node;
  node.id = id;
  node.inventory.set_accelerator(loom::v1::ACCELERATOR_KIND_CPU);
  node.inventory.set_slots(slots);
  node.inventory.set_hostname(id);
  node.inventory.set_address("127.0.0.1");
  node.last_heartbeat_time = absl::FromUnixMicros(1700000003000000);
  node.inventory.set_topology_domain("rack-1");
  (*node.inventory.mutable_labels())["zone"] = "a";
  return node;
}

namespace {

using google::protobuf::util::MessageDifferencer;

void ExpectSameJob(const JobRecord& a, const JobRecord& b) {
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.sequence, b.sequence);
  EXPECT_TRUE(MessageDifferencer::Equals(a.spec, b.spec)) << a.spec.DebugString() << " vs "
                                                          << b.spec.DebugString();
  EXPECT_EQ(a.phase, b.phase);
  EXPECT_EQ(a.failure_class, b.failure_class);
  EXPECT_EQ(a.reason, b.reason);
  EXPECT_EQ(a.message, b.message);
  EXPECT_EQ(a.create_time, b.create_time);
  EXPECT_EQ(a.start_time, b.start_time);
  EXPECT_EQ(a.end_time, b.end_time);
  EXPECT_EQ(a.attempt, b.attempt);
  EXPECT_TRUE(MessageDifferencer::Equals(a.progress, b.progress));
  EXPECT_EQ(a.checkpoint_dir, b.checkpoint_dir);
  EXPECT_EQ(a.rank_nodes, b.rank_nodes);
  EXPECT_EQ(a.rendezvous_port, b.rendezvous_port);
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(a.tenant, b.tenant);
  EXPECT_TRUE(MessageDifferencer::Equals(a.state, b.state)) << a.state.DebugString() << " vs "
                                                            << b.state.DebugString();
}

TEST_P(JobStoreConformanceTest, CreateThenGetRoundTripsEveryField) {
  ASSERT_TRUE(store_->UpsertNode(SampleNode("node-a", 2)).ok());
  ASSERT_TRUE(store_->UpsertNode(SampleNode("node-b", 2)).ok());
  JobRecord job = SampleJob("job-00000001", 1);
  job.rank_nodes = {"node-b", "node-a"};
  ASSERT_TRUE(store_->CreateJob(job).ok());
  absl::StatusOr<JobRecord> got = store_->GetJob("job-00000001");
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameJob(*got, job);
}

TEST_P(JobStoreConformanceTest, UnsetTimesStayUnset) {
  JobRecord job = SampleJob("job-1", 1);
  job.start_time = absl::InfinitePast();
  job.end_time = absl::InfinitePast();
  job.progress.Clear();
  ASSERT_TRUE(store_->CreateJob(job).ok());
  absl::StatusOr<JobRecord> got = store_->GetJob("job-1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->start_time, absl::InfinitePast());
  EXPECT_EQ(got->end_time, absl::InfinitePast());
  EXPECT_EQ(got->progress.step(), 0);
}

TEST_P(JobStoreConformanceTest, GetUnknownJobIsNotFound) {
  EXPECT_EQ(store_->GetJob("job-nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_P(JobStoreConformanceTest, DuplicateIdOrSequenceIsAlreadyExists) {
  ASSERT_TRUE(store_->CreateJob(SampleJob("job-1", 1)).ok());
  EXPECT_EQ(store_->CreateJob(SampleJob("job-1", 2)).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store_->CreateJob(SampleJob("job-2", 1)).code(), absl::StatusCode::kAlreadyExists);
  absl::StatusOr<std::vector<JobRecord>> all = store_->ListJobs();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 1u);
}

TEST_P(JobStoreConformanceTest, RequestIdIsUniqueUnlessEmpty) {
  JobRecord first = SampleJob("job-1", 1);
  first.request_id = "client-42";
  ASSERT_TRUE(store_->CreateJob(first).ok());
  JobRecord same_request = SampleJob("job-2", 2);
  same_request.request_id = "client-42";
  EXPECT_EQ(store_->CreateJob(same_request).code(), absl::StatusCode::kAlreadyExists);
  JobRecord none_a = SampleJob("job-3", 3), none_b = SampleJob("job-4", 4);
  none_a.request_id.clear();
  none_b.request_id.clear();
  EXPECT_TRUE(store_->CreateJob(none_a).ok());
  EXPECT_TRUE(store_->CreateJob(none_b).ok());
}

TEST_P(JobStoreConformanceTest, UpdateReplacesFieldsAndPlacement) {
  ASSERT_TRUE(store_->UpsertNode(SampleNode("node-a", 2)).ok());
  ASSERT_TRUE(store_->UpsertNode(SampleNode("node-b", 2)).ok());
  JobRecord job = SampleJob("job-1", 1);
  job.rank_nodes = {"node-a", "node-a", "node-b"};
  ASSERT_TRUE(store_->CreateJob(job).ok());

  job.phase = loom::v1::JOB_PHASE_FAILED;
  job.reason = "RankFailed";
  job.message = "rank 1 on node node-a exited with code 3: boom";
  job.attempt = 4;
  job.progress.set_step(9);
  job.rank_nodes = {"node-b"};
  job.rendezvous_port = 0;
  ASSERT_TRUE(store_->UpdateJob(job).ok());
  absl::StatusOr<JobRecord> got = store_->GetJob("job-1");
  ASSERT_TRUE(got.ok());
  ExpectSameJob(*got, job);

  job.rank_nodes.clear();
  ASSERT_TRUE(store_->UpdateJob(job).ok());
  got = store_->GetJob("job-1");
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->rank_nodes.empty());
}

TEST_P(JobStoreConformanceTest, UpdateUnknownJobIsNotFound) {
  EXPECT_EQ(store_->UpdateJob(SampleJob("job-ghost", 5)).code(), absl::StatusCode::kNotFound);
}

TEST_P(JobStoreConformanceTest, PlacementOnUnknownNodeIsRefusedAtomically) {
  ASSERT_TRUE(store_->UpsertNode(SampleNode("node-a", 2)).ok());
  JobRecord job = SampleJob("job-1", 1);
  job.rank_nodes = {"node-a"};
  ASSERT_TRUE(store_->CreateJob(job).ok());

  JobRecord bad = job;
  bad.phase = loom::v1::JOB_PHASE_SUCCEEDED;
  bad.rank_nodes = {"node-a", "node-missing"};
  absl::Status s = store_->UpdateJob(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("node-missing"), std::string::npos) << s;
  // Nothing of the failed update is visible: not the phase, not the first rank row.
  absl::StatusOr<JobRecord> got = store_->GetJob("job-1");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->phase, loom::v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(got->rank_nodes, std::vector<std::string>{"node-a"});

  JobRecord bad_new = SampleJob("job-2", 2);
  bad_new.rank_nodes = {"node-missing"};
  EXPECT_EQ(store_->CreateJob(bad_new).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->GetJob("job-2").status().code(), absl::StatusCode::kNotFound);
}

TEST_P(JobStoreConformanceTest, ListJobsOrdersBySequenceAndFiltersByPhase) {
  JobRecord a = SampleJob("job-a", 30);
  a.phase = loom::v1::JOB_PHASE_PENDING;
  JobRecord b = SampleJob("job-b", 10);
  b.phase = loom::v1::JOB_PHASE_SUCCEEDED;
  JobRecord c = SampleJob("job-c", 20);
  c.phase = loom::v1::JOB_PHASE_PENDING;
  for (const JobRecord& j : {a, b, c}) ASSERT_TRUE(store_->CreateJob(j).ok());

  absl::StatusOr<std::vector<JobRecord>> all = store_->ListJobs();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].id, "job-b");
  EXPECT_EQ((*all)[1].id, "job-c");
  EXPECT_EQ((*all)[2].id, "job-a");

  absl::StatusOr<std::vector<JobRecord>> pending = store_->ListJobs(loom::v1::JOB_PHASE_PENDING);
  ASSERT_TRUE(pending.ok());
  ASSERT_EQ(pending->size(), 2u);
  EXPECT_EQ((*pending)[0].id, "job-c");
  EXPECT_EQ((*pending)[1].id, "job-a");

  absl::StatusOr<std::vector<JobRecord>> failed = store_->ListJobs(loom::v1::JOB_PHASE_FAILED);
  ASSERT_TRUE(failed.ok());
  EXPECT_TRUE(failed->empty());
}

TEST_P(JobStoreConformanceTest, NodesUpsertGetAndListById) {
  EXPECT_EQ(store_->GetNode("node-z").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store_->UpsertNode(SampleNode("node-z", 1)).ok());
  ASSERT_TRUE(store_->UpsertNode(SampleNode("node-a", 4)).ok());
  NodeRecord z = SampleNode("node-z", 8);
  z.lost = true;
  z.inventory.set_accelerator(loom::v1::ACCELERATOR_KIND_H100);
  z.last_heartbeat_time = absl::FromUnixMicros(1800000000000001);
  z.admin.set_cordoned(true);
  z.admin.set_reason("disk replacement");
  ASSERT_TRUE(store_->UpsertNode(z).ok());

  absl::StatusOr<NodeRecord> got = store_->GetNode("node-z");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->inventory.slots(), 8);
  EXPECT_EQ(got->inventory.accelerator(), loom::v1::ACCELERATOR_KIND_H100);
  EXPECT_EQ(got->inventory.address(), "127.0.0.1");
  EXPECT_EQ(got->last_heartbeat_time, absl::FromUnixMicros(1800000000000001));
  EXPECT_TRUE(got->lost);
  EXPECT_TRUE(got->admin.cordoned());
  EXPECT_EQ(got->admin.reason(), "disk replacement");
  EXPECT_EQ(got->inventory.topology_domain(), "rack-1");
  EXPECT_EQ(got->inventory.labels().at("zone"), "a");

  absl::StatusOr<std::vector<NodeRecord>> nodes = store_->ListNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 2u);
  EXPECT_EQ((*nodes)[0].id, "node-a");
  EXPECT_FALSE((*nodes)[0].lost);
  EXPECT_EQ((*nodes)[1].id, "node-z");
}

// The scheduling policy's persisted state (docs/scheduling.md "Durability"): restart budgets,
// preemptions, gang-ready backoff, attempt start and suspects per job; cordon/drain per node.
// Every field survives a round trip, and an update that clears them clears them.
TEST_P(JobStoreConformanceTest, SchedulingPolicyStateRoundTripsAndClears) {
  NodeRecord node = SampleNode("node-d", 8);
  node.inventory.set_accelerator(loom::v1::ACCELERATOR_KIND_GH200);
  node.inventory.set_accelerator_memory_bytes(96LL << 30);
  node.inventory.set_host_memory_bytes(480LL << 30);
  node.inventory.set_superchip(true);
  node.inventory.set_cpu_arch("aarch64");
  node.inventory.set_topology_domain("nvl72-a");
  node.admin.set_cordoned(true);
  node.admin.set_draining(true);
  node.admin.set_reason("firmware");
  ASSERT_TRUE(store_->UpsertNode(node).ok());
  JobRecord job = SampleJob("job-policy", 40);
  job.rank_nodes = {"node-d"};
  job.phase = loom::v1::JOB_PHASE_RECOVERING;
  job.spec.set_queue("team-a-gpu");
  job.spec.set_priority(7);
  job.spec.set_max_infra_restarts(-1);
  job.state.set_preemptions(4);
  job.state.set_ready_timeouts(3);
  job.state.set_attempt_start_us(1700000005000000);
  job.state.set_not_before_us(1700000065000000);
  job.state.add_suspect_nodes("node-y");
  ASSERT_TRUE(store_->CreateJob(job).ok());

  absl::StatusOr<JobRecord> got = store_->GetJob("job-policy");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->state.preemptions(), 4);
  EXPECT_EQ(got->state.ready_timeouts(), 3);
  EXPECT_EQ(got->state.attempt_start_us(), 1700000005000000);
  EXPECT_EQ(got->state.not_before_us(), 1700000065000000);
  ASSERT_EQ(got->state.suspect_nodes_size(), 2);
  EXPECT_EQ(got->state.suspect_nodes(1), "node-y");
  EXPECT_EQ(got->spec.queue(), "team-a-gpu");
  EXPECT_EQ(got->spec.priority(), 7);
  EXPECT_EQ(got->spec.max_infra_restarts(), -1);
  absl::StatusOr<NodeRecord> n = store_->GetNode("node-d");
  ASSERT_TRUE(n.ok());
  EXPECT_TRUE(n->admin.draining());
  EXPECT_EQ(n->inventory.cpu_arch(), "aarch64");
  EXPECT_TRUE(n->inventory.superchip());
  EXPECT_EQ(n->inventory.accelerator_memory_bytes(), 96LL << 30);

  // The job is placed again: backoff and ready timeouts cleared, budgets kept.
  job.state.set_not_before_us(0);
  job.state.set_ready_timeouts(0);
  job.state.clear_suspect_nodes();
  job.phase = loom::v1::JOB_PHASE_STARTING;
  ASSERT_TRUE(store_->UpdateJob(job).ok());
  got = store_->GetJob("job-policy");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->state.not_before_us(), 0);
  EXPECT_EQ(got->state.ready_timeouts(), 0);
  EXPECT_EQ(got->state.suspect_nodes_size(), 0);
  EXPECT_EQ(got->state.infra_restarts(), 2);
  EXPECT_EQ(got->state.preemptions(), 4);
  node.admin.Clear();
  ASSERT_TRUE(store_->UpsertNode(node).ok());
  n = store_->GetNode("node-d");
  ASSERT_TRUE(n.ok());
  EXPECT_FALSE(n->admin.cordoned());
  EXPECT_FALSE(n->admin.draining());
  EXPECT_EQ(n->admin.reason(), "");
}

TEST_P(JobStoreConformanceTest, BatchesAreAllOrNothing) {
  ASSERT_TRUE(store_->UpsertNode(SampleNode("node-a", 4)).ok());
  std::vector<JobRecord> batch = {SampleJob("job-b1", 101), SampleJob("job-b2", 102)};
  for (JobRecord& j : batch) j.rank_nodes = {"node-a"};
  ASSERT_TRUE(store_->CreateJobs(batch).ok());
  // A batch whose last record clashes (sequence 101 is taken) stores nothing.
  std::vector<JobRecord> clash = {SampleJob("job-b3", 103), SampleJob("job-b4", 101)};
  for (JobRecord& j : clash) j.rank_nodes = {"node-a"};
  EXPECT_EQ(store_->CreateJobs(clash).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store_->GetJob("job-b3").status().code(), absl::StatusCode::kNotFound);
  // Updates: both or neither.
  batch[0].reason = "Placed";
  batch[1].reason = "Placed";
  ASSERT_TRUE(store_->UpdateJobs(batch).ok());
  absl::StatusOr<JobRecord> b2 = store_->GetJob("job-b2");
  ASSERT_TRUE(b2.ok()) << b2.status();
  EXPECT_EQ(b2->reason, "Placed");
  batch[0].reason = "Again";
  batch[1].id = "job-missing";
  EXPECT_EQ(store_->UpdateJobs(batch).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->GetJob("job-b1")->reason, "Placed");
  EXPECT_TRUE(store_->CreateJobs({}).ok());
  EXPECT_TRUE(store_->UpdateJobs({}).ok());
}

// The metric history: keyed rows, replaced on rewrite, listed per job in key order after a key,
// at most a limit; rows of other jobs never mix in.
TEST_P(JobStoreConformanceTest, MetricsAreKeyedReplacedAndPagedPerJob) {
  ASSERT_TRUE(store_->WriteMetrics({{"job-a", 4, "a4"}, {"job-a", 2, "a2"}, {"job-b", 3, "b3"},
                                    {"job-a", 3, "a3"}})
                  .ok());
  ASSERT_TRUE(store_->WriteMetrics({{"job-a", 3, "a3 again"}}).ok());
  ASSERT_TRUE(store_->WriteMetrics({}).ok());
  auto rows = [&](const std::string& job, int64_t after, int limit) {
    std::vector<std::string> out;
    absl::StatusOr<std::vector<MetricRow>> r = store_->ListMetrics(job, after, limit);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) {
      for (const MetricRow& m : *r) {
        EXPECT_EQ(m.job_id, job);
        out.push_back(absl::StrCat(m.key, ":", m.data));
      }
    }
    return out;
  };
  EXPECT_EQ(rows("job-a", -1, 10), (std::vector<std::string>{"2:a2", "3:a3 again", "4:a4"}));
  EXPECT_EQ(rows("job-a", 2, 1), (std::vector<std::string>{"3:a3 again"}));
  EXPECT_EQ(rows("job-a", 4, 10), (std::vector<std::string>{}));
  EXPECT_EQ(rows("job-b", -1, 10), (std::vector<std::string>{"3:b3"}));
  EXPECT_EQ(rows("job-c", -1, 10), (std::vector<std::string>{}));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->ListMetrics("job-a", -1, 0).status()));
}

}  // namespace
}  // namespace loom
