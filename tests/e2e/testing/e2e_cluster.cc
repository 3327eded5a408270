#include "tests/e2e/testing/e2e_cluster.h"

#include <dirent.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "services/cli/job_spec_yaml.h"

namespace loom {
namespace e2e {

using ::loom::testing::RunfilePath;
using ::loom::testing::Subprocess;

const char kTinyModelYaml[] = R"(
model:
  config:
    vocab_size: 256
    hidden_size: 48
    intermediate_size: 128
    num_hidden_layers: 2
    num_attention_heads: 4
    num_key_value_heads: 2
    max_position_embeddings: 64
    rms_norm_eps: 1.0e-5
    rope_theta: 10000
    tie_word_embeddings: true
dataset: {name: fortunes}
)";

double MetricSample(const std::string& metrics_url, const std::string& series) {
  absl::StatusOr<std::string> text = testing::HttpGet(metrics_url);
  if (!text.ok()) return -1;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (!absl::StartsWith(line, series) || line.size() <= series.size() + 1 ||
        line[series.size()] != ' ') {
      continue;
    }
    double v = 0;
    if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return v;
  }
  return -1;
}

bool Eventually(const std::function<bool()>& done, absl::Duration timeout,
                absl::Duration interval) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(interval);  // poll interval
  }
  return true;
}

std::map<int, pid_t> TrainerPids(const std::string& job_id) {
  std::map<int, pid_t> out;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return out;
  while (const dirent* e = ::readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    auto cmdline = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
    if (!cmdline.ok() || !absl::StrContains(*cmdline, "loom-trainer")) continue;
    std::vector<std::string> args = absl::StrSplit(*cmdline, '\0');
    bool ours = false;
    int rank = -1;
    for (const std::string& a : args) {
      ours |= a == absl::StrCat("--job_id=", job_id);
      if (absl::StartsWith(a, "--rank=")) rank = std::atoi(a.c_str() + 7);
    }
    if (ours && rank >= 0) out[rank] = pid;
  }
  ::closedir(proc);
  return out;
}

void E2EClusterTest::SetUp() {
  // Each test gets its own directory: database, checkpoints, ready files, logs.
  tmp_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                      ::testing::UnitTest::GetInstance()->current_test_info()->name());
  ASSERT_TRUE(MakeDirs(tmp_).ok());
}

absl::Status E2EClusterTest::StartCluster(const ClusterOptions& options) {
  options_ = options;
  ckpt_root_ = absl::StrCat(tmp_, "/checkpoints");
  RETURN_IF_ERROR(MakeDirs(ckpt_root_));
  checkpoint_ = StartDaemon("checkpoint", "services/checkpoint/loom-checkpoint",
                            {absl::StrCat("--checkpoint_root=", ckpt_root_)}, &checkpoint_info_);
  if (checkpoint_ == nullptr) return absl::UnavailableError("loom-checkpoint did not start");
  if (!options.queues_yaml.empty()) {
    RETURN_IF_ERROR(WriteFileAtomically(tmp_ + "/queues.yaml", options.queues_yaml));
  }
  RETURN_IF_ERROR(StartScheduler("scheduler", "0"));
  for (int i = 0; i < options.num_workers; ++i) {
    std::vector<std::string> args = {
        absl::StrCat("--scheduler=", scheduler_info_.grpc_address),
        absl::StrCat("--node_id=worker-", i), "--slots=1",
        absl::StrCat("--trainer=", RunfilePath("worker/trainer/loom-trainer")),
        absl::StrCat("--work_dir=", tmp_, "/work-", i), "--heartbeat_interval=200ms"};
    if (options.workers_share_checkpoint_root) {
      args.push_back(absl::StrCat("--checkpoint_root=", ckpt_root_));
    }
    if (!options.worker_data_roots.empty()) {
      args.push_back(absl::StrCat("--data_roots=", options.worker_data_roots));
    }
    ReadyInfo info;
    workers_.push_back(StartDaemon(absl::StrCat("worker-", i), "services/worker/loom-worker",
                                   std::move(args), &info));
    if (workers_.back() == nullptr) {
      return absl::UnavailableError(absl::StrCat("loom-worker worker-", i, " did not start"));
    }
    worker_infos_.push_back(info);
  }
  // A worker announces itself ready before it has registered with the scheduler, and a job
  // submitted before its nodes registered is refused as unplaceable (regression: a loaded CI
  // machine submitted offload_resume_e2e_test's job while only worker-0 had registered). Its
  // /readyz answers 200 once registered.
  for (size_t i = 0; i < worker_infos_.size(); ++i) {
    const std::string& url = worker_infos_[i].metrics_url;
    const std::string readyz = url.substr(0, url.rfind("/metrics")) + "/readyz";
    if (!Eventually([&] { return testing::HttpGet(readyz).ok(); }, absl::Seconds(60))) {
      return absl::DeadlineExceededError(
          absl::StrCat("worker-", i, " did not register with the scheduler within 60 s"));
    }
  }
  auto channel =
      grpc::CreateChannel(scheduler_info_.grpc_address, grpc::InsecureChannelCredentials());
  jobs_ = loom::v1::JobService::NewStub(channel);
  worker_api_ = loom::v1::WorkerService::NewStub(channel);
  checkpoints_ = loom::v1::CheckpointService::NewStub(
      grpc::CreateChannel(checkpoint_info_.grpc_address, grpc::InsecureChannelCredentials()));
  return absl::OkStatus();
}

absl::Status E2EClusterTest::StartScheduler(const std::string& name, const std::string& port) {
  // As in the local cluster: resume lookups and retention go through loom-checkpoint.
  std::vector<std::string> args = {
      absl::StrCat("--db=", tmp_, "/loom.db"), absl::StrCat("--checkpoint_root=", ckpt_root_),
      absl::StrCat("--checkpoint_service=", checkpoint_info_.grpc_address),
      absl::StrCat("--port=", port)};
  if (!options_.queues_yaml.empty()) {
    args.push_back(absl::StrCat("--queues_config=", tmp_, "/queues.yaml"));
  }
  for (const std::string& a : options_.scheduler_args) args.push_back(a);
  scheduler_ = StartDaemon(name, "services/scheduler/loom-scheduler", std::move(args),
                           &scheduler_info_);
  if (scheduler_ == nullptr) return absl::UnavailableError(absl::StrCat(name, " did not start"));
  return absl::OkStatus();
}

std::unique_ptr<Subprocess> E2EClusterTest::StartDaemon(const std::string& name,
                                                        const std::string& binary,
                                                        std::vector<std::string> args,
                                                        ReadyInfo* info) {
  auto daemon = testing::StartDaemon(tmp_, name, binary, std::move(args), info);
  EXPECT_TRUE(daemon.ok()) << daemon.status();
  return daemon.ok() ? std::move(*daemon) : nullptr;
}

void E2EClusterTest::Connect(const std::string& scheduler_address) {
  jobs_ = loom::v1::JobService::NewStub(
      grpc::CreateChannel(scheduler_address, grpc::InsecureChannelCredentials()));
}

std::unique_ptr<grpc::ClientContext> E2EClusterTest::Ctx(absl::Duration deadline) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(deadline));
  return ctx;
}

loom::v1::Job E2EClusterTest::Submit(const std::string& yaml) {
  auto spec = cli::JobSpecFromYaml(yaml, tmp_);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return loom::v1::Job();
  loom::v1::SubmitJobRequest req;
  *req.mutable_spec() = *spec;
  loom::v1::SubmitJobResponse resp;
  grpc::Status s = jobs_->SubmitJob(Ctx().get(), req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp.job();
}

loom::v1::Job E2EClusterTest::Get(const std::string& id) {
  loom::v1::GetJobRequest req;
  req.set_job_id(id);
  loom::v1::Job job;
  grpc::Status s = jobs_->GetJob(Ctx(absl::Seconds(30)).get(), req, &job);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return job;
}

void E2EClusterTest::Kill(const std::string& id) {
  loom::v1::KillJobRequest req;
  req.set_job_id(id);
  loom::v1::Job job;
  grpc::Status s = jobs_->KillJob(Ctx(absl::Seconds(30)).get(), req, &job);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

loom::v1::Job E2EClusterTest::WaitUntil(const std::string& id,
                                        const std::function<bool(const loom::v1::Job&)>& done,
                                        absl::Duration timeout, const std::string& what,
                                        absl::Duration interval) {
  const absl::Time deadline = absl::Now() + timeout;
  loom::v1::Job job;
  while (absl::Now() < deadline) {
    loom::v1::GetJobRequest req;
    req.set_job_id(id);
    grpc::Status s = jobs_->GetJob(Ctx().get(), req, &job);
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {  // e.g. a restarting scheduler
      absl::SleepFor(interval);  // poll interval
      continue;
    }
    if (!s.ok()) {
      ADD_FAILURE() << "GetJob " << id << ": " << s.error_message();
      return job;
    }
    if (done(job)) return job;
    if (job.phase() == loom::v1::JOB_PHASE_SUCCEEDED ||
        job.phase() == loom::v1::JOB_PHASE_FAILED ||
        job.phase() == loom::v1::JOB_PHASE_CANCELLED) {
      break;
    }
    absl::SleepFor(interval);  // poll interval
  }
  ADD_FAILURE() << "job " << id << " is " << loom::v1::JobPhase_Name(job.phase()) << " ("
                << job.message() << "), waiting for " << what << "\n"
                << DaemonLogs();
  return job;
}

loom::v1::Job E2EClusterTest::WaitFor(const std::string& id, loom::v1::JobPhase phase,
                                      absl::Duration timeout) {
  return WaitUntil(
      id, [phase](const loom::v1::Job& j) { return j.phase() == phase; }, timeout,
      loom::v1::JobPhase_Name(phase), absl::Milliseconds(200));
}

std::string E2EClusterTest::DaemonLogs() const {
  std::string out;
  if (!workers_.empty() && workers_[0] != nullptr) {
    absl::StrAppend(&out, "worker-0 log:\n", testing::Tail(workers_[0]->log_path()), "\n");
  }
  if (scheduler_ != nullptr) {
    absl::StrAppend(&out, "scheduler log:\n", testing::Tail(scheduler_->log_path()));
  }
  return out;
}

}  // namespace e2e
}  // namespace loom
