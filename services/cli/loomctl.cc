// loomctl: Loom's command-line client.
//
//   loomctl submit JOB.yaml [--wait]      submit a job spec (YAML); prints the job id. A job
//                                         more than the registered nodes could ever hold is
//                                         refused at once unless --wait_for_capacity. Ctrl-C
//                                         under --wait: --on_interrupt (ask: cancel it, y/N)
//   loomctl submit JOB.yaml --dry_run     the scheduler's admission checks only: prints the values
//                                         Loom fills in, the warnings, the resolved DeepSpeed config
//   loomctl resolve JOB.yaml [--json]     offline: the DeepSpeed config Loom will use ("auto"
//                                         and Hugging Face Trainer defaults filled in, each said)
//   loomctl plan JOB.yaml [--json] [--nodes=COUNT:SLOTS:HOST_GIB[:ACCEL_GIB]]
//                                         offline: predicted per-rank host/device/NVMe memory,
//                                         term by term (spec/memory_plan.h); with --nodes, the
//                                         fit and the technique to use (spec/technique_choice.h)
//   loomctl get JOB_ID [--json]           show one job
//   loomctl list [--phase=RUNNING] [--limit=N]
//                                         list jobs (every page of ListJobs, or the first N)
//   loomctl cancel JOB_ID                 graceful stop: the ranks write a final checkpoint, then
//                                         stop (a job not running yet is cancelled at once)
//   loomctl kill JOB_ID                   stop the ranks now, without a final checkpoint
//   loomctl resume JOB_ID [--wait]        continue a FAILED or CANCELLED job (same id) from its
//                                         newest committed checkpoint with fresh restart budgets
//                                         (--wait_for_capacity, --on_interrupt as for submit)
//   loomctl wait JOB_ID                   follow a job's step, loss and tokens/s until it ends
//   loomctl watch JOB_ID                  stream the job's events (WatchJob), one line each,
//                                         until it ends; for an ended job its retained history
//                                         (phase changes, restarts and why) first
//   loomctl logs JOB_ID [--follow] [--rank=N] [--tail=N] [--grep=RE] [--json]
//                                         the ranks' stdout/stderr lines (StreamLogs); logs live
//                                         in the scheduler's memory only (bounded, not persisted)
//   loomctl metrics JOB_ID [--csv|--json] the job's metric history: a row per step (loss,
//                                         held-out loss, lr, grad norm, tokens/s, memory)
//   loomctl explain JOB_ID                why a job is not running: reason, queue position
//   loomctl checkpoints JOB_ID            list a job's checkpoints (COMMITTED "CORRUPT" for a
//                                         step that failed verification, with the reason;
//                                         "DELETE_FAILED"/"DELETING" for a step whose files are
//                                         still on disk, with the error) and their disk usage
//   loomctl consolidate JOB_ID [--step=N] [--output_dir=D] [--max_shard_size=5GB] [--dtype=bf16]
//                                         write model.safetensors (or shards + index) + config.json
//   loomctl consolidate --from-deepspeed DIR --output_dir=D [--max_shard_size=5GB]
//                                         offline: a DeepSpeed ZeRO 1-3 checkpoint directory into
//                                         safetensors, streaming (deepspeed_consolidate.h)
//   loomctl checkpoint verify PATH        offline (no service): check a safetensors file, an export
//                                         directory (single or sharded) or a Loom step_* directory;
//                                         exit 0 valid, 3 invalid (first problem on stderr),
//                                         5 nothing there
//   loomctl checkpoint delete JOB_ID --step=N [--protect=S,..]
//                                         delete one checkpoint (idempotent; a step whose files
//                                         cannot be removed: the error and a non-zero exit, and
//                                         a rerun retries the removal)
//   loomctl checkpoint retain JOB_ID --keep_last=K [--protect=S,..]
//                                         keep the newest K committed checkpoints
//
// Authentication: --token or $LOOM_TOKEN (a bearer token; docs/operations.md). TLS: --tls_ca or
// $LOOM_TLS_CA (the CA that signed the servers' certificates).
// Addresses come from --scheduler / --checkpoint, else $LOOM_SCHEDULER / $LOOM_CHECKPOINT, else
// the ready files of a local cluster: --cluster_dir, $LOOM_HOME/cluster, .loom/cluster here or in
// the nearest parent, else the cluster scripts/local_cluster.sh started last (from any
// directory; services/cli/cluster_address.h).
// Every unary RPC carries a deadline of --timeout (default 30 s); streams (watch, logs) have none
// unless --stream_timeout is set. Channels reconnect with a backoff of at most
// --reconnect_backoff_max (1 s, as loom-worker and loom-gateway): gRPC's default grows to 120 s,
// so a scheduler back after a short restart stayed unreachable for loomctl. `submit` retries
// UNAVAILABLE and DEADLINE_EXCEEDED with the same request id (the scheduler creates the job at
// most once) until --retry_deadline (default 60 s) has passed.
// Exit status: 0 on success, the gRPC status code on an RPC error (3 = INVALID_ARGUMENT,
// 5 = NOT_FOUND, 9 = FAILED_PRECONDITION, 14 = UNAVAILABLE), 1 for a job that ended unsuccessfully
// under `wait` or `watch`, 2 for a usage error.
#include <grpcpp/grpcpp.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/daemon.h"
#include "common/grpc_channel.h"
#include "common/grpc_credentials.h"
#include "common/grpc_status.h"
#include "common/problems.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"
#include "proto/checkpoint_service.grpc.pb.h"
#include "proto/job_service.grpc.pb.h"
#include "services/cli/admin_commands.h"
#include "services/cli/checkpoint_commands.h"
#include "services/cli/deepspeed_command.h"
#include "services/cli/job_printing.h"
#include "services/cli/job_spec_yaml.h"
#include "services/cli/plan_command.h"
#include "services/cli/resolve_command.h"
#include "services/cli/cluster_address.h"
#include "services/cli/follow_commands.h"
#include "services/cli/metrics_command.h"
#include "services/cli/terminal_text.h"
#include "services/cli/wait_interrupt.h"

ABSL_FLAG(std::string, scheduler, "", "loom-scheduler address (host:port)");
ABSL_FLAG(std::string, checkpoint, "", "loom-checkpoint address (host:port)");
ABSL_FLAG(std::string, cluster_dir, "",
          "local cluster directory with ready files (default: $LOOM_HOME/cluster, else "
          ".loom/cluster here or in a parent, else the one local_cluster.sh started last)");
ABSL_FLAG(bool, wait, false, "submit, resume: wait for the job to end, printing progress");
ABSL_FLAG(bool, dry_run, false,
          "submit: run every admission check and print what Loom would use (values filled in, "
          "warnings, the resolved DeepSpeed config) without creating the job (also spelled "
          "--dry-run)");
ABSL_FLAG(std::string, request_id, "",
          "submit: idempotency key (default: a random one per invocation, reused by its retries)");
ABSL_FLAG(bool, json, false,
          "get/list/plan/resolve: print JSON (protobuf JSON mapping); logs: the raw lines, one "
          "LogLine each");
ABSL_FLAG(std::string, phase, "", "list: only jobs in this phase (e.g. RUNNING)");
ABSL_FLAG(std::string, name_prefix, "", "list: only jobs whose name starts with this");
ABSL_FLAG(int64_t, limit, 0, "list: at most this many jobs (0 = all; every page is fetched)");
ABSL_FLAG(int64_t, step, 0, "consolidate: checkpoint step (0 = newest committed)");
ABSL_FLAG(std::string, output_dir, "", "consolidate: output directory");
ABSL_FLAG(std::string, max_shard_size, "",
          "consolidate: split into model-0000k-of-0000n.safetensors of at most this size "
          "(\"5GB\", \"500MB\", bytes); empty = one model.safetensors");
ABSL_FLAG(std::string, dtype, "fp32", "consolidate: output dtype, fp32 or bf16");
ABSL_FLAG(std::string, from_deepspeed, "",
          "consolidate: a DeepSpeed ZeRO checkpoint directory (save_dir with `latest`, or the tag "
          "directory) to consolidate offline into --output_dir (also spelled --from-deepspeed)");
ABSL_FLAG(int32_t, keep_last, 0, "checkpoint retain: committed checkpoints to keep");
ABSL_FLAG(std::vector<std::string>, protect, {},
          "checkpoint delete/retain: steps that must not be deleted");
ABSL_FLAG(std::string, reason, "", "cordon/drain: why (shown by `loomctl nodes`)");
ABSL_FLAG(std::string, nodes, "", "plan: COUNT:SLOTS:HOST_GIB[:ACCELERATOR_GIB] to fit and choose for");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(30), "deadline of each unary RPC");
ABSL_FLAG(absl::Duration, retry_deadline, absl::Seconds(60),
          "submit: keep retrying while the scheduler is unreachable (UNAVAILABLE: restarting) "
          "for up to this long; the request id makes retries safe (0 = one try)");
ABSL_FLAG(absl::Duration, reconnect_backoff_max, loom::kDefaultReconnectBackoffMax,
          "upper bound of the channels' reconnect backoff (as loom-worker and loom-gateway)");
ABSL_FLAG(absl::Duration, stream_timeout, absl::ZeroDuration(),
          "watch/logs: deadline of the stream (0 = none)");
ABSL_FLAG(bool, csv, false, "metrics: print CSV (one row per step) instead of a table");
ABSL_FLAG(bool, follow, false, "logs: keep streaming new lines until the job ends");
ABSL_FLAG(std::vector<std::string>, rank, {}, "logs: only these ranks (e.g. --rank=0,1)");
ABSL_FLAG(int32_t, tail, 0, "logs: start with the last N retained lines (0 = all)");
ABSL_FLAG(std::string, grep, "",
          "logs: only the lines this regular expression (ECMAScript) finds, in what is printed");
ABSL_FLAG(std::string, token, "",
          "bearer token for a scheduler with authentication (default: $LOOM_TOKEN); prefer the "
          "environment variable, command lines are visible to other users");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle to verify the scheduler's / checkpoint service's TLS certificate "
          "(default: $LOOM_TLS_CA; empty = plaintext)");
ABSL_FLAG(std::string, tenant, "", "list: only this tenant's jobs (admins; users see their own)");
ABSL_FLAG(absl::Duration, wait_timeout, absl::Hours(24), "wait: give up after this long");
ABSL_FLAG(std::string, progress, "auto",
          "wait: 'line' redraws one progress line (step, loss, held-out, tokens/s, elapsed, ETA), "
          "'plain' prints a line per change, 'auto' a line on a terminal, plain otherwise");
ABSL_FLAG(std::string, on_interrupt, "ask",
          "wait, submit --wait, resume --wait: what Ctrl-C does: ask (on a terminal: cancel the job? y/N), "
          "detach (leave it running, say how to reattach), cancel (cancel the job)");
ABSL_FLAG(bool, wait_for_capacity, false,
          "submit, resume: queue the job even when the registered nodes together could never hold "
          "its ranks (capacity that is coming); without it such a job is refused at once");

namespace {

using loom::cli::PhaseName;
using loom::cli::TerminalSafe;
using loom::v1::Job;

int Fail(const absl::Status& s) {
  // A refused submission's problems (common/problems.h, from the gRPC status details: all of
  // them, even where the message was cut to fit gRPC's trailer): one line each.
  if (s.GetPayload(loom::kBadRequestTypeUrl).has_value()) {
    const std::vector<loom::Problem> problems = loom::ProblemsOf(s);
    if (problems.size() > 1) {
      std::fprintf(stderr, "loomctl: %s: %zu problems:\n",
                   absl::StatusCodeToString(s.code()).c_str(), problems.size());
      for (const loom::Problem& p : problems) {
        std::fprintf(stderr, "  %s\n",
                     TerminalSafe(p.path.empty() ? p.what : absl::StrCat(p.path, ": ", p.what))
                         .c_str());
      }
      return static_cast<int>(s.code());
    }
  }
  // Servers' messages quote what users sent (names, paths): escaped like everything printed.
  std::fprintf(stderr, "loomctl: %s: %s\n", absl::StatusCodeToString(s.code()).c_str(),
               TerminalSafe(s.message()).c_str());
  return static_cast<int>(s.code());
}

// `submit --dry_run`'s answer: the notes, then the resolved DeepSpeed config (JSON, or all of
// the answer as JSON with --json).
int PrintDryRun(const loom::v1::SubmitJobResponse& resp) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string text;
  if (absl::GetFlag(FLAGS_json)) {
    (void)google::protobuf::util::MessageToJsonString(resp, &text, options);
  } else {
    for (const std::string& note : resp.notes()) std::printf("%s\n", TerminalSafe(note).c_str());
    (void)google::protobuf::util::MessageToJsonString(resp.resolved_deepspeed_config(), &text,
                                                      options);
    std::printf("resolved deepspeed_config:\n");
  }
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!line.empty()) std::printf("%s\n", TerminalSafe(line).c_str());
  }
  std::fprintf(stderr, "loomctl: dry run: the job is admissible; nothing was submitted\n");
  return 0;
}

absl::StatusOr<std::string> Address(const std::string& flag_value, const char* env,
                                     const std::string& ready_name) {
  // services/cli/cluster_address.h: flag, environment, then the local cluster's ready files
  // (--cluster_dir, $LOOM_HOME, .loom/ here or above, the cluster local_cluster.sh started last).
  const std::string name = ready_name.substr(0, ready_name.find('.'));
  return loom::cli::ResolveDaemonAddress(flag_value, name, env, name,
                                         absl::GetFlag(FLAGS_cluster_dir));
}

// --flag, else $env, else "".
std::string FlagOrEnv(const std::string& flag_value, const char* env) {
  if (!flag_value.empty()) return flag_value;
  const char* e = std::getenv(env);
  return e != nullptr ? std::string(e) : std::string();
}

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() +
                    absl::ToChronoMilliseconds(absl::GetFlag(FLAGS_timeout)));
  loom::AddBearerToken(*ctx, FlagOrEnv(absl::GetFlag(FLAGS_token), "LOOM_TOKEN"));
  return ctx;
}

std::unique_ptr<grpc::ClientContext> StreamContext() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  const absl::Duration timeout = absl::GetFlag(FLAGS_stream_timeout);
  if (timeout > absl::ZeroDuration()) {
    ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  }
  loom::AddBearerToken(*ctx, FlagOrEnv(absl::GetFlag(FLAGS_token), "LOOM_TOKEN"));
  return ctx;
}

// TLS (--tls_ca / $LOOM_TLS_CA) or plaintext; exits with status 2 if the CA file is unusable.
std::shared_ptr<grpc::ChannelCredentials> Credentials() {
  auto creds = loom::MakeChannelCredentials(FlagOrEnv(absl::GetFlag(FLAGS_tls_ca), "LOOM_TLS_CA"));
  if (!creds.ok()) {
    std::fprintf(stderr, "loomctl: --tls_ca: %s\n", creds.status().ToString().c_str());
    std::exit(2);
  }
  return *creds;
}

// A channel to `address` whose reconnect backoff is capped at --reconnect_backoff_max (exits
// with status 2 for a value out of range).
std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  const absl::Duration max_backoff = absl::GetFlag(FLAGS_reconnect_backoff_max);
  if (absl::Status s = loom::ValidateReconnectBackoff("--reconnect_backoff_max", max_backoff);
      !s.ok()) {
    std::fprintf(stderr, "loomctl: %s\n", s.ToString().c_str());
    std::exit(2);
  }
  return loom::CreateReconnectingChannel(address, Credentials(), max_backoff);
}

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}


// The follow commands' context (services/cli/follow_commands.h): --timeout / --stream_timeout
// and the bearer token.
loom::cli::FollowContext Follow() {
  loom::cli::FollowContext f;
  f.unary = [] { return Context(); };
  f.stream = [] { return StreamContext(); };
  f.fail = Fail;
  return f;
}

// `loomctl wait ID` and `submit --wait`.
int WaitFor(loom::v1::JobService::Stub& stub, const std::string& id) {
  absl::StatusOr<loom::cli::OnInterrupt> on_interrupt =
      loom::cli::ParseOnInterrupt(absl::GetFlag(FLAGS_on_interrupt));
  if (!on_interrupt.ok()) return Fail(on_interrupt.status());
  loom::cli::WaitOptions options;
  options.timeout = absl::GetFlag(FLAGS_wait_timeout);
  options.on_interrupt = *on_interrupt;
  absl::StatusOr<loom::cli::ProgressMode> progress =
      loom::cli::ParseProgressMode(absl::GetFlag(FLAGS_progress));
  if (!progress.ok()) return Fail(progress.status());
  options.progress = *progress;
  return loom::cli::WaitForJob(stub, id, Follow(), options);
}

// `loomctl checkpoint verify PATH`: offline, through the library.
// The checkpoint commands' context: --timeout (or `deadline`) and the bearer token.
loom::cli::CheckpointCommandContext CheckpointContext() {
  loom::cli::CheckpointCommandContext ctx;
  ctx.context = [](absl::Duration deadline) {
    if (deadline == absl::ZeroDuration()) return Context();
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(deadline));
    loom::AddBearerToken(*c, FlagOrEnv(absl::GetFlag(FLAGS_token), "LOOM_TOKEN"));
    return c;
  };
  ctx.fail = Fail;
  return ctx;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "loomctl <submit FILE.yaml|resolve FILE.yaml|plan FILE.yaml|get ID|list|cancel ID|kill ID|resume ID|wait ID|watch ID|logs ID|metrics ID|"
      "explain ID|checkpoints ID|"
      "consolidate ID|checkpoint verify PATH|checkpoint delete ID|checkpoint retain ID|"
      "nodes|cordon NODE|uncordon NODE|drain NODE|queues> [flags]");
  std::vector<std::string> renamed_flags;
  loom::cli::NormalizeDashedFlags(argc, argv, &renamed_flags);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    std::fprintf(stderr, "%s\n", absl::ProgramUsageMessage().data());
    return 2;
  }
  const std::string cmd = args[1];
  const std::string arg = args.size() > 2 ? args[2] : "";
  {
    // Extra words were ignored (`loomctl get a b` showed a): a typo or a shell-split value must
    // not pass silently, as kubectl refuses them too.
    const size_t most = cmd == "checkpoint" ? 4
                        : (cmd == "list" || cmd == "nodes" || cmd == "queues") ? 2
                                                                                 : 3;
    if (args.size() > most) {
      std::fprintf(stderr, "loomctl %s: unexpected argument '%s'\n%s\n", cmd.c_str(),
                   TerminalSafe(args[most]).c_str(), absl::ProgramUsageMessage().data());
      return 2;
    }
  }
  auto need_arg = [&](const char* what) {
    if (arg.empty()) {
      std::fprintf(stderr, "loomctl %s: missing %s\n", cmd.c_str(), what);
      return false;
    }
    return true;
  };

  if (cmd == "resolve") {  // offline
    if (!need_arg("JOB.yaml")) return 2;
    return loom::cli::RunResolve(arg, absl::GetFlag(FLAGS_json));
  }
  if (cmd == "plan") {  // offline
    if (!need_arg("JOB.yaml")) return 2;
    return loom::cli::RunPlan(arg, absl::GetFlag(FLAGS_json), absl::GetFlag(FLAGS_nodes));
  }
  if (loom::IsAdminCommand(cmd)) {
    auto addr = Address(absl::GetFlag(FLAGS_scheduler), "LOOM_SCHEDULER", "scheduler.json");
    if (!addr.ok()) return Fail(addr.status());
    return loom::RunAdminCommand(cmd, arg, Channel(*addr),
                                 [] { return Context(); }, absl::GetFlag(FLAGS_reason),
                                 absl::GetFlag(FLAGS_json));
  }
  if (cmd == "checkpoint") {
    const std::string sub = arg;
    const std::string target = args.size() > 3 ? args[3] : "";
    if (sub != "verify" && sub != "delete" && sub != "retain") {
      std::fprintf(stderr, "loomctl checkpoint: want verify PATH | delete JOB_ID | retain JOB_ID\n");
      return 2;
    }
    if (target.empty()) {
      std::fprintf(stderr, "loomctl checkpoint %s: missing %s\n", sub.c_str(),
                   sub == "verify" ? "PATH" : "JOB_ID");
      return 2;
    }
    if (sub == "verify") return loom::cli::VerifyCheckpoint(target);
    auto protect = loom::cli::ParseProtectedSteps(absl::GetFlag(FLAGS_protect));
    if (!protect.ok()) return Fail(protect.status());
    auto addr = Address(absl::GetFlag(FLAGS_checkpoint), "LOOM_CHECKPOINT", "checkpoint.json");
    if (!addr.ok()) return Fail(addr.status());
    auto stub = loom::v1::CheckpointService::NewStub(Channel(*addr));
    if (sub == "delete") {
      return loom::cli::DeleteCheckpoint(*stub, target, absl::GetFlag(FLAGS_step), *protect,
                                         CheckpointContext());
    }
    return loom::cli::RetainCheckpoints(*stub, target, absl::GetFlag(FLAGS_keep_last), *protect,
                                        CheckpointContext());
  }

  if (cmd == "consolidate" && !absl::GetFlag(FLAGS_from_deepspeed).empty()) {
    return loom::cli::RunDeepSpeedConsolidate(absl::GetFlag(FLAGS_from_deepspeed),
                                              absl::GetFlag(FLAGS_output_dir),
                                              absl::GetFlag(FLAGS_max_shard_size));
  }
  if (cmd == "checkpoints" || cmd == "consolidate") {
    if (!need_arg("JOB_ID")) return 2;
    auto addr = Address(absl::GetFlag(FLAGS_checkpoint), "LOOM_CHECKPOINT", "checkpoint.json");
    if (!addr.ok()) return Fail(addr.status());
    auto stub = loom::v1::CheckpointService::NewStub(
        Channel(*addr));
    if (cmd == "checkpoints") return loom::cli::ListCheckpoints(*stub, arg, CheckpointContext());
    return loom::cli::Consolidate(*stub, arg, absl::GetFlag(FLAGS_step),
                                  absl::GetFlag(FLAGS_output_dir),
                                  absl::GetFlag(FLAGS_max_shard_size), absl::GetFlag(FLAGS_dtype),
                                  CheckpointContext());
  }

  auto addr = Address(absl::GetFlag(FLAGS_scheduler), "LOOM_SCHEDULER", "scheduler.json");
  if (!addr.ok()) return Fail(addr.status());
  auto stub =
      loom::v1::JobService::NewStub(Channel(*addr));

  if (cmd == "submit") {
    if (!need_arg("JOB.yaml")) return 2;
    auto spec = loom::cli::ReadJobSpecFile(arg);
    if (!spec.ok()) {
      return Fail(absl::IsNotFound(spec.status()) ? absl::InvalidArgumentError(spec.status().message())
                                                  : spec.status());
    }
    loom::v1::SubmitJobRequest req;
    *req.mutable_spec() = *spec;
    std::string request_id = absl::GetFlag(FLAGS_request_id);
    if (request_id.empty()) {
      absl::BitGen gen;
      request_id = absl::StrFormat("loomctl-%016x%016x", absl::Uniform<uint64_t>(gen),
                                   absl::Uniform<uint64_t>(gen));
    }
    req.set_request_id(request_id);
    req.set_wait_for_capacity(absl::GetFlag(FLAGS_wait_for_capacity));
    if (absl::GetFlag(FLAGS_wait)) {  // a bad --on_interrupt is said before anything is queued
      if (auto mode = loom::cli::ParseOnInterrupt(absl::GetFlag(FLAGS_on_interrupt));
          !mode.ok()) {
        return Fail(mode.status());
      }
    }
    if (absl::GetFlag(FLAGS_dry_run)) {
      req.set_validate_only(true);
      loom::v1::SubmitJobResponse resp;
      grpc::Status s = stub->SubmitJob(Context().get(), req, &resp);
      if (!s.ok()) return Fail(loom::FromGrpcStatus(s));
      return PrintDryRun(resp);
    }
    // Retries of an unanswered call carry the same request id, so the scheduler creates the job
    // at most once.
    loom::v1::SubmitJobResponse resp;
    grpc::Status s;
    const absl::Time give_up = absl::Now() + absl::GetFlag(FLAGS_retry_deadline);
    absl::Duration pause = absl::Milliseconds(100);
    for (;;) {
      s = stub->SubmitJob(Context().get(), req, &resp);
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
          s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
        break;
      }
      if (absl::Now() + pause >= give_up) break;
      // Pauses of 0.1 s doubling to 1 s: with the channel's reconnect backoff also capped at
      // 1 s, a scheduler that is back is reached within about 2 s.
      absl::SleepFor(pause);
      pause = std::min(pause * 2, absl::Seconds(1));
    }
    if (!s.ok()) return Fail(loom::FromGrpcStatus(s));
    if (resp.deduplicated()) {
      std::fprintf(stderr, "loomctl: request %s was already submitted as %s\n", request_id.c_str(),
                   resp.job().id().c_str());
    }
    std::printf("%s\n", resp.job().id().c_str());
    std::fflush(stdout);
    if (absl::GetFlag(FLAGS_wait)) return WaitFor(*stub, resp.job().id());
    return 0;
  }
  if (cmd == "get") {
    if (!need_arg("JOB_ID")) return 2;
    loom::v1::GetJobRequest req;
    req.set_job_id(arg);
    Job job;
    grpc::Status s = stub->GetJob(Context().get(), req, &job);
    if (!s.ok()) return Fail(loom::FromGrpcStatus(s));
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s\n", ToJson(job).c_str());  // JSON escapes control characters itself
    } else {
      std::printf("%s", loom::cli::FormatJob(job).c_str());
    }
    return 0;
  }
  if (cmd == "list") {
    loom::v1::ListJobsRequest req;
    std::string phase = absl::GetFlag(FLAGS_phase);
    if (!phase.empty()) {
      loom::v1::JobPhase p;
      // RUNNING, running or JOB_PHASE_RUNNING (the name REST and --json print).
      std::string name = absl::AsciiStrToUpper(phase);
      if (!absl::StartsWith(name, "JOB_PHASE_")) name = absl::StrCat("JOB_PHASE_", name);
      if (!loom::v1::JobPhase_Parse(name, &p) || p == loom::v1::JOB_PHASE_UNSPECIFIED) {
        return Fail(absl::InvalidArgumentError(absl::StrCat("--phase: unknown phase '", phase, "'")));
      }
      req.set_phase(p);
    }
    req.set_name_prefix(absl::GetFlag(FLAGS_name_prefix));
    req.set_tenant(absl::GetFlag(FLAGS_tenant));
    const int64_t limit = absl::GetFlag(FLAGS_limit);
    if (limit < 0) return Fail(absl::InvalidArgumentError("--limit: must be >= 0"));
    // Pages of the server's default size (or just what --limit needs), fetched until the last
    // page or --limit jobs.
    if (limit > 0) req.set_page_size(static_cast<int32_t>(std::min<int64_t>(limit, 1000)));
    loom::v1::ListJobsResponse resp;
    while (limit == 0 || resp.jobs_size() < limit) {
      loom::v1::ListJobsResponse page;
      grpc::Status s = stub->ListJobs(Context().get(), req, &page);
      if (!s.ok()) return Fail(loom::FromGrpcStatus(s));
      for (loom::v1::Job& j : *page.mutable_jobs()) {
        if (limit > 0 && resp.jobs_size() == limit) break;
        *resp.add_jobs() = std::move(j);
      }
      if (page.next_page_token().empty()) break;
      req.set_page_token(page.next_page_token());
    }
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s\n", ToJson(resp).c_str());
      return 0;
    }
    std::printf("%s", loom::cli::FormatJobTable(resp.jobs()).c_str());
    return 0;
  }
  if (cmd == "cancel" || cmd == "kill") {
    if (!need_arg("JOB_ID")) return 2;
    Job job;
    grpc::Status s;
    if (cmd == "cancel") {
      loom::v1::CancelJobRequest req;
      req.set_job_id(arg);
      s = stub->CancelJob(Context().get(), req, &job);
    } else {
      loom::v1::KillJobRequest req;
      req.set_job_id(arg);
      s = stub->KillJob(Context().get(), req, &job);
    }
    if (!s.ok()) return Fail(loom::FromGrpcStatus(s));
    std::printf("%s %s: %s\n", job.id().c_str(), PhaseName(job.phase()).c_str(),
                TerminalSafe(job.message()).c_str());
    return 0;
  }
  if (cmd == "resume") {
    if (!need_arg("JOB_ID")) return 2;
    if (!absl::GetFlag(FLAGS_wait)) {
      return loom::cli::ResumeJob(*stub, arg, absl::GetFlag(FLAGS_wait_for_capacity), Follow(),
                                  nullptr);
    }
    // A bad --on_interrupt is said before the job is resumed.
    absl::StatusOr<loom::cli::OnInterrupt> on_interrupt =
        loom::cli::ParseOnInterrupt(absl::GetFlag(FLAGS_on_interrupt));
    if (!on_interrupt.ok()) return Fail(on_interrupt.status());
    loom::cli::WaitOptions wait;
    wait.timeout = absl::GetFlag(FLAGS_wait_timeout);
    wait.on_interrupt = *on_interrupt;
    return loom::cli::ResumeJob(*stub, arg, absl::GetFlag(FLAGS_wait_for_capacity), Follow(),
                                &wait);
  }
  if (cmd == "watch") {
    if (!need_arg("JOB_ID")) return 2;
    return loom::cli::WatchJob(*stub, arg, Follow());
  }
  if (cmd == "logs") {
    if (!need_arg("JOB_ID")) return 2;
    loom::cli::LogsOptions logs;
    logs.follow = absl::GetFlag(FLAGS_follow);
    logs.tail = absl::GetFlag(FLAGS_tail);
    logs.ranks = absl::GetFlag(FLAGS_rank);
    logs.json = absl::GetFlag(FLAGS_json);
    logs.grep = absl::GetFlag(FLAGS_grep);
    return loom::cli::StreamLogs(*stub, arg, Follow(), logs);
  }
  if (cmd == "metrics") {
    if (!need_arg("JOB_ID")) return 2;
    const loom::cli::MetricsFormat format =
        absl::GetFlag(FLAGS_json)  ? loom::cli::MetricsFormat::kJson
        : absl::GetFlag(FLAGS_csv) ? loom::cli::MetricsFormat::kCsv
                                   : loom::cli::MetricsFormat::kTable;
    return loom::cli::ShowMetrics(*stub, arg, Follow(), format);
  }
  if (cmd == "explain") {
    if (!need_arg("JOB_ID")) return 2;
    loom::v1::ExplainPendingRequest req;
    req.set_job_id(arg);
    loom::v1::ExplainPendingResponse resp;
    grpc::Status s = stub->ExplainPending(Context().get(), req, &resp);
    if (!s.ok()) return Fail(loom::FromGrpcStatus(s));
    std::printf("phase:    %s\nreason:   %s\nmessage:  %s\n", PhaseName(resp.phase()).c_str(),
                TerminalSafe(resp.reason()).c_str(), TerminalSafe(resp.message()).c_str());
    if (resp.queue_position() > 0) {
      std::printf("position: %d in its queue", resp.queue_position());
      for (int i = 0; i < resp.jobs_ahead_size(); ++i) {
        std::printf("%s%s", i == 0 ? " (behind " : ", ", TerminalSafe(resp.jobs_ahead(i)).c_str());
      }
      std::printf("%s\n", resp.jobs_ahead_size() > 0 ? ")" : "");
    }
    return 0;
  }
  if (cmd == "wait") {
    if (!need_arg("JOB_ID")) return 2;
    return WaitFor(*stub, arg);
  }
  std::fprintf(stderr, "loomctl: unknown command '%s'\n%s\n", cmd.c_str(),
               absl::ProgramUsageMessage().data());
  return 2;
}
