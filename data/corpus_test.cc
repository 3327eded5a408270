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

// Packed samples: the recorded document starts are the byte offsets of the documents' first
// bytes in the concatenated stream (reference: the document texts themselves), and
// PackedPositions restarts at 0 exactly there and at the window's first token.
TEST(PackedPositionsTest, TextDocumentStartsAndPositionsRestartAtEachDocument) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/packed.txt";
  {
    std::ofstream f(path);
    for (int i = 0; i < 60; ++i) {
      std::string t = "doc " + std::to_string(i) + (i % 3 == 0 ? " long line\n" : "\n");
      f << t << "\n";
    }
  }
  CorpusOptions o;
  o.path = path;
  o.holdout_fraction = 0.2;
  absl::StatusOr<Corpus> c = LoadCorpus(o);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(static_cast<int64_t>(c->train_document_starts.size()), c->train_documents);
  ASSERT_EQ(static_cast<int64_t>(c->heldout_document_starts.size()), c->heldout_documents);
  // Every start is where a document's text begins: the byte before it ends the previous
  // paragraph (a newline), the bytes from it spell "doc ".
  for (int64_t s : c->train_document_starts) {
    EXPECT_EQ(c->train.Slice(s, 4), (std::vector<int64_t>{'d', 'o', 'c', ' '})) << s;
    if (s > 0) {
      EXPECT_EQ(c->train[s - 1], '\n') << s;
    }
  }
  EXPECT_EQ(c->train_document_starts.front(), 0);

  // A window from the middle of the second training document across the next two.
  const int64_t d1 = c->train_document_starts[1], d2 = c->train_document_starts[2],
                d3 = c->train_document_starts[3], d4 = c->train_document_starts[4];
  const int64_t start = d1 + 2, n = d4 - start + 3;
  const std::vector<int64_t> pos = PackedPositions(c->train, TrainBoundaries(*c), start, n);
  ASSERT_EQ(static_cast<int64_t>(pos.size()), n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t at = start + i;
    const int64_t doc_start = at >= d4 ? d4 : at >= d3 ? d3 : at >= d2 ? d2 : start;
    EXPECT_EQ(pos[i], at - doc_start) << "token " << at;
  }
  // A window inside one document counts up from 0; an empty window is empty.
  const std::vector<int64_t> inside = PackedPositions(c->train, TrainBoundaries(*c), d1, 3);
  EXPECT_EQ(inside, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_TRUE(PackedPositions(c->train, TrainBoundaries(*c), 0, 0).empty());
  // Held-out windows use the held-out side's starts.
  const int64_t h1 = c->heldout_document_starts[1];
  const std::vector<int64_t> held =
      PackedPositions(c->heldout, HeldOutBoundaries(*c), h1 - 1, 3);
  EXPECT_EQ(held, (std::vector<int64_t>{0, 0, 1}));
}

// Regression: an empty document records the same start as the next one; the walk must not stop
// restarting positions after such a repeated start.
TEST(PackedPositionsTest, RepeatedStartsOfEmptyDocumentsAreSkipped) {
  const TokenStream stream(std::vector<int32_t>{10, 11, 12, 20, 21, 30, 31, 32, 40});
  const std::vector<int64_t> starts = {0, 3, 3, 5, 5, 5, 8};
  DocumentBoundaries b;
  b.starts = &starts;
  EXPECT_EQ(PackedPositions(stream, b, 0, 9),
            (std::vector<int64_t>{0, 1, 2, 0, 1, 0, 1, 2, 0}));
  EXPECT_EQ(PackedPositions(stream, b, 3, 6), (std::vector<int64_t>{0, 1, 0, 1, 2, 0}));
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
