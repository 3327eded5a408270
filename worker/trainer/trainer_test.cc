// End-to-end tests of loom-trainer with real processes and real Gloo over loopback:
//   * ZeRO-3 equivalence: the same model, seed and global batch trained 12 steps on 1 rank
//     (micro 6), 2 ranks (micro 3) and 3 ranks (micro 2), GAS 2, clipping, AdamW + WarmupDecayLR
//     give the same per-step losses, eval losses and final parameters (reassembled from the
//     rank shards).
//   * Memory accounting: gathered bytes are 0 between steps; partition bytes = Σ ceil(n/N)*4.
//   * Resume: 2 ranks resumed from step 6 reproduce the uninterrupted run bit-exactly.
//   * Fine-tuning: a consolidated export initialises a 3-rank job with the same logits.
//   * Errors: resume with another world size, invalid config (exit 2), SIGTERM (exit 143).
// Every child has a deadline; on expiry all children are killed and the test fails.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "storage/checkpoint/consolidate.h"
#include "storage/checkpoint/shard_format.h"

extern char** environ;

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kDeadlineSeconds = 120;

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

std::string TrainerPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  std::string p = "worker/trainer/loom-trainer";
  if (access(p.c_str(), X_OK) == 0) return p;
  return absl::StrCat(srcdir ? srcdir : ".", "/loom/", p);
}

struct Child {
  pid_t pid = -1;
  int out_fd = -1;
  std::string buffer;
  std::vector<json> events;
  int exit_code = -1;
  bool eof = false;
};

Child Spawn(const std::vector<std::string>& args, const std::string& stderr_path) {
  int fds[2];
  if (pipe(fds) != 0) ADD_FAILURE() << "pipe";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addopen(&fa, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  Child c;
  if (posix_spawn(&c.pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) {
    ADD_FAILURE() << "posix_spawn " << args[0];
  }
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  c.out_fd = fds[0];
  return c;
}

// Reads available stdout of `c` (waiting up to `ms`); parses complete lines into events.
void Pump(Child& c, int ms) {
  if (c.eof) return;
  pollfd p{c.out_fd, POLLIN, 0};
  if (poll(&p, 1, ms) <= 0) return;
  char buf[65536];
  ssize_t n = read(c.out_fd, buf, sizeof(buf));
  if (n <= 0) {
    c.eof = true;
    close(c.out_fd);
    return;
  }
  c.buffer.append(buf, n);
  size_t pos;
  while ((pos = c.buffer.find('\n')) != std::string::npos) {
    std::string line = c.buffer.substr(0, pos);
    c.buffer.erase(0, pos + 1);
    json j = json::parse(line, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << "stdout line is not JSON: " << line;
    if (!j.is_discarded()) c.events.push_back(j);
  }
}

struct GangResult {
  std::vector<std::vector<json>> events;  // per rank
  std::vector<int> exit_codes;
  bool timed_out = false;
  std::vector<json> Of(int rank, const std::string& type) const {
    std::vector<json> out;
    for (const json& e : events[rank]) {
      if (e["event"] == type) out.push_back(e);
    }
    return out;
  }
};

// Starts `world` ranks (rank 0 first with --master_port=0, the others on the port it reports)
// and collects their events until all exit or the deadline passes (then kills them all).
GangResult RunGang(const std::string& name, const std::string& spec, int world,
                   const std::vector<std::string>& extra, int signal_after_first_step = 0) {
  const auto deadline = Clock::now() + std::chrono::seconds(kDeadlineSeconds);
  std::vector<Child> kids;
  auto args = [&](int rank, int port) {
    std::vector<std::string> a = {TrainerPath(), "--spec=" + spec,
                                  absl::StrCat("--rank=", rank),
                                  absl::StrCat("--world_size=", world),
                                  absl::StrCat("--master_port=", port),
                                  "--collective_timeout_s=60"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  GangResult r;
  kids.push_back(Spawn(args(0, 0), absl::StrCat(TmpDir(), "/", name, ".rank0.stderr")));
  if (world > 1) {
    int port = 0;
    while (port == 0 && Clock::now() < deadline && !kids[0].eof) {
      Pump(kids[0], 100);
      for (const json& e : kids[0].events) {
        if (e["event"] == "rendezvous") port = e["port"].get<int>();
      }
    }
    EXPECT_GT(port, 0) << name << ": rank 0 reported no rendezvous port";
    for (int rank = 1; rank < world && port > 0; ++rank) {
      kids.push_back(
          Spawn(args(rank, port), absl::StrCat(TmpDir(), "/", name, ".rank", rank, ".stderr")));
    }
  }
  bool signalled = false;
  while (Clock::now() < deadline) {
    bool all_eof = true;
    for (Child& c : kids) {
      Pump(c, 20);
      all_eof = all_eof && c.eof;
    }
    if (signal_after_first_step && !signalled) {
      for (const json& e : kids[0].events) {
        if (e["event"] == "step") {
          for (Child& c : kids) kill(c.pid, signal_after_first_step);
          signalled = true;
          break;
        }
      }
    }
    if (all_eof) break;
  }
  if (Clock::now() >= deadline) {
    r.timed_out = true;
    for (Child& c : kids) kill(c.pid, SIGKILL);
    ADD_FAILURE() << name << ": deadline of " << kDeadlineSeconds << " s passed; killed";
  }
  for (Child& c : kids) {
    int status = 0;
    waitpid(c.pid, &status, 0);
    c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.events.push_back(c.events);
    r.exit_codes.push_back(c.exit_code);
  }
  return r;
}

std::string WriteSpec(const std::string& name, int micro, int steps,
                      const std::string& extra_ds = "") {
  json spec = json::parse(R"({
    "name": "tiny",
    "model": {"config": {"architectures": ["LlamaForCausalLM"], "vocab_size": 256,
              "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 64, "tie_word_embeddings": false}},
    "dataset": {"name": "fortunes", "tokenizer": "byte"},
    "deepspeed_config": {
      "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 1e-4,
                    "warmup_max_lr": 3e-3, "warmup_num_steps": 4, "total_num_steps": 12,
                    "warmup_type": "linear"}},
      "zero_optimization": {"stage": 3, "overlap_comm": true}},
    "training": {"sequence_length": 32, "seed": "1234", "eval_every_steps": "6",
                 "eval_batches": 2},
    "checkpoint": {"interval_steps": "6"}
  })");
  spec["deepspeed_config"]["train_micro_batch_size_per_gpu"] = micro;
  spec["training"]["steps"] = std::to_string(steps);
  if (!extra_ds.empty()) spec["deepspeed_config"].update(json::parse(extra_ds));
  const std::string path = absl::StrCat(TmpDir(), "/", name, ".spec.json");
  std::ofstream(path) << spec.dump(2);
  return path;
}

// Full parameters reassembled from every rank's shard of `step_dir`, keyed by name.
std::map<std::string, std::vector<float>> Reassemble(const std::string& step_dir, int world,
                                                     const std::string& section) {
  std::map<std::string, std::vector<float>> out;
  for (int r = 0; r < world; ++r) {
    absl::StatusOr<loom::storage::ShardManifest> m = loom::storage::ReadManifest(step_dir, r);
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return {};
    EXPECT_EQ(m->world_size, world);
    absl::StatusOr<std::vector<float>> data = loom::storage::ReadShardVerified(step_dir, *m);
    EXPECT_TRUE(data.ok()) << data.status();
    if (!data.ok()) return {};
    const int64_t base = *loom::storage::SectionOffset(*m, section);
    for (const loom::storage::ShardParam& p : m->params) {
      std::vector<float>& full = out[p.name];
      const float* part = data->data() + base + p.partition_offset;
      full.insert(full.end(), part, part + p.partition_numel);
      if (r == world - 1) {
        // Padding beyond numel must be zero (DeepSpeed's zero-padded ds_tensor).
        for (size_t i = p.numel; i < full.size(); ++i) EXPECT_EQ(full[i], 0.f) << p.name;
        full.resize(p.numel);
      }
    }
  }
  return out;
}

std::optional<std::string> ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    return std::nullopt;
  }
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<double> Losses(const GangResult& r, const std::string& type) {
  std::vector<double> out;
  for (const json& e : r.Of(0, type)) out.push_back(e["loss"].get<double>());
  return out;
}

class TrainerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    one_ = new GangResult(RunGang("one", WriteSpec("one", 6, 12), 1,
                                  {"--checkpoint_dir=" + Dir("one")}));
    two_ = new GangResult(RunGang("two", WriteSpec("two", 3, 12), 2,
                                  {"--checkpoint_dir=" + Dir("two")}));
    three_ = new GangResult(RunGang("three", WriteSpec("three", 2, 12), 3,
                                    {"--checkpoint_dir=" + Dir("three")}));
  }
  static void TearDownTestSuite() {
    delete one_;
    delete two_;
    delete three_;
  }
  static std::string Dir(const std::string& name) { return TmpDir() + "/ckpt_" + name; }
  static void ExpectSuccess(const GangResult& r, const std::string& name) {
    for (size_t rank = 0; rank < r.exit_codes.size(); ++rank) {
      EXPECT_EQ(r.exit_codes[rank], 0) << name << " rank " << rank << " (see "
                                       << name << ".rank" << rank << ".stderr)";
      EXPECT_EQ(r.Of(rank, "done").size(), 1u) << name << " rank " << rank;
    }
  }
  static GangResult* one_;
  static GangResult* two_;
  static GangResult* three_;
};
GangResult* TrainerTest::one_ = nullptr;
GangResult* TrainerTest::two_ = nullptr;
GangResult* TrainerTest::three_ = nullptr;

// Tolerances (fp32, 12 steps): losses rtol 1e-5; parameters |a-b| <= 2e-5 + 1e-4 |b|.
// Measured differences are ~1e-7 relative: only the order of fp32 sums differs.
constexpr double kLossRtol = 1e-5;
constexpr double kParamAtol = 2e-5;
constexpr double kParamRtol = 1e-4;

TEST_F(TrainerTest, Zero3OnTwoAndThreeRanksEqualsOneRank) {
  ExpectSuccess(*one_, "one");
  ExpectSuccess(*two_, "two");
  ExpectSuccess(*three_, "three");
  for (const std::string type : {"step", "eval"}) {
    std::vector<double> a = Losses(*one_, type), b = Losses(*two_, type),
                        c = Losses(*three_, type);
    ASSERT_EQ(a.size(), type == "step" ? 12u : 3u);
    ASSERT_EQ(b.size(), a.size());
    ASSERT_EQ(c.size(), a.size());
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max({worst, std::abs(b[i] - a[i]) / a[i], std::abs(c[i] - a[i]) / a[i]});
      EXPECT_NEAR(b[i], a[i], kLossRtol * std::abs(a[i])) << type << " " << i;
      EXPECT_NEAR(c[i], a[i], kLossRtol * std::abs(a[i])) << type << " " << i;
    }
    std::cout << "max relative " << type << " loss difference = " << worst << "\n";
  }
  // Training made progress (held-out loss fell from ~ln 256).
  std::vector<double> ev = Losses(*one_, "eval");
  EXPECT_NEAR(ev.front(), std::log(256.0), 0.1);
  EXPECT_LT(ev.back(), ev.front() - 1.0);
  // The schedule: WarmupDecayLR linear, step 1 runs at warmup_min_lr, step 4 at
  // 1e-4 + (3e-3 - 1e-4) * 2/4 (last_batch_iteration 2).
  std::vector<json> steps = one_->Of(0, "step");
  EXPECT_DOUBLE_EQ(steps[0]["lr"].get<double>(), 1e-4);
  EXPECT_NEAR(steps[3]["lr"].get<double>(), 1e-4 + 2.9e-3 * 0.5, 1e-12);

  const std::string step12 = "/" + loom::storage::StepDirName(12);
  auto p1 = Reassemble(Dir("one") + step12, 1, "fp32_params");
  auto p2 = Reassemble(Dir("two") + step12, 2, "fp32_params");
  auto p3 = Reassemble(Dir("three") + step12, 3, "fp32_params");
  ASSERT_EQ(p1.size(), 1u + 2u * 9u + 2u);
  double max_param_diff = 0;
  for (const auto& [name, a] : p1) {
    for (const auto* other : {&p2, &p3}) {
      const std::vector<float>& b = other->at(name);
      ASSERT_EQ(b.size(), a.size()) << name;
      double worst = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        const double diff = std::abs(double(a[i]) - b[i]);
        max_param_diff = std::max(max_param_diff, diff);
        worst = std::max(worst, diff - kParamRtol * std::abs(double(a[i])));
      }
      EXPECT_LE(worst, kParamAtol) << name;
    }
  }
  std::cout << "max |param(1 rank) - param(N ranks)| = " << max_param_diff << "\n";
}

TEST_F(TrainerTest, MemoryAccounting) {
  const int64_t psi = 2 * 256 * 64 + 2 * (2 * 64 + 64 * 64 + 2 * 32 * 64 + 64 * 64 +
                                          3 * 64 * 160) + 64;
  for (const auto& [r, world] : {std::pair{one_, 1}, {two_, 2}, {three_, 3}}) {
    std::vector<json> started = r->Of(0, "started");
    ASSERT_EQ(started.size(), 1u);
    EXPECT_EQ(started[0]["params"].get<int64_t>(), psi);
    const int64_t bytes = started[0]["partition_bytes"].get<int64_t>();
    // Σ ceil(n/N)*4 lies in [Ψ*4/N, Ψ*4/N + 4*(#params)] (at most N-1 padding per parameter).
    EXPECT_GE(bytes * world, psi * 4) << world;
    EXPECT_LE(bytes * world - psi * 4, 4 * (world - 1) * 21) << world;
    for (int rank = 0; rank < world; ++rank) {
      std::vector<json> steps = r->Of(rank, "step");
      ASSERT_EQ(steps.size(), 12u);
      for (const json& e : steps) {
        EXPECT_EQ(e["gathered_bytes_between_steps"].get<int64_t>(), 0);
        EXPECT_EQ(e["partition_bytes"].get<int64_t>(), bytes);
        // Peak gathered = the largest full weight plus its gradient buffer, not the model.
        EXPECT_LE(e["peak_gathered_bytes"].get<int64_t>(), 2 * 4 * (256 * 64 + world));
      }
    }
  }
  // Rank 0 wrote the logits of the live model.
  std::ifstream f(Dir("two") + "/final_logits.json");
  ASSERT_TRUE(f.good());
  json logits = json::parse(f);
  ASSERT_EQ(logits["tokens"].size(), 32u);
  ASSERT_EQ(logits["logits"].size(), 32u);
  EXPECT_EQ(logits["logits"][0].size(), 256u);
}

TEST_F(TrainerTest, ResumeFromStepSixEqualsUninterruptedRun) {
  ExpectSuccess(*two_, "two");
  const std::string from = Dir("two") + "/" + loom::storage::StepDirName(6);
  GangResult resumed = RunGang("resumed", WriteSpec("resumed", 3, 12), 2,
                               {"--checkpoint_dir=" + Dir("resumed"), "--resume_from=" + from});
  ExpectSuccess(resumed, "resumed");
  std::vector<double> full = Losses(*two_, "step"), part = Losses(resumed, "step");
  ASSERT_EQ(part.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(part[i], full[i + 6]) << "step " << i + 7;
  EXPECT_EQ(resumed.Of(0, "step")[0]["step"].get<int>(), 7);
  const std::string step12 = "/" + loom::storage::StepDirName(12);
  for (const char* section : {"fp32_params", "exp_avg", "exp_avg_sq"}) {
    auto a = Reassemble(Dir("two") + step12, 2, section);
    auto b = Reassemble(Dir("resumed") + step12, 2, section);
    ASSERT_FALSE(a.empty());
    for (const auto& [name, v] : a) {
      ASSERT_EQ(v, b[name]) << section << " " << name << " differs after resume (bit-exact)";
    }
  }
  auto m = loom::storage::ReadManifest(Dir("resumed") + step12, 1);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->optimizer_step, 12);
  EXPECT_EQ(m->optimizer, "adamw");
  EXPECT_EQ(m->params[0].name, "model.embed_tokens.weight");
  // The checkpoint records the step's training loss and the held-out loss measured at it.
  ASSERT_EQ(m->metrics.count("train_loss"), 1u);
  EXPECT_DOUBLE_EQ(m->metrics.at("train_loss"), full[11]);
  ASSERT_EQ(m->metrics.count("eval_loss"), 1u);
  EXPECT_DOUBLE_EQ(m->metrics.at("eval_loss"), Losses(*two_, "eval").back());
}

// Fine-tuning from an export: the step-12 checkpoint of the 2-rank run, consolidated into a
// Hugging Face directory, initialises a 3-rank job; trained one step with lr 0 (no change), it
// computes the logits the 2-rank trainer computed, and a wrong shape is refused by name.
TEST_F(TrainerTest, InitialisesFromAConsolidatedExport) {
  ExpectSuccess(*two_, "two");
  const std::string export_dir = TmpDir() + "/export_two";
  auto consolidated = loom::storage::Consolidate(Dir("two"), 12, export_dir);
  ASSERT_TRUE(consolidated.ok()) << consolidated.status();

  json spec = json::parse(*ReadText(WriteSpec("finetune", 2, 1)));
  spec["model"]["init_from"] = export_dir;
  spec["deepspeed_config"]["optimizer"]["params"]["lr"] = 0.0;
  spec["deepspeed_config"].erase("scheduler");
  const std::string spec_path = TmpDir() + "/finetune.lr0.spec.json";
  std::ofstream(spec_path) << spec.dump(2);
  GangResult r = RunGang("finetune", spec_path, 3, {"--checkpoint_dir=" + Dir("finetune")});
  ExpectSuccess(r, "finetune");
  json want = json::parse(*ReadText(Dir("two") + "/final_logits.json"));
  json got = json::parse(*ReadText(Dir("finetune") + "/final_logits.json"));
  ASSERT_EQ(want["tokens"], got["tokens"]);
  double max_diff = 0;
  for (size_t i = 0; i < want["logits"].size(); ++i) {
    for (size_t v = 0; v < want["logits"][i].size(); ++v) {
      max_diff = std::max(max_diff, std::abs(want["logits"][i][v].get<double>() -
                                             got["logits"][i][v].get<double>()));
    }
  }
  EXPECT_LT(max_diff, 1e-5) << "logits of the fine-tuning start differ from the exported model's";

  json wrong = spec;
  wrong["model"]["config"]["intermediate_size"] = 128;  // the export has 160
  const std::string wrong_path = TmpDir() + "/finetune.wrong.spec.json";
  std::ofstream(wrong_path) << wrong.dump(2);
  GangResult bad = RunGang("finetune_wrong", wrong_path, 1, {});
  EXPECT_NE(bad.exit_codes[0], 0);
  std::vector<json> errors = bad.Of(0, "error");
  ASSERT_EQ(errors.size(), 1u);
  const std::string msg = errors[0]["message"];
  EXPECT_NE(msg.find("model.init_from: model.layers.0.mlp.gate_proj.weight has shape [160,64]"),
            std::string::npos)
      << msg;
}

// ZeRO-Offload / ZeRO-Infinity with real ranks: the step runs in CpuAdam over state in host
// memory (cpu) or on files (nvme, with the parameter partitions on files too and pipelined
// sub-group swapping). cpu and nvme give bit-identical losses, parameters and moments (same
// CpuAdam math, only the placement differs); against the in-memory LibTorch update they agree
// within the fp32 tolerances above (CpuAdam has no FMA, LibTorch's vector add has: ~1 ulp per
// step). A resumed NVMe run continues bit-exactly, and the swap files are gone after exit.
TEST_F(TrainerTest, OffloadToCpuAndNvmeMatchesTheInMemoryRunAndResumes) {
  ExpectSuccess(*two_, "two");
  const std::string nvme_dir = TmpDir() + "/nvme";
  const std::string zero_cpu = R"({"zero_optimization": {"stage": 3, "sub_group_size": 5000,
      "offload_optimizer": {"device": "cpu"}}})";
  const std::string zero_nvme = absl::StrCat(
      R"({"zero_optimization": {"stage": 3, "sub_group_size": 5000,
      "offload_optimizer": {"device": "nvme", "nvme_path": ")", nvme_dir,
      R"(", "buffer_count": 6, "pipeline_read": true, "pipeline_write": true},
      "offload_param": {"device": "nvme", "nvme_path": ")", nvme_dir,
      R"(", "buffer_count": 2, "buffer_size": 100000}}})");
  GangResult cpu = RunGang("offload_cpu", WriteSpec("offload_cpu", 3, 12, zero_cpu), 2,
                           {"--checkpoint_dir=" + Dir("offload_cpu")});
  GangResult nvme = RunGang("offload_nvme", WriteSpec("offload_nvme", 3, 12, zero_nvme), 2,
                            {"--checkpoint_dir=" + Dir("offload_nvme")});
  ExpectSuccess(cpu, "offload_cpu");
  ExpectSuccess(nvme, "offload_nvme");
  ASSERT_EQ(cpu.Of(0, "started").size(), 1u);
  EXPECT_EQ(cpu.Of(0, "started")[0]["offload_optimizer"], "cpu");
  EXPECT_EQ(nvme.Of(1, "started")[0]["offload_optimizer"], "nvme");
  EXPECT_EQ(nvme.Of(1, "started")[0]["offload_param"], "nvme");
  // NVMe keeps only sub-group and parameter buffers in memory, cpu keeps the moments (2x4 bytes
  // per partition element).
  const int64_t part = cpu.Of(0, "started")[0]["partition_bytes"].get<int64_t>();
  EXPECT_EQ(cpu.Of(0, "started")[0]["offload_resident_bytes"].get<int64_t>(), 2 * part);
  EXPECT_LT(nvme.Of(0, "started")[0]["offload_resident_bytes"].get<int64_t>(), 2 * part);

  for (const std::string type : {"step", "eval"}) {
    std::vector<double> base = Losses(*two_, type), c = Losses(cpu, type),
                        n = Losses(nvme, type);
    ASSERT_EQ(c.size(), base.size());
    ASSERT_EQ(n.size(), base.size());
    for (size_t i = 0; i < base.size(); ++i) {
      EXPECT_EQ(n[i], c[i]) << type << " " << i << ": nvme and cpu offload must be bit-identical";
      EXPECT_NEAR(c[i], base[i], kLossRtol * std::abs(base[i])) << type << " " << i;
    }
  }
  const std::string step12 = "/" + loom::storage::StepDirName(12);
  for (const char* section : {"fp32_params", "exp_avg", "exp_avg_sq"}) {
    auto c = Reassemble(Dir("offload_cpu") + step12, 2, section);
    auto n = Reassemble(Dir("offload_nvme") + step12, 2, section);
    auto base = Reassemble(Dir("two") + step12, 2, section);
    ASSERT_EQ(c.size(), 21u);
    for (const auto& [name, v] : c) {
      ASSERT_EQ(v, n[name]) << section << " " << name << ": nvme differs from cpu offload";
      if (std::string(section) != "fp32_params") continue;
      double worst = 0;
      for (size_t i = 0; i < v.size(); ++i) {
        worst = std::max(worst, std::abs(double(v[i]) - base[name][i]) -
                                    kParamRtol * std::abs(double(base[name][i])));
      }
      EXPECT_LE(worst, kParamAtol) << name;
    }
  }
  // The swap files were scratch space: none is left behind.
  int left = 0;
  std::string find = absl::StrCat("find ", nvme_dir, " -name '*.swp' | grep -c . > ", TmpDir(),
                                  "/swp_count.txt");
  (void)std::system(find.c_str());
  std::ifstream(TmpDir() + "/swp_count.txt") >> left;
  EXPECT_EQ(left, 0);

  // Stages 1 and 2 offload too (their fp32 master partitions are stepped by CpuAdam, then
  // all-gathered into the replicas): same losses within the fp32 tolerance.
  for (int stage : {1, 2}) {
    const std::string name = absl::StrCat("offload_stage", stage);
    GangResult r = RunGang(
        name,
        WriteSpec(name, 3, 12,
                  absl::StrCat(R"({"zero_optimization": {"stage": )", stage,
                               R"(, "offload_optimizer": {"device": "nvme", "nvme_path": ")",
                               nvme_dir, R"("}}})")),
        2, {});
    ExpectSuccess(r, name);
    std::vector<double> base = Losses(*two_, "step"), got = Losses(r, "step");
    ASSERT_EQ(got.size(), base.size()) << name;
    for (size_t i = 0; i < base.size(); ++i) {
      EXPECT_NEAR(got[i], base[i], kLossRtol * std::abs(base[i])) << name << " step " << i;
    }
  }

  // Resume the NVMe run from step 6: identical to the uninterrupted NVMe run.
  const std::string from = Dir("offload_nvme") + "/" + loom::storage::StepDirName(6);
  GangResult resumed =
      RunGang("offload_resumed", WriteSpec("offload_resumed", 3, 12, zero_nvme), 2,
              {"--checkpoint_dir=" + Dir("offload_resumed"), "--resume_from=" + from});
  ExpectSuccess(resumed, "offload_resumed");
  std::vector<double> full = Losses(nvme, "step"), rest = Losses(resumed, "step");
  ASSERT_EQ(rest.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(rest[i], full[i + 6]) << "step " << i + 7;
  for (const char* section : {"fp32_params", "exp_avg", "exp_avg_sq"}) {
    auto a = Reassemble(Dir("offload_nvme") + step12, 2, section);
    auto b = Reassemble(Dir("offload_resumed") + step12, 2, section);
    ASSERT_FALSE(a.empty());
    for (const auto& [name, v] : a) ASSERT_EQ(v, b[name]) << section << " " << name;
  }
}

TEST(TrainerErrorsTest, UnusableNvmePathIsAnErrorNamingIt) {
  GangResult r = RunGang(
      "bad_nvme",
      WriteSpec("bad_nvme", 6, 2, R"({"zero_optimization": {"stage": 3,
          "offload_optimizer": {"device": "nvme", "nvme_path": "/proc/loom_no_nvme"}}})"),
      1, {});
  EXPECT_EQ(r.exit_codes[0], 1);
  std::vector<json> errors = r.Of(0, "error");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0]["message"].get<std::string>().find("/proc/loom_no_nvme"),
            std::string::npos)
      << errors[0]["message"];
}

TEST_F(TrainerTest, ResumeWithAnotherWorldSizeIsRefused) {
  const std::string from = Dir("two") + "/" + loom::storage::StepDirName(6);
  GangResult r = RunGang("wrong_world", WriteSpec("wrong_world", 6, 12), 1,
                         {"--resume_from=" + from});
  EXPECT_EQ(r.exit_codes[0], 1);
  std::vector<json> errors = r.Of(0, "error");
  ASSERT_EQ(errors.size(), 1u);
  const std::string msg = errors[0]["message"];
  EXPECT_NE(msg.find("world size 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("world size 1"), std::string::npos) << msg;
}

TEST(TrainerErrorsTest, InvalidConfigExitsTwoWithAnErrorEvent) {
  GangResult r = RunGang("bad", WriteSpec("bad", 2, 3, R"({"fp16": {"enabled": true}})"), 1, {});
  EXPECT_EQ(r.exit_codes[0], 2);
  std::vector<json> errors = r.Of(0, "error");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0]["message"].get<std::string>().find("deepspeed_config.fp16.enabled"),
            std::string::npos);
  EXPECT_TRUE(r.Of(0, "started").empty());
}

TEST(TrainerErrorsTest, SigtermStopsAllRanksAtAStepBoundary) {
  GangResult r = RunGang("sigterm", WriteSpec("sigterm", 1, 100000), 2, {}, SIGTERM);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(r.exit_codes[rank], 143) << rank;
    std::vector<json> stopped = r.Of(rank, "stopped");
    ASSERT_EQ(stopped.size(), 1u) << rank;
    EXPECT_EQ(stopped[0]["step"], r.Of(0, "stopped")[0]["step"]);  // the same boundary
  }
}

}  // namespace
