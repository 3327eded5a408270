// The truth test's fixture (dashboards_truth.h): the local cluster and Prometheus, the sampler
// of the scheduler's API, the test's actions, and the comparison at stable instants.
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "google/protobuf/util/json_util.h"
#include "proto/checkpoint_service.grpc.pb.h"
#include "services/cli/job_spec_yaml.h"
#include "tests/observability/dashboards_truth.h"

namespace loom::dashboards_truth {

double Seconds(const google::protobuf::Timestamp& t) { return t.seconds() + t.nanos() * 1e-9; }
double NowSeconds() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }
std::string Fmt(double v) { return absl::StrFormat("%.17g", v); }
bool Terminal(JobPhase p) {
  return p == v1::JOB_PHASE_SUCCEEDED || p == v1::JOB_PHASE_FAILED || p == v1::JOB_PHASE_CANCELLED;
}
std::string PhaseName(JobPhase p) {
  std::string n = v1::JobPhase_Name(p);
  return absl::StartsWith(n, "JOB_PHASE_") ? n.substr(10) : n;
}

std::string JobYaml(const JobParams& p) {
  return absl::StrCat("name: ", p.name, "\nqueue: ", p.queue, "\n", kModel,
                      "deepspeed_config:\n  train_micro_batch_size_per_gpu: ", kMicroBatch,
                      "\n  gradient_accumulation_steps: 1\n  gradient_clipping: 1.0\n"
                      "  optimizer: {type: AdamW, params: {lr: ",
                      p.lr, "}}\n  zero_optimization:\n", p.zero,
                      "resources: {num_ranks: ", p.ranks, ", accelerator: cpu}\n",
                      "training: {steps: ", p.steps, ", sequence_length: ", kSequenceLength,
                      ", seed: ", p.seed, ", eval_batches: 1",
                      p.eval_every > 0 ? absl::StrCat(", eval_every_steps: ", p.eval_every) : "",
                      "}\n",
                      "checkpoint: {interval_steps: ", p.checkpoint_every, "}\n",
                      "max_restarts: ", p.max_restarts, "\n");
}

std::string Substitute(const std::string& expr, const Vars& v) {
  std::string out = absl::StrReplaceAll(expr, {{"$__rate_interval", v.rate_interval},
                                               {"${__rate_interval}", v.rate_interval},
                                               {"${job}", v.job},
                                               {"${instance}", v.instance},
                                               {"${rank}", v.rank},
                                               {"${tenant}", v.tenant},
                                               {"${queue}", v.queue}});
  // Longest names first: "$instance" before a shorter variable could match its prefix.
  out = absl::StrReplaceAll(out, {{"$instance", v.instance},
                                  {"$tenant", v.tenant},
                                  {"$queue", v.queue},
                                  {"$rank", v.rank},
                                  {"$job", v.job}});
  return out;
}

// "{attempt=1, job_id=x, rank=0}" of the named labels of a sample (absent labels as "").
std::string Key(const PromSample& s, const std::vector<std::string>& names) {
  std::vector<std::string> parts;
  for (const std::string& n : names) {
    auto it = s.labels.find(n);
    parts.push_back(absl::StrCat(n, "=", it == s.labels.end() ? "" : it->second));
  }
  return absl::StrCat("{", absl::StrJoin(parts, ","), "}");
}
std::string Key(const std::vector<std::pair<std::string, std::string>>& labels) {
  std::vector<std::string> parts;
  for (const auto& [n, v] : labels) parts.push_back(absl::StrCat(n, "=", v));
  return absl::StrCat("{", absl::StrJoin(parts, ","), "}");
}

// Histogram quantile as Prometheus computes it (linear interpolation in the bucket), from
// cumulative bucket counts by upper bound.
double BucketQuantile(double q, const std::vector<std::pair<double, double>>& cumulative) {
  if (cumulative.empty() || cumulative.back().second <= 0) return std::nan("");
  const double total = cumulative.back().second;
  const double rank = q * total;
  double lower = 0, lower_count = 0;
  for (const auto& [upper, count] : cumulative) {
    if (count >= rank) {
      if (std::isinf(upper)) return lower;
      return lower + (upper - lower) * (rank - lower_count) / std::max(count - lower_count, 1e-300);
    }
    lower = upper;
    lower_count = count;
  }
  return lower;
}

// The bounds (lower, upper] of the bucket of `bounds` (ascending upper bounds, +Inf implied)
// that holds `v`.
std::pair<double, double> BucketOf(double v, const std::vector<double>& bounds) {
  double lower = 0;
  for (double b : bounds) {
    if (v <= b) return {lower, b};
    lower = b;
  }
  return {lower, INFINITY};
}

// The q-quantile of `values` as the rank statistic a histogram estimates (the ceil(q*n)-th).
double RankQuantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  size_t idx = static_cast<size_t>(std::ceil(q * values.size()));
  if (idx > 0) --idx;
  return values[std::min(idx, values.size() - 1)];
}

double Num(const json& ev, const std::string& field) {
  if (!ev.is_object() || !ev.contains(field)) return 0;
  const json& v = ev[field];
  if (v.is_string()) return std::strtod(v.get<std::string>().c_str(), nullptr);
  if (v.is_number()) return v.get<double>();
  return 0;
}

void DashboardsTruthTest::StartEverything() {
  e2e::ClusterOptions options;
  options.num_workers = 0;  // started below: two 2-slot workers
  options.queues_yaml = "queues: [{name: default}, {name: research}]\n";
  options.scheduler_args = {absl::StrCat("--cycle_trace_file=", tmp_, "/cycles.trace")};
  const absl::Status started = StartCluster(options);
  ASSERT_TRUE(started.ok()) << started;
  for (int i = 0; i < 2; ++i) {
    ReadyInfo info;
    workers_.push_back(
        StartDaemon(absl::StrCat("worker-", i), "services/worker/loom-worker",
                    {absl::StrCat("--scheduler=", scheduler_info_.grpc_address),
                     absl::StrCat("--node_id=worker-", i), "--slots=2",
                     absl::StrCat("--trainer=", RunfilePath("worker/trainer/loom-trainer")),
                     absl::StrCat("--work_dir=", tmp_, "/work-", i),
                     absl::StrCat("--checkpoint_root=", ckpt_root_), "--heartbeat_interval=500ms"},
                    &info));
    ASSERT_NE(workers_.back(), nullptr);
    worker_infos_.push_back(info);
    instance_of_node_[absl::StrCat("worker-", i)] = testing::HostPort(info.metrics_url);
  }
  gateway_ = StartDaemon("gateway", "services/gateway/loom-gateway",
                         {absl::StrCat("--scheduler=", scheduler_info_.grpc_address),
                          absl::StrCat("--checkpoint=", checkpoint_info_.grpc_address), "--port=0"},
                         &gateway_info_);
  ASSERT_NE(gateway_, nullptr);
  admin_ = v1::AdminService::NewStub(
      grpc::CreateChannel(scheduler_info_.grpc_address, grpc::InsecureChannelCredentials()));
  auto prom = testing::PrometheusServer::Start(
      tmp_,
      {{"loom-scheduler", {testing::HostPort(scheduler_info_.metrics_url)}},
       {"loom-checkpoint", {testing::HostPort(checkpoint_info_.metrics_url)}},
       {"loom-gateway", {testing::HostPort(gateway_info_.metrics_url)}},
       {"loom-worker",
        {testing::HostPort(worker_infos_[0].metrics_url),
         testing::HostPort(worker_infos_[1].metrics_url)}}},
      {RunfilePath("deploy/prometheus/alerts.yml")});
  ASSERT_TRUE(prom.ok()) << prom.status();
  prom_ = std::move(*prom);
  targets_ = {{"loom-scheduler", testing::HostPort(scheduler_info_.metrics_url)},
              {"loom-checkpoint", testing::HostPort(checkpoint_info_.metrics_url)},
              {"loom-gateway", testing::HostPort(gateway_info_.metrics_url)},
              {"loom-worker", testing::HostPort(worker_infos_[0].metrics_url)},
              {"loom-worker", testing::HostPort(worker_infos_[1].metrics_url)}};
  // Every target scraped and up, and both nodes registered, before anything happens.
  ASSERT_TRUE(Eventually(
      [&] {
        auto s = prom_->Samples("count(up == 1)");
        return s.ok() && !s->empty() && s->front().value == 5;
      },
      absl::Seconds(30), absl::Milliseconds(250)))
      << "not every daemon is up in Prometheus";
  ASSERT_TRUE(Eventually(
      [&] {
        Snapshot s = TakeSnapshot();
        return s.nodes.size() == 2 && s.nodes[0].live() && s.nodes[1].live();
      },
      absl::Seconds(30)));
  run_start_ = NowSeconds();
  StartSampler();
}

Snapshot DashboardsTruthTest::TakeSnapshot() {
  Snapshot s;
  s.t0 = NowSeconds();
  v1::ListJobsRequest req;
  req.set_page_size(1000);
  v1::ListJobsResponse resp;
  grpc::Status st = jobs_->ListJobs(Ctx(absl::Seconds(10)).get(), req, &resp);
  if (st.ok()) s.jobs.assign(resp.jobs().begin(), resp.jobs().end());
  v1::ListNodesRequest nreq;
  v1::ListNodesResponse nresp;
  grpc::Status ns = admin_->ListNodes(Ctx(absl::Seconds(10)).get(), nreq, &nresp);
  if (ns.ok()) s.nodes.assign(nresp.nodes().begin(), nresp.nodes().end());
  s.t1 = NowSeconds();
  if (!st.ok() || !ns.ok()) s.t0 = -1;  // unusable
  return s;
}

void DashboardsTruthTest::StartSampler() {
  sampler_ = std::thread([this] {
    while (!stop_sampler_.load()) {
      Snapshot s = TakeSnapshot();
      if (s.t0 > 0) {
        absl::MutexLock l(&snapshots_mu_);
        snapshots_.push_back(std::move(s));
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
  });
}

Job DashboardsTruthTest::SubmitJob(const JobParams& p) {
  Job job = Submit(JobYaml(p));
  EXPECT_FALSE(job.id().empty()) << p.name;
  ++submitted_;
  return job;
}

// POST/GET through the gateway; counts what was sent by (route, method, code).
httplib::Result DashboardsTruthTest::Gateway(const std::string& method, const std::string& path,
                                             const std::string& route, const std::string& body) {
  httplib::Client client(
      testing::HostPort(gateway_info_.http_url)
          .substr(0, testing::HostPort(gateway_info_.http_url).rfind(':')),
      std::stoi(testing::HostPort(gateway_info_.http_url)
                    .substr(testing::HostPort(gateway_info_.http_url).rfind(':') + 1)));
  client.set_read_timeout(30);
  const absl::Time start = absl::Now();
  httplib::Result r = method == "POST" ? client.Post(path.c_str(), body, "application/json")
                                       : client.Get(path.c_str());
  const double took = absl::ToDoubleSeconds(absl::Now() - start);
  EXPECT_TRUE(r) << method << " " << path;
  if (r) {
    gateway_sent_[{route, method, std::to_string(r->status)}] += 1;
    gateway_latencies_.push_back(took);
  }
  return r;
}

Job DashboardsTruthTest::SubmitThroughGateway(const JobParams& p) {
  auto spec = cli::JobSpecFromYaml(JobYaml(p), tmp_);
  EXPECT_TRUE(spec.ok()) << spec.status();
  std::string spec_json;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(*spec, &spec_json).ok());
  auto r = Gateway("POST", "/v1/jobs", "/v1/jobs", absl::StrCat("{\"spec\": ", spec_json, "}"));
  Job job;
  if (r && r->status == 200) {
    v1::SubmitJobResponse resp;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(r->body, &resp).ok()) << r->body;
    job = resp.job();
    ++submitted_;
  } else {
    ADD_FAILURE() << "gateway submit: " << (r ? r->body : "no answer");
  }
  return job;
}

// Waits for attempt `attempt` of the 1-rank job `id` to have stepped (its step gauge on the
// worker is there, so its series are in Prometheus), then sends `sig` to its trainer.
void DashboardsTruthTest::KillTrainerOfAttempt(const std::string& id, int attempt, int sig,
                                               int min_step) {
  Job job = WaitUntil(
      id,
      [&](const Job& j) {
        return j.attempt() == attempt && j.phase() == v1::JOB_PHASE_RUNNING &&
               j.progress().step() >= min_step;
      },
      absl::Minutes(2), absl::StrCat("attempt ", attempt, " stepping"));
  ASSERT_EQ(job.attempt(), attempt) << job.message();
  // The scheduler learned the step from the worker: the worker's gauge has it too; one more
  // scrape so that Prometheus has the series.
  absl::SleepFor(absl::Milliseconds(1200));
  std::map<int, pid_t> pids = TrainerPids(id);
  ASSERT_EQ(pids.count(0), 1u) << "no trainer of " << id;
  ASSERT_EQ(::kill(pids[0], sig), 0);
}

std::vector<HistoryEntry> DashboardsTruthTest::History(const std::string& id) {
  std::vector<HistoryEntry> out;
  auto ctx = Ctx();
  v1::WatchJobRequest req;
  req.set_job_id(id);
  auto reader = jobs_->WatchJob(ctx.get(), req);
  v1::JobEvent e;
  while (reader->Read(&e)) {
    if (e.type() == "History") {
      out.push_back({e.job().phase(), Seconds(e.time()), e.job().attempt(), e.job().reason(),
                     e.job().message()});
    } else if (e.type() == "Snapshot") {
      break;
    }
  }
  ctx->TryCancel();
  return out;
}

// The trainer's events (JSON lines of its stdout) of rank `rank` of `id` through StreamLogs:
// attempt -> events in order.
std::map<int, std::vector<json>> DashboardsTruthTest::Events(const std::string& id, int rank) {
  std::map<int, std::vector<json>> out;
  v1::StreamLogsRequest req;
  req.set_job_id(id);
  req.add_ranks(rank);
  auto ctx = Ctx();
  auto reader = jobs_->StreamLogs(ctx.get(), req);
  v1::LogLine line;
  while (reader->Read(&line)) {
    if (line.stream() != "stdout") continue;
    json ev = json::parse(line.text(), nullptr, false);
    if (ev.is_object()) out[line.attempt()].push_back(std::move(ev));
  }
  EXPECT_TRUE(reader->Finish().ok()) << id;
  return out;
}

// The last "step" event of rank `rank` of the given attempt.
json DashboardsTruthTest::LastStepEvent(const std::string& id, int attempt, int rank) {
  auto events = Events(id, rank);
  json last;
  for (const json& ev : events[attempt]) {
    if (ev.contains("step") && ev["step"].is_object()) last = ev["step"];
  }
  return last;
}

std::vector<PromSample> DashboardsTruthTest::Eval(const std::string& expr,
                                                  std::optional<double> time) {
  auto s = prom_->Samples(expr, time);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : std::vector<PromSample>{};
}

// Unix time of the last scrape of the target (`job` label) that holds `instance`.
double DashboardsTruthTest::LastScrape(const std::string& job, const std::string& instance) {
  std::string sel =
      absl::StrCat("up{job=\"", job, "\"",
                   instance.empty() ? "" : absl::StrCat(",instance=\"", instance, "\""), "}[1m]");
  double last = 0;
  for (const PromSample& s : Eval(sel)) last = std::max(last, s.time);
  return last;
}

// The evaluation of `expr` over the grid [run_start_, run_end_] every 0.5 s: time -> key -> v.
std::map<double, std::map<std::string, double>> DashboardsTruthTest::Grid(
    const std::string& expr, const std::vector<std::string>& key_labels) {
  std::map<double, std::map<std::string, double>> out;
  auto r = prom_->QueryRange(expr, run_start_, run_end_, 0.5);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return out;
  for (const json& series : *r) {
    PromSample s;
    for (const auto& [k, v] : series["metric"].items()) s.labels[k] = v.get<std::string>();
    const std::string key = Key(s, key_labels);
    for (const json& pair : series["values"]) {
      double t = pair[0].get<double>();
      out[t][key] = std::strtod(pair[1].get<std::string>().c_str(), nullptr);
    }
  }
  // Grid points where nothing answered still count (as empty).
  for (double t = run_start_; t <= run_end_; t += 0.5) out.try_emplace(std::round(t * 1000) / 1000);
  return out;
}

// The truth at grid time `t` if the sampled truth was the same from t - before to t + after
// (snapshots no more than 1 s apart over that window); nullopt otherwise.
std::optional<std::map<std::string, double>> DashboardsTruthTest::StableTruth(
    const std::vector<Snapshot>& snaps, const Quantity& q, double t, double before, double after) {
  std::optional<std::map<std::string, double>> value;
  double covered_from = INFINITY, covered_to = -INFINITY, prev_t1 = -INFINITY;
  for (const Snapshot& s : snaps) {
    if (s.t1 < t - before || s.t0 > t + after) continue;
    if (prev_t1 > -INFINITY && s.t0 - prev_t1 > 1.0) return std::nullopt;  // a gap
    prev_t1 = s.t1;
    covered_from = std::min(covered_from, s.t0);
    covered_to = std::max(covered_to, s.t1);
    std::map<std::string, double> v = q(s);
    for (auto it = v.begin(); it != v.end();) it = it->second == 0 ? v.erase(it) : std::next(it);
    if (!value.has_value()) {
      value = std::move(v);
    } else if (*value != v) {
      return std::nullopt;
    }
  }
  if (!value.has_value() || covered_from > t - before + 1.0 || covered_to < t + after - 1.0) {
    return std::nullopt;
  }
  return value;
}

// Compares target `target` of `p` (with `vars`) with the truth at every grid time where the
// truth was stable; keys of `key_labels`, absent keys = 0. At least `min_points` comparisons.
void DashboardsTruthTest::CheckStable(const Panel& p, size_t target, const Vars& vars,
                                      const std::vector<std::string>& key_labels,
                                      const Quantity& truth, double before, double after,
                                      double tolerance, int min_points) {
  ASSERT_LT(target, p.exprs.size()) << p.title;
  const std::string expr = Substitute(p.exprs[target], vars);
  const std::vector<Snapshot> snaps = Snapshots();
  int compared = 0, wrong = 0;
  std::set<std::string> distinct;
  std::string first_wrong;
  for (auto& [t, got] : Grid(expr, key_labels)) {
    std::optional<std::map<std::string, double>> want = StableTruth(snaps, truth, t, before, after);
    if (!want.has_value()) continue;
    ++compared;
    std::map<std::string, double> g = got;
    for (auto it = g.begin(); it != g.end();) {
      it = std::abs(it->second) <= tolerance ? g.erase(it) : std::next(it);
    }
    bool same = g.size() == want->size();
    for (const auto& [k, v] : *want) {
      auto it = g.find(k);
      same = same && it != g.end() &&
             std::abs(it->second - v) <= tolerance * std::max(1.0, std::abs(v));
    }
    distinct.insert(Describe(*want));
    if (!same && wrong++ < 3) {
      absl::StrAppend(&first_wrong, "\n  at ", Fmt(t), " (run +",
                      absl::StrFormat("%.1f", t - run_start_), " s): expected ", Describe(*want),
                      ", got ", Describe(g));
    }
  }
  EXPECT_EQ(wrong, 0) << Where(p, target) << "\n  query: " << expr << "\n  " << wrong << " of "
                      << compared
                      << " stable grid points disagree with the scheduler:" << first_wrong;
  EXPECT_GE(compared, min_points) << Where(p, target) << ": too few stable points";
  std::cout << "  " << Where(p, target) << ": " << compared << " points, truths "
            << absl::StrJoin(distinct, " ") << "\n";
}

}  // namespace loom::dashboards_truth
