// Non-finite values through the engine's own event path (trainer_events_test checks protobuf's
// printer and parser only): a real 1-rank loom-trainer whose step events are built by the engine
// (worker/engine/trainer_event_builders.cc) and printed by loom-trainer (TrainerEventLine).
//   * Step 1: rank 0 injects +inf into one gradient element (--test_inject_inf_grad_steps=1,
//     fp32: no overflow check), so the global gradient norm sqrt(sum g^2) is +inf.
//   * AdamW with lr 3e37 and weight decay 0.1 (the largest lr whose step size lr / (1 - beta1)
//     still converts to float): each step multiplies every weight by 1 - lr * 0.1 = -3e36, so
//     after step 1 the weights are ~1e34-1e36 and after step 2 every non-zero weight overflows
//     to +-inf. Step 3's forward (RMSNorm of +-inf is inf * 0 = NaN in IEEE arithmetic) and so
//     its loss, and the final held-out loss, are NaN.
// On stdout these must be the JSON mapping's strings "Infinity" and "NaN" (never 0 or null), and
// read back as +inf and NaN by the worker's parser (ParseTrainerEventLine).
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "worker/trainer/gang_test_util.h"
#include "worker/trainer/trainer_events.h"

namespace {

using namespace loom::trainer_test;  // NOLINT: test helpers

// Runs one rank to its exit (killed after the deadline); its stdout lines and exit code.
struct RankRun {
  std::vector<std::string> lines;
  int exit_code = -1;
};
RankRun RunOneRank(const std::string& name, const std::string& spec,
               const std::vector<std::string>& extra) {
  std::vector<std::string> args = {TrainerPath(), "--spec=" + spec, "--rank=0", "--world_size=1",
                                   "--master_port=0"};
  args.insert(args.end(), extra.begin(), extra.end());
  Child c = Spawn(args, TmpDir() + "/" + name + ".rank0.stderr");
  const auto deadline = Clock::now() + std::chrono::seconds(kDeadlineSeconds);
  std::string out;
  bool eof = false;
  while (!eof && Clock::now() < deadline) {
    const int ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    pollfd p{c.out_fd, POLLIN, 0};
    if (poll(&p, 1, std::max(ms, 1)) <= 0) continue;
    char buf[65536];
    const ssize_t n = read(c.out_fd, buf, sizeof(buf));
    if (n <= 0) {
      eof = true;
    } else {
      out.append(buf, n);
    }
  }
  if (!eof) {
    kill(c.pid, SIGKILL);
    ADD_FAILURE() << name << ": no exit within " << kDeadlineSeconds << " s; killed";
  }
  close(c.out_fd);
  int status = 0;
  waitpid(c.pid, &status, 0);
  RankRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  return r;
}

// The raw stdout line of the first event of `kind` (e.g. "step") whose message has "step": s.
std::string LineOf(const RankRun& r, const std::string& kind, int64_t step) {
  for (const std::string& line : r.lines) {
    absl::StatusOr<loom::TrainerEvent> ev = loom::trainer::ParseTrainerEventLine(line, false);
    if (!ev.ok()) continue;
    const json flat = FlatEventJson(*ev);
    if (flat["event"] == kind && flat.contains("step") && flat["step"] == step) return line;
  }
  return "";
}

TEST(TrainerEventsEngineTest, NonFiniteLossAndGradNormReachStdoutAsTheMappingsStrings) {
  json spec = json::parse(*ReadText(WriteSpec("nonfinite", /*micro=*/2, /*steps=*/3)));
  spec["deepspeed_config"].erase("scheduler");  // the constant lr below
  spec["deepspeed_config"]["optimizer"] = {{"type", "AdamW"},
                                           {"params", {{"lr", 3e37}, {"weight_decay", 0.1}}}};
  const std::string path = TmpDir() + "/nonfinite.spec.json";
  std::ofstream(path) << spec.dump(2);
  const RankRun r = RunOneRank("nonfinite", path, {"--test_inject_inf_grad_steps=1"});
  std::string all;
  for (const std::string& l : r.lines) all += l + "\n";
  ASSERT_EQ(r.exit_code, 0) << all << "(see nonfinite.rank0.stderr)";

  // Step 1: a finite loss, the injected inf in the gradient norm.
  const std::string step1 = LineOf(r, "step", 1);
  ASSERT_FALSE(step1.empty()) << all;
  const json j1 = json::parse(step1);  // plain JSON: the strings are JSON strings
  EXPECT_EQ(j1["step"]["grad_norm"], "Infinity") << step1;
  ASSERT_TRUE(j1["step"]["loss"].is_number()) << step1;
  EXPECT_TRUE(std::isfinite(j1["step"]["loss"].get<double>())) << step1;
  EXPECT_GT(j1["step"]["loss"].get<double>(), 0) << step1;

  // Step 3 and the final evaluation: NaN.
  const std::string step3 = LineOf(r, "step", 3);
  ASSERT_FALSE(step3.empty()) << all;
  EXPECT_EQ(json::parse(step3)["step"]["loss"], "NaN") << step3;
  const std::string eval3 = LineOf(r, "eval", 3);
  ASSERT_FALSE(eval3.empty()) << all;
  EXPECT_EQ(json::parse(eval3)["eval"]["loss"], "NaN") << eval3;

  // The worker's reader gets the values back, strict and lenient alike.
  for (bool lenient : {false, true}) {
    absl::StatusOr<loom::TrainerEvent> a = loom::trainer::ParseTrainerEventLine(step1, lenient);
    absl::StatusOr<loom::TrainerEvent> b = loom::trainer::ParseTrainerEventLine(step3, lenient);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(a->step().grad_norm(), std::numeric_limits<double>::infinity());
    EXPECT_TRUE(std::isnan(b->step().loss()));
  }
}

}  // namespace
