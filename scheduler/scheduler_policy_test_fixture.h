// File: scheduler/scheduler_policy_test_fixture.h (test only)
//
// The PolicyTest fixture shared by scheduler_policy_test.cc (ordering, quotas, backfill,
// topology, preemption) and scheduler_budget_test.cc (gang-ready timeouts, restart budgets,
// drain, durability, group commit): a Scheduler over an in-memory store with a fake clock and
// fake workers that run what they are told.
#ifndef LOOM_SCHEDULER_SCHEDULER_POLICY_TEST_FIXTURE_H_
#define LOOM_SCHEDULER_SCHEDULER_POLICY_TEST_FIXTURE_H_

#include <map>
#include <set>
#include <thread>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "scheduler/fake_clock.h"
#include "scheduler/scheduler.h"
#include "scheduler/test_job_spec.h"
#include "storage/in_memory_job_store.h"
#include "storage/sqlite_job_store.h"

namespace loom {

using loom::v1::HeartbeatResponse;
using loom::v1::Job;
using loom::v1::RankStatus;

inline std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

class PolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.checkpoint_root = TmpDir() + "/ckpt";
    // The tests count heartbeat intervals against a 10 s timeout (the default is 40 s).
    options_.heartbeat_timeout = absl::Seconds(10);
    // Restarts at once (restart_test covers the backoff before them).
    options_.restart_backoff_base = absl::ZeroDuration();
    options_.validation.fortunes_dir = TmpDir() + "/fortunes";
    ASSERT_TRUE(MakeDirs(options_.validation.fortunes_dir).ok());
    store_ = std::make_unique<InMemoryJobStore>();
    Start();
  }

  void Start() {
    absl::StatusOr<std::unique_ptr<Scheduler>> s =
        Scheduler::Create(options_, store_.get(), &clock_, nullptr);
    ASSERT_TRUE(s.ok()) << s.status();
    scheduler_ = std::move(*s);
  }

  void UseQueues(const std::string& yaml) {
    absl::StatusOr<QueuesConfig> c = ParseQueuesConfig(yaml);
    ASSERT_TRUE(c.ok()) << c.status();
    options_.queues = *c;
    scheduler_.reset();
    Start();
  }

  void Register(const std::string& node, int slots, const std::string& domain = "",
                std::map<std::string, std::string> labels = {}) {
    loom::v1::NodeInventory inv;
    inv.set_accelerator(loom::v1::ACCELERATOR_KIND_CPU);
    inv.set_slots(slots);
    inv.set_address(node);
    inv.set_topology_domain(domain);
    inv.set_cpu_arch("x86_64");
    for (const auto& [k, v] : labels) (*inv.mutable_labels())[k] = v;
    absl::StatusOr<absl::Duration> r = scheduler_->RegisterWorker(node, inv);
    ASSERT_TRUE(r.ok()) << r.status();
  }

  static loom::v1::JobSpec Spec(int ranks, int priority = 0, const std::string& queue = "") {
    loom::v1::JobSpec spec = TestJobSpecWithRanks(ranks);
    spec.set_priority(priority);
    spec.set_queue(queue);
    return spec;
  }

  std::string Submit(const loom::v1::JobSpec& spec, const std::string& tenant = "default") {
    absl::StatusOr<Job> job = scheduler_->SubmitJob(spec, "", nullptr, tenant);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  }

  Job Get(const std::string& id) {
    absl::StatusOr<Job> job = scheduler_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : Job();
  }
  loom::v1::JobPhase Phase(const std::string& id) { return Get(id).phase(); }

  void Cycle() { ASSERT_TRUE(scheduler_->RunSchedulingCycle().ok()); }

  // A fake worker per node: it runs what it is told to start (RUNNING at once, rank 0 with a
  // rendezvous port), reports every rank it runs in each heartbeat, and stops what it is told
  // to stop (reported STOPPED once, then forgotten).
  HeartbeatResponse WorkerBeat(const std::string& node) {
    std::map<std::pair<std::string, int>, RankStatus>& ranks = workers_[node];
    loom::v1::HeartbeatRequest req;
    req.set_node_id(node);
    for (const auto& [key, st] : ranks) *req.add_ranks() = st;
    absl::StatusOr<HeartbeatResponse> resp = scheduler_->Heartbeat(req);
    EXPECT_TRUE(resp.ok()) << node << ": " << resp.status();
    for (auto it = ranks.begin(); it != ranks.end();) {
      it = it->second.state() == loom::v1::RANK_STATE_STOPPED ? ranks.erase(it) : std::next(it);
    }
    if (!resp.ok()) return HeartbeatResponse();
    for (const loom::v1::RankAssignment& stop : resp->stop()) {
      for (auto& [key, st] : ranks) {
        if (st.job_id() == stop.job_id() && st.attempt() == stop.attempt()) {
          st.set_state(loom::v1::RANK_STATE_STOPPED);
        }
      }
    }
    for (const loom::v1::RankAssignment& a : resp->start()) {
      RankStatus st;
      st.set_job_id(a.job_id());
      st.set_attempt(a.attempt());
      st.set_rank(a.rank());
      st.set_state(start_running_ ? loom::v1::RANK_STATE_RUNNING : loom::v1::RANK_STATE_STARTING);
      if (a.rank() == 0) st.set_rendezvous_port(29500);
      ranks[{a.job_id(), a.rank()}] = st;
    }
    return *resp;
  }

  // Heartbeats from every node, then a cycle; `rounds` times.
  void Settle(int rounds = 3) {
    for (int r = 0; r < rounds; ++r) {
      for (const auto& node : Nodes()) WorkerBeat(node);
      Cycle();
    }
  }

  std::vector<std::string> Nodes() {
    std::vector<std::string> out;
    absl::StatusOr<std::vector<loom::v1::NodeInfo>> nodes = scheduler_->ListNodes();
    EXPECT_TRUE(nodes.ok());
    for (const auto& n : *nodes) {
      if (n.live()) out.push_back(n.node_id());
    }
    return out;
  }

  // Sets rank 0's reported progress of `job_id` (on whichever node runs it).
  void SetProgress(const std::string& job_id, int64_t step, int64_t checkpoint_step) {
    for (auto& [node, ranks] : workers_) {
      auto it = ranks.find({job_id, 0});
      if (it == ranks.end()) continue;
      it->second.mutable_progress()->set_step(step);
      it->second.mutable_progress()->set_last_checkpoint_step(checkpoint_step);
    }
  }

  // Ends every rank of `job_id` successfully.
  void Finish(const std::string& job_id) {
    for (auto& [node, ranks] : workers_) {
      for (auto& [key, st] : ranks) {
        if (key.first == job_id) st.set_state(loom::v1::RANK_STATE_SUCCEEDED);
      }
    }
    for (const auto& node : Nodes()) WorkerBeat(node);
    for (auto& [node, ranks] : workers_) {
      for (auto it = ranks.begin(); it != ranks.end();) {
        it = it->first.first == job_id ? ranks.erase(it) : std::next(it);
      }
    }
  }

  SchedulerOptions options_;
  FakeClock clock_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<Scheduler> scheduler_;
  std::map<std::string, std::map<std::pair<std::string, int>, RankStatus>> workers_;
  bool start_running_ = true;
};

}  // namespace loom

#endif  // LOOM_SCHEDULER_SCHEDULER_POLICY_TEST_FIXTURE_H_
