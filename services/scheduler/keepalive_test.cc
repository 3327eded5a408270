// Issue 52 finding 3: a client that keeps its connection alive with HTTP/2 pings every 10 s (what
// gRPC's keepalive guides and most client libraries suggest) must be able to watch a quiet job
// for as long as it likes. A pending job's WatchJob stream sends nothing for minutes; with gRPC's
// server defaults (pings without data at most every 5 min, 2 strikes) the server ended such a
// stream with UNAVAILABLE "Too many pings". Real loom-scheduler on loopback; the wait below is the
// duration under test (several client pings), not a synchronisation.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "proto/job_service.grpc.pb.h"
#include "scheduler/test_job_spec.h"
#include "services/scheduler/scheduler_server.h"

namespace loom {
namespace {

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

TEST(KeepaliveTest, AQuietWatchSurvivesClientPingsEveryTenSeconds) {
  SchedulerServerOptions options;
  options.db_path = TmpDir() + "/keepalive_test.db";
  options.scheduler.checkpoint_root = TmpDir() + "/checkpoints";
  options.scheduler.validation.fortunes_dir = TmpDir() + "/fortunes";
  ASSERT_TRUE(MakeDirs(options.scheduler.validation.fortunes_dir).ok());
  absl::StatusOr<std::unique_ptr<SchedulerServer>> server = SchedulerServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();

  // No worker registers: the job stays PENDING and its watch is quiet after the snapshot.
  auto control = loom::v1::JobService::NewStub(
      grpc::CreateChannel((*server)->grpc_address(), grpc::InsecureChannelCredentials()));
  loom::v1::SubmitJobRequest submit;
  *submit.mutable_spec() = TestJobSpecWithRanks(1);
  loom::v1::SubmitJobResponse submitted;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(control->SubmitJob(&ctx, submit, &submitted).ok());
  }
  const std::string id = submitted.job().id();

  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);  // ping however long the stream is quiet
  auto watcher = loom::v1::JobService::NewStub(grpc::CreateCustomChannel(
      (*server)->grpc_address(), grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext watch_ctx;
  loom::v1::WatchJobRequest req;
  req.set_job_id(id);
  auto stream = watcher->WatchJob(&watch_ctx, req);
  absl::Mutex mu;
  std::vector<loom::v1::JobEvent> events;
  grpc::Status finished;
  bool done = false;
  std::thread reader([&] {
    loom::v1::JobEvent e;
    while (stream->Read(&e)) {
      absl::MutexLock l(&mu);
      events.push_back(e);
    }
    grpc::Status s = stream->Finish();
    absl::MutexLock l(&mu);
    finished = s;
    done = true;
  });

  // Five client pings without a byte of data on the stream.
  absl::SleepFor(absl::Seconds(55));
  {
    absl::MutexLock l(&mu);
    EXPECT_FALSE(done) << "the quiet watch ended: " << finished.error_code() << " "
                       << finished.error_message();
  }
  loom::v1::KillJobRequest kill;
  kill.set_job_id(id);
  loom::v1::Job killed;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(control->KillJob(&ctx, kill, &killed).ok());
  }
  reader.join();
  EXPECT_TRUE(finished.ok()) << finished.error_code() << " " << finished.error_message();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front().type(), "Snapshot");
  EXPECT_EQ(events.back().job().phase(), loom::v1::JOB_PHASE_CANCELLED)
      << "the watch did not see the end: " << events.size() << " events";
}

}  // namespace
}  // namespace loom
