// File: tests/e2e/testing/e2e_cluster.h
//
// The fixture the end-to-end tests share (cluster_e2e_test, liveness_e2e_test,
// scheduler_restart_e2e_test): real loom-checkpoint, loom-scheduler and loom-worker daemons
// started from the test's runfiles on loopback with OS-chosen ports (each writes a ready file,
// tests/testing/subprocess.h), a real SQLite file in a directory of the test's own, gRPC stubs,
// and the polls the tests wait with (a condition and a deadline, never a bare sleep).
//
// Thread-safety: one test thread. Errors: setup failures are gtest failures (ASSERT in SetUp
// through StartCluster's status); RPC errors other than UNAVAILABLE fail the test.
#ifndef LOOM_TESTS_E2E_TESTING_E2E_CLUSTER_H_
#define LOOM_TESTS_E2E_TESTING_E2E_CLUSTER_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/daemon.h"
#include "gtest/gtest.h"
#include "proto/checkpoint_service.grpc.pb.h"
#include "proto/job_service.grpc.pb.h"
#include "proto/worker_service.grpc.pb.h"
#include "tests/testing/subprocess.h"

namespace loom {
namespace e2e {

// The model and dataset sections of the tests' job specs (YAML): a 2-layer byte-level Llama
// (hidden 48, 4 heads, 2 KV heads) on the fortunes corpus. Tests append the rest.
extern const char kTinyModelYaml[];

// The value of the Prometheus sample `series` (the exact text before the value, e.g.
// `loom_nodes{state="lost"}`) served at `metrics_url`, or -1 if absent or unreachable.
double MetricSample(const std::string& metrics_url, const std::string& series);

// Polls `done` every `interval` until it returns true; false once `timeout` passed.
bool Eventually(const std::function<bool()>& done, absl::Duration timeout,
                absl::Duration interval = absl::Milliseconds(100));

// Pids of the loom-trainer processes of `job_id` (from /proc/<pid>/cmdline), by rank.
std::map<int, pid_t> TrainerPids(const std::string& job_id);

// What StartCluster starts.
struct ClusterOptions {
  int num_workers = 2;  // loom-worker daemons "worker-<i>", one rank slot each
  // Appended to the scheduler's --db, --checkpoint_root, --checkpoint_service, --port.
  std::vector<std::string> scheduler_args;
  std::string queues_yaml;  // written to <dir>/queues.yaml and passed as --queues_config if set
  // Workers read and write checkpoints under the shared root (--checkpoint_root) when true.
  bool workers_share_checkpoint_root = true;
  std::string worker_data_roots;  // --data_roots of the workers ("" = flag not passed)
};

// `num_workers` workers whose jobs may read Debian's fortunes corpus: the scheduler's data roots
// (queues.yaml) and the workers' --data_roots both name /usr/share/games/fortunes.
inline ClusterOptions FortunesCluster(int num_workers = 2) {
  ClusterOptions options;
  options.num_workers = num_workers;
  options.queues_yaml = "data_roots: [/usr/share/games/fortunes]\nqueues: [{name: default}]\n";
  options.worker_data_roots = "/usr/share/games/fortunes";
  return options;
}

// A gtest fixture base: a per-test directory, the daemons, stubs and polls.
class E2EClusterTest : public ::testing::Test {
 protected:
  // Creates tmp_ = <TEST_TMPDIR>/<test name>.
  void SetUp() override;

  // Starts loom-checkpoint (root <tmp>/checkpoints), loom-scheduler and the workers, waits
  // (up to 60 s) until every worker has registered with the scheduler, and connects jobs_,
  // checkpoints_ and worker_api_. Errors name the daemon that did not start or register.
  absl::Status StartCluster(const ClusterOptions& options);
  // (Re)starts loom-scheduler as `name` on `port` ("0": any) with the cluster's arguments.
  absl::Status StartScheduler(const std::string& name, const std::string& port);
  // Starts a daemon from the runfiles in tmp_ (nullptr and a test failure if it does not start).
  std::unique_ptr<testing::Subprocess> StartDaemon(const std::string& name,
                                                   const std::string& binary,
                                                   std::vector<std::string> args, ReadyInfo* info);
  // Connects jobs_ to `scheduler_address`.
  void Connect(const std::string& scheduler_address);

  // A client context with a deadline.
  static std::unique_ptr<grpc::ClientContext> Ctx(absl::Duration deadline = absl::Seconds(60));

  // Submits the YAML spec (relative paths against tmp_); the job as answered.
  loom::v1::Job Submit(const std::string& yaml);
  // GetJob (a test failure if it fails).
  loom::v1::Job Get(const std::string& id);
  void Kill(const std::string& id);
  // Polls GetJob every `interval` until `done(job)` holds; the last job seen. UNAVAILABLE (a
  // restarting scheduler) is retried. Fails the test (with the scheduler's and worker-0's log
  // tails) if the job ends first or after `timeout`.
  loom::v1::Job WaitUntil(const std::string& id,
                          const std::function<bool(const loom::v1::Job&)>& done,
                          absl::Duration timeout, const std::string& what,
                          absl::Duration interval = absl::Milliseconds(100));
  // WaitUntil the job is in `phase`.
  loom::v1::Job WaitFor(const std::string& id, loom::v1::JobPhase phase,
                        absl::Duration timeout = absl::Minutes(4));
  // The tails of the scheduler's and worker-0's logs (for failure messages).
  std::string DaemonLogs() const;

  std::string tmp_, ckpt_root_;
  ClusterOptions options_;
  ReadyInfo scheduler_info_, checkpoint_info_;
  std::vector<ReadyInfo> worker_infos_;
  std::unique_ptr<testing::Subprocess> scheduler_, checkpoint_;
  std::vector<std::unique_ptr<testing::Subprocess>> workers_;
  std::unique_ptr<loom::v1::JobService::Stub> jobs_;
  std::unique_ptr<loom::v1::CheckpointService::Stub> checkpoints_;
  std::unique_ptr<loom::v1::WorkerService::Stub> worker_api_;
};

}  // namespace e2e
}  // namespace loom

#endif  // LOOM_TESTS_E2E_TESTING_E2E_CLUSTER_H_
