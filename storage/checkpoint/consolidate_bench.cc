// consolidate_bench: Loom's checkpoint consolidation against `cp` and `cp` + `sync` of the same
// shard bytes, and against a zero_to_fp32-style Python consolidation of the same model saved in
// DeepSpeed's checkpoint layout. Not a test (docs/benchmarks.md "Consolidation").
//
//   bazel run -c opt //storage/checkpoint:consolidate_bench -- [--size_gb=2] [--repeats=5]
//       [--layout=params|trainer] [--work_dir=/tmp/loom_consolidate_bench] [--keep] [--reuse]
//
// The model: Llama-like tensor shapes (hidden 2048, intermediate 5632, 4 KV heads, vocab 32000,
// untied lm_head) with as many decoder layers as make the checkpoint >= --size_gb GB (10^9 bytes),
// 2 ranks. Every parameter element has a value computed from (parameter index, element index)
// (BenchValue; exact in fp32), so the Python side makes the same values independently.
//   --layout=params (default, the headline): the shards hold fp32_params only, so every shard
//     byte is output; --layout=trainer: + exp_avg, exp_avg_sq (as loom-trainer writes them), and
//     the DeepSpeed checkpoint carries the same Adam moments.
// Paths, each timed as the wall time of one child process, on a warm page cache (every input
// file is read once before timing; `sync` runs untimed before each path, so no path pays for
// the previous one's writeback):
//   cp        `cp rank_0.shard rank_1.shard DIR/` (the same bytes; no checksum);
//   cp+sync   that plus `sync DIR/rank_0.shard DIR/rank_1.shard` (fsync of both copies):
//             durable output, like Loom's;
//   loom      loom-consolidate: CRC-32 of every shard byte, model.safetensors + config.json
//             fsynced and published by rename (peak RSS from wait4's rusage);
//   python    /opt/loom/venv/bin/python3 bench/consolidate_peer.py consolidate: DeepSpeed's zero_to_fp32
//             reconstruction (torch.load of each rank's zero_pp_rank_<r>_mp_rank_00_*_states.pt,
//             torch.cat), one safetensors file, fsynced; process start and `import torch`
//             included, as a user running zero_to_fp32.py pays them.
// Checked once per run, untimed: the cp copies equal the shards byte for byte (cmp), and the
// Python output equals Loom's tensor for tensor, Loom's equalling the formula
// (consolidate_peer.py compare).
// Output: one line per repeat, then per path the median, best and spread (min..max) of
// --repeats runs; the last line (medians):
// (cpu = user + system seconds of the child, and the 1-minute load average, per run.)
//   consolidate layout=<l> stat=median repeats=<n> loom_s=<x> cp_s=<y> cp_sync_s=<z>
//       vs_cp=<y/x> vs_cp_sync=<z/x> python_s=<p> vs_python=<p/x> checkpoint_bytes=<b>
//       peak_rss_bytes=<r>
// (vs_* are throughput ratios: > 1 means Loom is faster.)
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/file_util.h"
#include "storage/checkpoint/shard_format.h"

ABSL_FLAG(std::string, work_dir, "/tmp/loom_consolidate_bench", "Scratch directory (removed).");
ABSL_FLAG(std::string, layout, "params", "params (fp32 params only) or trainer (+ Adam moments)");
ABSL_FLAG(double, size_gb, 2.0, "Smallest checkpoint size, GB (10^9 bytes); picks the layers");
ABSL_FLAG(int, layers, 0, "Decoder layers (0 = from --size_gb)");
ABSL_FLAG(int, repeats, 5, "Runs per path (median, best and spread are reported)");
ABSL_FLAG(bool, keep, false, "Keep the work directory");
ABSL_FLAG(bool, reuse, false,
          "Reuse the checkpoints a --keep run of the same layout and layers left in --work_dir");
ABSL_FLAG(std::string, consolidate_binary, "", "loom-consolidate (default: next to this binary)");
ABSL_FLAG(std::string, python, "/opt/loom/venv/bin/python3", "Python with torch and numpy");
ABSL_FLAG(std::string, peer_script, "",
          "bench/consolidate_peer.py (default: under $BUILD_WORKSPACE_DIRECTORY, as bazel run sets)");

namespace {

constexpr int32_t kWorldSize = 2;

struct ChildRun {
  double seconds = 0;
  double cpu_seconds = 0;  // user + system time of the child (wait4's rusage)
  int64_t max_rss_bytes = 0;
  int status = 0;
};

ChildRun Spawn(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (std::string& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const absl::Time start = absl::Now();
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  ChildRun run;
  struct rusage ru;
  ::wait4(pid, &run.status, 0, &ru);
  run.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  run.max_rss_bytes = static_cast<int64_t>(ru.ru_maxrss) * 1024;
  run.cpu_seconds = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                    1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  return run;
}

void Check(const ChildRun& r, const std::string& what, const std::string& log) {
  if (WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) return;
  std::fprintf(stderr, "%s failed (status %d); log %s\n", what.c_str(), r.status, log.c_str());
  std::exit(1);
}

int64_t FileBytes(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

// Reads every file under `dir` to warm the page cache (cat > /dev/null).
void Warm(const std::string& dir, const std::string& log) {
  (void)Spawn({"/bin/sh", "-c", "find '" + dir + "' -type f -exec cat {} + > /dev/null"}, log);
}

// The 1-minute load average (/proc/loadavg), to show how busy the shared machine was.
std::string LoadAverage() {
  auto text = loom::ReadFile("/proc/loadavg");
  if (!text.ok()) return "?";
  return text->substr(0, text->find(' '));
}

struct Shape {
  std::string name;
  std::vector<int64_t> dims;
  int64_t numel() const {
    int64_t k = 1;
    for (int64_t d : dims) k *= d;
    return k;
  }
};

// A Llama-like decoder (TinyLlama-1.1B proportions: hidden 2048, 32 heads, 4 KV heads,
// intermediate 5632, vocab 32000, untied lm_head).
std::vector<Shape> LlamaShapes(int layers) {
  const int64_t h = 2048, kv = 256, inter = 5632, vocab = 32000;
  std::vector<Shape> s = {{"model.embed_tokens.weight", {vocab, h}}};
  for (int l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    s.push_back({p + "input_layernorm.weight", {h}});
    s.push_back({p + "self_attn.q_proj.weight", {h, h}});
    s.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    s.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    s.push_back({p + "self_attn.o_proj.weight", {h, h}});
    s.push_back({p + "post_attention_layernorm.weight", {h}});
    s.push_back({p + "mlp.gate_proj.weight", {inter, h}});
    s.push_back({p + "mlp.up_proj.weight", {inter, h}});
    s.push_back({p + "mlp.down_proj.weight", {h, inter}});
  }
  s.push_back({"model.norm.weight", {h}});
  s.push_back({"lm_head.weight", {vocab, h}});
  return s;
}

int64_t Numel(const std::vector<Shape>& shapes) {
  int64_t n = 0;
  for (const Shape& s : shapes) n += s.numel();
  return n;
}

// Element i of parameter j: (((i * 2654435761 + j * 40503) mod 2^24) - 2^23) * 2^-24, exact in
// fp32 (consolidate_peer.py bench_values computes the same). Section s > 0 (Adam moments) uses
// parameter index j + 1000 s.
float BenchValue(int64_t j, int64_t i) {
  const uint64_t k = (static_cast<uint64_t>(i) * 2654435761ull + static_cast<uint64_t>(j) * 40503ull) &
                     0xFFFFFFull;
  return static_cast<float>(static_cast<int64_t>(k) - (1 << 23)) * (1.0f / 16777216.0f);
}

struct Stats {
  double median = 0, best = 0, worst = 0;
};

Stats Summarise(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Stats s;
  s.best = v.front();
  s.worst = v.back();
  const size_t n = v.size();
  s.median = n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string work = absl::GetFlag(FLAGS_work_dir);
  const std::string layout = absl::GetFlag(FLAGS_layout);
  if (layout != "params" && layout != "trainer") {
    std::fprintf(stderr, "--layout: '%s' (must be params or trainer)\n", layout.c_str());
    return 2;
  }
  const bool trainer = layout == "trainer";
  std::vector<std::string> sections = {"fp32_params"};
  if (trainer) sections = {"fp32_params", "exp_avg", "exp_avg_sq"};
  int layers = absl::GetFlag(FLAGS_layers);
  if (layers <= 0) {
    const double want = absl::GetFlag(FLAGS_size_gb) * 1e9;
    layers = 1;
    while (static_cast<double>(Numel(LlamaShapes(layers)) * 4 *
                               static_cast<int64_t>(sections.size())) < want) {
      ++layers;
    }
  }
  std::string consolidate = absl::GetFlag(FLAGS_consolidate_binary);
  if (consolidate.empty()) {
    char exe[4096];
    ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    std::string self(exe, n > 0 ? static_cast<size_t>(n) : 0);
    consolidate = self.substr(0, self.rfind('/') + 1) + "loom-consolidate";
  }
  std::string peer = absl::GetFlag(FLAGS_peer_script);
  if (peer.empty()) {
    const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
    peer = absl::StrCat(ws != nullptr ? ws : ".", "/bench/consolidate_peer.py");
  }
  if (FileBytes(peer) < 0) {
    std::fprintf(stderr, "--peer_script: %s does not exist\n", peer.c_str());
    return 2;
  }
  const std::string python = absl::GetFlag(FLAGS_python);
  const std::string ckpt = work + "/ckpt";
  const std::string stamp_path = work + "/generated";
  const std::string stamp = absl::StrCat("layout=", layout, " layers=", layers, "\n");
  auto old_stamp = loom::ReadFile(stamp_path);
  const bool reuse = absl::GetFlag(FLAGS_reuse) && old_stamp.ok() && *old_stamp == stamp;
  if (!reuse) (void)Spawn({"/bin/rm", "-rf", work}, "/dev/null");
  const std::string step_dir = ckpt + "/step_00000001";
  const std::string ds_dir = work + "/deepspeed";
  if (!loom::MakeDirs(step_dir).ok()) return 1;
  const std::string log = work + "/bench.log";

  // 1. Loom's checkpoint, rank by rank (one rank's sections in memory at a time).
  const std::vector<Shape> shapes = LlamaShapes(layers);
  const absl::Time gen_start = absl::Now();
  for (int32_t r = 0; r < kWorldSize && !reuse; ++r) {
    loom::storage::ShardManifest m;
    m.step = 1;
    m.rank = r;
    m.world_size = kWorldSize;
    m.model_config_json = absl::StrCat(
        R"({"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":2048,)",
        R"("intermediate_size":5632,"num_attention_heads":32,"num_key_value_heads":4,)",
        R"("num_hidden_layers":)", layers, R"(,"vocab_size":32000,"tie_word_embeddings":false})");
    m.sections = sections;
    for (const Shape& s : shapes) m.params.push_back({s.name, s.dims, s.numel()});
    loom::storage::AssignPartitionLayout(m);
    std::vector<std::vector<float>> data(sections.size());
    std::vector<const float*> ptrs;
    for (size_t s = 0; s < sections.size(); ++s) {
      data[s].assign(static_cast<size_t>(m.section_numel), 0.0f);  // padding stays 0
      for (size_t j = 0; j < m.params.size(); ++j) {
        const loom::storage::ShardParam& p = m.params[j];
        const int64_t first = r * p.partition_numel;
        for (int64_t t = 0; t < p.partition_numel && first + t < p.numel; ++t) {
          data[s][static_cast<size_t>(p.partition_offset + t)] =
              BenchValue(static_cast<int64_t>(j + 1000 * s), first + t);
        }
      }
      ptrs.push_back(data[s].data());
    }
    absl::Status st = loom::storage::WriteShard(step_dir, m, ptrs);
    if (!st.ok()) {
      std::fprintf(stderr, "WriteShard: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  const std::string shard0 = step_dir + "/rank_0.shard", shard1 = step_dir + "/rank_1.shard";
  const int64_t checkpoint_bytes = FileBytes(shard0) + FileBytes(shard1);
  const double gen_s = absl::ToDoubleSeconds(absl::Now() - gen_start);

  // 2. The same model in DeepSpeed's ZeRO-3 layout (the Python peer's input).
  std::string shapes_json = "[";
  for (size_t j = 0; j < shapes.size(); ++j) {
    absl::StrAppend(&shapes_json, j == 0 ? "" : ",", "{\"name\":\"", shapes[j].name,
                    "\",\"shape\":[", absl::StrJoin(shapes[j].dims, ","), "]}");
  }
  shapes_json += "]";
  const std::string shapes_path = work + "/shapes.json";
  if (!loom::WriteFileAtomically(shapes_path, shapes_json).ok()) return 1;
  ChildRun make;
  if (!reuse) {
    make = Spawn({python, peer, "make", shapes_path, ds_dir, absl::StrCat(kWorldSize), "3",
                  trainer ? "1" : "0"},
                 log);
    Check(make, "consolidate_peer.py make", log);
    if (!loom::WriteFileAtomically(stamp_path, stamp).ok()) return 1;
  }
  int64_t ds_bytes = 0;
  for (int32_t r = 0; r < kWorldSize; ++r) {
    ds_bytes += FileBytes(absl::StrCat(ds_dir, "/global_step1/zero_pp_rank_", r,
                                       "_mp_rank_00_optim_states.pt"));
    ds_bytes += FileBytes(absl::StrCat(ds_dir, "/global_step1/zero_pp_rank_", r,
                                       "_mp_rank_00_model_states.pt"));
  }
  std::printf("checkpoint: %s layout, %d layers, %zu tensors, %lld parameters, %d ranks; "
              "loom shards %lld bytes (generated in %.1f s), deepspeed files %lld bytes "
              "(%.1f s)%s\n",
              layout.c_str(), layers, shapes.size(), static_cast<long long>(Numel(shapes)),
              kWorldSize, static_cast<long long>(checkpoint_bytes), gen_s,
              static_cast<long long>(ds_bytes), make.seconds,
              reuse ? "; reused from a previous --keep run" : "");
  std::fflush(stdout);
  Warm(ckpt, log);
  Warm(ds_dir, log);

  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  std::vector<double> cp_t, cp_sync_t, loom_t, py_t;
  int64_t loom_rss = 0, py_rss = 0;
  const std::string copy = work + "/copy";
  const std::string out = work + "/loom_out";
  const std::string py_out = work + "/python.safetensors";
  for (int rep = 0; rep < repeats; ++rep) {
    // cp, then the fsync of the copies.
    (void)Spawn({"/bin/sync"}, log);
    (void)loom::MakeDirs(copy);
    ChildRun c = Spawn({"/bin/cp", shard0, shard1, copy + "/"}, log);
    Check(c, "cp", log);
    ChildRun s = Spawn({"/bin/sync", copy + "/rank_0.shard", copy + "/rank_1.shard"}, log);
    Check(s, "sync", log);
    cp_t.push_back(c.seconds);
    cp_sync_t.push_back(c.seconds + s.seconds);
    if (rep == 0) {
      Check(Spawn({"/usr/bin/cmp", shard0, copy + "/rank_0.shard"}, log), "cmp rank 0 copy", log);
      Check(Spawn({"/usr/bin/cmp", shard1, copy + "/rank_1.shard"}, log), "cmp rank 1 copy", log);
    }
    (void)Spawn({"/bin/rm", "-rf", copy}, log);

    // Loom.
    (void)Spawn({"/bin/sync"}, log);
    ChildRun l = Spawn({consolidate, "--checkpoint_dir=" + ckpt, "--step=1", "--output_dir=" + out},
                       log);
    Check(l, "loom-consolidate", log);
    loom_t.push_back(l.seconds);
    loom_rss = std::max(loom_rss, l.max_rss_bytes);

    // Python (zero_to_fp32-style, DeepSpeed layout).
    (void)Spawn({"/bin/sync"}, log);
    ChildRun p = Spawn({python, peer, "consolidate", ds_dir, py_out}, log);
    Check(p, "python consolidation", log);
    py_t.push_back(p.seconds);
    py_rss = std::max(py_rss, p.max_rss_bytes);
    if (rep == 0) {
      Check(Spawn({python, peer, "compare", shapes_path, out + "/model.safetensors", py_out}, log),
            "compare python vs loom (see the log)", log);
    }
    (void)Spawn({"/bin/rm", "-rf", out, py_out}, log);
    std::printf("run %d: cp %.3f s (cpu %.3f s), cp+sync %.3f s, loom %.3f s (cpu %.3f s, rss %lld), "
                "python %.3f s (cpu %.3f s, rss %lld); load average %s%s\n",
                rep + 1, c.seconds, c.cpu_seconds, c.seconds + s.seconds, l.seconds,
                l.cpu_seconds, static_cast<long long>(l.max_rss_bytes), p.seconds, p.cpu_seconds,
                static_cast<long long>(p.max_rss_bytes), LoadAverage().c_str(),
                rep == 0 ? "; outputs equal (cp: cmp; python vs loom vs formula: every tensor)"
                         : "");
    std::fflush(stdout);
  }
  const double gb = static_cast<double>(checkpoint_bytes) / 1e9;
  const Stats cp = Summarise(cp_t), cps = Summarise(cp_sync_t), lo = Summarise(loom_t),
              py = Summarise(py_t);
  auto row = [&](const char* name, const Stats& st) {
    std::printf("%-9s median %.3f s (%.2f GB/s)  best %.3f s  spread %.3f..%.3f s\n", name,
                st.median, gb / st.median, st.best, st.best, st.worst);
  };
  row("cp", cp);
  row("cp+sync", cps);
  row("loom", lo);
  row("python", py);
  std::printf("best-of-%d ratios: vs_cp=%.3f vs_cp_sync=%.3f vs_python=%.2f; loom peak RSS %lld, "
              "python peak RSS %lld\n",
              repeats, cp.best / lo.best, cps.best / lo.best, py.best / lo.best,
              static_cast<long long>(loom_rss), static_cast<long long>(py_rss));
  if (!absl::GetFlag(FLAGS_keep)) (void)Spawn({"/bin/rm", "-rf", work}, "/dev/null");
  std::printf(
      "consolidate layout=%s stat=median repeats=%d loom_s=%.3f cp_s=%.3f cp_sync_s=%.3f "
      "vs_cp=%.3f vs_cp_sync=%.3f python_s=%.3f vs_python=%.2f checkpoint_bytes=%lld "
      "peak_rss_bytes=%lld\n",
      layout.c_str(), repeats, lo.median, cp.median, cps.median, cp.median / lo.median,
      cps.median / lo.median, py.median, py.median / lo.median,
      static_cast<long long>(checkpoint_bytes), static_cast<long long>(loom_rss));
  return 0;
}
