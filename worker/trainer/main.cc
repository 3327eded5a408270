// loom-trainer: one training rank of a Loom job (ZeRO-3 Llama over c10d Gloo).
//
//   loom-trainer --spec=job.json --rank=R --world_size=N [--master_addr=127.0.0.1] [--bind_address=A]
//                [--master_port=P] [--checkpoint_dir=DIR] [--job_id=ID]
//                [--resume_from=DIR/step_00000006] [--collective_timeout_s=300]
//                [--malloc_mmap_threshold_bytes=0] [--malloc_trim_threshold_bytes=0]
//                [--trajectory_dir=DIR]
//
// --trajectory_dir (debugging and the PyTorch reference test; the worker never passes it): every
// rank writes into DIR (a fresh directory) the initial and final weights as Hugging Face exports
// (initial_hf/, final_hf/), every training window it ran (tokens_rank_<r>.bin + .json) and rank 0
// the per-step loss, lr and gradient norm (trajectory.json); format in worker/engine/trajectory.h.
//
// --spec is a loom.v1.JobSpec (proto/common.proto) in protobuf's JSON mapping, as the worker
// writes it, read with protobuf's JSON parser (a field JobSpec does not have is refused); only
// model, dataset, deepspeed_config, training and checkpoint are used (engine_options.h). Rank 0
// may use --master_port=0: its TCPStore binds a free port and reports it in the rendezvous
// event; the other ranks must then be started with that port.
//
// Protocol with the worker daemon: stdout carries only loom.TrainerEvent messages
// (proto/trainer_events.proto, whose field comments are the schema), one per line as protobuf
// JSON, flushed: process_start first, rendezvous (rank 0), warning*, started, eval, step*, eval,
// checkpoint*, then done, stopped or error. The engine builds each event as the message
// (worker/engine/engine.h EventCallback); Emit prints it.
// Logs go to stderr. Exit codes (worker/trainer/exit_codes.h): 0 done, or stopped gracefully
// (SIGUSR1: checkpoint at the next step boundary every rank agrees on, then stop; the last event
// says which); 1 runtime error (collective failure, I/O, LibTorch); 65 data error (a checkpoint
// to resume from fails its size or CRC-32 check: DATA_LOSS); 66 dataset error (the data set
// changed since the job first started, or is too small for it: data/dataset_error.h; not
// retried); 78 invalid flags/spec/config
// (INVALID_ARGUMENT: the scheduler does not retry it); 143 stopped by SIGTERM/SIGINT at a step
// boundary (a second signal exits 143 immediately). At the end rank 0 writes
// <checkpoint_dir>/final_logits.json.
#include <malloc.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/net_address.h"
#include "data/dataset_error.h"
#include "worker/engine/collectives.h"
#include "worker/engine/device.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_options.h"
#include "worker/engine/gloo_collectives.h"
#include "worker/trainer/exit_codes.h"
#include "worker/trainer/monitor_writers.h"
#include "worker/trainer/trainer_events.h"

ABSL_FLAG(std::string, spec, "", "Path to the loom.v1.JobSpec in protobuf's JSON mapping.");
ABSL_FLAG(int, rank, 0, "This process's rank in [0, world_size).");
ABSL_FLAG(int, world_size, 1, "Number of ranks.");
ABSL_FLAG(std::string, master_addr, "127.0.0.1",
          "Address of rank 0's TCPStore: rank 0's node's advertised address (loom-worker passes "
          "the scheduler's; the default suits ranks started by hand on one host).");
ABSL_FLAG(std::string, bind_address, "",
          "Address this rank's Gloo transport binds and advertises to its peers (loom-worker "
          "passes its --advertise_address; empty: the local address on the route to "
          "--master_addr, common/net_address.h).");
ABSL_FLAG(int, master_port, 0, "Port of rank 0's TCPStore (0 on rank 0: let the OS choose).");
ABSL_FLAG(std::string, checkpoint_dir, "", "Directory for step_<S>/rank_<r>.shard and logits.");
ABSL_FLAG(std::string, job_id, "", "Job id (for logs).");
ABSL_FLAG(std::string, resume_from, "", "A checkpoint step directory to resume from.");
ABSL_FLAG(int, collective_timeout_s, 300, "Timeout of rendezvous and every collective.");
// glibc allocator settings, applied with mallopt() at startup; both 0 (glibc's defaults) by
// default. glibc's default mmap threshold is dynamic: each freed mmapped chunk raises it (up to
// 32 MiB on 64-bit), so after the first step ZeRO-3's large transient tensors (gathered
// parameters, full-size weight gradients before bucketing, buckets) are carved from the heap,
// where freed memory stays in the process. A fixed threshold (which disables the adjustment) sends
// every block of that size or more to mmap, returned to the kernel on free; fixing it also fixes
// the trim threshold at 128 KiB, so raise that too (64 MiB). Measured (docs/benchmarks.md,
// ZeRO-3 vs DDP, 107M parameters, 2 ranks): 4 MiB + 64 MiB cut the peak RSS from ~1715 to
// ~1410 MiB (-18 %) but made steps 1.6x slower (page faults on every large buffer), which is why
// it is not the default; 1 MiB was slower still, 16 MiB saved little.
// An allocator setting in the environment (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_,
// GLIBC_TUNABLES) wins: the flags are then not applied, so a benchmark can give every system the
// same setting.
ABSL_FLAG(int64_t, malloc_mmap_threshold_bytes, 0,
          "glibc M_MMAP_THRESHOLD set with mallopt at startup; 0: glibc's default (dynamic).");
ABSL_FLAG(int64_t, malloc_trim_threshold_bytes, 0,
          "glibc M_TRIM_THRESHOLD set with mallopt at startup; 0: glibc's default.");
ABSL_FLAG(std::string, trajectory_dir, "",
          "Debug: dump initial/final HF exports, training token ids and per-step losses here "
          "(worker/engine/trajectory.h).");
// Test hooks (tests only; the worker never passes them).
ABSL_FLAG(std::vector<std::string>, test_inject_inf_grad_steps, {},
          "Test only: 1-based steps at which rank 0 writes +inf into a gradient.");
ABSL_FLAG(std::string, test_layer_order, "",
          "Test only: STEP:L0,L1,... runs the decoder layers in this order at that step.");
ABSL_FLAG(bool, test_zenflow_fused_accumulation, false,
          "Test only: ZenFlow with overlap_step accumulates on the training thread.");
ABSL_FLAG(bool, print_libtorch, false,
          "Print one line on what the linked LibTorch was built with and sees (its version, CUDA "
          "runtime, cuDNN, NCCL, CUDA devices) and exit 0.");
ABSL_FLAG(int, test_rank_sequence_length, 0,
          "Test only: this rank's training samples use this many tokens (uneven data).");

namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_checkpoint_stop{false};

void OnCheckpointSignal(int) { g_checkpoint_stop.store(true); }

void OnSignal(int) {
  if (g_stop.exchange(true)) _exit(143);  // second signal: give up at once
}

void EmitLine(const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void Emit(const loom::TrainerEvent& event) { EmitLine(loom::trainer::TrainerEventLine(event)); }

constexpr int kConfigError = loom::kTrainerExitConfigError;

// The exit code of a failed run (exit_codes.h).
int ExitCodeFor(const absl::Status& status) {
  if (loom::data::IsDatasetError(status)) return loom::kTrainerExitDatasetError;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      return kConfigError;
    case absl::StatusCode::kDataLoss:
      return loom::kTrainerExitDataError;
    default:
      return 1;
  }
}

int Fail(const absl::Status& status, int code) {
  LOG(ERROR) << status;
  loom::TrainerEvent event;
  event.mutable_error()->set_message(std::string(status.message()));
  Emit(event);
  return code;
}

// This process's resident set now (VmRSS from /proc/self/statm), bytes; 0 if unreadable.
int64_t ResidentBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * ::sysconf(_SC_PAGESIZE) : 0;
}

int Main() {
  using loom::engine::EngineOptions;
  // Before anything is built: what the process costs by itself (LibTorch, libraries), so that
  // benchmarks can report memory with and without it.
  loom::TrainerEvent process_start;
  process_start.mutable_process_start()->set_rss_bytes(ResidentBytes());
  Emit(process_start);
  const int rank = absl::GetFlag(FLAGS_rank);
  const int world = absl::GetFlag(FLAGS_world_size);
  if (world < 1 || rank < 0 || rank >= world) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
                    "--rank=", rank, " is not in [0, --world_size=", world, ")")), kConfigError);
  }
  if (absl::GetFlag(FLAGS_collective_timeout_s) <= 0) {
    return Fail(absl::InvalidArgumentError("--collective_timeout_s must be positive"), kConfigError);
  }
  absl::StatusOr<std::string> spec_text =
      loom::ReadRegularFile(absl::GetFlag(FLAGS_spec), /*max_bytes=*/64 << 20);
  if (!spec_text.ok()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--spec: ", spec_text.status().message())),
                2);
  }
  absl::StatusOr<EngineOptions> options = loom::engine::ParseJobSpecJson(*spec_text, world);
  if (!options.ok()) return Fail(options.status(), kConfigError);
  options->rank = rank;
  options->checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  options->resume_from = absl::GetFlag(FLAGS_resume_from);
  options->job_id = absl::GetFlag(FLAGS_job_id);
  options->collective_timeout = absl::Seconds(absl::GetFlag(FLAGS_collective_timeout_s));
  options->trajectory_dir = absl::GetFlag(FLAGS_trajectory_dir);
  options->test_zenflow_fused_accumulation = absl::GetFlag(FLAGS_test_zenflow_fused_accumulation);
  for (const std::string& v : absl::GetFlag(FLAGS_test_inject_inf_grad_steps)) {
    int64_t step = 0;
    if (!absl::SimpleAtoi(v, &step) || step < 1) {
      return Fail(absl::InvalidArgumentError("--test_inject_inf_grad_steps: " + v), kConfigError);
    }
    options->test_inject_inf_grad_steps.push_back(step);
  }
  if (const std::string order = absl::GetFlag(FLAGS_test_layer_order); !order.empty()) {
    std::vector<std::string> parts = absl::StrSplit(order, ':');
    bool ok = parts.size() == 2 && absl::SimpleAtoi(parts[0], &options->test_layer_order_step);
    for (absl::string_view l : absl::StrSplit(parts.size() == 2 ? parts[1] : "", ',')) {
      int64_t layer = -1;
      ok = ok && absl::SimpleAtoi(l, &layer) && layer >= 0 &&
           layer < options->model.num_hidden_layers;
      options->test_layer_order.push_back(layer);
    }
    if (!ok) return Fail(absl::InvalidArgumentError("--test_layer_order: " + order), kConfigError);
  }
  options->test_rank_sequence_length = absl::GetFlag(FLAGS_test_rank_sequence_length);
  if (options->test_rank_sequence_length < 0 ||
      options->test_rank_sequence_length > options->model.max_position_embeddings) {
    return Fail(absl::InvalidArgumentError("--test_rank_sequence_length out of range"), kConfigError);
  }

  // The rank's device, from resources.accelerator (worker/engine/device.h). A GPU kind on a node
  // without a CUDA device is the job's configuration error (exit 78), found before the rendezvous.
  const loom::engine::LibTorchInfo libtorch = loom::engine::DescribeLibTorch();
  LOG(INFO) << loom::engine::LibTorchInfoLine(libtorch);
  int local_rank = rank;
  if (const char* v = std::getenv("LOCAL_RANK"); v != nullptr && !absl::SimpleAtoi(v, &local_rank)) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("LOCAL_RANK=", v, ": not an integer")),
                kConfigError);
  }
  absl::StatusOr<loom::engine::RankDevice> device = loom::engine::ResolveRankDevice(
      options->accelerator, local_rank, libtorch.cuda_devices);
  if (!device.ok()) return Fail(device.status(), kConfigError);
  if (device->cuda) {
    // The engine's CUDA path (NCCL collectives, device-resident shards) is the GPU-ranks issue;
    // until it lands a GPU rank is refused at start rather than silently trained on the host.
    return Fail(absl::InvalidArgumentError(absl::StrCat(
                    "resources.accelerator: ", options->accelerator, " (", device->ToString(),
                    "): this loom-trainer trains on CPU ranks only; set resources.accelerator: "
                    "cpu")),
                kConfigError);
  }

  std::unique_ptr<loom::engine::Collectives> coll;
  if (world == 1) {
    coll = loom::engine::CreateLocalCollectives();
  } else {
    loom::engine::GlooOptions g;
    g.rank = rank;
    g.world_size = world;
    g.master_addr = absl::GetFlag(FLAGS_master_addr);
    if (g.master_addr.empty()) {
      return Fail(absl::InvalidArgumentError("--master_addr: required when --world_size > 1"),
                  kConfigError);
    }
    absl::StatusOr<std::string> bind =
        loom::GlooBindAddress(absl::GetFlag(FLAGS_bind_address), g.master_addr);
    if (!bind.ok()) return Fail(bind.status(), ExitCodeFor(bind.status()));
    g.bind_address = *bind;
    g.master_port = absl::GetFlag(FLAGS_master_port);
    g.timeout = options->collective_timeout;
    g.on_listening = [](int port) {
      loom::TrainerEvent rendezvous;
      rendezvous.mutable_rendezvous()->set_port(port);
      Emit(rendezvous);
    };
    absl::StatusOr<std::unique_ptr<loom::engine::Collectives>> c =
        loom::engine::CreateGlooCollectives(g);
    if (!c.ok()) return Fail(c.status(), ExitCodeFor(c.status()));
    coll = std::move(*c);
  }
  LOG(INFO) << "job " << options->job_id << " rank " << rank << "/" << world << " joined";
  // DeepSpeed's tensorboard / csv_monitor blocks: rank 0 writes them beside its events. A monitor
  // that cannot write is a warning, not a failed job.
  std::unique_ptr<loom::trainer::MonitorWriters> monitors;
  auto warn = [](const std::string& message) {
    LOG(WARNING) << message;
    loom::TrainerEvent w;
    w.mutable_warning()->set_message(message);
    Emit(w);
  };
  if (rank == 0) {
    absl::StatusOr<std::unique_ptr<loom::trainer::MonitorWriters>> m =
        loom::trainer::MonitorWriters::Open(options->ds.monitor, options->checkpoint_dir,
                                            options->ds.train_batch_size,
                                            options->ds.fp16.enabled);
    if (m.ok()) {
      monitors = *std::move(m);
    } else {
      warn(absl::StrCat("monitors not written: ", m.status().message()));
    }
  }
  auto emit = [&](const loom::TrainerEvent& event) {
    Emit(event);
    if (monitors == nullptr) return;
    if (absl::Status w = monitors->Write(event); !w.ok()) {
      warn(absl::StrCat("monitors stopped: ", w.message()));
      monitors.reset();
    }
  };
  absl::Status s = loom::engine::RunTraining(*options, *coll, emit, &g_stop,
                                               &g_checkpoint_stop);
  if (s.ok()) return 0;
  if (s.code() == absl::StatusCode::kCancelled) {
    LOG(WARNING) << s;
    return 143;
  }
  return Fail(s, ExitCodeFor(s));
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_print_libtorch)) {
    std::cout << loom::engine::LibTorchInfoLine(loom::engine::DescribeLibTorch()) << std::endl;
    return 0;
  }
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  // See the malloc_* flags above. Set before any large allocation of the engine.
  const bool env_allocator = std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr ||
                             std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr ||
                             std::getenv("GLIBC_TUNABLES") != nullptr;
  if (const int64_t t = env_allocator ? 0 : absl::GetFlag(FLAGS_malloc_mmap_threshold_bytes);
      t > 0) {
    if (t > (32 << 20) || mallopt(M_MMAP_THRESHOLD, static_cast<int>(t)) != 1) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
                      "--malloc_mmap_threshold_bytes=", t, ": not in (0, 32 MiB]")), kConfigError);
    }
  }
  if (const int64_t t = env_allocator ? 0 : absl::GetFlag(FLAGS_malloc_trim_threshold_bytes);
      t > 0) {
    if (t > (1LL << 30) || mallopt(M_TRIM_THRESHOLD, static_cast<int>(t)) != 1) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
                      "--malloc_trim_threshold_bytes=", t, ": not in (0, 1 GiB]")), kConfigError);
    }
  }
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  struct sigaction usr1 = {};
  usr1.sa_handler = OnCheckpointSignal;
  sigemptyset(&usr1.sa_mask);
  sigaction(SIGUSR1, &usr1, nullptr);
  // A rank outlives nothing: if the process that started it (the worker daemon) dies, the rank
  // is asked to stop like on cancel, instead of training on unreported and unsupervised.
  const pid_t parent = ::getppid();
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::raise(SIGTERM);  // the parent died before prctl took effect
  try {
    return Main();
  } catch (const std::exception& e) {
    return Fail(absl::InternalError(e.what()), 1);
  }
}
