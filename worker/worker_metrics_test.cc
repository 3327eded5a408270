// WorkerMetrics' cumulative-to-counter conversion (the trainer reports counts since its process
// started; Prometheus wants counters): one process's repeated samples count once, a second
// process of the same rank number (a new attempt, or a running rank next to a succeeded one of
// an earlier job, which the daemon records on every tick) adds its own counts without the two
// mixing. Checked by scraping the registry's text exposition.
#include "worker/worker_metrics.h"

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <string>

#include "gtest/gtest.h"

namespace loom::worker {
namespace {

std::string Scrape(prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

RankStats SuperOffload(int64_t pid, double speculated, double hits, double clip) {
  RankStats s;
  s.process_id = pid;
  s.superoffload = true;
  s.superoffload_speculated = speculated;
  s.superoffload_hits = hits;
  s.superoffload_rollbacks_clip = clip;
  s.superoffload_replays = clip;
  s.superoffload_speculation_paused = 2 * clip;
  s.superoffload_speculation_no_buffer = 3 * clip;
  s.optimizer_rollbacks = clip;
  s.superoffload_overlap_fraction = 0.5;
  return s;
}

TEST(WorkerMetricsTest, CumulativeCountsOfTwoProcessesOfOneRankNeverMix) {
  prometheus::Registry registry;
  WorkerMetrics m(registry);
  // A succeeded process (pid 100, final counts 10/7/3) and a running one (pid 200), recorded
  // alternately as the daemon does on each tick.
  for (int tick = 0; tick < 3; ++tick) {
    m.RecordRankStats(0, SuperOffload(100, 10, 7, 3));
    m.RecordRankStats(0, SuperOffload(200, 4, 4, 0));
  }
  m.RecordRankStats(0, SuperOffload(200, 6, 5, 1));
  const std::string text = Scrape(registry);
  for (const char* line :
       {"loom_trainer_superoffload_speculated_sub_groups_total{rank=\"0\"} 16\n",
        "loom_trainer_superoffload_speculation_hits_total{rank=\"0\"} 12\n",
        "loom_trainer_superoffload_rollbacks_total{rank=\"0\",reason=\"clip\"} 4\n",
        "loom_trainer_superoffload_replays_total{rank=\"0\",reason=\"clip\"} 4\n",
        "loom_trainer_superoffload_speculation_paused_sub_groups_total{rank=\"0\"} 8\n",
        "loom_trainer_superoffload_speculation_no_buffer_sub_groups_total{rank=\"0\"} 12\n",
        "loom_trainer_superoffload_rollbacks_total{rank=\"0\",reason=\"overflow\"} 0\n",
        "loom_trainer_optimizer_rollbacks_total{rank=\"0\"} 4\n",
        // The gauges are the last recorded process's.
        "loom_trainer_superoffload_speculation_hit_rate{rank=\"0\"} 0.8333333333333334\n",
        "loom_trainer_superoffload_optimizer_overlap_fraction{rank=\"0\"} 0.5\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << " missing:\n" << text;
  }
}

TEST(WorkerMetricsTest, NoSuperOffloadSeriesWithoutSuperOffload) {
  prometheus::Registry registry;
  WorkerMetrics m(registry);
  RankStats s;
  s.process_id = 1;
  s.superoffload_speculated = 5;  // ignored: not a SuperOffload rank
  m.RecordRankStats(0, s);
  const std::string text = Scrape(registry);
  EXPECT_EQ(text.find("loom_trainer_superoffload_speculated_sub_groups_total{"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("loom_trainer_optimizer_rollbacks_total{rank=\"0\"} 0\n"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace loom::worker
