// WorkerMetrics, checked by scraping the registry's text exposition: per-rank series carry the
// job id and attempt, exist from a rank's first step until the worker forgets it, and turn the
// trainer's cumulative counts into counter increments per rank process.
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

loom::v1::RankStatus Rank(const std::string& job, int attempt, int rank, loom::v1::RankState state,
                          int64_t step, double loss) {
  loom::v1::RankStatus st;
  st.set_job_id(job);
  st.set_attempt(attempt);
  st.set_rank(rank);
  st.set_state(state);
  st.mutable_progress()->set_step(step);
  st.mutable_progress()->set_loss(loss);
  return st;
}


TEST(WorkerMetricsTest, CumulativeCountsOfTwoRankProcessesNeverMix) {
  prometheus::Registry registry;
  WorkerMetrics m(registry);
  // A succeeded rank 0 of job-a (final counts 10/7/3) and a running rank 0 of job-b, recorded
  // on every tick as the daemon does: each counts once, into its own series.
  const loom::v1::RankStatus a = Rank("job-a", 1, 0, loom::v1::RANK_STATE_SUCCEEDED, 5, 3.0);
  loom::v1::RankStatus b = Rank("job-b", 1, 0, loom::v1::RANK_STATE_RUNNING, 2, 4.0);
  for (int tick = 0; tick < 3; ++tick) {
    m.RecordRanks({a, b}, 2);
    m.RecordRankStats(a, SuperOffload(100, 10, 7, 3));
    m.RecordRankStats(b, SuperOffload(200, 4, 4, 0));
  }
  m.RecordRanks({a, b}, 2);
  m.RecordRankStats(b, SuperOffload(200, 6, 5, 1));
  const std::string text = Scrape(registry);
  const std::string ja = "{attempt=\"1\",job_id=\"job-a\",rank=\"0\"";
  const std::string jb = "{attempt=\"1\",job_id=\"job-b\",rank=\"0\"";
  for (const std::string& line :
       {"loom_trainer_superoffload_speculated_sub_groups_total" + ja + "} 10\n",
        "loom_trainer_superoffload_speculated_sub_groups_total" + jb + "} 6\n",
        "loom_trainer_superoffload_speculation_hits_total" + ja + "} 7\n",
        "loom_trainer_superoffload_speculation_hits_total" + jb + "} 5\n",
        "loom_trainer_superoffload_rollbacks_total" + ja + ",reason=\"clip\"} 3\n",
        "loom_trainer_superoffload_replays_total" + jb + ",reason=\"clip\"} 1\n",
        "loom_trainer_superoffload_speculation_paused_sub_groups_total" + ja + "} 6\n",
        "loom_trainer_superoffload_speculation_no_buffer_sub_groups_total" + jb + "} 3\n",
        "loom_trainer_superoffload_rollbacks_total" + jb + ",reason=\"overflow\"} 0\n",
        "loom_trainer_optimizer_rollbacks_total" + ja + "} 3\n",
        "loom_trainer_superoffload_speculation_hit_ratio" + jb + "} 0.8333333333333334\n",
        "loom_trainer_superoffload_optimizer_overlap_ratio" + ja + "} 0.5\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << " missing:\n" << text;
  }
}

TEST(WorkerMetricsTest, NoSuperOffloadSeriesWithoutSuperOffload) {
  prometheus::Registry registry;
  WorkerMetrics m(registry);
  const loom::v1::RankStatus r = Rank("job-a", 1, 0, loom::v1::RANK_STATE_RUNNING, 1, 5.0);
  m.RecordRanks({r}, 1);
  RankStats s;
  s.process_id = 1;
  s.superoffload_speculated = 5;  // ignored: not a SuperOffload rank
  m.RecordRankStats(r, s);
  const std::string text = Scrape(registry);
  EXPECT_EQ(text.find("loom_trainer_superoffload_speculated_sub_groups_total{"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("loom_trainer_optimizer_rollbacks_total{attempt=\"1\",job_id=\"job-a\","
                      "rank=\"0\"} 0\n"),
            std::string::npos)
      << text;
}

// Issue 53: throughput is a counter to rate(): the global tokens of each step (tokens/s times
// step seconds), counted once however often the daemon records the same numbers.
TEST(WorkerMetricsTest, TokensAreACounter) {
  prometheus::Registry registry;
  WorkerMetrics m(registry);
  const loom::v1::RankStatus r = Rank("job-a", 1, 0, loom::v1::RANK_STATE_RUNNING, 2, 5.0);
  RankStats s;
  s.process_id = 7;
  s.tokens = 4096;
  for (int tick = 0; tick < 3; ++tick) {
    m.RecordRanks({r}, 1);
    m.RecordRankStats(r, s);
  }
  s.tokens = 6144;
  m.RecordRankStats(r, s);
  EXPECT_NE(Scrape(registry).find(
                "loom_trainer_tokens_total{attempt=\"1\",job_id=\"job-a\",rank=\"0\"} 6144\n"),
            std::string::npos)
      << Scrape(registry);
}

// Issue 53: an ended rank does not keep "aging": its timestamp gauges go when it stops running
// (its last values stay until the worker forgets it).
TEST(WorkerMetricsTest, TimestampsOnlyWhileTheRankRuns) {
  prometheus::Registry registry;
  WorkerMetrics m(registry);
  loom::v1::RankStatus r = Rank("job-a", 1, 0, loom::v1::RANK_STATE_RUNNING, 0, 0);
  RankStats s;
  s.process_id = 7;
  s.last_step_unix_seconds = 1000;  // the rank's start, before its first step
  s.last_checkpoint_unix_seconds = 1000;
  m.RecordRanks({r}, 1);
  m.RecordRankStats(r, s);
  std::string text = Scrape(registry);
  const std::string key = "{attempt=\"1\",job_id=\"job-a\",rank=\"0\"} 1000\n";
  EXPECT_NE(text.find("loom_trainer_last_step_timestamp_seconds" + key), std::string::npos) << text;
  EXPECT_NE(text.find("loom_trainer_last_checkpoint_timestamp_seconds" + key), std::string::npos);
  r = Rank("job-a", 1, 0, loom::v1::RANK_STATE_FAILED, 3, 4.0);
  m.RecordRanks({r}, 1);
  m.RecordRankStats(r, s);
  text = Scrape(registry);
  EXPECT_EQ(text.find("loom_trainer_last_step_timestamp_seconds{"), std::string::npos) << text;
  EXPECT_EQ(text.find("loom_trainer_last_checkpoint_timestamp_seconds{"), std::string::npos);
  EXPECT_NE(text.find("loom_trainer_step{attempt=\"1\",job_id=\"job-a\",rank=\"0\"} 3\n"),
            std::string::npos);
}

// Issue 53: two jobs' rank 0 on one worker (a 2-slot worker, or a GPU node's eight ranks) never
// share a series: each carries its job id and attempt.
TEST(WorkerMetricsTest, TwoJobsOnOneWorkerNeverShareASeries) {
  prometheus::Registry registry;
  WorkerMetrics m(registry);
  m.RecordRanks({Rank("job-a", 1, 0, loom::v1::RANK_STATE_RUNNING, 40, 2.4041),
                 Rank("job-b", 2, 0, loom::v1::RANK_STATE_RUNNING, 7, 2.4835)},
                2);
  const std::string text = Scrape(registry);
  for (const char* line :
       {"loom_trainer_loss{attempt=\"1\",job_id=\"job-a\",rank=\"0\"} 2.4041\n",
        "loom_trainer_loss{attempt=\"2\",job_id=\"job-b\",rank=\"0\"} 2.4835\n",
        "loom_trainer_step{attempt=\"1\",job_id=\"job-a\",rank=\"0\"} 40\n",
        "loom_trainer_step{attempt=\"2\",job_id=\"job-b\",rank=\"0\"} 7\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << " missing:\n" << text;
  }
  EXPECT_EQ(text.find("loom_trainer_loss{rank=\"0\"}"), std::string::npos) << text;
}

// Issue 53: nothing before a rank's first step (no 0 loss/step/throughput at an attempt's start)
// and nothing once the worker no longer reports the rank.
TEST(WorkerMetricsTest, RankSeriesExistFromTheFirstStepUntilTheRankIsGone) {
  prometheus::Registry registry;
  WorkerMetrics m(registry);
  m.RecordRanks({Rank("job-a", 1, 0, loom::v1::RANK_STATE_RUNNING, 0, 0)}, 1);
  std::string text = Scrape(registry);
  EXPECT_EQ(text.find("loom_trainer_step{"), std::string::npos) << text;
  EXPECT_EQ(text.find("loom_trainer_loss{"), std::string::npos) << text;
  EXPECT_EQ(text.find("loom_trainer_tokens_per_second{"), std::string::npos) << text;
  m.RecordRanks({Rank("job-a", 1, 0, loom::v1::RANK_STATE_RUNNING, 1, 5.5)}, 1);
  const std::string a = "{attempt=\"1\",job_id=\"job-a\",rank=\"0\"}";
  EXPECT_NE(Scrape(registry).find("loom_trainer_step" + a + " 1\n"), std::string::npos);
  // The succeeded rank keeps its final values while the worker still reports it ...
  m.RecordRanks({Rank("job-a", 1, 0, loom::v1::RANK_STATE_SUCCEEDED, 9, 3.25)}, 1);
  EXPECT_NE(Scrape(registry).find("loom_trainer_loss" + a + " 3.25\n"), std::string::npos);
  // ... and every series of it goes when the worker forgets it.
  m.RecordRanks({}, 1);
  text = Scrape(registry);
  for (const char* name : {"loom_trainer_step{", "loom_trainer_loss{",
                           "loom_trainer_tokens_per_second{", "loom_trainer_last_checkpoint_step{"}) {
    EXPECT_EQ(text.find(name), std::string::npos) << name << " left:\n" << text;
  }
}

}  // namespace
}  // namespace loom::worker
