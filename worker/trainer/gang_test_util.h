// Test helpers shared by the loom-trainer process tests: spawn a gang of real loom-trainer ranks
// (rank 0 first on port 0, the others on the port it reports), collect their events with a
// deadline (on expiry every child is killed and the test fails), write job specs, and reassemble
// full parameters from rank shards. Test-only; not thread-safe.
#ifndef LOOM_WORKER_TRAINER_GANG_TEST_UTIL_H_
#define LOOM_WORKER_TRAINER_GANG_TEST_UTIL_H_

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
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "gtest/gtest.h"
#include "storage/checkpoint/shard_format.h"
#include "worker/trainer/trainer_events.h"

extern char** environ;

namespace loom::trainer_test {

using nlohmann::json;
using Clock = std::chrono::steady_clock;


inline constexpr int kDeadlineSeconds = 120;

inline std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

inline std::string TrainerPath() {
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
  // Not a loom-trainer (e.g. the PyTorch reference script): stdout lines are plain JSON objects.
  bool plain_json = false;
};

inline Child Spawn(const std::vector<std::string>& args, const std::string& stderr_path) {
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

// A loom.TrainerEvent as the flat JSON object the tests read: {"event": "<kind>", <every field
// of that kind's message, int64 as JSON numbers>} (an unset `optional` field is left out).
// Generic over the message (protobuf reflection), so it follows the .proto.
inline json FlatEventJson(const loom::TrainerEvent& ev) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* top = ev.GetReflection();
  const FieldDescriptor* kind =
      top->GetOneofFieldDescriptor(ev, ev.GetDescriptor()->FindOneofByName("kind"));
  json out = json::object();
  if (kind == nullptr) return out;
  out["event"] = kind->name();
  const google::protobuf::Message& m = top->GetMessage(ev, kind);
  const google::protobuf::Reflection* r = m.GetReflection();
  for (int i = 0; i < m.GetDescriptor()->field_count(); ++i) {
    const FieldDescriptor* f = m.GetDescriptor()->field(i);
    if (f->has_presence() && !r->HasField(m, f)) continue;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: out[f->name()] = r->GetInt32(m, f); break;
      case FieldDescriptor::CPPTYPE_INT64: out[f->name()] = r->GetInt64(m, f); break;
      case FieldDescriptor::CPPTYPE_UINT32: out[f->name()] = r->GetUInt32(m, f); break;
      case FieldDescriptor::CPPTYPE_UINT64: out[f->name()] = r->GetUInt64(m, f); break;
      case FieldDescriptor::CPPTYPE_DOUBLE: out[f->name()] = r->GetDouble(m, f); break;
      case FieldDescriptor::CPPTYPE_FLOAT: out[f->name()] = r->GetFloat(m, f); break;
      case FieldDescriptor::CPPTYPE_BOOL: out[f->name()] = r->GetBool(m, f); break;
      case FieldDescriptor::CPPTYPE_STRING: out[f->name()] = r->GetString(m, f); break;
      default: ADD_FAILURE() << "FlatEventJson: unhandled field " << f->full_name(); break;
    }
  }
  return out;
}

// Reads available stdout of `c` (waiting up to `ms`); parses complete lines into events. Every
// stdout line of a trainer must be a loom.TrainerEvent with no field the .proto lacks (protobuf's
// parser); a plain_json child's lines are read as JSON objects.
inline void Pump(Child& c, int ms) {
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
    if (c.plain_json) {
      json j = json::parse(line, nullptr, false);
      EXPECT_FALSE(j.is_discarded()) << "stdout line is not JSON: " << line;
      if (!j.is_discarded()) c.events.push_back(j);
      continue;
    }
    absl::StatusOr<loom::TrainerEvent> ev =
        loom::trainer::ParseTrainerEventLine(line, /*ignore_unknown_fields=*/false);
    EXPECT_TRUE(ev.ok()) << "stdout line is not a loom.TrainerEvent (" << ev.status()
                         << "): " << line;
    if (ev.ok()) c.events.push_back(FlatEventJson(*ev));
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
// `per_rank[r]` (optional) are extra flags for rank r only. `signal_after_first_step` (if non-zero)
// is sent once rank 0 reported its first step: to every rank, or only to `signal_only_rank`.
inline GangResult RunGang(const std::string& name, const std::string& spec, int world,
                          const std::vector<std::string>& extra, int signal_after_first_step = 0,
                          const std::vector<std::vector<std::string>>& per_rank = {},
                          int collective_timeout_s = 60, int signal_only_rank = -1) {
  const auto deadline = Clock::now() + std::chrono::seconds(kDeadlineSeconds);
  std::vector<Child> kids;
  auto args = [&](int rank, int port) {
    std::vector<std::string> a = {TrainerPath(), "--spec=" + spec,
                                  absl::StrCat("--rank=", rank),
                                  absl::StrCat("--world_size=", world),
                                  absl::StrCat("--master_port=", port),
                                  absl::StrCat("--collective_timeout_s=", collective_timeout_s)};
    a.insert(a.end(), extra.begin(), extra.end());
    if (rank < static_cast<int>(per_rank.size())) {
      a.insert(a.end(), per_rank[rank].begin(), per_rank[rank].end());
    }
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
          for (size_t k = 0; k < kids.size(); ++k) {
            if (signal_only_rank < 0 || static_cast<int>(k) == signal_only_rank) {
              kill(kids[k].pid, signal_after_first_step);
            }
          }
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

// A tiny Llama job spec (2 layers, hidden 64, vocab 256, GAS 2, clipping 0.5, AdamW +
// WarmupDecayLR; stage 3 gathering one parameter at a time); `extra_ds` is merged (shallowly)
// into deepspeed_config.
inline std::string WriteSpec(const std::string& name, int micro, int steps,
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
      "zero_optimization": {"stage": 3, "overlap_comm": false, "reduce_bucket_size": 1,
                            "stage3_prefetch_bucket_size": 0,
                            "stage3_param_persistence_threshold": 0,
                            "stage3_max_reuse_distance": 0}},
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
inline std::map<std::string, std::vector<float>> Reassemble(const std::string& step_dir, int world,
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

inline std::optional<std::string> ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    return std::nullopt;
  }
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline std::vector<double> Losses(const GangResult& r, const std::string& type) {
  std::vector<double> out;
  for (const json& e : r.Of(0, type)) out.push_back(e["loss"].get<double>());
  return out;
}


}  // namespace loom::trainer_test

#endif  // LOOM_WORKER_TRAINER_GANG_TEST_UTIL_H_
