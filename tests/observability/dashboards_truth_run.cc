// The truth test's run (dashboards_truth.h): jobs of every outcome, the truth collected
// after it, and the panels of deploy/grafana/*.json.
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

void DashboardsTruth::Cordon(const std::string& node, bool on) {
  v1::NodeInfo info;
  grpc::Status s;
  if (on) {
    v1::CordonNodeRequest req;
    req.set_node_id(node);
    req.set_reason("truth test: keep the shared jobs on worker-0");
    s = admin_->CordonNode(Ctx().get(), req, &info);
  } else {
    v1::UncordonNodeRequest req;
    req.set_node_id(node);
    s = admin_->UncordonNode(Ctx().get(), req, &info);
  }
  ASSERT_TRUE(s.ok()) << s.error_message();
}

JobRun& DashboardsTruth::Track(const Job& job, const std::string& label, const JobParams& p) {
  JobRun& r = runs_[job.id()];
  r.label = label;
  r.params = p;
  label_to_id_[label] = job.id();
  return r;
}

// While a job is RECOVERING: remember its failure class for the attempt that failed.
void DashboardsTruth::CaptureRestart(const std::string& id, int failed_attempt) {
  Job j = WaitUntil(
      id,
      [&](const Job& x) {
        return x.phase() == v1::JOB_PHASE_RECOVERING && x.attempt() == failed_attempt;
      },
      absl::Minutes(1), absl::StrCat("RECOVERING after attempt ", failed_attempt),
      absl::Milliseconds(50));
  runs_[id].restart_class[failed_attempt] = j.failure_class();
}

void DashboardsTruth::RunScenario() {
  // 1. Two 1-rank jobs share worker-0 (worker-1 cordoned while they are placed): a ZenFlow
  //    job through gRPC and a SuperOffload job through the gateway, different seeds and lr.
  ASSERT_NO_FATAL_FAILURE(Cordon("worker-1", true));
  JobParams za{.name = "shared-zenflow",
               .zero = kZenFlowZero,
               .steps = kSharedSteps,
               .checkpoint_every = kSharedSteps / 2,
               .seed = 1,
               .lr = 0.003};
  JobParams sb{.name = "shared-superoffload",
               .queue = "research",
               .zero = kSuperOffloadZero,
               .steps = kSharedSteps,
               .checkpoint_every = kSharedSteps / 2,
               .seed = 2,
               .lr = 0.01};
  Job a = SubmitJob(za);
  Track(a, "shared-zenflow", za);
  Job b = SubmitThroughGateway(sb);
  ASSERT_FALSE(b.id().empty());
  Track(b, "shared-superoffload", sb);
  a = WaitFor(a.id(), v1::JOB_PHASE_RUNNING, absl::Minutes(2));
  b = WaitFor(b.id(), v1::JOB_PHASE_RUNNING, absl::Minutes(2));
  ASSERT_EQ(a.rank_nodes_size(), 1);
  ASSERT_EQ(b.rank_nodes_size(), 1);
  EXPECT_EQ(a.rank_nodes(0), "worker-0");
  EXPECT_EQ(b.rank_nodes(0), "worker-0");
  ASSERT_NO_FATAL_FAILURE(Cordon("worker-1", false));

  // 2. A job that fails: its trainer killed (SIGHUP: exit 129, a user failure) at each of its
  //    four attempts; three restarts, then FAILED. A 2-rank job submitted through the gateway
  //    meanwhile waits for two free slots.
  JobParams fp{.name = "failing",
               .steps = 1000000,
               .checkpoint_every = 1000000,
               .seed = 3,
               .max_restarts = 3};
  Job f = SubmitJob(fp);
  Track(f, "failing", fp);
  JobParams cp{.name = "cancelled",
               .queue = "research",
               .ranks = 2,
               .steps = 1000000,
               .checkpoint_every = 100,
               .seed = 4,
               // It runs thousands of steps, more lines than the worker keeps: its last eval
               // event must be recent.
               .eval_every = 100};
  Job c = SubmitThroughGateway(cp);
  ASSERT_FALSE(c.id().empty());
  Track(c, "cancelled", cp);
  for (int attempt = 1; attempt <= 4; ++attempt) {
    ASSERT_NO_FATAL_FAILURE(KillTrainerOfAttempt(f.id(), attempt, SIGHUP));
    if (attempt < 4) {
      ASSERT_NO_FATAL_FAILURE(CaptureRestart(f.id(), attempt));
    }
  }
  f = WaitFor(f.id(), v1::JOB_PHASE_FAILED, absl::Minutes(1));
  ASSERT_EQ(f.phase(), v1::JOB_PHASE_FAILED) << f.message();
  // Three restarts now: LoomRestartStorm ("more than 3") must stay quiet; give the rule a few
  // evaluations at 3.
  storm_quiet_from_ = NowSeconds();
  absl::SleepFor(absl::Seconds(6));
  storm_quiet_to_ = NowSeconds();

  // 3. A job killed (SIGKILL) after its first committed checkpoint: attempt 2 resumes there.
  JobParams rp{.name = "restarted",
               .steps = kRestartedSteps,
               .checkpoint_every = kRestartedSteps / 2,
               .seed = 5,
               .max_restarts = 1};
  Job r = SubmitJob(rp);
  Track(r, "restarted", rp);
  r = WaitUntil(
      r.id(),
      [&](const Job& j) {
        return j.phase() == v1::JOB_PHASE_RUNNING &&
               j.progress().last_checkpoint_step() >= rp.checkpoint_every &&
               j.progress().step() >= rp.checkpoint_every + 20;
      },
      absl::Minutes(2), "restarted: a checkpoint and steps past it", absl::Milliseconds(20));
  std::map<int, pid_t> pids = TrainerPids(r.id());
  ASSERT_EQ(pids.count(0), 1u);
  ASSERT_EQ(::kill(pids[0], SIGKILL), 0);
  runs_[r.id()].killed_after_checkpoint_at = NowSeconds();
  ASSERT_NO_FATAL_FAILURE(CaptureRestart(r.id(), 1));

  // 4. The 2-rank job runs once slots free up; cancelled through the gateway once it steps.
  c = WaitUntil(
      c.id(),
      [](const Job& j) { return j.phase() == v1::JOB_PHASE_RUNNING && j.progress().step() >= 150; },
      absl::Minutes(3), "cancelled: running");
  absl::SleepFor(absl::Seconds(2));  // a few scrapes of both ranks
  auto cancel =
      Gateway("POST", absl::StrCat("/v1/jobs/", c.id(), ":cancel"), "/v1/jobs/{id}:cancel");
  ASSERT_TRUE(cancel && cancel->status == 200) << (cancel ? cancel->body : "");
  ++cancelled_;

  // 5. A 2-rank job that succeeds.
  JobParams pp{.name = "pair",
               .ranks = 2,
               .steps = kPairSteps,
               .checkpoint_every = kPairSteps / 2,
               .seed = 6,
               .lr = 0.005};
  Job pr = SubmitJob(pp);
  Track(pr, "pair", pp);

  for (const char* label : {"shared-zenflow", "shared-superoffload", "restarted", "pair"}) {
    Job j = WaitFor(label_to_id_[label], v1::JOB_PHASE_SUCCEEDED, absl::Minutes(4));
    ASSERT_EQ(j.phase(), v1::JOB_PHASE_SUCCEEDED) << label << ": " << j.message();
  }
  Job cj = WaitFor(c.id(), v1::JOB_PHASE_CANCELLED, absl::Minutes(2));
  ASSERT_EQ(cj.phase(), v1::JOB_PHASE_CANCELLED) << cj.message();

  // 6. Consolidations: the first shared job's last checkpoint (ok) and a job that does not
  //    exist (not_found).
  for (const std::string& id : {label_to_id_["shared-zenflow"], std::string("job-doesnotexist")}) {
    v1::ConsolidateCheckpointRequest req;
    req.set_job_id(id);
    v1::ConsolidateCheckpointResponse resp;
    const absl::Time start = absl::Now();
    grpc::Status s = checkpoints_->ConsolidateCheckpoint(Ctx().get(), req, &resp);
    consolidation_seconds_.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    if (id == "job-doesnotexist") {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
      ++consolidations_["not_found"];
    } else {
      ASSERT_TRUE(s.ok()) << s.error_message();
      ++consolidations_["ok"];
      consolidated_path_ = resp.safetensors_path();
      consolidated_bytes_ = static_cast<double>(resp.total_bytes());
      consolidated_step_ = resp.step();
    }
  }
  // 7. Gateway reads: a job (200) and one that does not exist (404).
  Gateway("GET", absl::StrCat("/v1/jobs/", label_to_id_["pair"]), "/v1/jobs/{id}");
  Gateway("GET", "/v1/jobs/job-doesnotexist", "/v1/jobs/{id}");

  // The workers forget the ended ranks (5 heartbeats); then a few more scrapes of the quiet
  // cluster.
  ASSERT_TRUE(Eventually(
      [&] {
        auto s = prom_->Samples("count(loom_trainer_step)");
        return s.ok() && s->empty();
      },
      absl::Seconds(30), absl::Milliseconds(250)))
      << "ended ranks' series are still there";
  absl::SleepFor(absl::Seconds(4));
  run_end_ = NowSeconds();
  StopSampler();
}

// Everything the checkers need that only exists after the run.
void DashboardsTruth::CollectTruth() {
  for (auto& [id, run] : runs_) {
    run.final = Get(id);
    run.history = History(id);
    const int attempt = run.final.attempt();
    // The last instant at which every rank of the final attempt still had its step series: the
    // earliest of the ranks' last samples (a series goes a few heartbeats after its rank ends,
    // and ranks end a heartbeat or two apart; they stop at the same step, in lockstep).
    for (int rank = 0; rank < run.params.ranks; ++rank) {
      double last = 0;
      for (const PromSample& s :
           Eval(absl::StrCat("loom_trainer_step{job_id=\"", id, "\",attempt=\"", attempt,
                             "\",rank=\"", rank, "\"}[15m]"))) {
        last = std::max(last, s.time);
      }
      run.t_last = rank == 0 ? last : std::min(run.t_last, last);
    }
    EXPECT_GT(run.t_last, 0) << run.label << ": no step series of attempt " << attempt;
    for (int rank = 0; rank < run.params.ranks; ++rank) {
      // The worker keeps the newest 2000 lines of a rank (LogRing): a long attempt's "started"
      // event may be gone. A first attempt starts at step 0 (nothing to resume from).
      auto events = Events(id, rank);
      bool started_seen = false;
      for (const json& ev : events[attempt]) {
        if (ev.contains("started") && ev["started"].is_object()) {
          run.start_step = static_cast<int64_t>(Num(ev["started"], "start_step"));
          started_seen = true;
        }
        if (ev.contains("step") && ev["step"].is_object()) run.last_step[rank] = ev["step"];
        if (ev.contains("eval") && ev["eval"].is_object()) run.last_eval[rank] = ev["eval"];
      }
      EXPECT_TRUE(started_seen || attempt == 1)
          << run.label << " rank " << rank << ": the started event of attempt " << attempt
          << " is no longer in the worker's log ring";
      EXPECT_FALSE(run.last_step[rank].is_null())
          << run.label << " rank " << rank << ": no step event";
    }
  }
  // The resumed attempt's first samples of its checkpoint step.
  JobRun& r = runs_[label_to_id_["restarted"]];
  for (const PromSample& s :
       Eval(absl::StrCat("loom_trainer_last_checkpoint_step{job_id=\"", label_to_id_["restarted"],
                         "\",attempt=\"2\",rank=\"0\"}[15m]"))) {
    r.first_after_resume.emplace_back(s.time, s.value);
  }
  std::sort(r.first_after_resume.begin(), r.first_after_resume.end());
}

std::vector<Panel> DashboardsTruth::LoadPanels() {
  std::vector<Panel> out;
  const std::string dir = RunfilePath("deploy/grafana");
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".json") files.push_back(e.path().filename().string());
  }
  std::sort(files.begin(), files.end());
  EXPECT_GE(files.size(), 4u);
  for (const std::string& f : files) {
    auto text = ReadFile(absl::StrCat(dir, "/", f));
    EXPECT_TRUE(text.ok()) << f;
    json d = json::parse(text.ok() ? *text : "{}", nullptr, false);
    std::function<void(const json&)> walk = [&](const json& panels) {
      for (const json& p : panels) {
        if (p.value("type", "") == "row") {
          if (p.contains("panels")) walk(p["panels"]);
          continue;
        }
        Panel panel{f, p.value("title", ""), p.value("type", "")};
        for (const json& t : p.value("targets", json::array())) {
          panel.exprs.push_back(t.value("expr", ""));
          panel.legends.push_back(t.value("legendFormat", ""));
        }
        out.push_back(std::move(panel));
      }
    };
    walk(d.value("panels", json::array()));
  }
  return out;
}

}  // namespace loom::dashboards_truth
