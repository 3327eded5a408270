// scheduler_bench: control-plane throughput and scheduling-cycle latency (docs/benchmarks.md,
// "Scheduler"). Not a test.
//
//  (1) Submissions/s: a real in-process SchedulerServer (gRPC on loopback, SQLite in WAL mode
//      with synchronous=FULL, the production store) and --client_threads client threads, each
//      with its own channel, submitting --submissions jobs in total with unary SubmitJob calls.
//      The scheduling loop runs as in production (every 200 ms) with no workers registered.
//  (2) Cycle latency: the Scheduler core on its own SQLite file with --nodes simulated nodes
//      (8 h100 slots each, 16 nodes per topology domain, labels on every 4th node) and --jobs
//      pending jobs (1-16 ranks, 4 tenants in 4 queues with quotas and borrowing, priorities
//      0-3, some require_single_domain or a node_selector). Between cycles (untimed) fake workers
//      heartbeat every node, run what they were assigned, and finish --finish_fraction of the
//      running jobs; each cycle then places jobs into the freed slots. The first cycle (bulk
//      admission onto an empty cluster) is reported separately; p50/p99 are over the others.
//
// Last line: `scheduler_bench submissions_per_s=<x> cycle_p99_ms=<y>`.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/percentile.h"
#include "proto/job_service.grpc.pb.h"
#include "scheduler/fake_clock.h"
#include "scheduler/scheduler.h"
#include "scheduler/test_job_spec.h"
#include "services/scheduler/scheduler_server.h"
#include "storage/sqlite_job_store.h"

ABSL_FLAG(std::string, dir, "/tmp/loom_scheduler_bench",
          "Scratch directory for the SQLite files (recreated).");
ABSL_FLAG(int, client_threads, 8, "gRPC client threads for the submission benchmark.");
ABSL_FLAG(int, submissions, 8000, "Jobs submitted over gRPC in total.");
ABSL_FLAG(int, nodes, 1000, "Simulated nodes for the cycle benchmark.");
ABSL_FLAG(int, jobs, 10000, "Pending jobs for the cycle benchmark.");
ABSL_FLAG(int, cycles, 40, "Timed scheduling cycles after the first.");
ABSL_FLAG(double, finish_fraction, 0.03, "Running jobs that finish between cycles.");

namespace loom {
namespace {

double SubmissionsPerSecond(const std::string& dir) {
  SchedulerServerOptions options;
  options.db_path = dir + "/submit.db";
  options.scheduler.checkpoint_root = dir + "/checkpoints";
  options.scheduler.validation.fortunes_dir = dir + "/fortunes";
  options.scheduler.max_unfinished_jobs_per_tenant = 0;  // thousands of jobs of one tenant
  CHECK(MakeDirs(options.scheduler.validation.fortunes_dir).ok());
  absl::StatusOr<std::unique_ptr<SchedulerServer>> server = SchedulerServer::Start(options);
  CHECK(server.ok()) << server.status();
  const int threads = absl::GetFlag(FLAGS_client_threads);
  const int total = absl::GetFlag(FLAGS_submissions);
  const loom::v1::JobSpec spec = TestJobSpecWithRanks(2);
  std::atomic<int> next{0}, failures{0};
  // Warm up the channels and the server (not timed).
  std::vector<std::unique_ptr<loom::v1::JobService::Stub>> stubs;
  for (int t = 0; t < threads; ++t) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", t);  // distinct channels (separate HTTP/2 connections)
    stubs.push_back(loom::v1::JobService::NewStub(grpc::CreateCustomChannel(
        (*server)->grpc_address(), grpc::InsecureChannelCredentials(), args)));
    grpc::ClientContext ctx;
    loom::v1::ListJobsRequest req;
    req.set_page_size(1);
    loom::v1::ListJobsResponse resp;
    CHECK(stubs.back()->ListJobs(&ctx, req, &resp).ok());
  }
  const absl::Time start = absl::Now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      loom::v1::SubmitJobRequest req;
      *req.mutable_spec() = spec;
      while (true) {
        const int i = next.fetch_add(1);
        if (i >= total) break;
        req.set_request_id(absl::StrCat("bench-", i));
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        loom::v1::SubmitJobResponse resp;
        if (!stubs[t]->SubmitJob(&ctx, req, &resp).ok()) failures.fetch_add(1);
      }
    });
  }
  for (std::thread& w : workers) w.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  CHECK_EQ(failures.load(), 0) << "failed submissions";
  (*server)->Shutdown(absl::Seconds(2));
  const double rate = total / seconds;
  std::printf("submissions: %d jobs over gRPC from %d client threads in %.3f s = %.0f /s "
              "(SQLite WAL, synchronous=FULL)\n",
              total, threads, seconds, rate);
  return rate;
}

// Delegates to the real store and counts the job records written and the time spent writing.
class CountingStore final : public JobStore {
 public:
  explicit CountingStore(std::unique_ptr<JobStore> inner) : inner_(std::move(inner)) {}
  absl::Status CreateJob(const JobRecord& job) override { return Timed([&] { return inner_->CreateJob(job); }, 1); }
  absl::Status UpdateJob(const JobRecord& job) override { return Timed([&] { return inner_->UpdateJob(job); }, 1); }
  absl::Status CreateJobs(const std::vector<JobRecord>& jobs) override {
    return Timed([&] { return inner_->CreateJobs(jobs); }, jobs.size());
  }
  absl::Status UpdateJobs(const std::vector<JobRecord>& jobs) override {
    return Timed([&] { return inner_->UpdateJobs(jobs); }, jobs.size());
  }
  absl::StatusOr<JobRecord> GetJob(const std::string& id) override { return inner_->GetJob(id); }
  absl::StatusOr<std::vector<JobRecord>> ListJobs(loom::v1::JobPhase phase) override {
    return inner_->ListJobs(phase);
  }
  absl::Status UpsertNode(const NodeRecord& node) override { return inner_->UpsertNode(node); }
  absl::StatusOr<NodeRecord> GetNode(const std::string& id) override { return inner_->GetNode(id); }
  absl::StatusOr<std::vector<NodeRecord>> ListNodes() override { return inner_->ListNodes(); }
  absl::Status WriteMetrics(const std::vector<MetricRow>& rows) override {
    return inner_->WriteMetrics(rows);
  }
  absl::StatusOr<std::vector<MetricRow>> ListMetrics(const std::string& job_id, int64_t after,
                                                     int limit) override {
    return inner_->ListMetrics(job_id, after, limit);
  }

  void Reset() {
    records_ = 0;
    write_time_ = absl::ZeroDuration();
  }
  int64_t records() const { return records_; }
  absl::Duration write_time() const { return write_time_; }

 private:
  template <typename F>
  absl::Status Timed(F f, size_t n) {
    const absl::Time t0 = absl::Now();
    absl::Status s = f();
    write_time_ += absl::Now() - t0;
    records_ += static_cast<int64_t>(n);
    return s;
  }
  std::unique_ptr<JobStore> inner_;
  int64_t records_ = 0;  // the scheduler calls under its own lock: no race
  absl::Duration write_time_;
};

// A fake worker per node: runs what it is assigned, reports it, finishes what it is told.
struct FakeCluster {
  Scheduler* scheduler;
  std::vector<std::string> nodes;
  std::map<std::string, std::map<std::pair<std::string, int>, loom::v1::RankStatus>> ranks;

  void BeatAll() {
    for (const std::string& node : nodes) {
      auto& mine = ranks[node];
      loom::v1::HeartbeatRequest req;
      req.set_node_id(node);
      for (const auto& [key, st] : mine) *req.add_ranks() = st;
      absl::StatusOr<loom::v1::HeartbeatResponse> resp = scheduler->Heartbeat(req);
      CHECK(resp.ok()) << resp.status();
      for (auto it = mine.begin(); it != mine.end();) {
        const auto s = it->second.state();
        it = (s == loom::v1::RANK_STATE_STOPPED || s == loom::v1::RANK_STATE_SUCCEEDED)
                 ? mine.erase(it)
                 : std::next(it);
      }
      for (const auto& stop : resp->stop()) {
        for (auto& [key, st] : mine) {
          if (st.job_id() == stop.job_id()) st.set_state(loom::v1::RANK_STATE_STOPPED);
        }
      }
      for (const auto& a : resp->start()) {
        loom::v1::RankStatus st;
        st.set_job_id(a.job_id());
        st.set_attempt(a.attempt());
        st.set_rank(a.rank());
        st.set_state(loom::v1::RANK_STATE_RUNNING);
        if (a.rank() == 0) st.set_rendezvous_port(29500);
        mine[{a.job_id(), a.rank()}] = st;
      }
    }
  }

  // Marks `fraction` of the running jobs' ranks SUCCEEDED (reported in the next BeatAll).
  void Finish(double fraction, std::mt19937_64& rng) {
    absl::StatusOr<std::vector<loom::v1::Job>> running =
        scheduler->ListJobs(loom::v1::JOB_PHASE_RUNNING);
    CHECK(running.ok());
    std::vector<std::string> ids;
    for (const auto& j : *running) ids.push_back(j.id());
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(static_cast<size_t>(fraction * static_cast<double>(ids.size()) + 0.5));
    std::set<std::string> done(ids.begin(), ids.end());
    for (auto& [node, mine] : ranks) {
      for (auto& [key, st] : mine) {
        if (done.count(key.first)) st.set_state(loom::v1::RANK_STATE_SUCCEEDED);
      }
    }
  }
};

double CycleP99(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<SqliteJobStore>> sqlite = SqliteJobStore::Open(dir + "/cycle.db");
  CHECK(sqlite.ok()) << sqlite.status();
  auto counting = std::make_unique<CountingStore>(std::move(*sqlite));
  CountingStore* store = counting.get();
  SchedulerOptions options;
  options.checkpoint_root = dir + "/checkpoints";
  options.validation.fortunes_dir = dir + "/fortunes";
  options.heartbeat_timeout = absl::Hours(1);
  options.max_unfinished_jobs_per_tenant = 0;  // --jobs pending jobs over four tenants
  absl::StatusOr<QueuesConfig> queues = ParseQueuesConfig(
      "tenants: {t0: {weight: 2}}\n"
      "queues:\n"
      "  - {name: q0, tenant: t0, quota: {h100: 3000}, borrowing_limit: {h100: 1000}}\n"
      "  - {name: q1, tenant: t1, quota: {h100: 2000}, borrowing_limit: {h100: 1000}}\n"
      "  - {name: q2, tenant: t2, quota: {h100: 2000}}\n"
      "  - {name: q3, tenant: t3}\n");
  CHECK(queues.ok()) << queues.status();
  options.queues = *queues;
  FakeClock clock;
  absl::StatusOr<std::unique_ptr<Scheduler>> scheduler =
      Scheduler::Create(options, store, &clock, nullptr);
  CHECK(scheduler.ok()) << scheduler.status();
  FakeCluster cluster{scheduler->get(), {}, {}};
  const int num_nodes = absl::GetFlag(FLAGS_nodes);
  for (int i = 0; i < num_nodes; ++i) {
    const std::string id = absl::StrFormat("node-%05d", i);
    loom::v1::NodeInventory inv;
    inv.set_accelerator(loom::v1::ACCELERATOR_KIND_H100);
    inv.set_slots(8);
    inv.set_accelerator_memory_bytes(80LL << 30);
    inv.set_host_memory_bytes(2048LL << 30);
    inv.set_cpu_arch("x86_64");
    inv.set_topology_domain(absl::StrCat("rack-", i / 16));
    if (i % 4 == 0) (*inv.mutable_labels())["ib"] = "ndr";
    CHECK((*scheduler)->RegisterWorker(id, inv).ok());
    cluster.nodes.push_back(id);
  }
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<int> ranks_dist(1, 16), prio(0, 3), tenant(0, 3), pct(0, 99);
  const int num_jobs = absl::GetFlag(FLAGS_jobs);
  loom::v1::JobSpec base = TestJobSpecWithRanks(1);
  base.mutable_resources()->set_accelerator(loom::v1::ACCELERATOR_KIND_H100);
  const absl::Time submit_start = absl::Now();
  for (int j = 0; j < num_jobs; ++j) {
    loom::v1::JobSpec spec = base;
    spec.mutable_resources()->set_num_ranks(ranks_dist(rng));
    spec.set_priority(prio(rng));
    const int t = tenant(rng);
    spec.set_queue(absl::StrCat("q", t));
    const int p = pct(rng);
    if (p < 10) spec.mutable_resources()->set_require_single_domain(true);
    if (p >= 10 && p < 15) (*spec.mutable_resources()->mutable_node_selector())["ib"] = "ndr";
    CHECK((*scheduler)->SubmitJob(spec, "", nullptr, absl::StrCat("t", t)).ok());
  }
  std::printf("cycle setup: %d nodes x 8 h100 slots (%d domains), %d pending jobs submitted "
              "in-process in %.2f s\n",
              num_nodes, (num_nodes + 15) / 16, num_jobs,
              absl::ToDoubleSeconds(absl::Now() - submit_start));
  auto timed_cycle = [&]() {
    const absl::Time t0 = absl::Now();
    CHECK((*scheduler)->RunSchedulingCycle().ok());
    return absl::ToDoubleMilliseconds(absl::Now() - t0);
  };
  const double first_ms = timed_cycle();
  absl::StatusOr<std::vector<loom::v1::Job>> starting =
      (*scheduler)->ListJobs(loom::v1::JOB_PHASE_STARTING);
  CHECK(starting.ok());
  std::printf("first cycle (bulk admission onto the empty cluster): %.1f ms, %zu jobs placed\n",
              first_ms, starting->size());
  std::vector<double> samples, store_ms;
  int64_t records = 0;
  const int cycles = absl::GetFlag(FLAGS_cycles);
  int64_t placed_total = 0;
  for (int c = 0; c < cycles; ++c) {
    clock.Advance(absl::Seconds(1));
    cluster.BeatAll();  // start assigned rank 0s
    cluster.BeatAll();  // rank 0 ports known: the other ranks start
    cluster.BeatAll();  // all running
    cluster.Finish(absl::GetFlag(FLAGS_finish_fraction), rng);
    cluster.BeatAll();  // report the finished ones: their slots are free
    absl::StatusOr<std::vector<loom::v1::Job>> before =
        (*scheduler)->ListJobs(loom::v1::JOB_PHASE_STARTING);
    store->Reset();
    samples.push_back(timed_cycle());
    store_ms.push_back(absl::ToDoubleMilliseconds(store->write_time()));
    records += store->records();
    absl::StatusOr<std::vector<loom::v1::Job>> after =
        (*scheduler)->ListJobs(loom::v1::JOB_PHASE_STARTING);
    placed_total += static_cast<int64_t>(after->size()) - static_cast<int64_t>(before->size());
  }
  absl::StatusOr<std::vector<loom::v1::Job>> pending =
      (*scheduler)->ListJobs(loom::v1::JOB_PHASE_PENDING);
  const double p50 = Percentile(samples, 0.50), p99 = Percentile(samples, 0.99);
  std::printf("steady cycles: %d, %lld jobs placed in them, %zu still pending at the end; "
              "cycle p50 %.2f ms, p99 %.2f ms, max %.2f ms\n",
              cycles, static_cast<long long>(placed_total), pending->size(), p50, p99,
              *std::max_element(samples.begin(), samples.end()));
  std::printf("  of which store writes (one transaction per cycle): p50 %.2f ms, p99 %.2f ms; "
              "%.1f job records written per cycle on average\n",
              Percentile(store_ms, 0.5), Percentile(store_ms, 0.99),
              static_cast<double>(records) / cycles);
  return p99;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_minloglevel = 2;  // errors only: the scheduler logs every placement at INFO
  const std::string dir = absl::GetFlag(FLAGS_dir);
  std::system(absl::StrCat("rm -rf '", dir, "'").c_str());
  CHECK(loom::MakeDirs(dir).ok());
  const double rate = loom::SubmissionsPerSecond(dir);
  const double p99 = loom::CycleP99(dir);
  std::system(absl::StrCat("rm -rf '", dir, "'").c_str());
  std::printf("scheduler_bench submissions_per_s=%.0f cycle_p99_ms=%.2f\n", rate, p99);
  return 0;
}
