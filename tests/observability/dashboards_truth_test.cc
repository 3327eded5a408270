// The truth test of the dashboards and alerts (issue 53): a real Prometheus (Debian's
// /usr/bin/prometheus, 1 s scrape and rule evaluation, the checked-in deploy/prometheus/alerts.yml)
// scrapes a real local Loom cluster (loom-scheduler, loom-checkpoint, loom-gateway and two 2-slot
// loom-workers on loopback) while jobs of every outcome run:
//   shared-zenflow, shared-superoffload  two 1-rank jobs that share worker-0 (worker-1 is cordoned
//                                        while they are placed), SUCCEEDED; the first is then
//                                        consolidated by loom-checkpoint
//   failing      1 rank, max_restarts 3: its trainer is killed (SIGHUP, exit 129: a user failure)
//                at each of its 4 attempts -> 3 restarts, then FAILED
//   cancelled    2 ranks, submitted through the gateway while the cluster is full (it queues),
//                cancelled through the gateway once it steps -> CANCELLED
//   restarted    1 rank: SIGKILLed after its first checkpoint -> attempt 2 resumes from it,
//                SUCCEEDED
//   pair         2 ranks, SUCCEEDED
// Then EVERY panel target of EVERY dashboard in deploy/grafana/*.json is evaluated through
// Prometheus' HTTP API and compared with ground truth: the scheduler's own API (ListJobs and
// AdminService.ListNodes sampled every 250 ms during the run, WatchJob's phase history, GetJob,
// the trainers' step events through StreamLogs), the files on disk, and what the test itself did
// (jobs submitted and cancelled, requests sent to the gateway, consolidations asked for). Each
// panel has a checker in one table keyed by (dashboard file, panel title); a panel without one
// fails the test, so a panel added later cannot escape it, and so does a checker whose panel is
// gone.
//
// How values are compared:
// * Gauges the scheduler and workers keep (jobs by phase, slots, ranks, nodes): at every 0.5 s
//   grid point of the run where the truth sampled from the API did not change for 3 s before it
//   (5 s for worker rank states, whose ended ranks are reported 5 heartbeats) and 0.5 s after.
// * Counters and histograms over the whole run: evaluated at the last scrape of their target,
//   with the rate interval covering the whole run, so that increase() neither extrapolates nor
//   misses (the counters exist at 0 before their first event): exact counts.
// * Per-job series (job detail, checkpoints): instant queries at the time of the last scrape that
//   still had the job's last attempt's ranks (their series go a few heartbeats after the rank
//   ends), compared with GetJob and the last "step" event of each rank.
#include "tests/observability/dashboards_truth.h"

#include <iostream>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace loom::dashboards_truth {

DashboardsTruth::CheckerTable DashboardsTruth::Checkers() {
  CheckerTable c;
  AddClusterCheckers(c);
  AddJobCheckers(c);
  return c;
}

namespace {

TEST_F(DashboardsTruth, EveryPanelOfEveryDashboardAgreesWithTheScheduler) {
  const absl::Time started = absl::Now();
  ASSERT_NO_FATAL_FAILURE(StartEverything());
  ASSERT_NO_FATAL_FAILURE(RunScenario());
  std::cout << "run: " << (run_end_ - run_start_) << " s\n";
  ASSERT_NO_FATAL_FAILURE(CollectTruth());
  for (const auto& [id, run] : runs_) {
    std::cout << run.label << " " << id << ": " << PhaseName(run.final.phase()) << " attempt "
              << run.final.attempt() << " step " << run.final.progress().step() << " loss "
              << Fmt(run.final.progress().loss()) << " ckpt "
              << run.final.progress().last_checkpoint_step() << " restarts "
              << run.final.user_restarts() << "+" << run.final.infra_restarts() << " nodes "
              << absl::StrJoin(run.final.rank_nodes(), ",") << " t_last run +"
              << (run.t_last - run_start_) << " start_step " << run.start_step << "\n";
  }
  CheckerTable checkers = Checkers();
  std::set<std::pair<std::string, std::string>> panels;
  for (const Panel& p : LoadPanels()) {
    const auto key = std::make_pair(p.file, p.title);
    EXPECT_TRUE(panels.insert(key).second)
        << "two panels titled \"" << p.title << "\" in " << p.file;
    auto it = checkers.find(key);
    if (it == checkers.end()) {
      ADD_FAILURE()
          << "panel \"" << p.title << "\" of " << p.file
          << " has no checker in dashboards_truth_*_checkers.cc: every panel must be compared "
             "with the scheduler's truth (or be explicitly structural, saying why)";
      continue;
    }
    std::cout << "checking " << p.file << " / " << p.title << "\n";
    it->second(p);
  }
  for (const auto& [key, checker] : checkers) {
    EXPECT_TRUE(panels.count(key)) << "checker for \"" << key.second << "\" of " << key.first
                                   << ", a panel that no longer exists";
  }
  CheckAlerts();
  CheckTemplateVariables();
  std::cout << "whole test: " << absl::ToDoubleSeconds(absl::Now() - started) << " s\n";
}
}  // namespace
}  // namespace loom::dashboards_truth
