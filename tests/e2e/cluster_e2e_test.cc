// End to end: the real loom-scheduler, loom-checkpoint and two loom-worker daemons on loopback
// (OS-chosen ports), real loom-trainer rank processes doing ZeRO-3 over Gloo, a real SQLite file.
// A small job goes client -> scheduler -> workers -> ranks -> checkpoint shards -> consolidated
// safetensors, which an independent PyTorch script then checks against the trainer's logits.
// The daemons and polls are the shared fixture's (tests/e2e/testing/e2e_cluster.h).
#include <grpcpp/grpcpp.h>

#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <map>
#include <set>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "storage/checkpoint/consolidate.h"
#include "storage/safetensors/safetensors.h"
#include "tests/e2e/testing/e2e_cluster.h"
#include "tests/testing/subprocess.h"

namespace loom {
namespace {

using ::loom::e2e::Eventually;
using ::loom::e2e::TrainerPids;
using ::loom::testing::RunfilePath;
using ::loom::testing::Subprocess;

const std::string kTinyJob = absl::StrCat("name: e2e-tiny", e2e::kTinyModelYaml, R"(deepspeed_config:
  train_micro_batch_size_per_gpu: 4
  gradient_accumulation_steps: 1
  gradient_clipping: 1.0
  optimizer: {type: AdamW, params: {lr: 0.003, betas: [0.9, 0.95], weight_decay: 0.01}}
  zero_optimization: {stage: 3}
resources: {num_ranks: 2, accelerator: cpu}
training: {steps: 8, sequence_length: 32, seed: 5, eval_batches: 2}
checkpoint: {interval_steps: 4}
)");

class ClusterE2ETest : public e2e::E2EClusterTest {
 protected:
  virtual int NumWorkers() const { return 2; }
  virtual std::vector<std::string> ExtraSchedulerArgs() const { return {}; }

  void SetUp() override {
    E2EClusterTest::SetUp();
    // Data a job may name: the fortunes corpus and <tmp>/data (the scheduler's queues config,
    // the workers' --data_roots); <tmp>/scheduler-only is allowed by the scheduler alone.
    ASSERT_TRUE(MakeDirs(tmp_ + "/data").ok());
    ASSERT_TRUE(MakeDirs(tmp_ + "/scheduler-only").ok());
    e2e::ClusterOptions options;
    options.num_workers = NumWorkers();
    options.scheduler_args = ExtraSchedulerArgs();
    options.queues_yaml =
        absl::StrCat("data_roots: [/usr/share/games/fortunes, ", tmp_, "/data, ", tmp_,
                     "/scheduler-only]\nqueues: [{name: default}]\n");
    options.worker_data_roots = absl::StrCat("/usr/share/games/fortunes,", tmp_, "/data");
    const absl::Status started = StartCluster(options);
    ASSERT_TRUE(started.ok()) << started;
  }
};

TEST_F(ClusterE2ETest, TrainsConsolidatesAndExportsAJob) {
  loom::v1::Job job = Submit(kTinyJob);
  ASSERT_FALSE(job.id().empty());
  EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_PENDING);

  job = WaitFor(job.id(), loom::v1::JOB_PHASE_SUCCEEDED);
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_SUCCEEDED);
  EXPECT_EQ(job.progress().step(), 8);
  EXPECT_GT(job.progress().tokens_per_second(), 0);
  ASSERT_TRUE(job.progress().has_eval_loss());
  // Byte-level model at initialisation: held-out loss near ln(256) = 5.545.
  EXPECT_NEAR(job.progress().initial_eval_loss(), 5.545, 0.3);
  EXPECT_LT(job.progress().eval_loss(), job.progress().initial_eval_loss());
  // The metric history (issue 45): every step of rank 0, and the evaluations before and after
  // training, as the job's progress (reported through another path, the heartbeat's) says.
  loom::v1::GetJobMetricsRequest metrics_req;
  metrics_req.set_job_id(job.id());
  loom::v1::GetJobMetricsResponse metrics;
  ASSERT_TRUE(jobs_->GetJobMetrics(Ctx().get(), metrics_req, &metrics).ok());
  std::vector<int64_t> train_steps;
  std::map<int64_t, double> eval_at;
  for (const loom::v1::MetricPoint& p : metrics.points()) {
    if (p.kind() == loom::v1::MetricPoint::KIND_TRAIN) {
      train_steps.push_back(p.step());
      EXPECT_GT(p.loss(), 0);
      EXPECT_GT(p.tokens_per_second(), 0);
      if (p.step() == 8) EXPECT_EQ(p.loss(), job.progress().loss());
    } else {
      eval_at[p.step()] = p.loss();
    }
  }
  EXPECT_EQ(train_steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(eval_at[0], job.progress().initial_eval_loss());
  EXPECT_EQ(eval_at[8], job.progress().eval_loss());
  // The gang spans both single-slot workers.
  ASSERT_EQ(job.rank_nodes_size(), 2);
  EXPECT_EQ(std::set<std::string>(job.rank_nodes().begin(), job.rank_nodes().end()).size(), 2u);

  // Both checkpoints are committed.
  loom::v1::ListCheckpointsRequest list_req;
  list_req.set_job_id(job.id());
  loom::v1::ListCheckpointsResponse list;
  ASSERT_TRUE(checkpoints_->ListCheckpoints(Ctx().get(), list_req, &list).ok());
  ASSERT_EQ(list.checkpoints_size(), 2);
  EXPECT_EQ(list.checkpoints(0).step(), 4);
  EXPECT_EQ(list.checkpoints(1).step(), 8);
  for (const auto& c : list.checkpoints()) {
    EXPECT_TRUE(c.committed());
    EXPECT_EQ(c.world_size(), 2);
  }

  loom::v1::ConsolidateCheckpointRequest cons_req;
  cons_req.set_job_id(job.id());
  loom::v1::ConsolidateCheckpointResponse cons;
  grpc::Status cs = checkpoints_->ConsolidateCheckpoint(Ctx().get(), cons_req, &cons);
  ASSERT_TRUE(cs.ok()) << cs.error_message();
  EXPECT_EQ(cons.step(), 8);

  // The file passes the safetensors validator and holds the HF Llama tensors (tied: no lm_head).
  auto file = safetensors::Reader::Open(cons.safetensors_path());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  const auto* embed = (*file)->Find("model.embed_tokens.weight");
  ASSERT_NE(embed, nullptr);
  EXPECT_EQ(embed->dtype, "F32");
  EXPECT_EQ(embed->shape, (std::vector<int64_t>{256, 48}));
  const auto* k = (*file)->Find("model.layers.1.self_attn.k_proj.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->shape, (std::vector<int64_t>{24, 48}));  // 2 KV heads x head_dim 12
  EXPECT_EQ((*file)->Find("lm_head.weight"), nullptr);
  EXPECT_EQ((*file)->tensors().size(), 1u + 2u * 9u + 1u);

  // Independent check with PyTorch 2.11 (the project venv): rebuild the model from the export and compare logits.
  std::string model_dir = cons.safetensors_path().substr(0, cons.safetensors_path().rfind('/'));
  std::string cmd = absl::StrCat("/opt/loom/venv/bin/python3 ", RunfilePath("tests/python/check_export.py"),
                                 " --model_dir ", model_dir, " --logits ", job.checkpoint_dir(),
                                 "/final_logits.json --atol 1e-4 > ", tmp_, "/check_export.log 2>&1");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << testing::Tail(absl::StrCat(tmp_, "/check_export.log"));

  // Every daemon serves Prometheus metrics. The trainer's series (step, loss, tokens; checked
  // while a rank runs by //tests/observability:prometheus_scrape_test) are removed once the
  // worker forgets the ended rank (issue 53: no stale series of ended jobs).
  auto sched_metrics = testing::HttpGet(scheduler_info_.metrics_url);
  ASSERT_TRUE(sched_metrics.ok()) << sched_metrics.status();
  EXPECT_TRUE(absl::StrContains(*sched_metrics, "loom_jobs{phase=\"SUCCEEDED\"} 1"))
      << *sched_metrics;
  absl::StatusOr<std::string> worker_metrics;
  EXPECT_TRUE(Eventually(
      [&] {
        worker_metrics = testing::HttpGet(worker_infos_[0].metrics_url);
        return worker_metrics.ok() && !absl::StrContains(*worker_metrics, "loom_trainer_step{");
      },
      absl::Seconds(30), absl::Milliseconds(50)))
      << (worker_metrics.ok() ? *worker_metrics : worker_metrics.status().ToString());
  ASSERT_TRUE(worker_metrics.ok()) << worker_metrics.status();
  EXPECT_TRUE(absl::StrContains(*worker_metrics, "loom_worker_heartbeats_total"))
      << *worker_metrics;
  auto ckpt_metrics = testing::HttpGet(checkpoint_info_.metrics_url);
  ASSERT_TRUE(ckpt_metrics.ok()) << ckpt_metrics.status();
  EXPECT_TRUE(absl::StrContains(*ckpt_metrics, "loom_checkpoint_consolidations_total"));
}

TEST_F(ClusterE2ETest, FailedRankFailsTheJobWithItsError) {
  // A text corpus under the cluster's data root that admission only sniffs (over its 16 MiB
  // split-check bound) but that holds a single paragraph, so the trainer's hold-out split leaves
  // one side empty: every rank fails. (An empty file is refused at submission.)
  std::string empty = absl::StrCat(tmp_, "/data/empty.txt");
  ASSERT_TRUE(WriteFileAtomically(empty, std::string((16 << 20) + 1, 'a')).ok());
  std::string yaml = kTinyJob;
  yaml.replace(yaml.find("dataset: {name: fortunes}"), 25,
               absl::StrCat("dataset: {name: custom, path: ", empty, "}"));
  loom::v1::Job job = Submit(yaml);
  job = WaitFor(job.id(), loom::v1::JOB_PHASE_FAILED, absl::Minutes(2));
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.message(), "rank")) << job.message();
  EXPECT_TRUE(absl::StrContains(job.message(), "empty.txt")) << job.message();
}

// The worker does not take the scheduler's word for a path: a corpus the scheduler admits (its
// data roots include <tmp>/scheduler-only) but the workers' --data_roots do not is refused
// before any trainer starts, and the job fails naming the field.
TEST_F(ClusterE2ETest, WorkerRefusesAPathOutsideItsOwnDataRoots) {
  const std::string corpus = absl::StrCat(tmp_, "/scheduler-only/corpus.txt");
  std::string text;
  for (int i = 0; i < 200; ++i) absl::StrAppend(&text, "line ", i, " of a corpus\n%\n");
  ASSERT_TRUE(WriteFileAtomically(corpus, text).ok());
  std::string yaml = kTinyJob;
  yaml.replace(yaml.find("dataset: {name: fortunes}"), 25,
               absl::StrCat("dataset: {name: custom, path: ", corpus, "}"));
  loom::v1::Job job = Submit(yaml);
  job = WaitFor(job.id(), loom::v1::JOB_PHASE_FAILED, absl::Minutes(2));
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.message(), "refused to start the trainer: dataset.path: '" +
                                                   corpus + "' is outside the data roots"))
      << job.message();
  // Each job directory records its owner for the workers' init_from checks.
  auto owner = ReadFile(absl::StrCat(ckpt_root_, "/", job.id(), "/.loom-tenant"));
  ASSERT_TRUE(owner.ok()) << owner.status();
  EXPECT_EQ(*owner, "default\n");
}

TEST_F(ClusterE2ETest, KillStopsRunningRanksPromptly) {
  std::string yaml = kTinyJob;
  yaml.replace(yaml.find("steps: 8"), 8, "steps: 100000");
  loom::v1::Job job = Submit(yaml);
  job = WaitFor(job.id(), loom::v1::JOB_PHASE_RUNNING, absl::Minutes(2));
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_RUNNING);
  loom::v1::KillJobRequest req;
  req.set_job_id(job.id());
  loom::v1::Job cancelled;
  ASSERT_TRUE(jobs_->KillJob(Ctx().get(), req, &cancelled).ok());
  EXPECT_EQ(cancelled.phase(), loom::v1::JOB_PHASE_CANCELLED);
  EXPECT_EQ(cancelled.reason(), "Killed");
  // The workers stop their ranks: no RUNNING rank left on either worker within 20 s.
  const absl::Time killed_at = absl::Now();
  absl::Time deadline = absl::Now() + absl::Seconds(20);
  bool stopped = false;
  while (!stopped && absl::Now() < deadline) {
    stopped = true;
    for (const ReadyInfo& w : worker_infos_) {
      auto m = testing::HttpGet(w.metrics_url);
      ASSERT_TRUE(m.ok()) << m.status();
      stopped &= absl::StrContains(*m, "loom_worker_ranks{state=\"RANK_STATE_RUNNING\"} 0");
    }
    if (!stopped) absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_TRUE(stopped) << "ranks still running 20 s after kill";
  // Promptly: a heartbeat to learn of it, then SIGTERM (SIGKILL after the worker's 5 s grace).
  EXPECT_LT(absl::Now() - killed_at, absl::Seconds(10));
  // A second kill (or cancel) of an ended job is refused.
  grpc::Status again = jobs_->KillJob(Ctx().get(), req, &cancelled);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  loom::v1::CancelJobRequest cancel;
  cancel.set_job_id(job.id());
  EXPECT_EQ(jobs_->CancelJob(Ctx().get(), cancel, &cancelled).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

// Graceful cancel: the ranks write a final checkpoint at an agreed step and stop; the job ends
// CANCELLED naming that step, which the checkpoint service lists as committed. Meanwhile the
// job's logs hold the trainers' lines and a watcher sees STOPPING, then CANCELLED.
TEST_F(ClusterE2ETest, CancelWritesACommittedFinalCheckpointAndLogsHoldTrainerLines) {
  std::string yaml = kTinyJob;
  yaml.replace(yaml.find("steps: 8"), 8, "steps: 100000");
  yaml.replace(yaml.find("interval_steps: 4"), 17, "interval_steps: 50000");
  loom::v1::Job job = Submit(yaml);
  job = WaitFor(job.id(), loom::v1::JOB_PHASE_RUNNING, absl::Minutes(2));
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_RUNNING);
  // A few steps, so that the final checkpoint is not the initial state.
  const absl::Time step_deadline = absl::Now() + absl::Minutes(1);
  while (job.progress().step() < 2 && absl::Now() < step_deadline) {
    absl::SleepFor(absl::Milliseconds(100));
    loom::v1::GetJobRequest get;
    get.set_job_id(job.id());
    ASSERT_TRUE(jobs_->GetJob(Ctx().get(), get, &job).ok());
  }
  ASSERT_GE(job.progress().step(), 2);

  // Logs of the running job: the trainers' stderr (glog) and stdout (JSON events) of both ranks.
  const absl::Time log_deadline = absl::Now() + absl::Seconds(10);
  std::vector<loom::v1::LogLine> lines;
  bool have_both = false;
  while (!have_both && absl::Now() < log_deadline) {
    loom::v1::StreamLogsRequest logs_req;
    logs_req.set_job_id(job.id());
    auto ctx = Ctx();
    auto reader = jobs_->StreamLogs(ctx.get(), logs_req);
    lines.clear();
    loom::v1::LogLine line;
    while (reader->Read(&line)) lines.push_back(line);
    ASSERT_TRUE(reader->Finish().ok());
    std::set<std::string> kinds;
    for (const auto& l : lines) {
      if (absl::StrContains(l.text(), "joined")) kinds.insert(absl::StrCat("joined", l.rank()));
      if (absl::StrContains(l.text(), "{\"step\":{")) kinds.insert(absl::StrCat("step", l.rank()));
    }
    have_both = kinds.size() == 4;
    if (!have_both) absl::SleepFor(absl::Milliseconds(300));
  }
  EXPECT_TRUE(have_both) << "trainer lines missing from " << lines.size() << " log lines";
  bool saw_stderr = false, saw_stdout = false;
  for (const auto& l : lines) {
    saw_stderr |= l.stream() == "stderr";
    saw_stdout |= l.stream() == "stdout";
    EXPECT_EQ(l.attempt(), 1);
  }
  EXPECT_TRUE(saw_stderr);
  EXPECT_TRUE(saw_stdout);

  grpc::ClientContext watch_ctx;
  watch_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(3));
  loom::v1::WatchJobRequest watch_req;
  watch_req.set_job_id(job.id());
  auto watch = jobs_->WatchJob(&watch_ctx, watch_req);
  std::vector<loom::v1::JobEvent> events;
  std::thread watcher([&] {
    loom::v1::JobEvent e;
    while (watch->Read(&e)) events.push_back(e);
  });
  // A failed ASSERT below returns early: stop and join the watcher on every path (an unjoined
  // std::thread would terminate the binary and leave the cluster's daemons running).
  absl::Cleanup stop_watcher = [&] {
    if (watcher.joinable()) {
      watch_ctx.TryCancel();
      watcher.join();
    }
  };

  loom::v1::CancelJobRequest req;
  req.set_job_id(job.id());
  loom::v1::Job stopping;
  ASSERT_TRUE(jobs_->CancelJob(Ctx().get(), req, &stopping).ok());
  EXPECT_EQ(stopping.phase(), loom::v1::JOB_PHASE_STOPPING);
  job = WaitFor(job.id(), loom::v1::JOB_PHASE_CANCELLED, absl::Minutes(2));
  watcher.join();
  EXPECT_TRUE(watch->Finish().ok());
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_CANCELLED);
  EXPECT_EQ(job.reason(), "Cancelled");
  const std::string marker = "final checkpoint written at step ";
  const size_t at = job.message().find(marker);
  ASSERT_NE(at, std::string::npos) << job.message();
  const int64_t step = std::stoll(job.message().substr(at + marker.size()));
  EXPECT_GE(step, 2);
  EXPECT_EQ(job.progress().last_checkpoint_step(), step);

  loom::v1::ListCheckpointsRequest list_req;
  list_req.set_job_id(job.id());
  loom::v1::ListCheckpointsResponse list;
  ASSERT_TRUE(checkpoints_->ListCheckpoints(Ctx().get(), list_req, &list).ok());
  ASSERT_EQ(list.checkpoints_size(), 1);  // the interval (50000) was never reached
  EXPECT_EQ(list.checkpoints(0).step(), step);
  EXPECT_TRUE(list.checkpoints(0).committed());
  EXPECT_EQ(list.checkpoints(0).world_size(), 2);

  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front().type(), "Snapshot");
  EXPECT_EQ(events.back().job().phase(), loom::v1::JOB_PHASE_CANCELLED);
  bool saw_stopping = false;
  for (const auto& e : events) saw_stopping |= e.job().phase() == loom::v1::JOB_PHASE_STOPPING;
  EXPECT_TRUE(saw_stopping);

  // The same through loomctl: logs of one rank (the buffer outlives the job), watch of the ended
  // job (its snapshot; exit 1: not SUCCEEDED), kill of the ended job (9 = FAILED_PRECONDITION).
  auto loomctl = [&](const std::string& name, std::vector<std::string> args) {
    args.insert(args.begin(), {RunfilePath("services/cli/loomctl"),
                               absl::StrCat("--scheduler=", scheduler_info_.grpc_address)});
    const std::string out = absl::StrCat(tmp_, "/loomctl-", name, ".out");
    auto p = testing::Subprocess::Start(args, out);
    EXPECT_TRUE(p.ok()) << p.status();
    const int code = p.ok() ? testing::ExitCode(p->Wait(absl::Seconds(30))) : -1;
    auto text = ReadFile(out);
    return std::make_pair(code, text.ok() ? *text : std::string());
  };
  auto [logs_code, logs_out] = loomctl("logs", {"logs", job.id(), "--rank=1", "--tail=3"});
  EXPECT_EQ(logs_code, 0) << logs_out;
  int rank1_lines = 0;
  for (absl::string_view l : absl::StrSplit(logs_out, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(l, "[rank 1] ")) ++rank1_lines;
  }
  EXPECT_EQ(rank1_lines, 3) << logs_out;
  auto [watch_code, watch_out] = loomctl("watch", {"watch", job.id()});
  EXPECT_EQ(watch_code, 1) << watch_out;
  EXPECT_TRUE(absl::StrContains(watch_out, "Snapshot")) << watch_out;
  EXPECT_TRUE(absl::StrContains(watch_out, "CANCELLED")) << watch_out;
  auto [kill_code, kill_out] = loomctl("kill", {"kill", job.id()});
  EXPECT_EQ(kill_code, 9) << kill_out;
}

// The scheduler kill -9 / restart tests live in scheduler_restart_e2e_test.cc.

// Recovery: three single-slot workers; the scheduler declares a silent node lost after 3 s.
class ClusterRecoveryE2ETest : public ClusterE2ETest {
 protected:
  int NumWorkers() const override { return 3; }
  std::vector<std::string> ExtraSchedulerArgs() const override {
    return {"--heartbeat_timeout_s=3"};
  }
};

TEST_F(ClusterRecoveryE2ETest, KilledWorkerMidTrainingResumesFromCheckpointAndMatchesUninterrupted) {
  std::string yaml = kTinyJob;
  yaml.replace(yaml.find("steps: 8"), 8, "steps: 120");
  yaml.replace(yaml.find("interval_steps: 4"), 17, "interval_steps: 20");
  // The reference: the same job, uninterrupted.
  loom::v1::Job reference = WaitFor(Submit(yaml).id(), loom::v1::JOB_PHASE_SUCCEEDED);
  ASSERT_EQ(reference.phase(), loom::v1::JOB_PHASE_SUCCEEDED);
  ASSERT_EQ(reference.attempt(), 1);

  // keep_last 1: retention runs through loom-checkpoint on every checkpoint, and must keep
  // the newest committed one the recovery resumes from.
  std::string with_retention = yaml;
  with_retention.replace(with_retention.find("interval_steps: 20"), 18,
                         "interval_steps: 20, keep_last: 1");
  // A lost node is an infra failure (max_infra_restarts); the surviving rank may report its
  // collective error before the node looks silent, which counts as a user failure.
  loom::v1::Job job =
      Submit(absl::StrCat(with_retention, "max_restarts: 2\nmax_infra_restarts: 2\n"));
  // Wait for a committed checkpoint, then kill -9 the worker of rank 1 (its trainer gets
  // SIGTERM through its parent-death signal: the node is gone). The checkpoint is watched on
  // disk (every 2 ms), not through the scheduler's progress, which trails the ranks by up to a
  // heartbeat: 120 steps take about 4 s here (see offload_resume_e2e_test).
  job = WaitFor(job.id(), loom::v1::JOB_PHASE_RUNNING, absl::Minutes(2));
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_RUNNING);
  const std::string checkpoint_dir = absl::StrCat(ckpt_root_, "/", job.id());
  ASSERT_TRUE(e2e::Eventually(
      [&] {
        auto newest = storage::NewestCommittedCheckpoint(checkpoint_dir);
        return newest.ok() && newest->step >= 20;
      },
      absl::Minutes(2), absl::Milliseconds(2)))
      << "no checkpoint committed in " << checkpoint_dir;
  const std::string victim = job.rank_nodes(1);
  const int victim_index = victim.back() - '0';
  workers_[victim_index]->Kill();

  job = WaitFor(job.id(), loom::v1::JOB_PHASE_SUCCEEDED, absl::Minutes(3));
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_SUCCEEDED) << job.message();
  EXPECT_EQ(job.attempt(), 2);
  EXPECT_EQ(job.progress().step(), 120);
  for (const std::string& node : job.rank_nodes()) EXPECT_NE(node, victim);
  // The second attempt resumed from a committed checkpoint, not from step 0.
  bool resumed = false;
  for (int i = 0; i < NumWorkers(); ++i) {
    auto log = ReadFile(absl::StrCat(tmp_, "/work-", i, "/", job.id(), "/attempt_2/rank_0.log"));
    if (log.ok() && absl::StrContains(*log, "start step ") &&
        !absl::StrContains(*log, "start step 0\n")) {
      resumed = true;
    }
  }
  EXPECT_TRUE(resumed) << "attempt 2 did not resume from a checkpoint";
  // Same data order, same optimizer state: the resumed run ends where the uninterrupted one did.
  // fp32 on CPU, same world size: the trainer's resume is bit-exact (trainer_test); allow 1e-5.
  EXPECT_NEAR(job.progress().eval_loss(), reference.progress().eval_loss(), 1e-5);
  EXPECT_NEAR(job.progress().loss(), reference.progress().loss(), 1e-5);
  EXPECT_DOUBLE_EQ(job.progress().initial_eval_loss(), reference.progress().initial_eval_loss());
  // Retention (keep_last 1) leaves only the final checkpoint. The scheduler's checkpoint worker
  // applies retention asynchronously, after the commit (scheduler/checkpoint_worker.h), so the
  // job can read SUCCEEDED before the older step is deleted: wait for it, with a deadline.
  loom::v1::ListCheckpointsRequest list_req;
  list_req.set_job_id(job.id());
  loom::v1::ListCheckpointsResponse list;
  bool one_left = Eventually(
      [&] {
        list.Clear();
        return checkpoints_->ListCheckpoints(Ctx().get(), list_req, &list).ok() &&
               list.checkpoints_size() == 1;
      },
      absl::Seconds(60));
  ASSERT_TRUE(one_left) << "retention left " << list.checkpoints_size() << " checkpoints";
  EXPECT_EQ(list.checkpoints(0).step(), 120);
}

// A committed checkpoint damaged on disk (one byte of the newest committed step's rank 1 shard)
// is verified before it is chosen as the resume point: the step is marked corrupt and skipped,
// the job resumes from the intact step before it, says so in its history, and succeeds without
// spending a user restart (max_restarts 0: a user failure would end the job).
TEST_F(ClusterRecoveryE2ETest, CorruptNewestCheckpointIsSkippedForThePreviousIntactOne) {
  std::string yaml = kTinyJob;
  yaml.replace(yaml.find("steps: 8"), 8, "steps: 1000");
  yaml.replace(yaml.find("interval_steps: 4"), 17, "interval_steps: 20");
  loom::v1::Job job = Submit(absl::StrCat(yaml, "max_restarts: 0\nmax_infra_restarts: 2\n"));
  absl::Time deadline = absl::Now() + absl::Minutes(2);
  while (absl::Now() < deadline) {
    job = WaitFor(job.id(), loom::v1::JOB_PHASE_RUNNING, absl::Minutes(2));
    if (job.progress().last_checkpoint_step() >= 40) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_GE(job.progress().last_checkpoint_step(), 40);
  // Freeze both ranks (no newer checkpoint can appear), then damage the newest committed step.
  std::map<int, pid_t> trainers = TrainerPids(job.id());
  ASSERT_EQ(trainers.size(), 2u);
  for (const auto& [rank, pid] : trainers) ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  absl::Cleanup resume_rank0 = [&] { ::kill(trainers[0], SIGCONT); };
  loom::v1::ListCheckpointsRequest list_req;
  list_req.set_job_id(job.id());
  loom::v1::ListCheckpointsResponse list;
  ASSERT_TRUE(checkpoints_->ListCheckpoints(Ctx().get(), list_req, &list).ok());
  std::vector<int64_t> committed;
  for (const auto& c : list.checkpoints()) {
    if (c.committed()) committed.push_back(c.step());
  }
  ASSERT_GE(committed.size(), 2u);
  const int64_t corrupt_step = committed.back();
  const int64_t intact_step = committed[committed.size() - 2];
  ASSERT_LT(corrupt_step, 1000);
  {
    std::fstream f(absl::StrCat(job.checkpoint_dir(), "/step_",
                                absl::StrFormat("%08d", corrupt_step), "/rank_1.shard"),
                   std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekg(1000);
    const char c = static_cast<char>(f.get());
    f.seekp(1000);
    f.put(static_cast<char>(c ^ 0x40));
  }
  // Rank 1's node dies (worker and trainer): an infrastructure failure.
  const std::string victim = job.rank_nodes(1);
  workers_[victim.back() - '0']->Kill();
  ::kill(trainers[1], SIGKILL);
  job = WaitFor(job.id(), loom::v1::JOB_PHASE_RECOVERING, absl::Minutes(1));
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_RECOVERING) << job.message();
  ::kill(trainers[0], SIGCONT);  // it is being stopped; let it go

  job = WaitFor(job.id(), loom::v1::JOB_PHASE_SUCCEEDED, absl::Minutes(4));
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_SUCCEEDED) << job.message();
  EXPECT_EQ(job.progress().step(), 1000);
  EXPECT_EQ(job.attempt(), 2);
  EXPECT_EQ(job.user_restarts(), 0);
  EXPECT_EQ(job.infra_restarts(), 1);
  // Attempt 2 started from the intact step (its rank 0 log), not the corrupt one nor step 0.
  bool resumed_from_intact = false;
  for (int i = 0; i < NumWorkers(); ++i) {
    auto log = ReadFile(absl::StrCat(tmp_, "/work-", i, "/", job.id(), "/attempt_2/rank_0.log"));
    if (log.ok() && absl::StrContains(*log, absl::StrCat("start step ", intact_step, "\n"))) {
      resumed_from_intact = true;
    }
  }
  EXPECT_TRUE(resumed_from_intact) << "attempt 2 did not resume from step " << intact_step;
  // The ended job's history (WatchJob) says what happened.
  grpc::ClientContext watch_ctx;
  watch_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  loom::v1::WatchJobRequest watch_req;
  watch_req.set_job_id(job.id());
  auto watch = jobs_->WatchJob(&watch_ctx, watch_req);
  loom::v1::JobEvent e;
  std::string second_start;
  bool saw_recovering = false;
  while (watch->Read(&e)) {
    if (e.type() != "History") continue;
    saw_recovering |= e.job().phase() == loom::v1::JOB_PHASE_RECOVERING;
    if (e.job().phase() == loom::v1::JOB_PHASE_STARTING && e.job().attempt() == 2) {
      second_start = e.job().message();
    }
  }
  EXPECT_TRUE(watch->Finish().ok());
  EXPECT_TRUE(saw_recovering);
  EXPECT_TRUE(absl::StrContains(second_start, absl::StrCat("/step_",
                                                           absl::StrFormat("%08d", intact_step),
                                                           "; skipped step ", corrupt_step, " (")))
      << second_start;
  EXPECT_TRUE(absl::StrContains(second_start, "rank_1.shard")) << second_start;
  EXPECT_TRUE(absl::StrContains(second_start, "CRC-32")) << second_start;
}

TEST_F(ClusterRecoveryE2ETest, WorkerThatStopsHeartbeatingWhileItsRankStepsKeepsItsJob) {
  std::string yaml = kTinyJob;
  yaml.replace(yaml.find("steps: 8"), 8, "steps: 800");
  yaml.replace(yaml.find("interval_steps: 4"), 17, "interval_steps: 50");
  loom::v1::Job job = Submit(yaml);
  // Wait until the job is stepping (RUNNING comes before the first step, and "no step progress
  // yet" is exactly what makes a silent node lost).
  const absl::Time deadline = absl::Now() + absl::Minutes(2);
  do {
    job = WaitFor(job.id(), loom::v1::JOB_PHASE_RUNNING, absl::Minutes(2));
    if (job.progress().step() >= 5) break;
    absl::SleepFor(absl::Milliseconds(50));
  } while (absl::Now() < deadline);
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_RUNNING);
  ASSERT_GE(job.progress().step(), 5);
  ASSERT_LT(job.progress().step(), 200) << "too far along to freeze a worker";
  // Freeze (SIGSTOP) the worker daemon of rank 1: it sends no heartbeats, while its trainer
  // process keeps stepping with rank 0 (whose worker still reports the job's step; a ZeRO-3
  // step needs both ranks). The freeze lasts until the scheduler's heartbeat timeout (3 s) has
  // passed and the reported step has advanced after it: the job stays RUNNING in attempt 1
  // throughout, and the ranks kept stepping past the timeout.
  Subprocess& frozen = *workers_[job.rank_nodes(1).back() - '0'];
  ASSERT_EQ(::kill(frozen.pid(), SIGSTOP), 0);
  absl::Cleanup thaw = [&frozen] { ::kill(frozen.pid(), SIGCONT); };
  const absl::Time frozen_at = absl::Now();
  const absl::Time timeout_passed = frozen_at + absl::Seconds(3) + absl::Milliseconds(500);
  int64_t step_at_timeout = -1, last_step = -1;
  const absl::Time freeze_deadline = frozen_at + absl::Seconds(60);
  while (absl::Now() < freeze_deadline) {
    loom::v1::GetJobRequest get;
    get.set_job_id(job.id());
    ASSERT_TRUE(jobs_->GetJob(Ctx().get(), get, &job).ok());
    ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_RUNNING) << job.message();
    ASSERT_EQ(job.attempt(), 1);
    if (absl::Now() >= timeout_passed) {
      if (step_at_timeout < 0) step_at_timeout = job.progress().step();
      last_step = job.progress().step();
      // Held for at least twice the timeout, and stepping went on after the timeout.
      if (absl::Now() >= frozen_at + absl::Seconds(6) && last_step >= step_at_timeout + 5) break;
    }
    absl::SleepFor(absl::Milliseconds(100));  // poll interval
  }
  std::cout << "frozen " << absl::ToDoubleSeconds(absl::Now() - frozen_at)
            << " s: step " << step_at_timeout << " at the heartbeat timeout, " << last_step
            << " at the end of the freeze\n";
  ASSERT_GE(last_step, step_at_timeout + 5)
      << "the ranks did not keep stepping past the heartbeat timeout";
  std::move(thaw).Invoke();
  job = WaitFor(job.id(), loom::v1::JOB_PHASE_SUCCEEDED, absl::Minutes(3));
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_SUCCEEDED) << job.message();
  EXPECT_EQ(job.attempt(), 1);  // never torn down
  EXPECT_EQ(job.progress().step(), 800);
}

}  // namespace
}  // namespace loom
