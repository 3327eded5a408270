// control_plane_loadgen: the load side of the control-plane benchmark (docs/benchmarks.md,
// "Control plane at cluster scale"; bench/control_plane_bench.py runs it against a real
// loom-scheduler daemon in another process). Not a test.
//
// What it does, over real gRPC to --scheduler:
//   1. Registers --nodes simulated worker nodes (8 H100 slots each, 16 nodes per topology
//      domain), as loom-worker does.
//   2. Heartbeats every node every --interval_ms from --heartbeat_threads threads (each thread
//      owns a contiguous share of the nodes and one gRPC channel; node start times are spread
//      over the first interval). A simulated node runs what the heartbeat reply assigns: rank 0
//      reports a rendezvous port at once, every rank reports RUNNING with a step that advances by
//      one per heartbeat, and ends SUCCEEDED after a per-job run time drawn from
//      [--min_run_s, --max_run_s] (a hash of the job id, so all ranks of a job agree); stop
//      entries end the attempt's local ranks (STOPPED). NOT_FOUND (the scheduler forgot the
//      node: it was declared lost) is counted and the node registers again.
//   3. Fills the queue with --prefill jobs from --submit_threads threads (1-16 ranks, priorities
//      0-3; durable: SubmitJob returns after the commit).
//   4. Measures for --duration_s: every heartbeat's round-trip latency, and the latency of
//      --submit_rate submissions per second from one paced client.
// Pacing is by the wall clock (SleepUntil a heartbeat's due time); a heartbeat sent more than one
// interval after its due time is counted as "late", meaning this generator, not the scheduler,
// fell behind, and the run is reported as invalid.
//
// Last line (stdout):
//   loadgen nodes=<n> heartbeats=<k> heartbeat_p50_ms=<> heartbeat_p99_ms=<> heartbeat_max_ms=<>
//   late_heartbeats=<> heartbeat_errors=<> not_found=<> submits=<> submit_p50_ms=<>
//   submit_p99_ms=<> submit_errors=<> prefill_per_s=<> window_start_us=<> window_end_us=<>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/percentile.h"
#include "proto/job_service.grpc.pb.h"
#include "proto/worker_service.grpc.pb.h"
#include "scheduler/test_job_spec.h"

ABSL_FLAG(std::string, scheduler, "", "loom-scheduler's gRPC address (host:port), required.");
ABSL_FLAG(int, nodes, 2000, "Simulated worker nodes.");
ABSL_FLAG(int, slots_per_node, 8, "H100 rank slots per node.");
ABSL_FLAG(int, heartbeat_threads, 64, "Threads sending heartbeats (one gRPC channel each).");
ABSL_FLAG(int, interval_ms, 1000, "Heartbeat interval of every node.");
ABSL_FLAG(int, prefill, 20000, "Jobs submitted before the measurement window.");
ABSL_FLAG(int, submit_threads, 8, "Client threads for the prefill.");
ABSL_FLAG(double, submit_rate, 20, "Submissions per second during the measurement window.");
ABSL_FLAG(int, warmup_s, 10, "Seconds of heartbeats after the prefill before measuring.");
ABSL_FLAG(int, duration_s, 60, "Length of the measurement window in seconds.");
ABSL_FLAG(int, min_run_s, 20, "Shortest simulated job run time in seconds.");
ABSL_FLAG(int, max_run_s, 90, "Longest simulated job run time in seconds.");

namespace loom {
namespace {

using loom::v1::RankState;

std::shared_ptr<grpc::Channel> NewChannel(const std::string& target, int id) {
  grpc::ChannelArguments args;
  args.SetInt("grpc.channel_id", id);  // distinct channels: separate HTTP/2 connections
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

// One rank a simulated node runs.
struct SimRank {
  loom::v1::RankStatus status;
  absl::Time started;
  absl::Duration run;
};

// A simulated worker node: its ranks, keyed by (job, attempt, rank).
struct SimNode {
  std::string id;
  loom::v1::NodeInventory inventory;
  std::map<std::tuple<std::string, int, int>, SimRank> ranks;
  absl::Time due;
};

struct Shared {
  // The measurement window in Unix microseconds (read by every heartbeat thread).
  std::atomic<int64_t> window_start_us{INT64_MAX};
  std::atomic<int64_t> window_end_us{INT64_MAX};
  std::atomic<bool> stop{false};
  std::atomic<int64_t> late{0}, errors{0}, not_found{0}, heartbeats{0};
  std::mutex mu;
  std::vector<double> heartbeat_ms;  // inside the window only
};

absl::Duration RunTime(const std::string& job_id) {
  const int lo = absl::GetFlag(FLAGS_min_run_s), hi = absl::GetFlag(FLAGS_max_run_s);
  const size_t h = std::hash<std::string>{}(job_id);
  return absl::Seconds(lo + static_cast<int>(h % static_cast<size_t>(std::max(1, hi - lo + 1))));
}

bool Register(loom::v1::WorkerService::Stub& stub, const SimNode& node) {
  loom::v1::RegisterWorkerRequest req;
  req.set_node_id(node.id);
  *req.mutable_inventory() = node.inventory;
  loom::v1::RegisterWorkerResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  // As a worker daemon keeps trying to register: a channel whose first connect failed (seen
  // once at 4,000 nodes: one of the 64 channels, "failed to connect to all addresses") retries
  // within the deadline instead of failing every node on it.
  ctx.set_wait_for_ready(true);
  const grpc::Status s = stub.RegisterWorker(&ctx, req, &resp);
  if (!s.ok()) std::fprintf(stderr, "RegisterWorker %s: %s\n", node.id.c_str(), s.error_message().c_str());
  return s.ok();
}

// One heartbeat of `node`: report, then apply the reply.
void Beat(loom::v1::WorkerService::Stub& stub, SimNode& node, Shared& shared) {
  const absl::Time now = absl::Now();
  loom::v1::HeartbeatRequest req;
  req.set_node_id(node.id);
  for (auto& [key, r] : node.ranks) {
    loom::v1::RankStatus& st = r.status;
    if (st.state() == loom::v1::RANK_STATE_RUNNING) {
      const int64_t step = absl::ToInt64Seconds(now - r.started) + 1;
      st.mutable_progress()->set_step(step);
      st.set_last_step_time_us(absl::ToUnixMicros(now));
      if (now - r.started >= r.run) {
        st.set_state(loom::v1::RANK_STATE_SUCCEEDED);
        st.set_exit_time_us(absl::ToUnixMicros(now));
      }
    }
    *req.add_ranks() = st;
  }
  loom::v1::HeartbeatResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  const absl::Time sent = absl::Now();
  const grpc::Status s = stub.Heartbeat(&ctx, req, &resp);
  const absl::Time got = absl::Now();
  shared.heartbeats.fetch_add(1);
  const int64_t sent_us = absl::ToUnixMicros(sent);
  if (sent_us >= shared.window_start_us.load() && sent_us < shared.window_end_us.load()) {
    std::lock_guard<std::mutex> lock(shared.mu);
    shared.heartbeat_ms.push_back(absl::ToDoubleMilliseconds(got - sent));
  }
  if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
    shared.not_found.fetch_add(1);
    node.ranks.clear();  // the scheduler failed them with the node
    (void)Register(stub, node);
    return;
  }
  if (!s.ok()) {
    shared.errors.fetch_add(1);
    return;
  }
  // Reported final states were delivered: forget those ranks.
  for (auto it = node.ranks.begin(); it != node.ranks.end();) {
    const RankState st = it->second.status.state();
    it = (st == loom::v1::RANK_STATE_SUCCEEDED || st == loom::v1::RANK_STATE_STOPPED)
             ? node.ranks.erase(it)
             : std::next(it);
  }
  for (const loom::v1::RankAssignment& stop : resp.stop()) {
    for (auto& [key, r] : node.ranks) {
      if (r.status.job_id() == stop.job_id() && r.status.attempt() == stop.attempt()) {
        r.status.set_state(loom::v1::RANK_STATE_STOPPED);
        r.status.set_graceful_stop(stop.graceful_stop());
        r.status.set_exit_time_us(absl::ToUnixMicros(got));
      }
    }
  }
  for (const loom::v1::RankAssignment& a : resp.start()) {
    auto key = std::make_tuple(a.job_id(), a.attempt(), a.rank());
    if (node.ranks.count(key)) continue;  // re-sent until reported
    SimRank r;
    r.status.set_job_id(a.job_id());
    r.status.set_attempt(a.attempt());
    r.status.set_rank(a.rank());
    r.status.set_state(loom::v1::RANK_STATE_RUNNING);
    if (a.rank() == 0) r.status.set_rendezvous_port(29500);
    r.started = got;
    r.run = RunTime(a.job_id());
    node.ranks.emplace(std::move(key), std::move(r));
  }
}

void HeartbeatThread(const std::string& target, int id, std::vector<SimNode>* nodes,
                     Shared* shared) {
  auto stub = loom::v1::WorkerService::NewStub(NewChannel(target, id));
  const absl::Duration interval = absl::Milliseconds(absl::GetFlag(FLAGS_interval_ms));
  while (!shared->stop.load()) {
    // The node due first (a thread owns at most a few hundred nodes: a linear scan is cheap).
    SimNode* next = &(*nodes)[0];
    for (SimNode& n : *nodes) {
      if (n.due < next->due) next = &n;
    }
    const absl::Time now = absl::Now();
    if (next->due > now) {
      absl::SleepFor(std::min(next->due - now, absl::Milliseconds(100)));  // pacing, not sync
      continue;
    }
    if (now - next->due > interval) shared->late.fetch_add(1);
    next->due += interval;
    if (next->due < now) next->due = now + interval;
    Beat(*stub, *next, *shared);
  }
}

// Writes a job spec into `spec` in place (one copy of the template, as a client fills its
// request once).
void FillSpec(std::mt19937_64& rng, loom::v1::JobSpec* spec) {
  static const loom::v1::JobSpec base = [] {
    loom::v1::JobSpec s = TestJobSpecWithRanks(1);
    s.mutable_resources()->set_accelerator(loom::v1::ACCELERATOR_KIND_H100);
    return s;
  }();
  std::uniform_int_distribution<int> ranks(1, 16), prio(0, 3);
  *spec = base;
  spec->mutable_resources()->set_num_ranks(ranks(rng));
  spec->set_priority(prio(rng));
}

// Submits one job with a spec from FillSpec; returns the latency in ms, or a negative value on
// error.
double SubmitOne(loom::v1::JobService::Stub& stub, std::mt19937_64& rng,
                 const std::string& request_id) {
  loom::v1::SubmitJobRequest req;
  FillSpec(rng, req.mutable_spec());
  req.set_request_id(request_id);
  loom::v1::SubmitJobResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  const absl::Time t0 = absl::Now();
  const grpc::Status s = stub.SubmitJob(&ctx, req, &resp);
  if (!s.ok()) {
    std::fprintf(stderr, "SubmitJob: %s\n", s.error_message().c_str());
    return -1;
  }
  return absl::ToDoubleMilliseconds(absl::Now() - t0);
}

// Submission throughput alone (--nodes=0): --prefill durable submissions from --submit_threads
// clients, each with its own channel, as fast as they go; the scheduler runs no nodes.
int SubmitOnly(const std::string& target) {
  const int total = absl::GetFlag(FLAGS_prefill);
  const int threads = std::max(1, absl::GetFlag(FLAGS_submit_threads));
  std::vector<std::unique_ptr<loom::v1::JobService::Stub>> stubs;
  for (int t = 0; t < threads; ++t) {
    stubs.push_back(loom::v1::JobService::NewStub(NewChannel(target, 2000 + t)));
    std::mt19937_64 rng(1);
    // Warm each channel (connection set-up is not a submission): one job each, not counted.
    if (SubmitOne(*stubs.back(), rng, absl::StrCat("warm-", t)) < 0) return 1;
  }
  std::atomic<int> next{0}, errors{0};
  std::vector<std::vector<double>> ms(static_cast<size_t>(threads));
  const absl::Time t0 = absl::Now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<uint64_t>(t) + 1);
      for (int i = next.fetch_add(1); i < total; i = next.fetch_add(1)) {
        const double m = SubmitOne(*stubs[static_cast<size_t>(t)], rng,
                                   absl::StrCat("submit-", i));
        if (m < 0) errors.fetch_add(1); else ms[static_cast<size_t>(t)].push_back(m);
      }
    });
  }
  for (auto& th : ts) th.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  std::vector<double> all;
  for (const auto& v : ms) all.insert(all.end(), v.begin(), v.end());
  std::printf("loadgen nodes=0 submits=%zu submit_errors=%d submit_threads=%d seconds=%.3f "
              "submit_per_s=%.1f submit_p50_ms=%.2f submit_p99_ms=%.2f\n",
              all.size(), errors.load(), threads, seconds, static_cast<double>(all.size()) / seconds,
              Percentile(all, 0.5), Percentile(all, 0.99));
  return errors.load() == 0 ? 0 : 1;
}

int Main() {
  const std::string target = absl::GetFlag(FLAGS_scheduler);
  if (target.empty()) {
    std::fprintf(stderr, "control_plane_loadgen: --scheduler: required (host:port)\n");
    return 2;
  }
  const int num_nodes = absl::GetFlag(FLAGS_nodes);
  if (num_nodes < 0 || absl::GetFlag(FLAGS_interval_ms) < 1 || absl::GetFlag(FLAGS_duration_s) < 1 ||
      absl::GetFlag(FLAGS_prefill) < 0) {
    std::fprintf(stderr, "control_plane_loadgen: --nodes and --prefill must be >= 0, "
                         "--interval_ms and --duration_s >= 1\n");
    return 2;
  }
  if (num_nodes == 0) return SubmitOnly(target);
  const int threads = std::max(1, std::min(absl::GetFlag(FLAGS_heartbeat_threads), num_nodes));
  const absl::Duration interval = absl::Milliseconds(absl::GetFlag(FLAGS_interval_ms));

  // 1. Nodes, split into one contiguous share per heartbeat thread.
  std::vector<std::vector<SimNode>> shares(static_cast<size_t>(threads));
  for (int i = 0; i < num_nodes; ++i) {
    SimNode n;
    n.id = absl::StrFormat("sim-%05d", i);
    loom::v1::NodeInventory& inv = n.inventory;
    inv.set_accelerator(loom::v1::ACCELERATOR_KIND_H100);
    inv.set_slots(absl::GetFlag(FLAGS_slots_per_node));
    inv.set_accelerator_memory_bytes(80LL << 30);
    inv.set_host_memory_bytes(2048LL << 30);
    inv.set_cpu_arch("x86_64");
    inv.set_hostname(n.id);
    inv.set_address("127.0.0.1");
    inv.set_topology_domain(absl::StrCat("rack-", i / 16));
    shares[static_cast<size_t>(i % threads)].push_back(std::move(n));
  }
  const absl::Time t_register = absl::Now();
  {
    std::vector<std::thread> ts;
    std::atomic<int> failed{0};
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        auto stub = loom::v1::WorkerService::NewStub(NewChannel(target, 1000 + t));
        for (SimNode& n : shares[static_cast<size_t>(t)]) {
          if (!Register(*stub, n)) failed.fetch_add(1);
        }
      });
    }
    for (auto& th : ts) th.join();
    if (failed.load() > 0) {
      std::fprintf(stderr, "control_plane_loadgen: %d registrations failed\n", failed.load());
      return 1;
    }
  }
  std::printf("registered %d nodes in %.2f s\n", num_nodes,
              absl::ToDoubleSeconds(absl::Now() - t_register));

  // 2. Heartbeats, spread over the first interval.
  Shared shared;
  const absl::Time beat_start = absl::Now();
  for (int t = 0; t < threads; ++t) {
    auto& share = shares[static_cast<size_t>(t)];
    for (size_t k = 0; k < share.size(); ++k) {
      const int global = static_cast<int>(k) * threads + t;
      share[k].due = beat_start + interval * global / num_nodes;
    }
  }
  std::vector<std::thread> beaters;
  for (int t = 0; t < threads; ++t) {
    beaters.emplace_back(HeartbeatThread, target, t, &shares[static_cast<size_t>(t)], &shared);
  }

  // 3. Prefill.
  const int prefill = absl::GetFlag(FLAGS_prefill);
  const int submit_threads = std::max(1, absl::GetFlag(FLAGS_submit_threads));
  std::atomic<int> next{0}, prefill_errors{0};
  const absl::Time t_prefill = absl::Now();
  {
    std::vector<std::thread> ts;
    for (int t = 0; t < submit_threads; ++t) {
      ts.emplace_back([&, t] {
        auto stub = loom::v1::JobService::NewStub(NewChannel(target, 2000 + t));
        std::mt19937_64 rng(static_cast<uint64_t>(t) + 1);
        for (int i = next.fetch_add(1); i < prefill; i = next.fetch_add(1)) {
          if (SubmitOne(*stub, rng, absl::StrCat("prefill-", i)) < 0) {
            prefill_errors.fetch_add(1);
          }
        }
      });
    }
    for (auto& th : ts) th.join();
  }
  const double prefill_s = absl::ToDoubleSeconds(absl::Now() - t_prefill);
  const double prefill_per_s = prefill > 0 ? prefill / prefill_s : 0;
  std::printf("prefill: %d jobs in %.2f s (%.0f/s durable, %d errors) while %d nodes heartbeat\n",
              prefill, prefill_s, prefill_per_s, prefill_errors.load(), num_nodes);
  std::fflush(stdout);

  // 4. Warm-up, then the window.
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_warmup_s)));
  const int64_t late_before = shared.late.load(), errors_before = shared.errors.load(),
                nf_before = shared.not_found.load(), beats_before = shared.heartbeats.load();
  const absl::Time window_start = absl::Now();
  const absl::Time window_end = window_start + absl::Seconds(absl::GetFlag(FLAGS_duration_s));
  shared.window_end_us.store(absl::ToUnixMicros(window_end));
  shared.window_start_us.store(absl::ToUnixMicros(window_start));
  std::vector<double> submit_ms;
  int submit_errors = 0;
  {
    auto stub = loom::v1::JobService::NewStub(NewChannel(target, 3000));
    std::mt19937_64 rng(99);
    const double rate = absl::GetFlag(FLAGS_submit_rate);
    absl::Time due = window_start;
    int i = 0;
    while (absl::Now() < window_end) {
      if (rate <= 0) {
        absl::SleepFor(window_end - absl::Now());
        break;
      }
      if (absl::Now() < due) absl::SleepFor(due - absl::Now());  // pacing
      const double ms = SubmitOne(*stub, rng, absl::StrCat("window-", i++));
      if (ms < 0) ++submit_errors; else submit_ms.push_back(ms);
      due += absl::Seconds(1.0 / rate);
    }
  }
  // Let in-flight heartbeats that were sent inside the window finish, then stop.
  absl::SleepFor(interval);
  shared.stop.store(true);
  for (auto& th : beaters) th.join();

  std::vector<double> beats;
  {
    std::lock_guard<std::mutex> lock(shared.mu);
    beats = shared.heartbeat_ms;
  }
  const int64_t late = shared.late.load() - late_before;
  std::printf(
      "loadgen nodes=%d heartbeats=%zu heartbeat_p50_ms=%.2f heartbeat_p99_ms=%.2f "
      "heartbeat_max_ms=%.2f late_heartbeats=%lld heartbeat_errors=%lld not_found=%lld "
      "submits=%zu submit_p50_ms=%.2f submit_p99_ms=%.2f submit_errors=%d prefill_per_s=%.0f "
      "window_start_us=%lld window_end_us=%lld total_heartbeats=%lld\n",
      num_nodes, beats.size(), Percentile(beats, 0.5), Percentile(beats, 0.99),
      beats.empty() ? 0.0 : *std::max_element(beats.begin(), beats.end()),
      static_cast<long long>(late), static_cast<long long>(shared.errors.load() - errors_before),
      static_cast<long long>(shared.not_found.load() - nf_before), submit_ms.size(),
      Percentile(submit_ms, 0.5), Percentile(submit_ms, 0.99), submit_errors, prefill_per_s,
      static_cast<long long>(absl::ToUnixMicros(window_start)),
      static_cast<long long>(absl::ToUnixMicros(window_end)),
      static_cast<long long>(shared.heartbeats.load() - beats_before));
  return 0;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return loom::Main();
}
