// The worker's pre-launch path check (worker/path_check.h) on real directories, owner records
// and symlinks under TEST_TMPDIR, and through WorkerDaemon with the fake trainer: a refused
// assignment is reported FAILED naming the field and no trainer starts.
#include "worker/path_check.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <deque>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "worker/worker_daemon.h"

namespace loom::worker {
namespace {

std::string RealTmp() {
  char* real = ::realpath(std::getenv("TEST_TMPDIR"), nullptr);
  std::string out = real != nullptr ? real : "/nonexistent";
  ::free(real);
  return out;
}

class PathCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = RealTmp();
    root_ = tmp_ + "/ckpt";
    ASSERT_TRUE(MakeDirs(root_ + "/job-b/step_00000004/hf").ok());
    ASSERT_TRUE(WriteFileAtomically(root_ + "/job-b/.loom-tenant", "team-b\n").ok());
    ASSERT_TRUE(MakeDirs(tmp_ + "/data-a").ok());
    ASSERT_TRUE(WriteFileAtomically(tmp_ + "/data-a/corpus.txt", "hello\n").ok());
    options_.checkpoint_root = root_;
    options_.data_roots = {"/usr/share/games/fortunes", "team-a=" + tmp_ + "/data-a"};
  }

  loom::v1::RankAssignment Assignment(const std::string& job, const std::string& tenant) {
    loom::v1::RankAssignment a;
    a.set_job_id(job);
    a.set_attempt(1);
    a.set_world_size(1);
    a.set_master_addr("127.0.0.1");
    a.set_tenant(tenant);
    a.set_checkpoint_dir(root_ + "/" + job);
    a.mutable_spec()->set_name("ok");
    return a;
  }

  static void ExpectDenied(const absl::StatusOr<loom::v1::RankAssignment>& got,
                           const std::string& prefix) {
    ASSERT_FALSE(got.ok()) << "allowed: " << got->DebugString();
    EXPECT_EQ(got.status().code(), absl::StatusCode::kPermissionDenied) << got.status();
    EXPECT_TRUE(absl::StartsWith(got.status().message(), prefix)) << got.status();
  }

  std::string tmp_, root_;
  WorkerPathOptions options_;
};

TEST_F(PathCheckTest, ForeignInitFromAndPathsOutsideTheRootsAreRefused) {
  // Team A names team B's export (the scheduler's word notwithstanding).
  loom::v1::RankAssignment a = Assignment("job-a", "team-a");
  a.mutable_spec()->mutable_model()->set_init_from(root_ + "/job-b/step_00000004/hf");
  ExpectDenied(CheckAssignmentPaths(a, options_), "model.init_from: ");
  // A job directory without an owner record is no tenant's.
  ASSERT_TRUE(MakeDirs(root_ + "/job-old/step_00000001/hf").ok());
  a.mutable_spec()->mutable_model()->set_init_from(root_ + "/job-old/step_00000001/hf");
  ExpectDenied(CheckAssignmentPaths(a, options_), "model.init_from: ");

  loom::v1::RankAssignment shadow = Assignment("job-a", "team-a");
  shadow.mutable_spec()->mutable_dataset()->set_path("/etc/shadow");
  ExpectDenied(CheckAssignmentPaths(shadow, options_), "dataset.path: '/etc/shadow' is outside");
  // Through a symlink in the tenant's own root.
  ASSERT_EQ(::symlink("/etc/shadow", (tmp_ + "/data-a/shadow").c_str()), 0);
  shadow.mutable_spec()->mutable_dataset()->set_path(tmp_ + "/data-a/shadow");
  ExpectDenied(CheckAssignmentPaths(shadow, options_), "dataset.path: ");
  // Team B's data root entry is not team A's.
  loom::v1::RankAssignment b = Assignment("job-b2", "team-b");
  b.mutable_spec()->mutable_dataset()->set_path(tmp_ + "/data-a/corpus.txt");
  ExpectDenied(CheckAssignmentPaths(b, options_), "dataset.path: ");

  // A checkpoint_dir that is not <root>/<job id>, or one recorded as another tenant's.
  loom::v1::RankAssignment elsewhere = Assignment("job-a", "team-a");
  elsewhere.set_checkpoint_dir(root_ + "/job-b");
  ExpectDenied(CheckAssignmentPaths(elsewhere, options_), "checkpoint_dir: ");
  ExpectDenied(CheckAssignmentPaths(Assignment("job-b", "team-a"), options_),
               "checkpoint_dir: " + root_ + "/job-b belongs to another tenant");
}

// Issue 42 defect 3 in the worker: an NVMe offload directory outside --scratch_roots is refused
// before the trainer could create it; one inside is given to the trainer resolved.
TEST_F(PathCheckTest, NvmeSwapDirectoriesOnlyUnderScratchRootsOrTheOwnJob) {
  const std::string nvme = tmp_ + "/nvme";
  ASSERT_TRUE(MakeDirs(nvme).ok());
  options_.scratch_roots = {"team-a=" + nvme};
  auto with_nvme = [&](const std::string& tenant, const std::string& path) {
    loom::v1::RankAssignment a = Assignment("job-" + tenant, tenant);
    google::protobuf::Value& zero =
        (*a.mutable_spec()->mutable_deepspeed_config()->mutable_fields())["zero_optimization"];
    google::protobuf::Struct& off =
        *(*zero.mutable_struct_value()->mutable_fields())["offload_optimizer"].mutable_struct_value();
    (*off.mutable_fields())["device"].set_string_value("nvme");
    (*off.mutable_fields())["nvme_path"].set_string_value(path);
    return a;
  };
  auto nvme_path_of = [](const loom::v1::RankAssignment& a) {
    return a.spec().deepspeed_config().fields().at("zero_optimization").struct_value().fields()
        .at("offload_optimizer").struct_value().fields().at("nvme_path").string_value();
  };
  const std::string field = "deepspeed_config.zero_optimization.offload_optimizer.nvme_path: ";
  ExpectDenied(CheckAssignmentPaths(with_nvme("team-a", "/local_nvme"), options_),
               field + "'/local_nvme' is outside the scratch roots of tenant team-a");
  struct stat st;
  EXPECT_NE(::stat("/local_nvme", &st), 0);
  // Team B has no scratch root here, and a data root is not writable.
  ExpectDenied(CheckAssignmentPaths(with_nvme("team-b", nvme), options_), field);
  ExpectDenied(CheckAssignmentPaths(with_nvme("team-a", tmp_ + "/data-a"), options_), field);
  absl::StatusOr<loom::v1::RankAssignment> ok =
      CheckAssignmentPaths(with_nvme("team-a", nvme + "/./swap/"), options_);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(nvme_path_of(*ok), nvme + "/swap");
  ok = CheckAssignmentPaths(with_nvme("team-b", root_ + "/job-team-b/swap"), options_);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(nvme_path_of(*ok), root_ + "/job-team-b/swap");

  EXPECT_EQ(ParseDataRoots("/a,x", "scratch_roots").status().message(),
            "scratch_roots: 'x' is neither an absolute path nor tenant=<absolute path>");
}

TEST_F(PathCheckTest, OwnExportsAndDataAreResolvedAndTheOwnerIsRecorded) {
  loom::v1::RankAssignment a = Assignment("job-a", "team-a");
  a.mutable_spec()->mutable_dataset()->set_path(tmp_ + "/data-a/../data-a/corpus.txt");
  absl::StatusOr<loom::v1::RankAssignment> checked = CheckAssignmentPaths(a, options_);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->spec().dataset().path(), tmp_ + "/data-a/corpus.txt");
  auto record = ReadFile(root_ + "/job-a/.loom-tenant");
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(*record, "team-a\n");

  // A later job of team A fine-tunes from job-a's export.
  ASSERT_TRUE(MakeDirs(root_ + "/job-a/step_00000002/hf").ok());
  loom::v1::RankAssignment next = Assignment("job-a2", "team-a");
  next.mutable_spec()->mutable_model()->set_init_from(root_ + "/job-a/step_00000002/hf/");
  checked = CheckAssignmentPaths(next, options_);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->spec().model().init_from(), root_ + "/job-a/step_00000002/hf");
  // The built-in corpus (no path) is not the tenant's to name, and is not checked.
  EXPECT_TRUE(CheckAssignmentPaths(Assignment("job-a3", "team-a"), options_).ok());
}

// Break-it H3: with the documented union form of --data_roots (every tenant's roots for every
// tenant), team A's dataset.path swapped after submission for a symlink into team B's root was
// accepted at start and team A trained on team B's data. The scheduler now sends the tenant's
// own roots with the assignment, and the worker requires both.
TEST_F(PathCheckTest, TheSchedulersRootsForTheTenantAreAppliedToo) {
  ASSERT_TRUE(MakeDirs(tmp_ + "/data-b").ok());
  ASSERT_TRUE(WriteFileAtomically(tmp_ + "/data-b/secret.txt", "b's\n").ok());
  options_.data_roots = {"/usr/share/games/fortunes", tmp_ + "/data-a", tmp_ + "/data-b"};
  // The swap: team A's corpus is now a symlink to team B's file.
  ASSERT_EQ(::rename((tmp_ + "/data-a/corpus.txt").c_str(), (tmp_ + "/data-a/real.txt").c_str()), 0);
  ASSERT_EQ(::symlink((tmp_ + "/data-b/secret.txt").c_str(), (tmp_ + "/data-a/corpus.txt").c_str()), 0);
  loom::v1::RankAssignment a = Assignment("job-a", "team-a");
  a.mutable_spec()->mutable_dataset()->set_path(tmp_ + "/data-a/corpus.txt");
  // Without the scheduler's roots the union lets it through (the bug, kept for old schedulers).
  EXPECT_TRUE(CheckAssignmentPaths(a, options_).ok());
  a.add_tenant_data_roots(tmp_ + "/data-a");
  a.set_tenant_roots_set(true);
  ExpectDenied(CheckAssignmentPaths(a, options_),
               "dataset.path: '" + tmp_ + "/data-a/corpus.txt' (" + tmp_ +
                   "/data-b/secret.txt) is outside the data roots of tenant team-a");
  // Its own file is still fine; the scheduler's roots do not widen the worker's.
  a.mutable_spec()->mutable_dataset()->set_path(tmp_ + "/data-a/real.txt");
  EXPECT_TRUE(CheckAssignmentPaths(a, options_).ok());
  a.clear_tenant_data_roots();
  a.add_tenant_data_roots("/elsewhere");
  a.add_tenant_data_roots(tmp_ + "/data-a");
  options_.data_roots = {"/usr/share/games/fortunes"};
  ExpectDenied(CheckAssignmentPaths(a, options_), "dataset.path: ");
}

TEST(ParseDataRootsTest, PathsAndTenantEntries) {
  auto roots = ParseDataRoots("/usr/share/games/fortunes, team-a=/data/a,,");
  ASSERT_TRUE(roots.ok()) << roots.status();
  EXPECT_EQ(*roots, (std::vector<std::string>{"/usr/share/games/fortunes", "team-a=/data/a"}));
  for (const char* bad : {"data", "team-a=data", "=/x"}) {
    auto got = ParseDataRoots(bad);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StartsWith(got.status().message(), "data_roots: ")) << got.status();
  }
}

// A scheduler that hands out one assignment and records the heartbeats.
class OneAssignmentClient : public SchedulerClient {
 public:
  explicit OneAssignmentClient(loom::v1::RankAssignment a) { reply_.add_start()->Swap(&a); }
  absl::StatusOr<loom::v1::RegisterWorkerResponse> RegisterWorker(
      const loom::v1::RegisterWorkerRequest&) override {
    return loom::v1::RegisterWorkerResponse();
  }
  absl::StatusOr<loom::v1::HeartbeatResponse> Heartbeat(
      const loom::v1::HeartbeatRequest& request) override {
    absl::MutexLock l(&mu);
    last = request;
    loom::v1::HeartbeatResponse r = reply_;
    reply_.Clear();
    return r;
  }
  absl::Mutex mu;
  loom::v1::HeartbeatRequest last;

 private:
  loom::v1::HeartbeatResponse reply_;
};

TEST_F(PathCheckTest, TheDaemonReportsARefusedRankAsFailedWithoutStartingTheTrainer) {
  loom::v1::RankAssignment a = Assignment("job-x", "team-a");
  a.mutable_spec()->mutable_dataset()->set_path("/etc/shadow");
  OneAssignmentClient client(a);
  prometheus::Registry registry;
  WorkerMetrics metrics(registry);
  WorkerOptions o;
  o.node_id = "node-a";
  o.inventory.set_slots(1);
  o.trainer_path = absl::StrCat(std::getenv("TEST_SRCDIR"), "/loom/worker/testdata/fake_trainer.sh");
  o.work_dir = tmp_ + "/work";
  o.confine_paths = true;
  o.paths = options_;
  ASSERT_TRUE(o.Validate().ok());
  WorkerDaemon daemon(o, &client, &metrics);
  ASSERT_TRUE(daemon.Tick().ok());  // receives the assignment
  ASSERT_TRUE(daemon.Tick().ok());  // reports it
  absl::MutexLock l(&client.mu);
  ASSERT_EQ(client.last.ranks_size(), 1);
  const loom::v1::RankStatus& st = client.last.ranks(0);
  EXPECT_EQ(st.state(), loom::v1::RANK_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(st.error(), "refused to start the trainer: dataset.path: '/etc/shadow'"))
      << st.error();
  // A configuration error, not retried (break-it H3: it was restarted as a rank failure).
  EXPECT_EQ(st.exit_code(), 78);
  struct stat sb;
  EXPECT_NE(::stat((tmp_ + "/work/job-x/attempt_1/spec.json").c_str(), &sb), 0)
      << "the trainer's spec was written: the rank was started";
  EXPECT_EQ(daemon.RunningRanks(), 0);
}

}  // namespace
}  // namespace loom::worker
