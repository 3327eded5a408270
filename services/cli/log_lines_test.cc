// services/cli/log_lines.h on lines a real loom-trainer wrote (a 2-step, 1-rank run of
// bench/memory_plan_grid.py's z2_n1 job, 2026-12-07): the sentences, what is left out for ranks
// other than 0 and for glog INFO, and that named ranks see everything.
#include "services/cli/log_lines.h"

#include <string>

#include "gtest/gtest.h"

namespace loom::cli {
namespace {

loom::v1::LogLine Line(int rank, const std::string& stream, const std::string& text) {
  loom::v1::LogLine l;
  l.set_rank(rank);
  l.set_stream(stream);
  l.set_text(text);
  return l;
}

constexpr char kStarted[] =
    R"({"started":{"rank":0,"world_size":1,"params":"6491520","zero_stage":2,"partition_bytes":"25966080","offload_optimizer":"none","offload_param":"none","offload_resident_bytes":"0","start_step":"0","param_bytes":"25966080","grad_bytes":"0","optimizer_state_bytes":"51932160","buffer_bytes":"0","cached_bytes":"0","peak_bytes":"77898240","superoffload_copy_bytes":"0","superoffload_casting":"","superoffload_sub_group_size":"0","activation_offload_bytes":"0"}})";
constexpr char kStep[] =
    R"({"step":{"step":"1","loss":5.6529059410095215,"tokens_per_s":1276.063840716288,"step_time_s":0.401233844,"optimizer_s":0.004715791,"comm_bytes":"0","lr":0.001,"grad_norm":13.340354537445888,"loss_scale":1,"skipped":false,"optimizer_step":"1","gathered_bytes_between_steps":"0","param_reads_ahead":"0","peak_gathered_bytes":"0","partition_bytes":"25966080","prefetch_hits":"0","trace_invalidations":"0","on_demand_fetches":"0","comm_s":0,"comm_elements":"4","data_s":7.8376e-05,"param_bytes":"25966080","grad_bytes":"25966080","optimizer_state_bytes":"51932160","buffer_bytes":"0","cached_bytes":"0","peak_bytes":"103864320","activation_offload_bytes":"0","optimizer_rollbacks":"0","speculated_sub_groups":"0","speculation_hits":"0","rollbacks_overflow":"0","rollbacks_clip":"0","replays":"0","speculation_paused":"0","speculation_no_buffer":"0","optimizer_overlap_fraction":0,"optimizer_work_s":0}})";

TEST(LogLinesTest, TrainerEventsBecomeSentences) {
  const LogRendering how{/*total_steps=*/300, /*ranks_named=*/false};
  auto at0 = [&](const std::string& text) {
    return ReadableLogLine(Line(0, "stdout", text), how).value_or("<left out>");
  };
  EXPECT_EQ(at0(kStep),
            "[rank 0] step 1/300  loss 5.6529  lr 1.00e-03  grad norm 13.340  1,276 tokens/s  "
            "0.40 s  peak 99.1 MiB");
  EXPECT_EQ(at0(kStarted),
            "[rank 0] started: 1 rank, 6.5M parameters, ZeRO stage 2 (partition 24.8 MiB), from "
            "step 0");
  EXPECT_EQ(at0(R"({"eval":{"step":"2","loss":4.2454419136047363}})"),
            "[rank 0] held-out loss 4.2454 at step 2");
  EXPECT_EQ(at0(R"({"checkpoint":{"step":"2","dir":"/tmp/grid/ck1/step_00000002"}})"),
            "[rank 0] checkpoint of step 2 committed: /tmp/grid/ck1/step_00000002");
  EXPECT_EQ(at0(R"({"done":{"step":"2","initial_eval_loss":5.6417889595031738,"final_eval_loss":4.2454419136047363,"collective_count":"10","collective_hash":"e4e15b1ce4f2b527"}})"),
            "[rank 0] done at step 2: held-out loss 5.6418 -> 4.2454");
  EXPECT_EQ(at0(R"({"warning":{"message":"deepspeed_config.gradient_clipping: not given"}})"),
            "[rank 0] warning: deepspeed_config.gradient_clipping: not given");
  EXPECT_EQ(at0(R"({"stopped":{"step":"7","checkpoint_step":"7"}})"),
            "[rank 0] stopped at step 7 (final checkpoint of step 7)");
  EXPECT_EQ(at0(R"({"process_start":{"rss_bytes":"362921984"}})"), "<left out>");
  EXPECT_EQ(at0(R"({"rendezvous":{"port":41234}})"), "<left out>");
  // Not an event: as it is.
  EXPECT_EQ(at0("plain text"), "[rank 0] plain text");
  EXPECT_EQ(at0(R"({"not_an_event": 1})"), R"([rank 0] {"not_an_event": 1})");
}

TEST(LogLinesTest, OtherRanksAndInfoLogsAreLeftOutUnlessRanksAreNamed) {
  const LogRendering by_default{0, false};
  EXPECT_FALSE(ReadableLogLine(Line(1, "stdout", kStep), by_default).has_value());
  EXPECT_EQ(*ReadableLogLine(Line(1, "stdout", R"({"error":{"message":"CUDA out of memory"}})"),
                             by_default),
            "[rank 1] error: CUDA out of memory");
  const std::string info =
      "I20261207 21:59:10.739727 31816 engine.cc:118] step 1/2 loss 5.65291 lr 0.001";
  const std::string warning =
      "W20261207 21:59:10.739727 31816 trainer_setup.cc:90] low disk space";
  EXPECT_FALSE(ReadableLogLine(Line(0, "stderr", info), by_default).has_value());
  EXPECT_EQ(*ReadableLogLine(Line(0, "stderr", warning), by_default), "[rank 0] " + warning);
  EXPECT_EQ(*ReadableLogLine(Line(1, "stderr", "Traceback (most recent call last):"), by_default),
            "[rank 1] Traceback (most recent call last):");

  const LogRendering named{0, true};
  EXPECT_EQ(*ReadableLogLine(Line(1, "stdout", kStep), named),
            "[rank 1] step 1  loss 5.6529  lr 1.00e-03  grad norm 13.340  1,276 tokens/s  0.40 s  "
            "peak 99.1 MiB");
  EXPECT_EQ(*ReadableLogLine(Line(1, "stderr", info), named), "[rank 1] " + info);
  EXPECT_EQ(*ReadableLogLine(Line(1, "stdout", R"({"rendezvous":{"port":41234}})"), named),
            "[rank 1] rendezvous on port 41234");
}

}  // namespace
}  // namespace loom::cli
