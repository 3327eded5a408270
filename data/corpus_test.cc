#include "data/corpus.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::data {
namespace {

using ::loom::testing::StatusIs;

TEST(SplitFortuneRecordsTest, SplitsOnPercentLines) {
  std::vector<std::string> r = SplitFortuneRecords("a b\nc\n%\nd\n%\n%\ne\n");
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0], "a b\nc\n");
  EXPECT_EQ(r[1], "d\n");
  EXPECT_EQ(r[2], "e\n");
  // "%" inside a line is text, not a separator.
  r = SplitFortuneRecords("100% sure\n%\n");
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0], "100% sure\n");
}

TEST(LoadCorpusTest, FortunesSplitIsDeterministicAndDisjoint) {
  CorpusOptions o;
  absl::StatusOr<Corpus> a = LoadCorpus(o);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<Corpus> b = LoadCorpus(o);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->train, b->train);
  EXPECT_EQ(a->heldout, b->heldout);
  // About 2.8 MB of text (the .dat index files are excluded); ~5% held out.
  const double total = a->train.size() + a->heldout.size();
  EXPECT_GT(total, 1.5e6);
  EXPECT_LT(total, 3.0e6);
  const double frac = static_cast<double>(a->heldout_documents) /
                      (a->heldout_documents + a->train_documents);
  EXPECT_GT(frac, 0.03);
  EXPECT_LT(frac, 0.07);
  EXPECT_GT(a->train_documents, 5000);
}

TEST(LoadCorpusTest, SingleTextFileAndErrors) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/corpus.txt";
  {
    std::ofstream f(path);
    for (int i = 0; i < 200; ++i) f << "paragraph " << i << " text\nmore\n\n";
  }
  CorpusOptions o;
  o.path = path;
  o.holdout_fraction = 0.2;
  absl::StatusOr<Corpus> c = LoadCorpus(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train_documents + c->heldout_documents, 200);

  o.holdout_fraction = 0.7;
  c = LoadCorpus(o);
  EXPECT_THAT(c, StatusIs(absl::StatusCode::kInvalidArgument, "dataset.holdout_fraction"));

  o.holdout_fraction = 0.05;
  o.path = path + ".missing";
  c = LoadCorpus(o);
  EXPECT_THAT(c, StatusIs(absl::StatusCode::kNotFound, o.path));
}

TEST(CorpusTest, FifoOrDeviceAsDatasetIsRefusedWithoutBlocking) {
  const std::string fifo = std::string(getenv("TEST_TMPDIR")) + "/corpus.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  CorpusOptions o;
  o.path = fifo;  // ReadFile would block forever waiting for a writer
  absl::StatusOr<Corpus> c = LoadCorpus(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
  o.path = "/dev/zero";  // ReadFile would never return
  c = LoadCorpus(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
}

TEST(WindowTest, TrainWindowsDependOnlyOnSeedStepAndGlobalIndex) {
  const int64_t len = 1000, window = 33;
  for (int64_t s = 0; s < 50; ++s) {
    int64_t start = TrainWindowStart(42, 3, 1, s, len, window);
    EXPECT_GE(start, 0);
    EXPECT_LE(start + window, len);
    EXPECT_EQ(start, TrainWindowStart(42, 3, 1, s, len, window));
  }
  EXPECT_NE(TrainWindowStart(42, 3, 1, 0, 1 << 20, window),
            TrainWindowStart(43, 3, 1, 0, 1 << 20, window));
  EXPECT_NE(TrainWindowStart(42, 3, 1, 0, 1 << 20, window),
            TrainWindowStart(42, 4, 1, 0, 1 << 20, window));
  EXPECT_EQ(EvalWindowStart(0, 5, 100, 20), 0);
  EXPECT_EQ(EvalWindowStart(4, 5, 100, 20), 80);
  EXPECT_EQ(EvalWindowStart(2, 5, 100, 20), 40);
}

}  // namespace
}  // namespace loom::data
