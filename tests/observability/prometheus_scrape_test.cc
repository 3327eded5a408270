// A real Prometheus (Debian's /usr/bin/prometheus) scrapes a local Loom cluster — the real
// loom-scheduler, loom-checkpoint, loom-gateway and one 3-slot loom-worker on loopback,
// OS-chosen ports — while it trains a one-rank job (then a ZenFlow and a SuperOffload job); the
// test then asks Prometheus' HTTP API (/api/v1/query) for the key series and checks their values. It also checks that `promtool check metrics` accepts every
// daemon's /metrics text, that Prometheus loads deploy/prometheus/alerts.yml and evaluates every
// rule without error, and that every metric name the Grafana dashboards and the alert rules use
// is one this cluster exports (names taken live from Prometheus' __name__ values).
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "proto/checkpoint_service.grpc.pb.h"
#include "proto/job_service.grpc.pb.h"
#include "services/cli/job_spec_yaml.h"
#include "tests/testing/prometheus.h"
#include "tests/testing/subprocess.h"

namespace loom {
namespace {

using ::loom::testing::HostPort;
using ::loom::testing::RunfilePath;
using ::loom::testing::Subprocess;
using json = nlohmann::json;

// One rank of a tiny model, two checkpoints: a job that moves every series and runs for a few
// seconds (several 1 s scrapes see the rank RUNNING).
constexpr char kJob[] = R"(
name: prometheus-scrape
model:
  config:
    vocab_size: 256
    hidden_size: 32
    intermediate_size: 64
    num_hidden_layers: 1
    num_attention_heads: 2
    num_key_value_heads: 1
    max_position_embeddings: 32
    rms_norm_eps: 1.0e-5
    rope_theta: 10000
    tie_word_embeddings: true
dataset: {name: fortunes}
deepspeed_config:
  train_micro_batch_size_per_gpu: 2
  gradient_accumulation_steps: 1
  optimizer: {type: AdamW, params: {lr: 0.003}}
  zero_optimization: {stage: 3}
resources: {num_ranks: 1, accelerator: cpu}
training: {steps: 3000, sequence_length: 16, seed: 3, eval_batches: 1}
checkpoint: {interval_steps: 1500}
)";

// Two short jobs beside kJob on the same worker, so that the series only ZenFlow and
// SuperOffload ranks export exist too (every name the dashboards use must be exported: checked
// below). kJob's model, one rank each; YAML with the zero_optimization block indented 4.
std::string TechniqueJob(const std::string& name, const std::string& zero) {
  std::string job = kJob;
  job.replace(job.find("name: prometheus-scrape"), std::string("name: prometheus-scrape").size(),
              "name: " + name);
  job.replace(job.find("  zero_optimization: {stage: 3}\n"),
              std::string("  zero_optimization: {stage: 3}\n").size(),
              "  gradient_clipping: 1.0\n  zero_optimization:\n" + zero);
  job.replace(job.find("steps: 3000"), std::string("steps: 3000").size(), "steps: 200");
  job.replace(job.find("interval_steps: 1500"), std::string("interval_steps: 1500").size(),
              "interval_steps: 100");
  return job;
}
constexpr char kZenFlowZero[] = R"(    stage: 2
    offload_optimizer: {device: cpu}
    zenflow: {topk_ratio: 0.25, select_strategy: step, select_interval: 4, update_interval: 2,
              overlap_step: true, full_warm_up_rounds: 1}
)";
constexpr char kSuperOffloadZero[] = R"(    stage: 3
    sub_group_size: 2000
    offload_optimizer: {device: cpu, super_offload: true, ratio: 0.5, cpuadam_cores_perc: 1.0}
)";

class PrometheusScrapeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Each test gets its own directory: database, checkpoints, ready files, logs.
    tmp_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_TRUE(MakeDirs(tmp_).ok());
    ckpt_root_ = absl::StrCat(tmp_, "/checkpoints");
    ASSERT_TRUE(MakeDirs(ckpt_root_).ok());
    scheduler_ = StartDaemon("scheduler", "services/scheduler/loom-scheduler",
                             {absl::StrCat("--db=", tmp_, "/loom.db"),
                              absl::StrCat("--checkpoint_root=", ckpt_root_)},
                             &scheduler_info_);
    checkpoint_ = StartDaemon("checkpoint", "services/checkpoint/loom-checkpoint",
                              {absl::StrCat("--checkpoint_root=", ckpt_root_)}, &checkpoint_info_);
    worker_ = StartDaemon("worker-0", "services/worker/loom-worker",
                          {absl::StrCat("--scheduler=", scheduler_info_.grpc_address),
                           "--node_id=worker-0", "--slots=3",
                           absl::StrCat("--trainer=", RunfilePath("worker/trainer/loom-trainer")),
                           absl::StrCat("--work_dir=", tmp_, "/work-0"),
                           "--heartbeat_interval=200ms"},
                          &worker_info_);
    gateway_ = StartDaemon("gateway", "services/gateway/loom-gateway",
                           {absl::StrCat("--scheduler=", scheduler_info_.grpc_address),
                            absl::StrCat("--checkpoint=", checkpoint_info_.grpc_address),
                            "--port=0"},
                           &gateway_info_);
  }

  std::unique_ptr<Subprocess> StartDaemon(const std::string& name, const std::string& binary,
                                          std::vector<std::string> args, ReadyInfo* info) {
    auto daemon = testing::StartDaemon(tmp_, name, binary, std::move(args), info);
    EXPECT_TRUE(daemon.ok()) << daemon.status();
    return daemon.ok() ? std::move(*daemon) : nullptr;
  }

  // Starts Prometheus (tests/testing/prometheus.h) on a free loopback port with its TSDB under
  // TEST_TMPDIR: 1 s scrapes of the four daemons, the checked-in alert rules.
  void StartPrometheus() {
    auto prom = testing::PrometheusServer::Start(
        tmp_,
        {{"loom-scheduler", {HostPort(scheduler_info_.metrics_url)}},
         {"loom-checkpoint", {HostPort(checkpoint_info_.metrics_url)}},
         {"loom-worker", {HostPort(worker_info_.metrics_url)}},
         {"loom-gateway", {HostPort(gateway_info_.metrics_url)}}},
        {RunfilePath("deploy/prometheus/alerts.yml")});
    ASSERT_TRUE(prom.ok()) << prom.status();
    prometheus_ = std::move(*prom);
  }

  // GET /api/v1/<endpoint> with `params`; returns the "data" member of a "success" answer.
  json PromApi(const std::string& endpoint,
               const std::vector<std::pair<std::string, std::string>>& params = {}) {
    absl::StatusOr<json> data = prometheus_->Api(endpoint, params);
    EXPECT_TRUE(data.ok()) << data.status();
    return data.ok() ? *data : json();
  }

  // The instant-query result vector of `promql`.
  json Query(const std::string& promql) { return PromApi("query", {{"query", promql}})["result"]; }

  // Waits until `promql` returns at least one sample (fails the test after `timeout`); returns the
  // first sample's value. Put the expected value into the query ("x == 1").
  double WaitForValue(const std::string& promql, absl::Duration timeout = absl::Seconds(20)) {
    absl::Time deadline = absl::Now() + timeout;
    json result;
    while (absl::Now() < deadline) {
      result = Query(promql);
      if (result.is_array() && !result.empty()) {
        return std::stod(result[0]["value"][1].get<std::string>());
      }
      absl::SleepFor(absl::Milliseconds(250));
    }
    ADD_FAILURE() << "no sample for " << promql << " after " << timeout << "; worker metrics:\n"
                  << testing::HttpGet(worker_info_.metrics_url).value_or("(unreachable)");
    return std::nan("");
  }

  static std::unique_ptr<grpc::ClientContext> Ctx() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return ctx;
  }

  // Submits kJob, waits for SUCCEEDED and consolidates its last checkpoint.
  void RunJob() {
    run_start_ = absl::ToUnixSeconds(absl::Now());
    auto jobs = loom::v1::JobService::NewStub(
        grpc::CreateChannel(scheduler_info_.grpc_address, grpc::InsecureChannelCredentials()));
    auto spec = cli::JobSpecFromYaml(kJob, tmp_);
    ASSERT_TRUE(spec.ok()) << spec.status();
    loom::v1::SubmitJobRequest req;
    *req.mutable_spec() = *spec;
    loom::v1::SubmitJobResponse resp;
    grpc::Status s = jobs->SubmitJob(Ctx().get(), req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    loom::v1::Job job;
    absl::Time deadline = absl::Now() + absl::Minutes(2);
    while (absl::Now() < deadline) {
      loom::v1::GetJobRequest get;
      get.set_job_id(resp.job().id());
      ASSERT_TRUE(jobs->GetJob(Ctx().get(), get, &job).ok());
      if (job.phase() == loom::v1::JOB_PHASE_SUCCEEDED || job.phase() == loom::v1::JOB_PHASE_FAILED ||
          job.phase() == loom::v1::JOB_PHASE_CANCELLED) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
    ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_SUCCEEDED)
        << job.message() << "\n" << testing::Tail(worker_->log_path());
    job_ = job;
    auto ckpt = loom::v1::CheckpointService::NewStub(
        grpc::CreateChannel(checkpoint_info_.grpc_address, grpc::InsecureChannelCredentials()));
    loom::v1::ConsolidateCheckpointRequest cons_req;
    cons_req.set_job_id(job.id());
    loom::v1::ConsolidateCheckpointResponse cons;
    grpc::Status cs = ckpt->ConsolidateCheckpoint(Ctx().get(), cons_req, &cons);
    ASSERT_TRUE(cs.ok()) << cs.error_message();
    EXPECT_EQ(cons.step(), 3000);
  }

  // Submits TechniqueJob(kZenFlowZero) and TechniqueJob(kSuperOffloadZero) together, waits for
  // both to succeed, and sends one request through the gateway (its series appear at the first).
  void RunTechniqueJobsAndAGatewayRequest() {
    auto jobs = loom::v1::JobService::NewStub(
        grpc::CreateChannel(scheduler_info_.grpc_address, grpc::InsecureChannelCredentials()));
    std::vector<std::string> ids;
    for (const auto& [name, zero] : {std::pair<const char*, const char*>{"zenflow", kZenFlowZero},
                                     {"superoffload", kSuperOffloadZero}}) {
      auto spec = cli::JobSpecFromYaml(TechniqueJob(name, zero), tmp_);
      ASSERT_TRUE(spec.ok()) << name << ": " << spec.status();
      loom::v1::SubmitJobRequest req;
      *req.mutable_spec() = *spec;
      loom::v1::SubmitJobResponse resp;
      grpc::Status s = jobs->SubmitJob(Ctx().get(), req, &resp);
      ASSERT_TRUE(s.ok()) << name << ": " << s.error_message();
      ids.push_back(resp.job().id());
    }
    for (const std::string& id : ids) {
      loom::v1::Job job;
      absl::Time deadline = absl::Now() + absl::Minutes(3);
      while (absl::Now() < deadline) {
        loom::v1::GetJobRequest get;
        get.set_job_id(id);
        ASSERT_TRUE(jobs->GetJob(Ctx().get(), get, &job).ok());
        if (job.phase() >= loom::v1::JOB_PHASE_SUCCEEDED) break;
        absl::SleepFor(absl::Milliseconds(200));
      }
      ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_SUCCEEDED)
          << job.spec().name() << ": " << job.message() << "\n" << testing::Tail(worker_->log_path());
    }
    auto listed = testing::HttpGet(absl::StrCat(gateway_info_.http_url, "/v1/jobs"));
    ASSERT_TRUE(listed.ok()) << listed.status();
  }

  std::string tmp_, ckpt_root_;
  ReadyInfo scheduler_info_, checkpoint_info_, worker_info_, gateway_info_;
  std::unique_ptr<Subprocess> scheduler_, checkpoint_, worker_, gateway_;
  std::unique_ptr<testing::PrometheusServer> prometheus_;
  int64_t run_start_ = 0;  // Unix seconds when RunJob submitted
  loom::v1::Job job_;      // as RunJob left it (SUCCEEDED)
};

TEST_F(PrometheusScrapeTest, PrometheusScrapesEveryDaemonDuringAJob) {
  ASSERT_NO_FATAL_FAILURE(StartPrometheus());
  // All three targets are scraped and up before the job starts, so that its run is recorded.
  EXPECT_EQ(WaitForValue("count(up == 1) == 4"), 4) << Query("up").dump();
  for (const char* job : {"loom-scheduler", "loom-checkpoint", "loom-worker", "loom-gateway"}) {
    EXPECT_EQ(WaitForValue(absl::StrCat("up{job=\"", job, "\"}")), 1) << job;
  }
  ASSERT_NO_FATAL_FAILURE(RunJob());

  // Each query states the value it expects, so that it waits for a fresh enough scrape.
  // Scheduler: the job's lifecycle, one live node with its slot free again.
  WaitForValue("loom_jobs{phase=\"SUCCEEDED\"} == 1");
  WaitForValue("loom_jobs{phase=\"PENDING\"} == 0");
  WaitForValue("loom_jobs_submitted_total == 1");
  WaitForValue("loom_job_phase_transitions_total{from=\"RUNNING\",to=\"SUCCEEDED\"} == 1");
  // Edges no job took are there at 0 (issue 53: increase() counts a first event).
  WaitForValue("loom_job_phase_transitions_total{from=\"RUNNING\",to=\"FAILED\"} == 0");
  WaitForValue("loom_scheduler_start_time_seconds > 0");
  WaitForValue("loom_nodes{state=\"live\"} == 1");
  WaitForValue("loom_nodes{state=\"lost\"} == 0");
  WaitForValue("loom_rank_slots{state=\"free\"} == 3");
  WaitForValue("loom_scheduling_cycle_seconds_count > 0");
  WaitForValue("loom_job_queue_wait_seconds_count == 1");
  WaitForValue("loom_tenant_jobs{tenant=\"default\",queue=\"default\",phase=\"SUCCEEDED\"} == 1");
  WaitForValue("loom_admission_attempts_total{result=\"admitted\"} == 1");
  WaitForValue("loom_admission_attempts_total{result=\"infeasible\"} == 0");
  WaitForValue("loom_accelerators{kind=\"cpu\",state=\"free\"} == 3");
  WaitForValue("loom_accelerators{kind=\"cpu\",state=\"allocated\"} == 0");
  WaitForValue("max_over_time(loom_accelerators{kind=\"cpu\",state=\"allocated\"}[5m]) == 1");
  WaitForValue("loom_job_restarts_total{cause=\"user\"} == 0");
  // Worker and its trainer rank. The rank ran (the worker forgets ended ranks after a few
  // heartbeats and their series go with them, so look back).
  WaitForValue("loom_worker_slots == 3");
  WaitForValue("max_over_time(loom_worker_ranks{state=\"RANK_STATE_RUNNING\"}[5m]) == 1");
  WaitForValue("max_over_time(loom_worker_rank_info{rank=\"0\",attempt=\"1\"}[5m]) == 1");
  WaitForValue("last_over_time(loom_trainer_step{rank=\"0\"}[5m]) == 3000");
  // The rank's series carry its job and attempt (issue 53: two jobs on one worker never share).
  WaitForValue(absl::StrCat("last_over_time(loom_trainer_step{job_id=\"", job_.id(),
                            "\",attempt=\"1\",rank=\"0\"}[5m]) == 3000"));
  // The loss fell. First reported: the held-out loss before training (step 0; an untrained
  // byte-level model is at ln 256 = 5.545, checked). Last: the held-out loss Prometheus scraped
  // last (after step 3000, the same held-out batch) and the last scraped per-step training loss.
  // Measured: 5.555 -> held-out 3.345, training 3.614 (first scraped 4.007, ~12 samples). The
  // per-step loss of 32 tokens is noisy, so it is compared with step 0, not with its own first
  // scrape (which may come hundreds of steps in).
  WaitForValue("last_over_time(loom_trainer_loss{rank=\"0\"}[5m]) > 0");
  json series = PromApi("query_range", {{"query", "loom_trainer_loss{rank=\"0\"}"},
                                        {"start", std::to_string(run_start_ - 5)},
                                        {"end", std::to_string(absl::ToUnixSeconds(absl::Now()))},
                                        {"step", "1"}})["result"];
  ASSERT_TRUE(series.is_array() && series.size() == 1) << series.dump();
  const json& values = series[0]["values"];
  ASSERT_GE(values.size(), 2u) << series.dump();
  const double first_loss = std::stod(values.front()[1].get<std::string>());
  const double last_loss = std::stod(values.back()[1].get<std::string>());
  EXPECT_NEAR(job_.progress().initial_eval_loss(), std::log(256.0), 0.1);
  const double last_eval =
      WaitForValue("last_over_time(loom_trainer_eval_loss{rank=\"0\"}[5m]) > 0");
  EXPECT_NEAR(last_eval, job_.progress().eval_loss(), 1e-9);
  std::cout << "loss: first scraped " << first_loss << ", last scraped " << last_loss
            << " (" << values.size() << " samples); held-out: step 0 "
            << job_.progress().initial_eval_loss() << ", last scraped " << last_eval << "\n";
  EXPECT_LT(last_eval, job_.progress().initial_eval_loss() - 1.0);
  EXPECT_LT(last_loss, job_.progress().initial_eval_loss() - 1.0);
  WaitForValue("max_over_time(loom_trainer_tokens_per_second{rank=\"0\"}[5m]) > 0");
  WaitForValue("max_over_time(loom_trainer_tokens_total{rank=\"0\"}[5m]) > 0");
  WaitForValue("max_over_time(loom_trainer_step_seconds{rank=\"0\"}[5m]) > 0");
  // One rank: nothing to wait for in collectives beyond a local copy; building batches takes time.
  WaitForValue("max_over_time(loom_trainer_communication_seconds{rank=\"0\"}[5m]) >= 0");
  WaitForValue("max_over_time(loom_trainer_stall_seconds{rank=\"0\"}[5m]) > 0");
  WaitForValue(
      "last_over_time(loom_trainer_stall_seconds{rank=\"0\"}[5m]) < "
      "last_over_time(loom_trainer_step_seconds{rank=\"0\"}[5m])");
  WaitForValue("last_over_time(loom_trainer_optimizer_rollbacks_total{rank=\"0\"}[5m]) == 0");
  WaitForValue("max_over_time(loom_rank_accelerator_info{rank=\"0\",accelerator_index=\"0\",node=\"worker-0\"}[5m]) == 1");
  WaitForValue("last_over_time(loom_trainer_zero_partition_bytes{rank=\"0\"}[5m]) > 1000");
  WaitForValue("last_over_time(loom_trainer_zero_gathered_peak_bytes{rank=\"0\"}[5m]) > 1000");
  // Adam keeps two fp32 moments per fp32 parameter; the step's peak holds at least the model
  // states that live through it.
  WaitForValue(
      "last_over_time(loom_trainer_optimizer_state_bytes{rank=\"0\"}[5m]) >= "
      "2 * last_over_time(loom_trainer_param_bytes{rank=\"0\"}[5m])");
  WaitForValue(
      "last_over_time(loom_trainer_memory_peak_bytes{rank=\"0\"}[5m]) >= "
      "last_over_time(loom_trainer_param_bytes{rank=\"0\"}[5m]) + "
      "last_over_time(loom_trainer_grad_bytes{rank=\"0\"}[5m]) + "
      "last_over_time(loom_trainer_optimizer_state_bytes{rank=\"0\"}[5m])");
  WaitForValue("last_over_time(loom_trainer_last_checkpoint_step{rank=\"0\"}[5m]) == 3000");
  // The timestamps exist only while the rank runs (an ended rank does not age).
  WaitForValue("time() - max_over_time(loom_trainer_last_checkpoint_timestamp_seconds[5m]) < 300");
  WaitForValue("time() - max_over_time(loom_trainer_last_step_timestamp_seconds[5m]) < 300");
  WaitForValue("time() - loom_worker_last_heartbeat_timestamp_seconds < 30");
  WaitForValue("loom_worker_heartbeats_total{result=\"ok\"} > 1");
  // Checkpoint service: the consolidation.
  WaitForValue("loom_checkpoint_consolidations_total{result=\"ok\"} == 1");
  WaitForValue("loom_checkpoint_consolidated_bytes_total > 1000");
  WaitForValue("loom_checkpoint_consolidation_seconds_count == 1");

  // The alert rules loaded and evaluate without error; none fires on this healthy cluster.
  json groups = PromApi("rules")["groups"];
  ASSERT_TRUE(groups.is_array() && !groups.empty()) << groups.dump();
  int rules = 0;
  for (const json& g : groups) {
    for (const json& r : g["rules"]) {
      ++rules;
      EXPECT_EQ(r.value("health", ""), "ok") << r.dump();
      if (r.value("type", "") == "alerting") {
        EXPECT_EQ(r.value("state", ""), "inactive") << r.dump();
      }
    }
  }
  EXPECT_GE(rules, 5);

  // Every metric name the dashboards and alerts use is exported by this cluster, and every
  // expression evaluates in this Prometheus: after a ZenFlow and a SuperOffload job, whose ranks
  // export their technique's series, and a gateway request.
  ASSERT_NO_FATAL_FAILURE(RunTechniqueJobsAndAGatewayRequest());
  WaitForValue("count(max_over_time(loom_trainer_zenflow_stall_seconds[5m])) == 1");
  WaitForValue("count(max_over_time(loom_trainer_superoffload_speculated_sub_groups_total[5m])) == 1");
  WaitForValue("sum(loom_gateway_requests_total{route=\"/v1/jobs\",method=\"GET\",code=\"200\"}) == 1");
  json names = PromApi("label/__name__/values");
  ASSERT_TRUE(names.is_array());
  std::vector<std::string> name_list;
  for (const json& n : names) name_list.push_back(n.get<std::string>());
  std::string names_path = absl::StrCat(tmp_, "/exported_metric_names.txt");
  ASSERT_TRUE(WriteFileAtomically(names_path, absl::StrJoin(name_list, "\n") + "\n").ok());
  std::string dashboards = RunfilePath("deploy/grafana");
  std::string cmd = absl::StrCat(
      "/opt/loom/venv/bin/python3 ", RunfilePath("tests/observability/check_promql_names.py"),
      " --metrics ", names_path, " --prometheus http://127.0.0.1:", prometheus_->port(), " ", dashboards, "/cluster-overview.json ", dashboards,
      "/job-detail.json ", dashboards, "/queues-fairness.json ", dashboards, "/checkpoints.json ",
      RunfilePath("deploy/prometheus/alerts.yml"), " > ", tmp_, "/check_names.log 2>&1");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << testing::Tail(absl::StrCat(tmp_, "/check_names.log"));
}

// `promtool check metrics` accepts every daemon's /metrics text, taken after the job so that the
// worker's per-rank trainer series are in it.
TEST_F(PrometheusScrapeTest, PromtoolAcceptsEveryDaemonsMetrics) {
  ASSERT_NO_FATAL_FAILURE(RunJob());
  for (const ReadyInfo* info :
       {&scheduler_info_, &checkpoint_info_, &worker_info_, &gateway_info_}) {
    auto text = testing::HttpGet(info->metrics_url);
    ASSERT_TRUE(text.ok()) << text.status();
    std::string path = absl::StrCat(tmp_, "/", info->name, ".metrics.txt");
    ASSERT_TRUE(WriteFileAtomically(path, *text).ok());
    std::string log = absl::StrCat(path, ".promtool.log");
    // promtool exits 0 when the text parses and passes its lint (names, units, _total, help).
    std::string cmd = absl::StrCat("/usr/bin/promtool check metrics < ", path, " > ", log, " 2>&1");
    EXPECT_EQ(std::system(cmd.c_str()), 0) << info->name << ":\n" << testing::Tail(log) << "\n"
                                           << *text;
  }
}

}  // namespace
}  // namespace loom
