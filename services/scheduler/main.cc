// loom-scheduler: the Loom control plane's job and worker API (gRPC), scheduling loop, and
// SQLite state. Flags -> SchedulerServerOptions -> SchedulerServer::Start -> wait for
// SIGTERM/SIGINT -> graceful shutdown.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/daemon.h"
#include "common/grpc_credentials.h"
#include "common/logging.h"
#include "common/net_address.h"
#include "services/scheduler/scheduler_server.h"

ABSL_FLAG(std::string, host, "127.0.0.1",
          "Address to bind gRPC and /metrics to (0.0.0.0: every interface; then "
          "--advertise_address is required).");
ABSL_FLAG(std::string, advertise_address, "",
          "Address other hosts dial to reach this scheduler, written to the ready line/file "
          "(default: --host)");
ABSL_FLAG(int, port, 0, "gRPC port (0 = any free port, reported in the ready line/file).");
ABSL_FLAG(int, metrics_port, 0, "Prometheus /metrics port (0 = any free port).");
ABSL_FLAG(std::string, ready_file, "",
          "If set, write {name, grpc_address, metrics_url, pid} here once serving.");
ABSL_FLAG(std::string, db, "", "SQLite database file holding jobs and nodes (required).");
ABSL_FLAG(std::string, checkpoint_root, "",
          "Directory under which each job's checkpoints live, <root>/<job id> (required).");
ABSL_FLAG(int, heartbeat_timeout_s, 40,
          "Seconds without a heartbeat after which a worker node is declared lost (unless a job "
          "with a rank on it still reports new steps; docs/scheduling.md \"Node liveness\").");
ABSL_FLAG(absl::Duration, reregistration_grace, absl::Seconds(30),
          "After a scheduler start, how long known nodes have to heartbeat or register again "
          "before they can be declared lost (at least --heartbeat_timeout_s), so that a restart "
          "re-adopts running jobs instead of failing them.");
ABSL_FLAG(int, schedule_interval_ms, 200, "Period of the scheduling loop, in milliseconds.");
ABSL_FLAG(std::string, cycle_trace_file, "",
          "If set, append one line per scheduling cycle (end time and duration in microseconds, "
          "ok, the admission pass's kind, then the time of each phase in microseconds: see "
          "SchedulerServerOptions::cycle_trace_path) to this file; the control-plane benchmark "
          "computes percentiles from it.");
ABSL_FLAG(double, hang_step_time_factor, 20,
          "A running job is hung when its step has not advanced for this many median step times "
          "(and at least --hang_min_timeout_s).");
ABSL_FLAG(int, hang_min_timeout_s, 120, "Shortest stall, in seconds, that counts as a hang.");
ABSL_FLAG(absl::Duration, cancel_grace, absl::Minutes(2),
          "How long a cancelled job's ranks may take to write their final checkpoint and stop "
          "before they are killed.");
ABSL_FLAG(absl::Duration, checkpoint_rpc_timeout, absl::Seconds(10),
          "Deadline of each call to --checkpoint_service.");
ABSL_FLAG(std::string, checkpoint_service, "",
          "loom-checkpoint address (host:port) used to find resume checkpoints and apply "
          "retention; empty = read --checkpoint_root directly");
ABSL_FLAG(std::string, queues_config, "",
          "YAML file defining queues, tenants, quotas and fair-share weights (docs/scheduling.md); "
          "empty = one 'default' queue open to every tenant, without quota");
ABSL_FLAG(int, ready_timeout_s, 300,
          "A placed gang whose ranks are not all running after this many seconds is torn down "
          "and requeued with exponential backoff (infra restart budget).");
ABSL_FLAG(int, ready_backoff_base_s, 10, "First backoff after a gang-ready timeout, in seconds.");
ABSL_FLAG(int, ready_backoff_cap_s, 600, "Longest backoff after gang-ready timeouts, in seconds.");
ABSL_FLAG(int, default_max_infra_restarts, 3,
          "Infra restart budget of jobs whose spec.max_infra_restarts is -1.");
ABSL_FLAG(bool, preemption, true,
          "Let blocked higher-priority jobs preempt lower-priority jobs of their accelerator kind.");
ABSL_FLAG(bool, backfill, true,
          "Let jobs start behind a blocked head job when they do not delay it.");
ABSL_FLAG(int, admission_queue_depth, 1000,
          "Waiting jobs an admission pass decides about, the first in queue order (0 = all; as "
          "Slurm's default_queue_depth); a full pass runs every --admission_full_interval "
          "(docs/scheduling.md \"Admission passes\").");
ABSL_FLAG(absl::Duration, admission_full_interval, absl::Seconds(10),
          "Shortest time between two admission passes over every waiting job.");
ABSL_FLAG(absl::Duration, progress_store_interval, absl::Seconds(5),
          "A running job's step progress is stored at most this often (it is published at once; "
          "a crash loses at most this much of it, which the workers report again). 0 = every "
          "scheduling cycle.");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "Bearer tokens file (YAML/JSON list of {tenant, role: user|admin, token_sha256 | token}; "
          "docs/operations.md). Empty = no authentication: every caller is tenant 'default'.");
ABSL_FLAG(int, max_streams_per_tenant, 256,
          "Most open WatchJob/StreamLogs streams of one tenant; one more is refused with "
          "RESOURCE_EXHAUSTED (docs/operations.md \"Per-tenant limits\"). 0 = no limit.");
ABSL_FLAG(int, max_streams, 4096,
          "Most open WatchJob/StreamLogs streams of every tenant together. 0 = no limit.");
ABSL_FLAG(int64_t, max_unfinished_jobs_per_tenant, 1000,
          "Most unfinished (not yet succeeded, failed or cancelled) jobs of one tenant; a "
          "submission over it is refused with RESOURCE_EXHAUSTED (HTTP 429). --queues_config "
          "tenants.<t>.max_unfinished_jobs overrides it per tenant. 0 = no limit.");
ABSL_FLAG(std::string, checkpoint_token_file, "",
          "File holding the token sent to --checkpoint_service (its --service_token_file).");
ABSL_FLAG(std::string, worker_token_file, "",
          "File holding the token loom-worker daemons must send (required with "
          "--auth_tokens_file).");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain for TLS on the gRPC port (with --tls_key).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for TLS on the gRPC port (with --tls_cert).");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle to verify loom-checkpoint (--checkpoint_service) over TLS; empty = plaintext.");
ABSL_FLAG(std::string, fortunes_dir, "/usr/share/games/fortunes",
          "Where the built-in 'fortunes' dataset lives (checked at submission).");
ABSL_FLAG(bool, confine_paths, true,
          "Confine model.init_from and dataset.path to the tenant's own jobs' checkpoint "
          "directories and its data roots (--queues_config data_roots; default --fortunes_dir); "
          "PERMISSION_DENIED otherwise. Turn off only on a single-user machine.");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  // Debian's Abseil is built without NDEBUG, so absl::Mutex records every lock order in a
  // global graph (deadlock detection, a debugging aid; GraphCycles was 0.9% of the daemon's
  // samples under durable submissions, docs/benchmarks.md). The tests keep it; the daemon
  // turns it off.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  // Block the shutdown signals before any thread starts, so every thread inherits the mask and
  // only sigwait() below sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::string> advertised = loom::AdvertisedAddress(
      "--host", absl::GetFlag(FLAGS_host), "--advertise_address",
      absl::GetFlag(FLAGS_advertise_address));
  if (!advertised.ok()) {
    std::fprintf(stderr, "loom-scheduler: %s\n", advertised.status().ToString().c_str());
    return 2;
  }
  loom::SchedulerServerOptions options;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.db_path = absl::GetFlag(FLAGS_db);
  options.schedule_interval = absl::Milliseconds(absl::GetFlag(FLAGS_schedule_interval_ms));
  options.cycle_trace_path = absl::GetFlag(FLAGS_cycle_trace_file);
  options.checkpoint_service = absl::GetFlag(FLAGS_checkpoint_service);
  options.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  absl::StatusOr<std::string> worker_token = loom::ReadTokenFile(absl::GetFlag(FLAGS_worker_token_file));
  if (!worker_token.ok()) {
    std::fprintf(stderr, "loom-scheduler: --worker_token_file: %s\n",
                 worker_token.status().ToString().c_str());
    return 1;
  }
  options.worker_token = *worker_token;
  absl::StatusOr<std::string> checkpoint_token =
      loom::ReadTokenFile(absl::GetFlag(FLAGS_checkpoint_token_file));
  if (!checkpoint_token.ok()) {
    std::fprintf(stderr, "loom-scheduler: --checkpoint_token_file: %s\n",
                 checkpoint_token.status().ToString().c_str());
    return 1;
  }
  options.checkpoint_token = *checkpoint_token;
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.checkpoint_tls_ca = absl::GetFlag(FLAGS_tls_ca);
  options.scheduler.checkpoint_root = absl::GetFlag(FLAGS_checkpoint_root);
  options.scheduler.heartbeat_timeout = absl::Seconds(absl::GetFlag(FLAGS_heartbeat_timeout_s));
  options.scheduler.reregistration_grace = absl::GetFlag(FLAGS_reregistration_grace);
  options.scheduler.hang_step_time_factor = absl::GetFlag(FLAGS_hang_step_time_factor);
  options.scheduler.hang_min_timeout = absl::Seconds(absl::GetFlag(FLAGS_hang_min_timeout_s));
  options.scheduler.cancel_grace = absl::GetFlag(FLAGS_cancel_grace);
  options.checkpoint_rpc_timeout = absl::GetFlag(FLAGS_checkpoint_rpc_timeout);
  // Ask for heartbeats well inside the timeout: a tenth of it, at most 1 s.
  options.scheduler.heartbeat_interval =
      std::min(absl::Seconds(1), options.scheduler.heartbeat_timeout / 10);
  options.scheduler.validation.fortunes_dir = absl::GetFlag(FLAGS_fortunes_dir);
  options.scheduler.confine_paths = absl::GetFlag(FLAGS_confine_paths);
  if (!absl::GetFlag(FLAGS_queues_config).empty()) {
    absl::StatusOr<loom::QueuesConfig> queues =
        loom::LoadQueuesConfig(absl::GetFlag(FLAGS_queues_config));
    if (!queues.ok()) {
      std::fprintf(stderr, "loom-scheduler: --queues_config: %s\n",
                   queues.status().ToString().c_str());
      return 1;
    }
    options.scheduler.queues = *std::move(queues);
  }
  options.scheduler.ready_timeout = absl::Seconds(absl::GetFlag(FLAGS_ready_timeout_s));
  options.scheduler.ready_backoff_base = absl::Seconds(absl::GetFlag(FLAGS_ready_backoff_base_s));
  options.scheduler.ready_backoff_cap = absl::Seconds(absl::GetFlag(FLAGS_ready_backoff_cap_s));
  options.scheduler.default_max_infra_restarts = absl::GetFlag(FLAGS_default_max_infra_restarts);
  options.scheduler.enable_preemption = absl::GetFlag(FLAGS_preemption);
  options.scheduler.enable_backfill = absl::GetFlag(FLAGS_backfill);
  options.scheduler.admission_queue_depth = absl::GetFlag(FLAGS_admission_queue_depth);
  options.scheduler.admission_full_interval = absl::GetFlag(FLAGS_admission_full_interval);
  options.scheduler.progress_store_interval = absl::GetFlag(FLAGS_progress_store_interval);
  options.scheduler.max_unfinished_jobs_per_tenant =
      absl::GetFlag(FLAGS_max_unfinished_jobs_per_tenant);
  options.streams.max_streams_per_tenant = absl::GetFlag(FLAGS_max_streams_per_tenant);
  options.streams.max_streams = absl::GetFlag(FLAGS_max_streams);

  absl::StatusOr<std::unique_ptr<loom::SchedulerServer>> server =
      loom::SchedulerServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "loom-scheduler: %s\n", server.status().ToString().c_str());
    return 1;
  }
  absl::Status ready = loom::AnnounceReady(
      {"loom-scheduler", loom::JoinHostPort(*advertised, (*server)->port()),
       loom::ReplaceUrlHost((*server)->metrics_url(), *advertised)},
      absl::GetFlag(FLAGS_ready_file));
  if (!ready.ok()) {
    std::fprintf(stderr, "loom-scheduler: %s\n", ready.ToString().c_str());
    return 1;
  }

  int sig = 0;
  sigwait(&signals, &sig);
  LOG(INFO) << "loom-scheduler: signal " << sig << ", shutting down";
  (*server)->Shutdown(absl::Seconds(5));
  server->reset();
  return 0;
}
