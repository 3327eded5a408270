// Training checked against PyTorch, not only against Loom: real 2-rank loom-trainer gangs (Gloo
// on loopback) run with --trajectory_dir, and tests/python/reference_trajectory.py (the venv's
// /opt/loom/venv/bin/python3 + torch 2.11, no code shared with the engine) replays the same batches from
// the initial HF export with torch.optim.AdamW, torch.nn.utils.clip_grad_norm_ and DeepSpeed's
// WarmupDecayLR, then compares per-step loss, lr, pre-clip gradient norm and the final HF export.
// Cases: ZeRO stage 0 and 3, 2 ranks, GAS 2, fp32 and bf16, gradient clipping at a threshold
// inside the range of the run's gradient norms, so some steps are clipped and some are not
// (asserted from the reference's own norms): a wrong clipping coefficient then changes the
// relative scale of the gradients Adam sees, which Adam's scale invariance would hide if every
// step were clipped by a similar factor. Tolerances are the script's (its docstring): fp32 loss
// rel 1e-5, grad norm rel 1e-5, weights |a-b| <= 1e-5; bf16 loss rel 1e-4, grad norm rel 1e-2,
// update within 3 % (rel L2), 99.9th percentile of |a-b| <= 2e-3, max |a-b| <= 2.5e-2.
// A packed-samples case (dataset.pack_documents, micro-batch 1) replays the recorded position
// ids: per-document attention and rotary angles, no target across a document boundary.
// Negative controls: the reference run with a spec that differs from what Loom ran (clipping
// threshold x1.5, Adam beta2 0.99) must report a mismatch; a dump into a used directory fails
// naming --trajectory_dir.
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/trainer/gang_test_util.h"

namespace {

using namespace loom::trainer_test;  // NOLINT: test helpers

constexpr int kWorld = 2;
constexpr int kSteps = 8;
constexpr int kMicro = 2;               // per rank; GAS 2 (WriteSpec) -> global batch 8
// Gradient norms of these runs are 1.82-2.17 (fp32 and bf16 alike): 4 of 8 steps clip.
constexpr double kClip = 1.95;
constexpr int kReferenceDeadlineS = 180;

struct Case {
  std::string name;
  int stage;
  bool bf16;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::string CaseSpec(const Case& c, const json& ds_overrides = json::object()) {
  const std::string path = WriteSpec(c.name, kMicro, kSteps);
  json spec = json::parse(*ReadText(path));
  json& ds = spec["deepspeed_config"];
  ds["gradient_clipping"] = kClip;
  if (c.stage == 0) ds["zero_optimization"] = {{"stage", 0}};
  if (c.bf16) ds["bf16"] = {{"enabled", true}};
  // Warm-up and decay both inside the 8 steps; the log warm-up on stage 0, linear on stage 3.
  ds["scheduler"]["params"]["warmup_type"] = c.stage == 0 ? "log" : "linear";
  for (auto it = ds_overrides.begin(); it != ds_overrides.end(); ++it) ds[it.key()] = *it;
  spec["training"]["eval_every_steps"] = "0";
  std::ofstream(path) << spec.dump(2);
  return path;
}

std::string TrajDir(const std::string& name) { return TmpDir() + "/traj_" + name; }

// Runs the reference script; returns its exit code and its one JSON line (null if none).
std::pair<int, json> RunReference(const std::string& name, const std::string& spec,
                                  const std::string& dir) {
  Child c = Spawn({"/opt/loom/venv/bin/python3", "tests/python/reference_trajectory.py",
                   "--spec=" + spec, "--dir=" + dir},
                  absl::StrCat(TmpDir(), "/", name, ".reference.stderr"));
  c.plain_json = true;  // the script prints {"event":"reference",...}, not a loom.TrainerEvent
  const auto deadline = Clock::now() + std::chrono::seconds(kReferenceDeadlineS);
  while (!c.eof && Clock::now() < deadline) Pump(c, 100);
  if (!c.eof) {
    kill(c.pid, SIGKILL);
    ADD_FAILURE() << name << ": reference did not finish within " << kReferenceDeadlineS << " s";
  }
  int status = 0;
  waitpid(c.pid, &status, 0);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  json line;
  for (const json& e : c.events) {
    if (e.value("event", "") == "reference") line = e;
  }
  return {code, line};
}

void ExpectGangOk(const GangResult& r, const std::string& name) {
  ASSERT_FALSE(r.timed_out) << name;
  for (int rank = 0; rank < static_cast<int>(r.exit_codes.size()); ++rank) {
    EXPECT_EQ(r.exit_codes[rank], 0) << name << " rank " << rank << " (see " << name << ".rank"
                                     << rank << ".stderr)";
    EXPECT_EQ(r.Of(rank, "done").size(), 1u) << name << " rank " << rank;
  }
}

class ReferenceTrajectoryTest : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceTrajectoryTest, LoomMatchesPyTorchReference) {
  const Case& c = GetParam();
  const std::string spec = CaseSpec(c);
  const std::string dir = TrajDir(c.name);
  GangResult r = RunGang(c.name, spec, kWorld, {"--trajectory_dir=" + dir});
  ExpectGangOk(r, c.name);
  if (HasFailure()) return;

  // The dump's per-step figures are the ones the trainer reported as events.
  json traj = json::parse(*ReadText(dir + "/trajectory.json"));
  std::vector<json> steps = r.Of(0, "step");
  ASSERT_EQ(traj["steps_run"].size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_EQ(traj["steps_run"][i]["loss"].get<double>(), steps[i]["loss"].get<double>());
    EXPECT_EQ(traj["steps_run"][i]["grad_norm"].get<double>(),
              steps[i]["grad_norm"].get<double>());
  }
  for (int rank = 0; rank < kWorld; ++rank) {
    json idx = json::parse(*ReadText(absl::StrCat(dir, "/tokens_rank_", rank, ".json")));
    EXPECT_EQ(idx["shape"], json({kSteps, 2, kMicro, 33})) << rank;
  }

  auto [code, rep] = RunReference(c.name, spec, dir);
  ASSERT_FALSE(rep.is_null()) << c.name << ": no report (see " << c.name << ".reference.stderr)";
  EXPECT_EQ(code, 0) << c.name << ": " << rep.dump(1);
  EXPECT_TRUE(rep.value("ok", false)) << rep.dump(1);
  EXPECT_EQ(rep["steps"], kSteps);
  EXPECT_EQ(rep["dtype"], c.bf16 ? "bf16" : "fp32");
  // Clipping really happened: the reference's own pre-clip norm exceeded the threshold on at
  // least 2 steps, and stayed below it on at least one.
  int above = 0;
  for (const json& n : rep["ref_grad_norm"]) above += n.get<double>() > kClip ? 1 : 0;
  EXPECT_GE(above, 2) << rep["ref_grad_norm"].dump();
  EXPECT_LT(above, kSteps) << rep["ref_grad_norm"].dump();
  EXPECT_EQ(rep["clipped_steps"], above);
  const double loss_tol = c.bf16 ? 1e-4 : 1e-5, weight_tol = c.bf16 ? 2.5e-2 : 1e-5;
  EXPECT_LE(rep["max_loss_rel"].get<double>(), loss_tol);
  EXPECT_LE(rep["max_weight_abs"].get<double>(), weight_tol);
  if (c.bf16) {
    EXPECT_LE(rep["update_rel"].get<double>(), 0.03);
    EXPECT_LE(rep["weight_p999_abs"].get<double>(), 2e-3);
  }
  // The run trained: the loss fell by more than any tolerance.
  EXPECT_LT(rep["ref_loss"].back().get<double>(), rep["ref_loss"].front().get<double>() - 0.05);
  std::cerr << c.name << ": max loss rel " << rep["max_loss_rel"] << ", grad norm rel "
            << rep["max_grad_norm_rel"] << ", weights max abs " << rep["max_weight_abs"]
            << " (99.9% " << rep["weight_p999_abs"] << "), update rel " << rep["update_rel"]
            << ", ref grad norms "
            << rep["ref_grad_norm"].dump() << "\n";

  if (c.stage != 0 || c.bf16) return;
  // Negative controls (fp32 stage 0 only): a reference told something other than what Loom ran
  // must see the difference.
  for (const auto& [what, ds] :
       std::vector<std::pair<std::string, json>>{
           {"clip", {{"gradient_clipping", kClip * 1.5}}},
           {"beta2", {{"optimizer", {{"type", "AdamW"},
                                     {"params", {{"lr", 3e-3}, {"weight_decay", 0.1},
                                                 {"betas", {0.9, 0.99}}}}}}}}}) {
    Case wrong = c;
    wrong.name = c.name + "_wrong_" + what;
    auto [wcode, wrep] = RunReference(wrong.name, CaseSpec(wrong, ds), dir);
    EXPECT_EQ(wcode, 1) << what << ": " << wrep.dump(1);
    EXPECT_FALSE(wrep.value("ok", true)) << what;
  }
}

// Packed samples (dataset.pack_documents): ZeRO-3, 2 ranks, micro-batch 1, GAS 2, 64-token
// windows of fortunes, each window a packed sample of the documents it covers. The reference
// rebuilds per-document attention, rotary positions and the ignored cross-document targets from
// the recorded position ids alone. Checked not to pass vacuously: the windows hold document
// starts (position 0 inside a window), and the same dump replayed as unpacked windows (the
// trajectory's "pack_documents" turned off) is a mismatch.
TEST(ReferenceTrajectoryPackedTest, PackedDocumentsMatchPyTorchReference) {
  const std::string name = "packed_s3";
  const std::string path = WriteSpec(name, /*micro=*/1, kSteps);
  json spec = json::parse(*ReadText(path));
  spec["dataset"]["pack_documents"] = true;
  spec["training"]["sequence_length"] = 64;
  spec["training"]["eval_every_steps"] = "0";
  spec["deepspeed_config"]["gradient_clipping"] = 0;
  std::ofstream(path) << spec.dump(2);
  const std::string dir = TrajDir(name);
  GangResult r = RunGang(name, path, kWorld, {"--trajectory_dir=" + dir});
  ExpectGangOk(r, name);
  if (HasFailure()) return;

  int starts_inside = 0, windows = 0;
  for (int rank = 0; rank < kWorld; ++rank) {
    std::optional<std::string> raw = ReadText(absl::StrCat(dir, "/positions_rank_", rank, ".bin"));
    ASSERT_TRUE(raw.has_value()) << "positions_rank_" << rank << ".bin";
    ASSERT_EQ(raw->size(), static_cast<size_t>(kSteps * 2 * 1 * 65 * 8)) << rank;
    const int64_t* pos = reinterpret_cast<const int64_t*>(raw->data());
    for (int w = 0; w < kSteps * 2; ++w, ++windows) {
      EXPECT_EQ(pos[w * 65], 0) << "window " << w;
      for (int i = 1; i < 65; ++i) {
        const int64_t p = pos[w * 65 + i];
        EXPECT_TRUE(p == 0 || p == pos[w * 65 + i - 1] + 1) << "window " << w << " token " << i;
        starts_inside += p == 0 ? 1 : 0;
      }
    }
  }
  EXPECT_GE(starts_inside, 4) << "of " << windows << " windows";

  auto [code, rep] = RunReference(name, path, dir);
  ASSERT_FALSE(rep.is_null()) << name << ": no report (see " << name << ".reference.stderr)";
  EXPECT_EQ(code, 0) << rep.dump(1);
  EXPECT_TRUE(rep.value("ok", false)) << rep.dump(1);
  EXPECT_LE(rep["max_loss_rel"].get<double>(), 1e-5);
  EXPECT_LE(rep["max_weight_abs"].get<double>(), 1e-5);
  EXPECT_LT(rep["ref_loss"].back().get<double>(), rep["ref_loss"].front().get<double>() - 0.05);
  std::cerr << name << ": " << starts_inside << " document starts inside " << windows
            << " windows; max loss rel " << rep["max_loss_rel"] << ", weights max abs "
            << rep["max_weight_abs"] << "\n";

  // Negative control: the same windows replayed without the packing.
  json traj = json::parse(*ReadText(dir + "/trajectory.json"));
  traj["pack_documents"] = false;
  std::ofstream(dir + "/trajectory.json") << traj.dump(2);
  auto [wcode, wrep] = RunReference(name + "_unpacked", path, dir);
  EXPECT_EQ(wcode, 1) << wrep.dump(1);
  EXPECT_FALSE(wrep.value("ok", true));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ReferenceTrajectoryTest,
    ::testing::Values(Case{"s0_fp32", 0, false}, Case{"s3_fp32", 3, false},
                      Case{"s0_bf16", 0, true}, Case{"s3_bf16", 3, true}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

TEST(ReferenceTrajectoryErrors, UsedDirectoryIsRefusedNamingTheFlag) {
  const Case c{"reuse", 0, false};
  const std::string spec = CaseSpec(c);
  const std::string dir = TrajDir(c.name);
  GangResult first = RunGang("reuse_a", spec, 1, {"--trajectory_dir=" + dir});
  ExpectGangOk(first, "reuse_a");
  GangResult second = RunGang("reuse_b", spec, 1, {"--trajectory_dir=" + dir});
  ASSERT_FALSE(second.timed_out);
  EXPECT_EQ(second.exit_codes[0], 1);
  std::vector<json> errors = second.Of(0, "error");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0]["message"].get<std::string>().find("--trajectory_dir"), std::string::npos)
      << errors[0].dump();
}

TEST(ReferenceTrajectoryErrors, ReferenceRejectsMissingDumpWithExitTwo) {
  const Case c{"missing", 0, false};
  auto [code, rep] = RunReference(c.name, CaseSpec(c), TrajDir("does_not_exist"));
  EXPECT_EQ(code, 2);
  EXPECT_NE(rep.value("error", "").find("trajectory.json"), std::string::npos) << rep.dump();
}

}  // namespace
