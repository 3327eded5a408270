// File: scheduler/scheduler_test_fixture.h (test only)
//
// The SchedulerTest fixture shared by scheduler_test.cc (API, placement, metrics),
// scheduler_failure_test.cc (rendezvous, rank failures, node liveness, hangs) and
// scheduler_recovery_test.cc (restarts, resume, retention): a Scheduler over an in-memory store
// with a fake clock and a metrics registry.
#ifndef LOOM_SCHEDULER_SCHEDULER_TEST_FIXTURE_H_
#define LOOM_SCHEDULER_SCHEDULER_TEST_FIXTURE_H_

#include "scheduler/scheduler.h"

#include <prometheus/registry.h>
#include <sys/stat.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "scheduler/fake_clock.h"
#include "scheduler/test_job_spec.h"
#include "storage/checkpoint/shard_format.h"
#include "storage/in_memory_job_store.h"
#include "storage/sqlite_job_store.h"

namespace loom {

using loom::v1::HeartbeatRequest;
using loom::v1::HeartbeatResponse;
using loom::v1::Job;
using loom::v1::RankState;
using loom::v1::RankStatus;

inline std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

// Value of the series of `name` whose labels include `label`=`value` (-1 if absent).
inline double MetricValue(prometheus::Registry& registry, const std::string& name,
                   const std::string& label = "", const std::string& value = "") {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      bool match = label.empty();
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == label && l.value == value) match = true;
      }
      if (!match) continue;
      if (family.type == prometheus::MetricType::Counter) return m.counter.value;
      if (family.type == prometheus::MetricType::Gauge) return m.gauge.value;
      if (family.type == prometheus::MetricType::Histogram) {
        return static_cast<double>(m.histogram.sample_count);
      }
    }
  }
  return -1;
}

// The sum over every series of `name` whose `label` is `value` (counters and gauges): for
// families whose closed label set is exported at 0 from the start (loom_job_phase_transitions_
// total), where MetricValue's first match may be another series.
inline double MetricSum(prometheus::Registry& registry, const std::string& name,
                        const std::string& label, const std::string& value) {
  double sum = 0;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name != label || l.value != value) continue;
        sum += family.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
      }
    }
  }
  return sum;
}

// Writes a committed checkpoint of `step` (every rank's shard + manifest) for `job`, through the
// storage library as a trainer would.
inline void WriteCommittedCheckpoint(const Job& job, int64_t step, int world_size) {
  for (int r = 0; r < world_size; ++r) {
    storage::ShardManifest m;
    m.step = step;
    m.rank = r;
    m.world_size = world_size;
    m.params.push_back({"w", {4}, 4, 0, 0});
    storage::AssignPartitionLayout(m);
    std::vector<float> data(m.section_numel, 1.0f);
    const float* sections[] = {data.data()};
    ASSERT_TRUE(storage::WriteShard(absl::StrCat(job.checkpoint_dir(), "/",
                                                 storage::StepDirName(step)),
                                    m, sections)
                    .ok());
  }
}

inline RankStatus Rank(const Job& job, int rank, RankState state, int port = 0) {
  RankStatus st;
  st.set_job_id(job.id());
  st.set_attempt(job.attempt());
  st.set_rank(rank);
  st.set_state(state);
  st.set_rendezvous_port(port);
  return st;
}

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.checkpoint_root = TmpDir() + "/ckpt";
    // The tests count heartbeat intervals against a 10 s timeout (the default is 40 s).
    options_.heartbeat_timeout = absl::Seconds(10);
    options_.validation.fortunes_dir = TmpDir() + "/fortunes";
    ASSERT_TRUE(MakeDirs(options_.validation.fortunes_dir).ok());
    // Restarts at once: these tests are about what a restart does (restart_test covers the
    // backoff before it).
    options_.restart_backoff_base = absl::ZeroDuration();
    store_ = std::make_unique<InMemoryJobStore>();
    Start();
  }

  // A new Scheduler over the SQLite file `db` (created if missing), as a restarted daemon: the
  // current scheduler and store are dropped first.
  void RestartOnSqlite(const std::string& db) {
    scheduler_.reset();
    store_.reset();
    absl::StatusOr<std::unique_ptr<SqliteJobStore>> sqlite = SqliteJobStore::Open(db);
    ASSERT_TRUE(sqlite.ok()) << sqlite.status();
    store_ = std::move(*sqlite);
    Start();
  }

  void Start() {
    registry_ = std::make_shared<prometheus::Registry>();
    metrics_ = std::make_unique<SchedulerMetrics>(*registry_);
    absl::StatusOr<std::unique_ptr<Scheduler>> s =
        Scheduler::Create(options_, store_.get(), &clock_, metrics_.get());
    ASSERT_TRUE(s.ok()) << s.status();
    scheduler_ = std::move(*s);
  }

  void Register(const std::string& node, int slots,
                loom::v1::AcceleratorKind kind = loom::v1::ACCELERATOR_KIND_CPU) {
    loom::v1::NodeInventory inv;
    inv.set_accelerator(kind);
    inv.set_slots(slots);
    inv.set_hostname(node);
    inv.set_address(absl::StrCat("addr-", node));
    absl::StatusOr<absl::Duration> interval = scheduler_->RegisterWorker(node, inv);
    ASSERT_TRUE(interval.ok()) << interval.status();
    EXPECT_EQ(*interval, absl::Seconds(1));
  }

  Job Submit(int ranks, int max_restarts = 0, int max_infra_restarts = 0) {
    loom::v1::JobSpec spec = TestJobSpecWithRanks(ranks);
    spec.set_max_restarts(max_restarts);
    spec.set_max_infra_restarts(max_infra_restarts);
    absl::StatusOr<Job> job = scheduler_->SubmitJob(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : Job();
  }

  // SubmitJobAsync as the gRPC API calls it (tenant "default", no request id), waited for:
  // `wait_for_capacity` false refuses a job the registered nodes could never hold.
  absl::StatusOr<Job> SubmitWaitingForAnswer(const loom::v1::JobSpec& spec,
                                             bool wait_for_capacity) {
    absl::Notification answered;
    absl::StatusOr<Job> out;
    scheduler_->SubmitJobAsync(
        spec, "", "default",
        [&](absl::StatusOr<Job> job, bool) {
          out = std::move(job);
          answered.Notify();
        },
        wait_for_capacity);
    answered.WaitForNotification();
    return out;
  }

  Job Get(const std::string& id) {
    absl::StatusOr<Job> job = scheduler_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : Job();
  }

  void Cycle() { ASSERT_TRUE(scheduler_->RunSchedulingCycle().ok()); }

  HeartbeatResponse Beat(const std::string& node, std::vector<RankStatus> ranks = {}) {
    HeartbeatRequest req;
    req.set_node_id(node);
    for (RankStatus& r : ranks) *req.add_ranks() = std::move(r);
    absl::StatusOr<HeartbeatResponse> resp = scheduler_->Heartbeat(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? *resp : HeartbeatResponse();
  }

  // Places a 2-rank job on node-a/node-b and drives it to RUNNING (rank 0 port 29500). With
  // `spare_node`, an idle node-c is registered too (somewhere to recover to).
  Job RunTwoRankJob(int max_restarts = 0, bool spare_node = false, int max_infra_restarts = 0) {
    Register("node-a", 1);
    Register("node-b", 1);
    if (spare_node) Register("node-c", 1);
    Job job = Submit(2, max_restarts, max_infra_restarts);
    Cycle();
    job = Get(job.id());
    Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500)});
    Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_RUNNING)});
    job = Get(job.id());
    EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_RUNNING);
    return job;
  }

  SchedulerOptions options_;
  FakeClock clock_;
  std::unique_ptr<JobStore> store_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<SchedulerMetrics> metrics_;
  std::unique_ptr<Scheduler> scheduler_;
};

}  // namespace loom

#endif  // LOOM_SCHEDULER_SCHEDULER_TEST_FIXTURE_H_
