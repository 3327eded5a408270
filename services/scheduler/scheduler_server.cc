#include "services/scheduler/scheduler_server.h"

#include "services/scheduler/grpc_checkpoint_catalog.h"

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <prometheus/registry.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/grpc_channel.h"
#include "common/grpc_credentials.h"
#include "common/grpc_server.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace loom {

absl::Status SchedulerServerOptions::Validate() const {
  if (db_path.empty()) return absl::InvalidArgumentError("db: required (SQLite file path)");
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port: must be in [0, 65535], got ", port));
  }
  if (metrics_port < 0 || metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_port: must be in [0, 65535], got ", metrics_port));
  }
  if (checkpoint_rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("checkpoint_rpc_timeout: must be > 0");
  }
  if (schedule_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule_interval: must be > 0, got ", absl::FormatDuration(schedule_interval)));
  }
  if (!auth_tokens_file.empty() && worker_token.empty()) {
    return absl::InvalidArgumentError(
        "worker_token: required when auth_tokens_file is set (workers authenticate with it)");
  }
  if (tls_cert.empty() != tls_key.empty()) {
    return absl::InvalidArgumentError("tls_cert, tls_key: set both or neither");
  }
  if (streams.max_streams_per_tenant < 0 || streams.max_streams < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_streams_per_tenant, max_streams: must be >= 0 (0 = no limit), got ",
        streams.max_streams_per_tenant, ", ", streams.max_streams));
  }
  return scheduler.Validate();
}

absl::StatusOr<std::unique_ptr<SchedulerServer>> SchedulerServer::Start(
    const SchedulerServerOptions& options, Clock* clock) {
  RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<SchedulerServer> s(new SchedulerServer(options));
  ASSIGN_OR_RETURN(s->store_, SqliteJobStore::Open(options.db_path));
  s->registry_ = std::make_shared<prometheus::Registry>();
  s->scheduler_metrics_ = std::make_unique<SchedulerMetrics>(*s->registry_);
  if (!options.checkpoint_service.empty()) {
    ASSIGN_OR_RETURN(auto channel_creds, MakeChannelCredentials(options.checkpoint_tls_ca));
    s->checkpoints_ = std::make_unique<GrpcCheckpointCatalog>(
        // Bounded reconnect backoff, as the workers' and the gateway's channels: with gRPC's
        // default (up to 120 s) a RECOVERING job waited long after loom-checkpoint was back.
        CreateReconnectingChannel(options.checkpoint_service, channel_creds,
                                  kDefaultReconnectBackoffMax),
        options.checkpoint_rpc_timeout, options.checkpoint_token);
  }
  if (!options.auth_tokens_file.empty()) {
    ASSIGN_OR_RETURN(TokenAuthenticator auth,
                     TokenAuthenticator::FromFile(options.auth_tokens_file));
    s->auth_ = std::make_unique<TokenAuthenticator>(std::move(auth));
    LOG(INFO) << "authentication on: " << s->auth_->size() << " tokens from "
              << options.auth_tokens_file;
  } else {
    LOG(WARNING) << "authentication off (no --auth_tokens_file): every caller is tenant "
                 << "'default' and may see and cancel every job";
  }
  ASSIGN_OR_RETURN(auto server_creds, MakeServerCredentials(options.tls_cert, options.tls_key));
  ASSIGN_OR_RETURN(s->scheduler_, Scheduler::Create(options.scheduler, s->store_.get(), clock,
                                                    s->scheduler_metrics_.get(),
                                                    s->checkpoints_.get()));
  s->stream_limiter_ = std::make_unique<StreamLimiter>(options.streams);
  s->job_service_ =
      std::make_unique<JobServiceImpl>(s->scheduler_.get(), s->stream_limiter_.get());
  s->worker_service_ = std::make_unique<WorkerServiceImpl>(s->scheduler_.get());
  s->auth_job_service_ = std::make_unique<AuthJobService>(s->job_service_.get(),
                                                          s->scheduler_.get(), s->auth_.get());
  s->auth_worker_service_ = std::make_unique<AuthWorkerService>(
      s->worker_service_.get(), s->auth_ != nullptr ? options.worker_token : "");
  s->admin_service_ = std::make_unique<AdminServiceImpl>(s->scheduler_.get(), s->auth_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  ApplyKeepalivePolicy(builder);
  const std::string address = absl::StrCat(options.host, ":", options.port);
  builder.AddListeningPort(address, server_creds, &s->port_);
  builder.RegisterService(s->auth_job_service_.get());
  builder.RegisterService(s->auth_worker_service_.get());
  builder.RegisterService(s->admin_service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve gRPC on ", address));
  }
  MarkServing(*s->server_, {"loom.v1.JobService", "loom.v1.AdminService", "loom.v1.WorkerService"});
  ASSIGN_OR_RETURN(s->metrics_,
                   MetricsEndpoint::Start(options.host, options.metrics_port, s->registry_,
                                          [server = s.get()] { return server->Ready(); }));
  if (!options.cycle_trace_path.empty()) {
    s->cycle_trace_ = std::fopen(options.cycle_trace_path.c_str(), "ae");
    if (s->cycle_trace_ == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cycle_trace_path: cannot open ", options.cycle_trace_path, ": ", std::strerror(errno)));
    }
  }
  s->loop_ = std::thread([server = s.get()] { server->LoopMain(); });
  LOG(INFO) << "loom-scheduler serving on " << s->grpc_address() << ", metrics at "
            << s->metrics_url() << ", database " << options.db_path;
  return s;
}

absl::Status SchedulerServer::Ready() const {
  if (stopping_) return absl::UnavailableError("shutting down");
  if (!cycle_ok_) return absl::UnavailableError("no successful scheduling cycle yet");
  return absl::OkStatus();
}

std::string SchedulerServer::grpc_address() const {
  return absl::StrCat(options_.host, ":", port_);
}

void SchedulerServer::LoopMain() {
  int consecutive_errors = 0;
  // An iteration that starts this much later than the schedule says means the scheduler itself
  // did not run (or held its lock in a long cycle): the workers could not be heard meanwhile.
  constexpr absl::Duration kLateness = absl::Seconds(2);
  absl::Time previous_start = absl::InfinitePast();
  do {
    const absl::Time start = absl::Now();
    if (previous_start != absl::InfinitePast()) {
      const absl::Duration late = start - previous_start - options_.schedule_interval;
      if (late > kLateness) scheduler_->ExcusePause(late);
    }
    previous_start = start;
    absl::Status s = scheduler_->RunSchedulingCycle();
    cycle_ok_ = s.ok();
    if (cycle_trace_ != nullptr) {
      const absl::Time end = absl::Now();
      TraceCycle(end, end - start, s.ok(), static_cast<int>(scheduler_->LastAdmissionPass().kind),
                 scheduler_->LastCyclePhases());
    }
    if (!s.ok()) {
      // A store error (e.g. disk full) is retried next cycle; log the first and then sparsely.
      if (consecutive_errors++ % 50 == 0) LOG(ERROR) << "scheduling cycle failed: " << s;
    } else {
      consecutive_errors = 0;
    }
  } while (!stop_loop_.WaitForNotificationWithTimeout(options_.schedule_interval));
  absl::Status flushed = scheduler_->FlushProgress();
  if (!flushed.ok()) LOG(WARNING) << "progress of running jobs not stored at shutdown: " << flushed;
}

void SchedulerServer::TraceCycle(absl::Time end, absl::Duration took, bool ok, int pass_kind,
                                 const Scheduler::CyclePhases& phases) {
  auto us = [](absl::Duration d) { return static_cast<long long>(absl::ToInt64Microseconds(d)); };
  // A trace line is best effort: a full disk must not stop scheduling.
  (void)std::fprintf(cycle_trace_, "%lld %lld %d %d %lld %lld %lld %lld %lld %lld\n",
                     static_cast<long long>(absl::ToUnixMicros(end)), us(took), ok ? 1 : 0,
                     pass_kind, us(phases.checks), us(phases.resume_wait), us(phases.snapshot),
                     us(phases.decide), us(phases.apply), us(phases.store));
  (void)std::fflush(cycle_trace_);
}

void SchedulerServer::Shutdown(absl::Duration deadline) {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  stopping_ = true;
  if (server_ != nullptr) {
    // NOT_SERVING first, to every health watcher (issue 52: the health Watch never said so
    // before the server went away), then the in-flight calls get `deadline` to finish.
    ShutdownGracefully(*server_, std::chrono::system_clock::now() +
                                     std::chrono::milliseconds(absl::ToInt64Milliseconds(deadline)));
    server_->Wait();
  }
  if (!stop_loop_.HasBeenNotified()) stop_loop_.Notify();
  if (loop_.joinable()) loop_.join();
  if (cycle_trace_ != nullptr) {
    (void)std::fclose(cycle_trace_);
    cycle_trace_ = nullptr;
  }
  LOG(INFO) << "loom-scheduler on " << grpc_address() << " stopped";
}

SchedulerServer::~SchedulerServer() { Shutdown(absl::Seconds(5)); }

}  // namespace loom
