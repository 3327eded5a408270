// File: services/scheduler/scheduler_server.h
//
// loom-scheduler assembled: SQLite store -> Scheduler core -> gRPC JobService + WorkerService
// (plus the standard grpc.health.v1 service) on one port, a scheduling loop thread, and a
// Prometheus /metrics endpoint. main.cc turns flags into SchedulerServerOptions and runs one;
// tests start one in-process on port 0 and stop it, then start another on the same database.
#ifndef LOOM_SERVICES_SCHEDULER_SCHEDULER_SERVER_H_
#define LOOM_SERVICES_SCHEDULER_SCHEDULER_SERVER_H_

#include <grpcpp/server.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/daemon.h"
#include "scheduler/checkpoint_catalog.h"
#include "scheduler/clock.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_metrics.h"
#include "services/scheduler/admin_service.h"
#include "services/scheduler/auth_service.h"
#include "services/scheduler/job_service.h"
#include "services/scheduler/worker_service.h"
#include "storage/sqlite_job_store.h"

namespace prometheus {
class Registry;
}

namespace loom {

struct SchedulerServerOptions {
  std::string host = "127.0.0.1";  // gRPC and /metrics bind address
  int port = 0;                    // gRPC port; 0 = any free port
  int metrics_port = 0;            // /metrics port; 0 = any free port
  std::string db_path;             // SQLite file; required (created if absent)
  absl::Duration schedule_interval = absl::Milliseconds(200);  // scheduling loop period
  // loom-checkpoint's address (host:port) for resume lookups and retention; empty = read the
  // checkpoint root directly with the storage library.
  std::string checkpoint_service;
  // Deadline of each call to checkpoint_service (never made under the scheduler's lock).
  absl::Duration checkpoint_rpc_timeout = absl::Seconds(10);
  // Authentication (services/scheduler/auth_service.h): a tokens file (common/auth.h); empty =
  // off, every caller is tenant "default" with admin rights. With it, `worker_token` is required
  // and every WorkerService call must carry it.
  std::string auth_tokens_file;
  std::string worker_token;
  // TLS for the gRPC port (both or neither; PEM), and the CA bundle to verify loom-checkpoint
  // with (empty = plaintext to the checkpoint service).
  std::string tls_cert;
  std::string tls_key;
  std::string checkpoint_tls_ca;
  // Bearer token for the calls to checkpoint_service (its --service_token_file); empty = none.
  std::string checkpoint_token;
  // If set, one line per scheduling cycle is appended to this file: "<end unix us> <duration
  // us> <0|1 ok> <admission pass: 1 skipped, 2 partial, 3 full> <checks us> <resume_wait us>
  // <snapshot us> <decide us> <apply us> <store us>\n" (Scheduler::AdmissionPassStats::Kind,
  // Scheduler::CyclePhases; the control-plane benchmark reads exact percentiles from it; the
  // loom_scheduling_cycle_seconds histogram only has buckets). Opened at Start; an unopenable
  // path is INVALID_ARGUMENT naming it. Empty = off.
  std::string cycle_trace_path;
  // Caps on open WatchJob/StreamLogs streams, per tenant and in all (stream_limits.h;
  // --max_streams_per_tenant, --max_streams). Each >= 0; 0 = no limit.
  StreamLimits streams;
  SchedulerOptions scheduler;

  // INVALID_ARGUMENT naming the field.
  absl::Status Validate() const;
};

// Thread-safe.
class SchedulerServer {
 public:
  // Opens the store, loads the scheduler state, binds gRPC and /metrics and starts the loop.
  // `clock` must outlive the server. INVALID_ARGUMENT for bad options; UNAVAILABLE if a port
  // cannot be bound or the database cannot be opened.
  static absl::StatusOr<std::unique_ptr<SchedulerServer>> Start(
      const SchedulerServerOptions& options, Clock* clock = RealClock());
  ~SchedulerServer();  // Shutdown(5 s) if not done

  // Stops accepting RPCs, lets in-flight ones finish until `deadline` from now, then cancels
  // the rest; stops the loop. Idempotent.
  void Shutdown(absl::Duration deadline);

  int port() const { return port_; }
  std::string grpc_address() const;
  std::string metrics_url() const { return metrics_->url(); }
  std::string health_url() const { return metrics_->health_url(); }
  std::string ready_url() const { return metrics_->ready_url(); }
  // /readyz: OK once the store is loaded and a scheduling cycle has succeeded, until Shutdown;
  // UNAVAILABLE otherwise (e.g. while the store fails).
  absl::Status Ready() const;
  prometheus::Registry& registry() { return *registry_; }
  Scheduler& scheduler() { return *scheduler_; }
  StreamLimiter& stream_limiter() { return *stream_limiter_; }

 private:
  std::unique_ptr<CheckpointCatalog> checkpoints_;  // before scheduler_, which uses it
  explicit SchedulerServer(SchedulerServerOptions options) : options_(std::move(options)) {}
  void LoopMain();
  void TraceCycle(absl::Time end, absl::Duration took, bool ok, int pass_kind,
                  const Scheduler::CyclePhases& phases);

  const SchedulerServerOptions options_;
  std::unique_ptr<SqliteJobStore> store_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<SchedulerMetrics> scheduler_metrics_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<StreamLimiter> stream_limiter_;  // before job_service_, whose streams hold slots
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<TokenAuthenticator> auth_;  // null = authentication off
  std::unique_ptr<AuthJobService> auth_job_service_;
  std::unique_ptr<AuthWorkerService> auth_worker_service_;
  std::unique_ptr<AdminServiceImpl> admin_service_;
  std::atomic<bool> cycle_ok_{false};
  std::atomic<bool> stopping_{false};
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsEndpoint> metrics_;
  int port_ = 0;
  absl::Notification stop_loop_;
  std::thread loop_;
  std::FILE* cycle_trace_ = nullptr;  // options_.cycle_trace_path; written by the loop thread only
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_SCHEDULER_SERVER_H_
