// loom-worker: one daemon per node. Registers the node's inventory with loom-scheduler,
// heartbeats, and runs one loom-trainer process per assigned rank.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <memory>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/accelerator_kind.h"
#include "common/daemon.h"
#include "common/grpc_channel.h"
#include "common/grpc_credentials.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/net_address.h"
#include "proto/worker_service.grpc.pb.h"
#include "worker/gpu_inventory.h"
#include "worker/inventory.h"
#include "worker/path_check.h"
#include "worker/worker_daemon.h"

ABSL_FLAG(std::string, scheduler, "127.0.0.1:50051", "loom-scheduler gRPC address");
ABSL_FLAG(std::string, node_id, "", "unique node id (default: hostname-pid)");
ABSL_FLAG(int, slots, 1, "rank slots this node offers");
ABSL_FLAG(std::string, accelerator, "cpu",
          "accelerator kind: cpu, h100, h200, gh200, or auto (ask --nvidia_smi: its GPUs set the "
          "kind, slots and memory and every rank is bound to its own device; no nvidia-smi = cpu)");
ABSL_FLAG(std::string, nvidia_smi, "nvidia-smi",
          "nvidia-smi executable (a path or a name on PATH) that --accelerator=auto runs with "
          "--query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits");
ABSL_FLAG(std::string, gpu_inventory_file, "",
          "a recorded output of that nvidia-smi query to use instead of running it (implies "
          "--accelerator=auto; worker/testdata/nvidia_smi_*.csv)");
ABSL_FLAG(std::string, nccl_socket_ifname, "",
          "NCCL_SOCKET_IFNAME given to every rank (e.g. eth0); empty = not set");
ABSL_FLAG(std::string, nccl_ib_hca, "", "NCCL_IB_HCA given to every rank (e.g. mlx5_0,mlx5_1); "
          "empty = not set");
ABSL_FLAG(std::string, advertise_address, "",
          "address other nodes use to reach this node's ranks: the rendezvous host (MASTER_ADDR) "
          "when a rank 0 runs here and every rank's Gloo bind address (default: --address, "
          "else --host)");
ABSL_FLAG(std::string, address, "", "older name of --advertise_address");
ABSL_FLAG(std::string, topology_domain, "",
          "topology domain (NVLink island / rack) of this node; \"\" = its own domain");
ABSL_FLAG(std::string, labels, "", "node labels k=v,k2=v2 matched by jobs' node_selector");
ABSL_FLAG(int64_t, accelerator_memory_bytes, 0, "memory of one accelerator in bytes (0 for CPU)");
ABSL_FLAG(int64_t, host_memory_bytes, 0,
          "host memory offered for offload, in bytes (0 = the machine's physical memory)");
ABSL_FLAG(bool, superchip, false,
          "GH200-style superchip: the Grace CPU memory (host memory) is offload capacity over "
          "NVLink-C2C");
ABSL_FLAG(std::string, trainer, "", "path of the loom-trainer executable (required)");
ABSL_FLAG(std::string, work_dir, "", "directory for rank specs and logs (required)");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Milliseconds(500), "heartbeat period");
ABSL_FLAG(bool, confine_paths, true,
          "Check each assignment's checkpoint_dir and the paths its spec names against "
          "--checkpoint_root, --data_roots and --scratch_roots before starting its trainer (worker/path_check.h)");
ABSL_FLAG(std::string, checkpoint_root, "",
          "The checkpoint root as mounted here (the scheduler's --checkpoint_root); a job may "
          "name paths under <root>/<job> only for jobs of its own tenant. Empty: init_from can "
          "only name --data_roots");
ABSL_FLAG(std::string, data_roots, "/usr/share/games/fortunes",
          "Comma-separated data roots a spec's paths may name: /path (every tenant) or "
          "tenant=/path");
ABSL_FLAG(std::string, scratch_roots, "",
          "Comma-separated scratch roots (node-local NVMe mounts) where a job's ranks may write "
          "offload swap files (DeepSpeed nvme_path): /path (every tenant) or tenant=/path. "
          "Empty: only the job's own checkpoint directory");
ABSL_FLAG(std::string, host, "127.0.0.1",
          "address the /metrics endpoint binds (0.0.0.0: every interface; then "
          "--advertise_address is required)");
ABSL_FLAG(int, metrics_port, 0, "port for /metrics (0 = any free port)");
ABSL_FLAG(std::string, ready_file, "", "write {name, metrics_url, pid} here once serving");
ABSL_FLAG(absl::Duration, rpc_timeout, absl::Seconds(5),
          "deadline of each RegisterWorker / Heartbeat call to the scheduler");
ABSL_FLAG(absl::Duration, reconnect_backoff_max, loom::kDefaultReconnectBackoffMax,
          "longest wait between two attempts to connect to the scheduler (gRPC reconnect "
          "backoff cap): after a scheduler restart the worker heartbeats again within about "
          "1.2x this");
ABSL_FLAG(std::string, token_file, "",
          "file holding the worker token the scheduler expects (its --worker_token_file) when "
          "authentication is on");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle to verify the scheduler's TLS certificate; empty = plaintext");

namespace {

// SchedulerClient over gRPC. Every call carries a deadline and waits for the channel to be
// ready (wait_for_ready) within it: a fail-fast call on a channel in TRANSIENT_FAILURE fails at
// once without polling, so a reconnection attempt's result was only noticed by gRPC's 5 s backup
// poller and the worker came back seconds after the scheduler did. While the scheduler is down
// a call thus takes up to --rpc_timeout (DEADLINE_EXCEEDED) instead of failing at once.
class GrpcSchedulerClient : public loom::worker::SchedulerClient {
 public:
  GrpcSchedulerClient(std::shared_ptr<grpc::Channel> channel, std::string token,
                      absl::Duration timeout)
      : stub_(loom::v1::WorkerService::NewStub(channel)),
        token_(std::move(token)),
        timeout_(timeout) {}

  absl::StatusOr<loom::v1::RegisterWorkerResponse> RegisterWorker(
      const loom::v1::RegisterWorkerRequest& request) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout_));
    ctx.set_wait_for_ready(true);
    loom::AddBearerToken(ctx, token_);
    loom::v1::RegisterWorkerResponse resp;
    grpc::Status s = stub_->RegisterWorker(&ctx, request, &resp);
    if (!s.ok()) return loom::FromGrpcStatus(s);
    return resp;
  }

  absl::StatusOr<loom::v1::HeartbeatResponse> Heartbeat(
      const loom::v1::HeartbeatRequest& request) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout_));
    ctx.set_wait_for_ready(true);
    loom::AddBearerToken(ctx, token_);
    loom::v1::HeartbeatResponse resp;
    grpc::Status s = stub_->Heartbeat(&ctx, request, &resp);
    if (!s.ok()) return loom::FromGrpcStatus(s);
    return resp;
  }

 private:
  std::unique_ptr<loom::v1::WorkerService::Stub> stub_;
  const std::string token_;
  const absl::Duration timeout_;
};

absl::StatusOr<loom::v1::AcceleratorKind> ParseAccelerator(const std::string& s) {
  absl::StatusOr<loom::v1::AcceleratorKind> kind = loom::ParseAcceleratorKind(s);
  if (!kind.ok()) return absl::InvalidArgumentError(absl::StrCat("--accelerator: ", kind.status().message()));
  return kind;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;

  // Block SIGTERM/SIGINT in every thread; a dedicated thread waits for them.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  const bool detect_accelerators = absl::GetFlag(FLAGS_accelerator) == "auto" ||
                                   !absl::GetFlag(FLAGS_gpu_inventory_file).empty();
  auto accelerator = detect_accelerators ? absl::StatusOr<loom::v1::AcceleratorKind>(
                                               loom::v1::ACCELERATOR_KIND_CPU)
                                         : ParseAccelerator(absl::GetFlag(FLAGS_accelerator));
  if (!accelerator.ok()) {
    LOG(ERROR) << accelerator.status();
    return 2;
  }
  char hostname[256] = {0};
  ::gethostname(hostname, sizeof(hostname) - 1);
  loom::worker::WorkerOptions options;
  options.node_id = absl::GetFlag(FLAGS_node_id);
  if (options.node_id.empty()) options.node_id = absl::StrCat(hostname, "-", ::getpid());
  options.inventory.set_accelerator(*accelerator);
  options.inventory.set_slots(absl::GetFlag(FLAGS_slots));
  options.inventory.set_hostname(hostname);
  absl::StatusOr<std::string> advertised = loom::AdvertisedAddress(
      "--host", absl::GetFlag(FLAGS_host), "--advertise_address",
      absl::GetFlag(FLAGS_advertise_address).empty() ? absl::GetFlag(FLAGS_address)
                                                     : absl::GetFlag(FLAGS_advertise_address));
  if (!advertised.ok()) {
    LOG(ERROR) << advertised.status();
    return 2;
  }
  options.inventory.set_address(*advertised);
  options.inventory.set_host_memory_bytes(
      absl::GetFlag(FLAGS_host_memory_bytes) > 0
          ? absl::GetFlag(FLAGS_host_memory_bytes)
          : static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGE_SIZE));
  options.inventory.set_accelerator_memory_bytes(absl::GetFlag(FLAGS_accelerator_memory_bytes));
  options.inventory.set_topology_domain(absl::GetFlag(FLAGS_topology_domain));
  options.inventory.set_superchip(absl::GetFlag(FLAGS_superchip));
  options.inventory.set_cpu_arch(loom::worker::DetectCpuArch());
  auto labels = loom::worker::ParseLabels(absl::GetFlag(FLAGS_labels));
  if (!labels.ok()) {
    LOG(ERROR) << labels.status();
    return 2;
  }
  for (const auto& [k, v] : *labels) (*options.inventory.mutable_labels())[k] = v;
  if (options.inventory.accelerator_memory_bytes() < 0) {
    LOG(ERROR) << "--accelerator_memory_bytes: must be >= 0";
    return 2;
  }
  if (detect_accelerators) {
    // Device inventory (worker/gpu_inventory.h): each rank gets its own device.
    const std::string& file = absl::GetFlag(FLAGS_gpu_inventory_file);
    absl::StatusOr<loom::worker::GpuInventory> gpus =
        file.empty() ? loom::worker::DetectGpuInventory(absl::GetFlag(FLAGS_nvidia_smi))
                     : loom::worker::ReadGpuInventoryFile(file);
    if (!gpus.ok()) {
      LOG(ERROR) << gpus.status();
      return 2;
    }
    loom::worker::ApplyGpuInventory(*gpus, &options.inventory);
    LOG(INFO) << "accelerators: " << gpus->devices.size() << " x '" << gpus->model << "' ("
              << loom::AcceleratorKindName(options.inventory.accelerator()) << "), "
              << options.inventory.slots() << " slots";
  }
  options.nccl.socket_ifname = absl::GetFlag(FLAGS_nccl_socket_ifname);
  options.nccl.ib_hca = absl::GetFlag(FLAGS_nccl_ib_hca);
  options.trainer_path = absl::GetFlag(FLAGS_trainer);
  options.work_dir = absl::GetFlag(FLAGS_work_dir);
  options.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  options.confine_paths = absl::GetFlag(FLAGS_confine_paths);
  options.paths.checkpoint_root = absl::GetFlag(FLAGS_checkpoint_root);
  absl::StatusOr<std::vector<std::string>> data_roots =
      loom::worker::ParseDataRoots(absl::GetFlag(FLAGS_data_roots));
  if (!data_roots.ok()) {
    LOG(ERROR) << "--data_roots: " << data_roots.status();
    return 2;
  }
  options.paths.data_roots = *std::move(data_roots);
  absl::StatusOr<std::vector<std::string>> scratch_roots =
      loom::worker::ParseDataRoots(absl::GetFlag(FLAGS_scratch_roots), "scratch_roots");
  if (!scratch_roots.ok()) {
    LOG(ERROR) << "--scratch_roots: " << scratch_roots.status();
    return 2;
  }
  options.paths.scratch_roots = *std::move(scratch_roots);
  if (options.confine_paths && options.paths.checkpoint_root.empty()) {
    LOG(WARNING) << "no --checkpoint_root: model.init_from may only name --data_roots, and job "
                 << "directories get no owner record";
  }
  if (absl::Status s = options.Validate(); !s.ok()) {
    LOG(ERROR) << "invalid flags: " << s;
    return 2;
  }
  if (::access(options.trainer_path.c_str(), X_OK) != 0) {
    LOG(ERROR) << "--trainer: " << options.trainer_path << " is not an executable file";
    return 2;
  }

  auto registry = std::make_shared<prometheus::Registry>();
  loom::worker::WorkerMetrics metrics(*registry);
  auto endpoint = loom::MetricsEndpoint::Start(absl::GetFlag(FLAGS_host),
                                               absl::GetFlag(FLAGS_metrics_port), registry);
  if (!endpoint.ok()) {
    LOG(ERROR) << endpoint.status();
    return 1;
  }
  if (absl::GetFlag(FLAGS_rpc_timeout) <= absl::ZeroDuration()) {
    LOG(ERROR) << "--rpc_timeout: must be positive";
    return 2;
  }
  auto token = loom::ReadTokenFile(absl::GetFlag(FLAGS_token_file));
  if (!token.ok()) {
    LOG(ERROR) << "--token_file: " << token.status();
    return 2;
  }
  auto creds = loom::MakeChannelCredentials(absl::GetFlag(FLAGS_tls_ca));
  if (!creds.ok()) {
    LOG(ERROR) << "--tls_ca: " << creds.status();
    return 2;
  }
  if (absl::Status s = loom::ValidateReconnectBackoff("--reconnect_backoff_max",
                                                      absl::GetFlag(FLAGS_reconnect_backoff_max));
      !s.ok()) {
    LOG(ERROR) << s;
    return 2;
  }
  GrpcSchedulerClient client(
      loom::CreateReconnectingChannel(absl::GetFlag(FLAGS_scheduler), *creds,
                                      absl::GetFlag(FLAGS_reconnect_backoff_max)),
      *token, absl::GetFlag(FLAGS_rpc_timeout));
  loom::worker::WorkerDaemon daemon(options, &client, &metrics);
  (*endpoint)->SetReadyCheck([&daemon]() -> absl::Status {
    if (!daemon.Registered()) return absl::UnavailableError("not registered with the scheduler");
    return absl::OkStatus();
  });
  // Announce before the signal thread exists: returning early with a joinable std::thread
  // would call std::terminate (regression: an unwritable --ready_file aborted the process).
  // SIGTERM/SIGINT stay blocked meanwhile, so one arriving now is handled by the thread below.
  absl::Status ready = loom::AnnounceReady(
      {"loom-worker", "", loom::ReplaceUrlHost((*endpoint)->url(), *advertised)},
      absl::GetFlag(FLAGS_ready_file));
  if (!ready.ok()) {
    LOG(ERROR) << ready;
    endpoint->reset();  // stops serving (and joins) before `daemon`, which /readyz reads, goes
    return 1;
  }
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    LOG(INFO) << "signal " << sig << ": stopping ranks and shutting down";
    daemon.Shutdown();
  });
  LOG(INFO) << "loom-worker " << options.node_id << " serving metrics at " << (*endpoint)->url()
            << ", scheduler " << absl::GetFlag(FLAGS_scheduler);
  daemon.Run();
  // Run() returns after Shutdown(): from the signal thread, or from the daemon itself when
  // another worker process registered this node id. Then the signal thread still waits: wake it.
  const bool superseded = daemon.Superseded();
  if (superseded) ::kill(::getpid(), SIGTERM);  // blocked here; sigwait in signal_thread takes it
  signal_thread.join();
  // Stop serving (joining the server thread, so no /readyz probe is still running) before
  // `daemon`, which the ready check reads, is destroyed.
  endpoint->reset();
  if (superseded) {
    LOG(ERROR) << "loom-worker " << options.node_id
               << ": superseded by another worker registered with the same --node_id";
    return 1;
  }
  return 0;
}
