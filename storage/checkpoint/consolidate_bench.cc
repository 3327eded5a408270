// consolidate_bench: Loom's checkpoint consolidation against `cp` of the same shard bytes and
// against a Python (Debian python3-torch + numpy) consolidation, on a >= 2 GB checkpoint in Loom's
// shard layout (storage::WriteShard, 2 ranks, Llama-like tensor shapes). Not a test.
//
//   bazel run -c opt //storage/checkpoint:consolidate_bench -- [--work_dir=/tmp/loom_cbench]
//       [--layout=trainer|params] [--layers=N] [--repeats=5] [--keep]
//
// --layout=trainer (default): sections fp32_params, exp_avg, exp_avg_sq, as loom-trainer writes
//   them; --layout=params: fp32_params only (output bytes = checkpoint bytes, the harder case).
// Every path runs on the same warm page cache (the shards are read once before timing) and every
// path verifies the shard CRC-32s and fsyncs its output:
//   cp      `cp` of both shard files, then `sync FILE...` (fsync of the copies); "plain cp" time
//           (without the sync) is printed too.
//   loom    loom-consolidate (a child process; peak RSS from wait4's rusage).
//   python  /usr/bin/python3: CRC-32 (zlib) of each shard in 16 MiB chunks, numpy.fromfile of the
//           fp32_params section, torch.cat of the rank slices per parameter, a hand-written
//           safetensors file (header JSON padded to 8, tensor bytes), os.fsync.
// Throughput = checkpoint (shard) bytes / wall seconds. Best of --repeats runs per path.
// Last line: consolidate_bench vs_copy_throughput_ratio=<x> vs_python_speedup=<y>
//            peak_rss_bytes=<z> checkpoint_bytes=<w>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/file_util.h"
#include "storage/checkpoint/shard_format.h"

ABSL_FLAG(std::string, work_dir, "/tmp/loom_consolidate_bench", "Scratch directory (removed).");
ABSL_FLAG(std::string, layout, "trainer", "trainer (params + Adam moments) or params (params only)");
ABSL_FLAG(int, layers, 0, "Decoder layers (0 = enough for >= 2 GB in the chosen layout)");
ABSL_FLAG(int, repeats, 5, "Runs per path; the best is reported");
ABSL_FLAG(bool, keep, false, "Keep the work directory");
ABSL_FLAG(std::string, consolidate_binary, "", "loom-consolidate (default: next to this binary)");
ABSL_FLAG(std::string, python, "/usr/bin/python3", "Python with torch and numpy");

namespace {

constexpr char kPython[] = R"PY(
import json, os, sys, zlib
import numpy as np
import torch

step_dir, out_path = sys.argv[1], sys.argv[2]
manifests = []
for r in range(1 << 20):
    p = os.path.join(step_dir, "rank_%d.manifest.json" % r)
    if not os.path.exists(p):
        break
    with open(p) as f:
        manifests.append(json.load(f))
m0 = manifests[0]
n = m0["world_size"]
sec = m0["sections"].index("fp32_params") * m0["section_numel"]
ranks = []
for r, m in enumerate(manifests):
    path = os.path.join(step_dir, "rank_%d.shard" % r)
    crc = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(16 << 20)
            if not b:
                break
            crc = zlib.crc32(b, crc)
    if crc != m["shard_crc32"]:
        raise SystemExit("%s: CRC mismatch" % path)
    ranks.append(torch.from_numpy(np.fromfile(path, dtype=np.float32, count=m0["section_numel"],
                                              offset=sec * 4)))
state = {}
for p in m0["params"]:
    o, pn, numel = p["partition_offset"], p["partition_numel"], p["numel"]
    full = torch.cat([ranks[r][o:o + pn] for r in range(n)])[:numel]
    state[p["name"]] = full.view(p["shape"])
names = sorted(state)
header = {"__metadata__": {"format": "pt"}}
off = 0
for k in names:
    nb = state[k].numel() * 4
    header[k] = {"dtype": "F32", "shape": list(state[k].shape), "data_offsets": [off, off + nb]}
    off += nb
h = json.dumps(header, separators=(",", ":")).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(out_path, "wb") as f:
    f.write(len(h).to_bytes(8, "little"))
    f.write(h)
    for k in names:
        f.write(state[k].contiguous().numpy().data)
    f.flush()
    os.fsync(f.fileno())
)PY";

struct ChildRun {
  double seconds = 0;
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

// Reads a file to warm the page cache.
void Warm(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  std::vector<char> buf(8 << 20);
  while (::read(fd, buf.data(), buf.size()) > 0) {
  }
  ::close(fd);
}

struct Shape {
  std::string name;
  std::vector<int64_t> dims;
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
  for (const Shape& s : shapes) {
    int64_t k = 1;
    for (int64_t d : s.dims) k *= d;
    n += k;
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string work = absl::GetFlag(FLAGS_work_dir);
  const bool trainer = absl::GetFlag(FLAGS_layout) == "trainer";
  std::vector<std::string> sections = {"fp32_params"};
  if (trainer) sections = {"fp32_params", "exp_avg", "exp_avg_sq"};
  int layers = absl::GetFlag(FLAGS_layers);
  if (layers <= 0) {
    layers = 1;
    while (Numel(LlamaShapes(layers)) * 4 * static_cast<int64_t>(sections.size()) < (2LL << 30)) {
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
  (void)Spawn({"/bin/rm", "-rf", work}, "/dev/null");
  const std::string ckpt = work + "/ckpt";
  const std::string step_dir = ckpt + "/step_00000001";
  if (!loom::MakeDirs(step_dir).ok()) return 1;
  const std::string log = work + "/bench.log";

  // 1. The checkpoint, rank by rank (one rank's sections in memory at a time).
  const std::vector<Shape> shapes = LlamaShapes(layers);
  const absl::Time gen_start = absl::Now();
  for (int32_t r = 0; r < 2; ++r) {
    loom::storage::ShardManifest m;
    m.step = 1;
    m.rank = r;
    m.world_size = 2;
    m.model_config_json = absl::StrCat(
        R"({"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":2048,)",
        R"("intermediate_size":5632,"num_attention_heads":32,"num_key_value_heads":4,)",
        R"("num_hidden_layers":)", layers, R"(,"vocab_size":32000,"tie_word_embeddings":false})");
    m.sections = sections;
    for (const Shape& s : shapes) {
      int64_t k = 1;
      for (int64_t d : s.dims) k *= d;
      m.params.push_back({s.name, s.dims, k});
    }
    loom::storage::AssignPartitionLayout(m);
    std::vector<std::vector<float>> data(sections.size());
    std::vector<const float*> ptrs;
    for (size_t s = 0; s < sections.size(); ++s) {
      data[s].resize(static_cast<size_t>(m.section_numel));
      for (int64_t i = 0; i < m.section_numel; ++i) {
        data[s][i] = static_cast<float>((i * 2654435761u + s + r) & 0xffffff) * 1e-7f - 0.8f;
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
  const int64_t param_bytes = Numel(shapes) * 4;
  std::printf("checkpoint: %s layout, %d layers, %zu tensors, %lld parameters, 2 ranks, "
              "%lld shard bytes (generated in %.1f s)\n",
              trainer ? "trainer" : "params", layers, shapes.size(),
              static_cast<long long>(Numel(shapes)), static_cast<long long>(checkpoint_bytes),
              absl::ToDoubleSeconds(absl::Now() - gen_start));
  std::fflush(stdout);
  Warm(shard0);
  Warm(shard1);

  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  double cp_plain = 1e30, cp_sync = 1e30, loom_s = 1e30, py_s = 1e30;
  int64_t loom_rss = 0, py_rss = 0;
  const std::string py_script = work + "/consolidate.py";
  if (!loom::WriteFileAtomically(py_script, kPython).ok()) return 1;
  for (int rep = 0; rep < repeats; ++rep) {
    // cp (+ sync of the copies).
    const std::string copy = work + "/copy";
    (void)loom::MakeDirs(copy);
    ChildRun c = Spawn({"/bin/cp", shard0, shard1, copy + "/"}, log);
    Check(c, "cp", log);
    ChildRun s = Spawn({"/bin/sync", copy + "/rank_0.shard", copy + "/rank_1.shard"}, log);
    Check(s, "sync", log);
    cp_plain = std::min(cp_plain, c.seconds);
    cp_sync = std::min(cp_sync, c.seconds + s.seconds);
    (void)Spawn({"/bin/rm", "-rf", copy}, log);

    // Loom.
    const std::string out = work + "/loom_out";
    ChildRun l = Spawn({consolidate, "--checkpoint_dir=" + ckpt, "--step=1", "--output_dir=" + out},
                       log);
    Check(l, "loom-consolidate", log);
    if (l.seconds < loom_s) loom_s = l.seconds;
    loom_rss = std::max(loom_rss, l.max_rss_bytes);
    const int64_t loom_out_bytes = FileBytes(out + "/model.safetensors");
    (void)Spawn({"/bin/rm", "-rf", out}, log);

    // Python.
    const std::string py_out = work + "/python.safetensors";
    ChildRun p = Spawn({absl::GetFlag(FLAGS_python), py_script, step_dir, py_out}, log);
    Check(p, "python consolidation", log);
    const int64_t py_out_bytes = FileBytes(py_out);
    py_s = std::min(py_s, p.seconds);
    py_rss = std::max(py_rss, p.max_rss_bytes);
    ::unlink(py_out.c_str());
    std::printf("run %d: cp %.3f s (+sync %.3f s), loom %.3f s (rss %lld, out %lld B), "
                "python %.3f s (rss %lld, out %lld B)\n",
                rep + 1, c.seconds, s.seconds, l.seconds, static_cast<long long>(l.max_rss_bytes),
                static_cast<long long>(loom_out_bytes), p.seconds,
                static_cast<long long>(p.max_rss_bytes), static_cast<long long>(py_out_bytes));
    std::fflush(stdout);
  }
  const double gb = static_cast<double>(checkpoint_bytes) / 1e9;
  std::printf("checkpoint bytes %lld, output (fp32 params) bytes %lld\n",
              static_cast<long long>(checkpoint_bytes), static_cast<long long>(param_bytes));
  std::printf("cp (plain)      %.3f s  %.2f GB/s\n", cp_plain, gb / cp_plain);
  std::printf("cp + sync       %.3f s  %.2f GB/s\n", cp_sync, gb / cp_sync);
  std::printf("loom            %.3f s  %.2f GB/s  peak RSS %lld bytes\n", loom_s, gb / loom_s,
              static_cast<long long>(loom_rss));
  std::printf("python (torch)  %.3f s  %.2f GB/s  peak RSS %lld bytes\n", py_s, gb / py_s,
              static_cast<long long>(py_rss));
  std::printf("loom vs plain cp throughput ratio %.3f; vs cp+sync %.3f\n", cp_plain / loom_s,
              cp_sync / loom_s);
  if (!absl::GetFlag(FLAGS_keep)) (void)Spawn({"/bin/rm", "-rf", work}, "/dev/null");
  std::printf(
      "consolidate_bench vs_copy_throughput_ratio=%.3f vs_python_speedup=%.2f "
      "peak_rss_bytes=%lld checkpoint_bytes=%lld\n",
      cp_plain / loom_s, py_s / loom_s, static_cast<long long>(loom_rss),
      static_cast<long long>(checkpoint_bytes));
  return 0;
}
