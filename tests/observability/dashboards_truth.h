// The truth test of the dashboards (issue 53), shared by its parts: the jobs of the run,
// the truth sampled from the scheduler, the fixture that starts a local cluster and a real
// Prometheus (DashboardsTruthTest), and the run with its checkers (DashboardsTruth).
//   dashboards_truth_fixture.cc          cluster, Prometheus, sampler, actions, stable truth
//   dashboards_truth_run.cc              the scenario, the truth after it, the panels
//   dashboards_truth_compare.cc          helpers of the checkers; throughput, ages, alerts
//   dashboards_truth_cluster_checkers.cc cluster-overview, queues-fairness, services
//   dashboards_truth_job_checkers.cc     job-detail, checkpoints
//   dashboards_truth_test.cc             the test: every panel has a checker
// The fixture is single-threaded but for the sampler thread, which only appends to
// snapshots_ under snapshots_mu_. Times are Unix seconds (double) throughout.
#ifndef LOOM_TESTS_OBSERVABILITY_DASHBOARDS_TRUTH_H_
#define LOOM_TESTS_OBSERVABILITY_DASHBOARDS_TRUTH_H_

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "proto/admin_service.grpc.pb.h"
#include "proto/job_service.grpc.pb.h"
#include "tests/e2e/testing/e2e_cluster.h"
#include "tests/testing/prometheus.h"
#include "tests/testing/subprocess.h"

namespace loom::dashboards_truth {

using ::loom::e2e::Eventually;
using ::loom::e2e::TrainerPids;
using ::loom::testing::PromSample;
using ::loom::testing::RunfilePath;
using json = nlohmann::json;
using v1::Job;
using v1::JobPhase;

// Small helpers: a proto timestamp and now as Unix seconds; a double in full precision;
// whether a phase is terminal; a phase without its JOB_PHASE_ prefix.
double Seconds(const google::protobuf::Timestamp& t);
double NowSeconds();
std::string Fmt(double v);
bool Terminal(JobPhase p);
std::string PhaseName(JobPhase p);

// The tiny model of tests/observability (hidden 32, one layer, byte vocabulary): a step takes
// milliseconds on a CPU, so several 1 s scrapes see every job running.
inline constexpr char kModel[] = R"(model:
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
)";
inline constexpr int kMicroBatch = 2;
inline constexpr int kSequenceLength = 16;

inline constexpr char kZero3[] = "    stage: 3\n";
inline constexpr char kZenFlowZero[] = R"(    stage: 2
    offload_optimizer: {device: cpu}
    zenflow: {topk_ratio: 0.25, select_strategy: step, select_interval: 4, update_interval: 2,
              overlap_step: true, full_warm_up_rounds: 1}
)";
inline constexpr char kSuperOffloadZero[] = R"(    stage: 3
    sub_group_size: 2000
    offload_optimizer: {device: cpu, super_offload: true, ratio: 0.5, cpuadam_cores_perc: 1.0}
)";

// One job of the run: its spec's knobs (JobYaml writes the spec).
struct JobParams {
  std::string name;
  std::string queue = "default";
  std::string zero = kZero3;
  int ranks = 1;
  int steps = 1000;
  int checkpoint_every = 500;
  int seed = 1;
  double lr = 0.003;
  int max_restarts = 0;
  int eval_every = 0;  // training.eval_every_steps (0: only before and after training)
};

// The job spec (YAML) of `p`: kModel, the ZeRO block, checkpoints, restarts.
std::string JobYaml(const JobParams& p);

// What the scheduler said at one moment: every job (ListJobs) and node (ListNodes).
struct Snapshot {
  double t0 = 0, t1 = 0;  // before the first and after the last call
  std::vector<Job> jobs;
  std::vector<v1::NodeInfo> nodes;
};

// One entry of a job's phase history (WatchJob's "History" events).
struct HistoryEntry {
  JobPhase phase;
  double time;
  int attempt;
  std::string reason, message;
};

// A panel of a dashboard file.
struct Panel {
  std::string file, title, type;
  std::vector<std::string> exprs;
  std::vector<std::string> legends;
};

// The template variables of a dashboard and the rate interval, substituted into a target.
struct Vars {
  std::string job = ".*", instance = ".*", rank = ".*", tenant = ".*", queue = ".*";
  std::string rate_interval = "4s";
};

// `expr` with the dashboard variables ($job, ${job}, ..., $__rate_interval) of `v`.
std::string Substitute(const std::string& expr, const Vars& v);
// "{attempt=1,job_id=x,rank=0}" of the named labels of a sample (absent labels as "").
std::string Key(const PromSample& s, const std::vector<std::string>& names);
std::string Key(const std::vector<std::pair<std::string, std::string>>& labels);
// Histogram quantile as Prometheus computes it (linear interpolation in the bucket), from
// cumulative bucket counts by upper bound; NaN without observations.
double BucketQuantile(double q, const std::vector<std::pair<double, double>>& cumulative);
// The bounds (lower, upper] of the bucket of `bounds` (ascending, +Inf implied) holding `v`.
std::pair<double, double> BucketOf(double v, const std::vector<double>& bounds);
// The q-quantile of `values` as the rank statistic a histogram estimates (ceil(q*n)-th).
double RankQuantile(std::vector<double> values, double q);

// The fixture: a local cluster (scheduler, checkpoint service, gateway, two 2-slot workers) and
// a real Prometheus scraping it every second; a sampler thread that records ListJobs and
// ListNodes every ~0.25 s; the actions of the run; queries and the comparison of a panel with
// the sampled truth at stable instants.
class DashboardsTruthTest : public e2e::E2EClusterTest {
 protected:
  void TearDown() override {
    StopSampler();
    E2EClusterTest::TearDown();
  }

  // --- The cluster ---------------------------------------------------------------------------

  void StartEverything();

  // --- Truth sampled from the scheduler's API -------------------------------------------------

  Snapshot TakeSnapshot();

  void StartSampler();
  void StopSampler() {
    stop_sampler_ = true;
    if (sampler_.joinable()) sampler_.join();
  }

  // --- Actions ---------------------------------------------------------------------------------

  Job SubmitJob(const JobParams& p);

  // POST/GET through the gateway; counts what was sent by (route, method, code).
  httplib::Result Gateway(const std::string& method, const std::string& path,
                          const std::string& route, const std::string& body = "");

  Job SubmitThroughGateway(const JobParams& p);

  // Waits for attempt `attempt` of the 1-rank job `id` to have stepped (its step gauge on the
  // worker is there, so its series are in Prometheus), then sends `sig` to its trainer.
  void KillTrainerOfAttempt(const std::string& id, int attempt, int sig, int min_step = 1);

  // --- Truth after the run ---------------------------------------------------------------------

  std::vector<HistoryEntry> History(const std::string& id);

  // The trainer's events (JSON lines of its stdout) of rank `rank` of `id` through StreamLogs:
  // attempt -> events in order.
  std::map<int, std::vector<json>> Events(const std::string& id, int rank);

  // The last "step" event of rank `rank` of the given attempt.
  json LastStepEvent(const std::string& id, int attempt, int rank);

  std::vector<Snapshot> Snapshots() {
    absl::MutexLock l(&snapshots_mu_);
    return snapshots_;
  }

  // --- Prometheus -------------------------------------------------------------------------------

  std::vector<PromSample> Eval(const std::string& expr, std::optional<double> time = {});

  // Unix time of the last scrape of the target (`job` label) that holds `instance`.
  double LastScrape(const std::string& job, const std::string& instance = "");

  // The evaluation of `expr` over the grid [run_start_, run_end_] every 0.5 s: time -> key -> v.
  std::map<double, std::map<std::string, double>> Grid(const std::string& expr,
                                                       const std::vector<std::string>& key_labels);

  using Quantity = std::function<std::map<std::string, double>(const Snapshot&)>;

  // The truth at grid time `t` if the sampled truth was the same from t - before to t + after
  // (snapshots no more than 1 s apart over that window); nullopt otherwise.
  std::optional<std::map<std::string, double>> StableTruth(const std::vector<Snapshot>& snaps,
                                                           const Quantity& q, double t,
                                                           double before, double after);

  // Compares target `target` of `p` (with `vars`) with the truth at every grid time where the
  // truth was stable; keys of `key_labels`, absent keys = 0. At least `min_points` comparisons.
  void CheckStable(const Panel& p, size_t target, const Vars& vars,
                   const std::vector<std::string>& key_labels, const Quantity& truth,
                   double before = 3.0, double after = 0.5, double tolerance = 1e-9,
                   int min_points = 20);

  static std::string Describe(const std::map<std::string, double>& m) {
    if (m.empty()) return "{}";
    std::vector<std::string> parts;
    for (const auto& [k, v] : m) parts.push_back(absl::StrCat(k, "=", Fmt(v)));
    return absl::StrJoin(parts, " ");
  }
  static std::string Where(const Panel& p, size_t target) {
    return absl::StrCat("[", p.file, " / \"", p.title, "\" target ", target, "]");
  }

  // --- State of the run -----------------------------------------------------------------------

  std::unique_ptr<testing::PrometheusServer> prom_;
  std::unique_ptr<testing::Subprocess> gateway_;
  ReadyInfo gateway_info_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
  std::map<std::string, std::string> instance_of_node_;       // "worker-0" -> "127.0.0.1:port"
  std::vector<std::pair<std::string, std::string>> targets_;  // (job, instance)
  double run_start_ = 0, run_end_ = 0;
  std::thread sampler_;
  std::atomic<bool> stop_sampler_{false};
  absl::Mutex snapshots_mu_;
  std::vector<Snapshot> snapshots_ ABSL_GUARDED_BY(snapshots_mu_);
  int submitted_ = 0;
  std::map<std::tuple<std::string, std::string, std::string>, int> gateway_sent_;
  std::vector<double> gateway_latencies_;
};

// A job of the run, with everything the checkers compare against.
struct JobRun {
  std::string label;  // "shared-zenflow", ...
  JobParams params;
  Job final;                          // GetJob after the run
  std::vector<HistoryEntry> history;  // WatchJob's history
  double t_last = 0;                  // last scrape that had the final attempt's step series
  std::map<int, json> last_step;      // rank -> last "step" event (final attempt)
  std::map<int, json> last_eval;      // rank -> last "eval" event (final attempt)
  int64_t start_step = 0;  // the final attempt's "started" event: 0 or the step resumed from
  std::map<int, v1::FailureClass> restart_class;  // failed attempt -> class of its restart
  std::vector<std::pair<double, double>> first_after_resume;  // (time, last_checkpoint_step)
  // For a job killed after a checkpoint: when the test killed it, so after that checkpoint's
  // commit (the resumed attempt's checkpoint age is at least the time since); 0 otherwise.
  double killed_after_checkpoint_at = 0;
};

// A numeric field of a trainer event (int64 fields come as strings; zero values are omitted).
double Num(const json& ev, const std::string& field);

// The run (jobs of every outcome), the truth collected after it, and one checker per panel.
class DashboardsTruth : public DashboardsTruthTest {
 protected:
  using Checker = std::function<void(const Panel&)>;

  // --- The run ----------------------------------------------------------------------------------

  void Cordon(const std::string& node, bool on);

  JobRun& Track(const Job& job, const std::string& label, const JobParams& p);

  // While a job is RECOVERING: remember its failure class for the attempt that failed.
  void CaptureRestart(const std::string& id, int failed_attempt);

  void RunScenario();

  // Everything the checkers need that only exists after the run.
  void CollectTruth();

  // --- Panels
  // -------------------------------------------------------------------------------------

  std::vector<Panel> LoadPanels();

  // --- Helpers of the checkers
  // ----------------------------------------------------------------------

  const JobRun& Run(const std::string& label) { return runs_[label_to_id_[label]]; }

  // Target `target` of `p` for job `id` at `time`: (attempt, rank) -> value; only series of `id`.
  std::map<std::pair<int, int>, double> PerRank(const Panel& p, size_t target,
                                                const std::string& id, double time,
                                                const Vars& base = {});

  // For every job of the run: target `target` at the job's last scrape holds exactly one series
  // per rank of the final attempt, each equal to want(run, rank) (relative tolerance `tol`).
  // `only` limits the jobs that must have series (the others must have none).
  void CheckFinalPerRank(const Panel& p, size_t target,
                         const std::function<double(const JobRun&, int)>& want, double tol = 1e-9,
                         const std::function<bool(const JobRun&)>& only = nullptr,
                         const std::string& what = "");

  // The counter/histogram window covering the whole run, ending at `t`: "<ms>ms".
  std::string WholeRun(double t);

  // The value of target `target` of `p` at `t` keyed by `key_labels` (vars given).
  std::map<std::string, double> At(const Panel& p, size_t target, const Vars& v, double t,
                                   const std::vector<std::string>& key_labels);

  // Exact comparison of a map of values (absent = 0 on both sides), within `tol` relative.
  void ExpectValues(const Panel& p, size_t target, const std::string& expr,
                    std::map<std::string, double> got, std::map<std::string, double> want,
                    double tol = 1e-6, const std::string& note = "");

  // Counts over the whole run from a rate-per-minute (`per` = 60) or per-second (`per` = 1)
  // panel target, evaluated at `t` (a scrape of its target): value * window / per.
  std::map<std::string, double> WholeRunCounts(const Panel& p, size_t target, double t,
                                               const std::vector<std::string>& key_labels,
                                               double per, std::string* expr_out);

  // Transitions of the run from the histories: (from, to) -> count.
  std::map<std::pair<std::string, std::string>, int> Transitions();

  // Queue waits the scheduler observed (leaving PENDING for anything but CANCELLED), from the
  // histories.
  std::vector<double> QueueWaits();

  // Checks a histogram quantile target against true observations: the panel's value lies in
  // the bucket (of `bounds`) that holds the true q-quantile of `truth` (or, `or_below`, in a
  // lower bucket: the daemon's own timing is inside the test's).
  void ExpectQuantileInBucket(const Panel& p, size_t target, double q,
                              const std::vector<double>& truth, const std::vector<double>& bounds,
                              double t, const std::string& window, bool or_below);

  // Stable truth helpers over snapshots.
  static std::map<std::string, double> PhaseCount(const Snapshot& s, JobPhase phase);

  // Marks a snapshot unusable for rank-level truth (a job between phases whose ranks may be
  // starting or stopping).
  static bool Transitional(const Snapshot& s);
  static std::map<std::string, double> Unusable() { return {{"unusable", std::nan("")}}; }

  // Accelerators by kind and state from ListNodes (docs/metrics.md: allocated = slots ranks
  // hold; the rest of a cordoned node's slots cordoned, of a lost node's lost).
  static std::map<std::string, double> Accelerators(const Snapshot& s);

  // Ranks running on each worker instance: the ranks of RUNNING jobs by their rank_nodes.
  std::map<std::string, double> RunningRanksByInstance(const Snapshot& s);

  // --- The table
  // -----------------------------------------------------------------------------------

  // The checkers by (dashboard file, panel title): every panel of deploy/grafana/*.json has one.
  using CheckerTable = std::map<std::pair<std::string, std::string>, Checker>;
  CheckerTable Checkers();
  void AddClusterCheckers(CheckerTable& c);  // dashboards_truth_cluster_checkers.cc
  void AddJobCheckers(CheckerTable& c);      // dashboards_truth_job_checkers.cc
  void CheckThroughput(const Panel& p, size_t target, bool per_rank);
  void CheckRunningAge(const Panel& p, size_t target, bool since_start);
  void CheckAlerts();
  void CheckTemplateVariables();

  std::map<std::string, JobRun> runs_;  // by job id
  std::map<std::string, std::string> label_to_id_;
  int cancelled_ = 0;
  double storm_quiet_from_ = 0, storm_quiet_to_ = 0;
  std::vector<double> consolidation_seconds_;
  std::map<std::string, int> consolidations_;
  std::string consolidated_path_;
  double consolidated_bytes_ = 0;
  int64_t consolidated_step_ = 0;

  static constexpr int kSharedSteps = 1200;
  // Checkpoints at 1200 and 2400: attempt 2 resumes from 1200, seconds before its next one.
  static constexpr int kRestartedSteps = 2400;
  static constexpr int kPairSteps = 600;
};

}  // namespace loom::dashboards_truth

#endif  // LOOM_TESTS_OBSERVABILITY_DASHBOARDS_TRUTH_H_
