// `loomctl list` and `loomctl get` against a real in-process SchedulerServer whose SQLite file
// already holds jobs that schedulers before the admission limits accepted (issue 18): two with
// 3 MB names, which made ListJobs fail for every user ("Received message larger than max"), and
// one whose name and message carry terminal escapes, which loomctl printed raw. Those jobs cannot
// be deleted, so listing must cope with them: pages stay under the gRPC limit and everything
// printed is escaped.
#include <google/protobuf/util/json_util.h>

#include <cstdlib>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "scheduler/test_job_spec.h"
#include "services/scheduler/scheduler_server.h"
#include "storage/sqlite_job_store.h"
#include "tests/testing/subprocess.h"

namespace loom {
namespace {

struct CliRun {
  int code;
  std::string output;
};

CliRun Loomctl(const std::string& address, const std::vector<std::string>& args) {
  static int n = 0;
  const std::string log = absl::StrCat(std::getenv("TEST_TMPDIR"), "/loomctl_list_", n++, ".log");
  std::vector<std::string> argv = {testing::RunfilePath("services/cli/loomctl")};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--scheduler=" + address);
  auto p = testing::Subprocess::Start(argv, log);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return {-1, ""};
  int status = p->Wait(absl::Seconds(60));
  return {testing::ExitCode(status), *ReadFile(log)};
}

constexpr char kEscapeName[] = "\x1b]0;pwned\x07\x1b[31mred\x1b[0m\xC2\x9B" "2J";

JobRecord LegacyJob(int i, const std::string& name, const std::string& message) {
  JobRecord job;
  job.id = absl::StrCat("job-legacy", i);
  job.sequence = i + 1;
  job.spec = ValidTestJobSpec();
  job.spec.set_name(name);
  job.phase = loom::v1::JOB_PHASE_FAILED;
  job.failure_class = loom::v1::FAILURE_CLASS_USER;
  job.reason = "RankFailed";
  job.message = message;
  job.create_time = absl::Now();
  job.end_time = absl::Now();
  job.checkpoint_dir = absl::StrCat("/tmp/checkpoints/", job.id);
  return job;
}

TEST(LoomctlListTest, JobsOlderSchedulersAdmittedAreListedAndPrintedEscaped) {
  const std::string tmp = std::getenv("TEST_TMPDIR");
  SchedulerServerOptions options;
  options.db_path = tmp + "/loomctl_list.db";
  options.scheduler.checkpoint_root = tmp + "/checkpoints";
  options.scheduler.validation.fortunes_dir = tmp + "/fortunes";
  ASSERT_TRUE(MakeDirs(options.scheduler.validation.fortunes_dir).ok());
  std::vector<std::string> ids;
  {
    auto store = SqliteJobStore::Open(options.db_path);
    ASSERT_TRUE(store.ok()) << store.status();
    std::vector<JobRecord> jobs;
    jobs.push_back(LegacyJob(0, std::string(3 << 20, 'a'), "rank 0 failed"));
    jobs.push_back(LegacyJob(1, kEscapeName, "rank 1: \x1b[2J\x1b[Hscreen cleared"));
    jobs.push_back(LegacyJob(2, std::string(3 << 20, 'b'), "rank 0 failed"));
    for (int i = 3; i < 8; ++i) jobs.push_back(LegacyJob(i, absl::StrCat("ok-", i), "done"));
    for (const JobRecord& j : jobs) ids.push_back(j.id);
    ASSERT_TRUE((*store)->CreateJobs(jobs).ok());
  }
  absl::StatusOr<std::unique_ptr<SchedulerServer>> server = SchedulerServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->grpc_address();

  CliRun list = Loomctl(address, {"list"});
  ASSERT_EQ(list.code, 0) << list.output.substr(0, 2000);
  for (const std::string& id : ids) {
    EXPECT_TRUE(absl::StrContains(list.output, id)) << id << "\n" << list.output.substr(0, 2000);
  }
  EXPECT_FALSE(absl::StrContains(list.output, "\x1b")) << "raw ESC printed";
  EXPECT_FALSE(absl::StrContains(list.output, "\x07")) << "raw BEL printed";
  EXPECT_FALSE(absl::StrContains(list.output, "\xC2\x9B")) << "raw 8-bit CSI printed";
  EXPECT_TRUE(absl::StrContains(list.output, "\\x1b]0;pwned\\x07\\x1b[31mred")) << list.output;
  // Table names are cut: the 3 MB names do not flood the terminal.
  EXPECT_LT(list.output.size(), 4096u) << list.output.substr(0, 2000);

  CliRun limited = Loomctl(address, {"list", "--limit=2"});
  ASSERT_EQ(limited.code, 0) << limited.output.substr(0, 2000);
  EXPECT_TRUE(absl::StrContains(limited.output, ids[0]));
  EXPECT_TRUE(absl::StrContains(limited.output, ids[1]));
  EXPECT_FALSE(absl::StrContains(limited.output, ids[2]));

  CliRun get = Loomctl(address, {"get", ids[1]});
  ASSERT_EQ(get.code, 0) << get.output;
  EXPECT_FALSE(absl::StrContains(get.output, "\x1b")) << get.output;
  EXPECT_TRUE(absl::StrContains(get.output, "message:  rank 1: \\x1b[2J\\x1b[Hscreen cleared"))
      << get.output;

  CliRun json = Loomctl(address, {"list", "--json", "--limit=3"});
  ASSERT_EQ(json.code, 0) << json.output.substr(0, 2000);
  EXPECT_FALSE(absl::StrContains(json.output, "\x1b"));
  EXPECT_TRUE(absl::StrContains(json.output, "\\u001b]0;pwned")) << json.output.substr(0, 2000);
  (*server)->Shutdown(absl::Seconds(1));
}

// Issue 42 defect 6: `loomctl submit` gave up with UNAVAILABLE while the scheduler restarted
// (five tries over about 6 s, on a channel whose reconnect backoff grows to gRPC's 120 s). The
// scheduler here is down for 8 s, longer than those tries took; loomctl must keep retrying
// (same request id) within --retry_deadline and submit exactly one job once it is back.
TEST(LoomctlSubmitTest, SubmitRidesOutASchedulerRestart) {
  const std::string tmp = std::getenv("TEST_TMPDIR");
  SchedulerServerOptions options;
  options.db_path = tmp + "/loomctl_restart.db";
  options.scheduler.checkpoint_root = tmp + "/checkpoints";
  options.scheduler.validation.fortunes_dir = tmp + "/fortunes";
  ASSERT_TRUE(MakeDirs(options.scheduler.validation.fortunes_dir).ok());
  absl::StatusOr<std::unique_ptr<SchedulerServer>> first = SchedulerServer::Start(options);
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->port();
  const std::string address = (*first)->grpc_address();
  // The spec as JSON (a YAML document too).
  std::string spec_json;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(ValidTestJobSpec(), &spec_json, print)
                  .ok());
  // int64 fields print as strings in the JSON mapping; the YAML reader wants numbers.
  spec_json = std::regex_replace(spec_json, std::regex(R"re(:\s*"(-?[0-9]+)")re"), ":$1");
  const std::string spec_path = tmp + "/restart_job.yaml";
  ASSERT_TRUE(WriteFileAtomically(spec_path, spec_json).ok());
  // Once loomctl has connected to it, the scheduler goes away.
  (*first)->Shutdown(absl::Seconds(1));
  first->reset();
  const std::string log = tmp + "/loomctl_restart.log";
  auto loomctl = testing::Subprocess::Start(
      {testing::RunfilePath("services/cli/loomctl"), "submit", spec_path,
       "--scheduler=" + address},  // the default --retry_deadline (60 s)
      log);
  ASSERT_TRUE(loomctl.ok()) << loomctl.status();
  // The restart's downtime (not a readiness wait): loomctl is retrying meanwhile.
  absl::SleepFor(absl::Seconds(8));
  options.port = port;
  absl::StatusOr<std::unique_ptr<SchedulerServer>> second = SchedulerServer::Start(options);
  ASSERT_TRUE(second.ok()) << second.status();
  const int status = loomctl->Wait(absl::Seconds(60));
  const std::string output = *ReadFile(log);
  EXPECT_EQ(testing::ExitCode(status), 0) << output;
  EXPECT_TRUE(absl::StrContains(output, "job-")) << output;
}

}  // namespace
}  // namespace loom
