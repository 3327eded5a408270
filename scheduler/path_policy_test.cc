// Tenancy confinement of spec paths (scheduler/path_policy.h): the policy on real files,
// directories and symlinks under TEST_TMPDIR, the queues config's data roots, and the
// scheduler's submission check.
#include "scheduler/path_policy.h"

#include <unistd.h>

#include <map>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "scheduler/fake_clock.h"
#include "scheduler/queues.h"
#include "scheduler/scheduler.h"
#include "scheduler/test_job_spec.h"
#include "storage/in_memory_job_store.h"

namespace loom {
namespace {

class PathPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // realpath of TEST_TMPDIR: the policy compares resolved paths.
    char* real = ::realpath(std::getenv("TEST_TMPDIR"), nullptr);
    ASSERT_NE(real, nullptr);
    tmp_ = real;
    ::free(real);
    ckpt_ = tmp_ + "/ckpt";
    data_a_ = tmp_ + "/data-a";
    data_b_ = tmp_ + "/data-b";
    for (const std::string& d : {ckpt_ + "/job-a/step_00000004/hf", ckpt_ + "/job-b/step_00000004/hf",
                                 data_a_, data_b_}) {
      ASSERT_TRUE(MakeDirs(d).ok()) << d;
    }
    ASSERT_TRUE(WriteFileAtomically(data_a_ + "/corpus.txt", "hello\n").ok());
    ASSERT_TRUE(WriteFileAtomically(data_b_ + "/secret.txt", "b's\n").ok());
    policy_.checkpoint_root = ckpt_;
    policy_.default_data_roots = {"/usr/share/games/fortunes"};
    policy_.tenant_data_roots["team-a"] = {data_a_};
    policy_.tenant_data_roots["team-b"] = {data_b_};
    owners_ = {{"job-a", "team-a"}, {"job-b", "team-b"}};
  }

  absl::StatusOr<std::string> Confine(const std::string& field, const std::string& path,
                                      const std::string& tenant) {
    return ConfinePath(field, path, tenant, policy_, [this](const std::string& id)
                                                        -> absl::StatusOr<std::string> {
      auto it = owners_.find(id);
      if (it == owners_.end()) return absl::NotFoundError(id);
      return it->second;
    });
  }

  void ExpectDenied(const std::string& field, const std::string& path, const std::string& tenant,
                    const std::string& why) {
    absl::StatusOr<std::string> got = Confine(field, path, tenant);
    ASSERT_FALSE(got.ok()) << path << " was allowed as " << *got;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kPermissionDenied) << got.status();
    EXPECT_TRUE(absl::StartsWith(got.status().message(), field + ": ")) << got.status();
    EXPECT_TRUE(absl::StrContains(got.status().message(), why)) << got.status();
  }

  std::string tmp_, ckpt_, data_a_, data_b_;
  PathPolicy policy_;
  std::map<std::string, std::string> owners_;
};

TEST_F(PathPolicyTest, OwnJobsAndOwnDataRootsOnly) {
  const std::string export_a = ckpt_ + "/job-a/step_00000004/hf";
  EXPECT_EQ(*Confine("model.init_from", export_a, "team-a"), export_a);
  EXPECT_EQ(*Confine("dataset.path", data_a_ + "/corpus.txt", "team-a"), data_a_ + "/corpus.txt");
  EXPECT_EQ(*Confine("dataset.path", data_a_, "team-a"), data_a_);
  // A path that does not exist yet is checked on its normalised form (validation then says it
  // does not exist).
  EXPECT_EQ(*Confine("dataset.path", data_a_ + "/later/x.txt", "team-a"), data_a_ + "/later/x.txt");
  // A tenant without its own roots gets the default ones.
  EXPECT_TRUE(Confine("dataset.path", "/usr/share/games/fortunes", "team-c").ok());

  // Another tenant's export, a job that does not exist and the checkpoint root itself: one
  // message, so other tenants' job ids cannot be probed.
  const std::string why = "is in the checkpoint root but not in a checkpoint directory of a job of tenant team-a";
  ExpectDenied("model.init_from", ckpt_ + "/job-b/step_00000004/hf", "team-a", why);
  ExpectDenied("model.init_from", ckpt_ + "/job-nope/step_00000004/hf", "team-a", why);
  ExpectDenied("model.init_from", ckpt_, "team-a", why);
  // Files anywhere else, and another tenant's data root.
  ExpectDenied("dataset.path", "/etc/shadow", "team-a", "is outside the data roots of tenant team-a");
  // ... and says how a root is added (a newcomer's pass, issue 49).
  ExpectDenied("dataset.path", "/etc/shadow", "team-a", "LOOM_DATA_ROOTS=DIR,...");
  ExpectDenied("dataset.path", data_b_ + "/secret.txt", "team-a", "is outside the data roots");
  ExpectDenied("dataset.path", "/usr/share/games/fortunes", "team-a", "is outside the data roots");
  // A data root that contains the checkpoint root does not open other tenants' jobs.
  policy_.tenant_data_roots["team-a"].push_back(tmp_);
  ExpectDenied("model.init_from", ckpt_ + "/job-b/step_00000004/hf", "team-a", why);
  EXPECT_TRUE(Confine("dataset.path", data_b_ + "/secret.txt", "team-a").ok());
}

TEST_F(PathPolicyTest, SymlinksAndDotDotAreResolvedFirst) {
  // "..", out of the own data root and out of the own job directory.
  ExpectDenied("dataset.path", data_a_ + "/../data-b/secret.txt", "team-a", "(" + data_b_ + "/secret.txt)");
  ExpectDenied("model.init_from", ckpt_ + "/job-a/../job-b/step_00000004/hf", "team-a",
               "checkpoint directory");
  // Symlinks inside the tenant's own root (or own job) that point elsewhere.
  ASSERT_EQ(::symlink("/etc/shadow", (data_a_ + "/shadow").c_str()), 0);
  ExpectDenied("dataset.path", data_a_ + "/shadow", "team-a", "(/etc/shadow)");
  ASSERT_EQ(::symlink((ckpt_ + "/job-b").c_str(), (ckpt_ + "/job-a/b").c_str()), 0);
  ExpectDenied("model.init_from", ckpt_ + "/job-a/b/step_00000004/hf", "team-a",
               "checkpoint directory");
  // A symlink to an allowed place resolves to it, and that is what the trainer is given.
  ASSERT_EQ(::symlink(data_a_.c_str(), (tmp_ + "/link-a").c_str()), 0);
  EXPECT_EQ(*Confine("dataset.path", tmp_ + "/link-a/corpus.txt", "team-a"), data_a_ + "/corpus.txt");
  // Relative paths mean different files to the scheduler and the trainer.
  absl::StatusOr<std::string> relative = Confine("dataset.path", "data-a/corpus.txt", "team-a");
  EXPECT_EQ(relative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(relative.status().message(), "dataset.path: 'data-a/corpus.txt' must be an absolute path");
}

TEST_F(PathPolicyTest, SpecFieldsAreResolvedInPlace) {
  loom::v1::JobSpec spec = ValidTestJobSpec();
  spec.mutable_model()->set_init_from(ckpt_ + "/job-a/./step_00000004//hf/");
  spec.mutable_dataset()->set_path(tmp_ + "/data-b/../data-a/corpus.txt");
  loom::v1::JobSpec resolved;
  auto owner = [](const std::string& id) -> absl::StatusOr<std::string> {
    if (id == "job-a") return std::string("team-a");
    return absl::NotFoundError(id);
  };
  ASSERT_TRUE(ConfineJobSpecPaths(spec, "team-a", policy_, owner, &resolved).ok());
  EXPECT_EQ(resolved.model().init_from(), ckpt_ + "/job-a/step_00000004/hf");
  EXPECT_EQ(resolved.dataset().path(), data_a_ + "/corpus.txt");
  spec.mutable_dataset()->set_path("/etc/shadow");
  absl::Status denied = ConfineJobSpecPaths(spec, "team-a", policy_, owner);
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StartsWith(denied.message(), "dataset.path: '/etc/shadow'")) << denied;
  spec.mutable_dataset()->set_path(data_a_ + "/corpus.txt");
  spec.mutable_dataset()->set_tokenizer_model(data_b_ + "/tokenizer.model");
  denied = ConfineJobSpecPaths(spec, "team-a", policy_, owner);
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StartsWith(denied.message(), "dataset.tokenizer_model: '" + data_b_))
      << denied;
  spec.mutable_dataset()->set_tokenizer_model(data_a_ + "/./tokenizer.model");
  ASSERT_TRUE(ConfineJobSpecPaths(spec, "team-a", policy_, owner, &resolved).ok());
  EXPECT_EQ(resolved.dataset().tokenizer_model(), data_a_ + "/tokenizer.model");
}

// Issue 42 defect 3: `nvme_path: /local_nvme` made a worker create /local_nvme at its root. The
// swap directories a rank writes are confined to the tenant's scratch roots and its own jobs'
// directories; data roots (inputs other tenants read) are not writable.
TEST_F(PathPolicyTest, NvmePathsAreConfinedToScratchRootsAndOwnJobs) {
  const std::string scratch_a = tmp_ + "/nvme-a";
  ASSERT_TRUE(MakeDirs(scratch_a).ok());
  policy_.tenant_scratch_roots["team-a"] = {scratch_a};
  auto owner = [this](const std::string& id) -> absl::StatusOr<std::string> {
    auto it = owners_.find(id);
    if (it == owners_.end()) return absl::NotFoundError(id);
    return it->second;
  };
  // {zero_optimization: {<block>: {device: <device>, nvme_path: <path>}}}
  auto spec_with = [](const std::string& block, const std::string& device,
                      const std::string& path) {
    loom::v1::JobSpec spec = ValidTestJobSpec();
    google::protobuf::Struct offload;
    (*offload.mutable_fields())["device"].set_string_value(device);
    (*offload.mutable_fields())["nvme_path"].set_string_value(path);
    google::protobuf::Value& zero = (*spec.mutable_deepspeed_config()->mutable_fields())["zero_optimization"];
    (*zero.mutable_struct_value()->mutable_fields())["stage"].set_number_value(3);
    *(*zero.mutable_struct_value()->mutable_fields())[block].mutable_struct_value() = offload;
    return spec;
  };
  auto nvme_path_of = [](const loom::v1::JobSpec& spec, const std::string& block) {
    return spec.deepspeed_config().fields().at("zero_optimization").struct_value().fields()
        .at(block).struct_value().fields().at("nvme_path").string_value();
  };
  for (const std::string block : {"offload_optimizer", "offload_param"}) {
    const std::string field = "deepspeed_config.zero_optimization." + block + ".nvme_path";
    // The issue's case: a directory at the worker's root.
    absl::Status denied =
        ConfineJobSpecPaths(spec_with(block, "nvme", "/local_nvme"), "team-a", policy_, owner);
    EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied) << denied;
    EXPECT_TRUE(absl::StartsWith(denied.message(), field + ": '/local_nvme' is outside the "
                                 "scratch roots of tenant team-a (" + scratch_a + ")"))
        << denied;
    // Its own data root is read-only to it; another tenant's job directory is refused.
    denied = ConfineJobSpecPaths(spec_with(block, "nvme", data_a_), "team-a", policy_, owner);
    EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied) << denied;
    denied = ConfineJobSpecPaths(spec_with(block, "nvme", ckpt_ + "/job-b/swap"), "team-a",
                                 policy_, owner);
    EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied) << denied;
    EXPECT_TRUE(absl::StrContains(denied.message(), "not in a checkpoint directory")) << denied;
    // A tenant without scratch roots is told that none is configured and where an operator
    // configures them.
    denied = ConfineJobSpecPaths(spec_with(block, "nvme", scratch_a), "team-b", policy_, owner);
    EXPECT_TRUE(absl::StrContains(denied.message(), "(none configured)")) << denied;
    EXPECT_TRUE(absl::StrContains(denied.message(), "--scratch_roots")) << denied;
    // Allowed, and resolved in the spec the trainer gets: its scratch root (through "..") and
    // its own job directory.
    loom::v1::JobSpec resolved;
    ASSERT_TRUE(ConfineJobSpecPaths(spec_with(block, "nvme", data_a_ + "/../nvme-a/./x"),
                                    "team-a", policy_, owner, &resolved).ok());
    EXPECT_EQ(nvme_path_of(resolved, block), scratch_a + "/x");
    ASSERT_TRUE(ConfineJobSpecPaths(spec_with(block, "nvme", ckpt_ + "/job-a/swap/"), "team-a",
                                    policy_, owner, &resolved).ok());
    EXPECT_EQ(nvme_path_of(resolved, block), ckpt_ + "/job-a/swap");
    // DeepSpeed's sample configs carry nvme_path beside device "cpu": nothing writes there, so
    // it is left as written.
    ASSERT_TRUE(ConfineJobSpecPaths(spec_with(block, "cpu", "/local_nvme"), "team-a", policy_,
                                    owner, &resolved).ok());
    EXPECT_EQ(nvme_path_of(resolved, block), "/local_nvme");
  }
}

TEST(QueuesConfigDataRootsTest, ParsesDefaultAndPerTenantRoots) {
  absl::StatusOr<QueuesConfig> c = ParseQueuesConfig(R"(
data_roots: [/usr/share/games/fortunes]
tenants:
  team-a: {weight: 2, data_roots: [/data/a, /data/shared]}
  team-b: {data_roots: []}
queues:
  - name: default
)");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->data_roots.has_value());
  EXPECT_EQ(*c->data_roots, std::vector<std::string>{"/usr/share/games/fortunes"});
  EXPECT_EQ(c->tenant_data_roots.at("team-a"), (std::vector<std::string>{"/data/a", "/data/shared"}));
  EXPECT_TRUE(c->tenant_data_roots.at("team-b").empty());
  EXPECT_EQ(c->Weight("team-a"), 2);
  EXPECT_FALSE(ParseQueuesConfig("queues: [{name: q}]")->data_roots.has_value());
  EXPECT_TRUE(c->scratch_roots.empty());
  c = ParseQueuesConfig(
      "scratch_roots: [/local_nvme]\ntenants: {team-a: {scratch_roots: [/nvme/a]}}\n"
      "queues: [{name: q}]");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->scratch_roots, std::vector<std::string>{"/local_nvme"});
  EXPECT_EQ(c->tenant_scratch_roots.at("team-a"), std::vector<std::string>{"/nvme/a"});

  struct Bad {
    const char* yaml;
    const char* error;
  };
  for (const Bad& b : {Bad{"data_roots: [data]\nqueues: [{name: q}]",
                           "data_roots[0]: 'data' must be an absolute path"},
                       Bad{"data_roots: /data\nqueues: [{name: q}]",
                           "data_roots: must be a list of absolute paths"},
                       Bad{"tenants: {t: {data_roots: [[/x]]}}\nqueues: [{name: q}]",
                           "tenants.t.data_roots[0]: must be a path"},
                       Bad{"tenants: {t: {scratch_roots: [nvme]}}\nqueues: [{name: q}]",
                           "tenants.t.scratch_roots[0]: 'nvme' must be an absolute path"}}) {
    absl::StatusOr<QueuesConfig> got = ParseQueuesConfig(b.yaml);
    ASSERT_FALSE(got.ok()) << b.yaml;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(got.status().message(), b.error);
  }
}

// The acceptance case at submission: a cross-tenant init_from and a dataset.path outside the
// tenant's roots are refused with PERMISSION_DENIED naming the field, before validation reads
// either file.
TEST_F(PathPolicyTest, SchedulerRefusesForeignPathsAtSubmission) {
  SchedulerOptions options;
  options.checkpoint_root = ckpt_;
  options.validation.fortunes_dir = tmp_ + "/fortunes";
  ASSERT_TRUE(MakeDirs(options.validation.fortunes_dir).ok());
  options.confine_paths = true;
  options.queues.tenant_data_roots["team-a"] = {data_a_};
  InMemoryJobStore store;
  FakeClock clock;
  auto scheduler = Scheduler::Create(options, &store, &clock, nullptr);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();

  // Team B trains and exports; team A then names that export.
  absl::StatusOr<loom::v1::Job> b_job = (*scheduler)->SubmitJob(ValidTestJobSpec(), "", nullptr, "team-b");
  ASSERT_TRUE(b_job.ok()) << b_job.status();
  EXPECT_EQ(b_job->checkpoint_dir(), ckpt_ + "/" + b_job->id());
  const std::string b_export = b_job->checkpoint_dir() + "/step_00000004/hf";
  ASSERT_TRUE(MakeDirs(b_export).ok());
  ASSERT_TRUE(WriteFileAtomically(b_export + "/model.safetensors", "x").ok());

  loom::v1::JobSpec steal = ValidTestJobSpec();
  steal.mutable_model()->set_init_from(b_export);
  absl::StatusOr<loom::v1::Job> refused = (*scheduler)->SubmitJob(steal, "", nullptr, "team-a");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_TRUE(absl::StartsWith(refused.status().message(), "model.init_from: ")) << refused.status();
  // Team B may fine-tune from its own export (whatever validation then says of its content).
  absl::StatusOr<loom::v1::Job> own = (*scheduler)->SubmitJob(steal, "", nullptr, "team-b");
  EXPECT_NE(own.status().code(), absl::StatusCode::kPermissionDenied) << own.status();

  loom::v1::JobSpec shadow = ValidTestJobSpec();
  shadow.mutable_dataset()->set_path("/etc/shadow");
  refused = (*scheduler)->SubmitJob(shadow, "", nullptr, "team-a");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_TRUE(absl::StartsWith(refused.status().message(), "dataset.path: '/etc/shadow' is outside"))
      << refused.status();
  // Without a data_roots setting a tenant gets the fortunes dir: /etc/shadow is refused there
  // too, and the fortunes dir is allowed.
  refused = (*scheduler)->SubmitJob(shadow, "", nullptr, "team-c");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  loom::v1::JobSpec corpus = ValidTestJobSpec();
  corpus.mutable_dataset()->set_path(options.validation.fortunes_dir);
  EXPECT_NE((*scheduler)->SubmitJob(corpus, "", nullptr, "team-c").status().code(),
            absl::StatusCode::kPermissionDenied);
  corpus.mutable_dataset()->set_path(data_a_ + "/corpus.txt");
  EXPECT_NE((*scheduler)->SubmitJob(corpus, "", nullptr, "team-a").status().code(),
            absl::StatusCode::kPermissionDenied);

  // NVMe offload at the root of the worker's file system (issue 42 defect 3): refused without a
  // scratch root, accepted under one.
  loom::v1::JobSpec nvme = ValidTestJobSpec();
  google::protobuf::Struct& zero = *(*nvme.mutable_deepspeed_config()->mutable_fields())
                                        ["zero_optimization"].mutable_struct_value();
  google::protobuf::Struct& off =
      *(*zero.mutable_fields())["offload_optimizer"].mutable_struct_value();
  (*off.mutable_fields())["device"].set_string_value("nvme");
  (*off.mutable_fields())["nvme_path"].set_string_value("/local_nvme");
  refused = (*scheduler)->SubmitJob(nvme, "", nullptr, "team-a");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_TRUE(absl::StartsWith(refused.status().message(),
                               "deepspeed_config.zero_optimization.offload_optimizer.nvme_path: "
                               "'/local_nvme' is outside the scratch roots of tenant team-a"))
      << refused.status();
}

}  // namespace
}  // namespace loom
