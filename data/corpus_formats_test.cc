// LoadCorpus with the data formats and tokenizers of issue 17: JSONL, SentencePiece, flat token
// files, and the bad-input errors (each names the file and the line or byte offset).
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "data/corpus.h"

namespace loom::data {
namespace {

using ::loom::testing::StatusIs;

std::string TmpDir(const std::string& name) {
  std::string d = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  ::mkdir(d.c_str(), 0755);
  return d;
}

// One JSON line per fortune record of Debian's "computers" file: real text, escaped by hand
// (the reader under test is nlohmann::json; this writer is independent of it).
std::string FortunesJsonl(const std::string& dir) {
  absl::StatusOr<std::string> text = ReadFile("/usr/share/games/fortunes/computers");
  EXPECT_TRUE(text.ok());
  const std::string path = dir + "/fortunes.jsonl";
  std::ofstream f(path);
  for (const std::string& r : SplitFortuneRecords(*text)) {
    f << "{\"id\": 1, \"body\": \"";
    for (unsigned char c : r) {
      if (c == '"' || c == '\\') {
        f << '\\' << c;
      } else if (c == '\n') {
        f << "\\n";
      } else if (c == '\t') {
        f << "\\t";
      } else if (c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        f << buf;
      } else {
        f << c;
      }
    }
    f << "\"}\n";
  }
  return path;
}

CorpusOptions SentencePieceJsonl(const std::string& path, const std::string& record_dir) {
  CorpusOptions o;
  o.path = path;
  o.format = "jsonl";
  o.text_field = "body";
  o.tokenizer.kind = "sentencepiece";
  o.tokenizer.vocab_size = 1000;
  o.vocab_size = 1024;
  o.bos_token_id = 1;
  o.eos_token_id = 2;
  o.model_max_length = 128;
  o.record_dir = record_dir;
  return o;
}

TEST(CorpusFormatsTest, JsonlWithATrainedSentencePieceTokenizer) {
  const std::string dir = TmpDir("jsonl_sp");
  const std::string path = FortunesJsonl(dir);
  absl::StatusOr<Corpus> c = LoadCorpus(SentencePieceJsonl(path, dir + "/ckpt"));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_NE(c->tokenizer, nullptr);
  EXPECT_EQ(c->tokenizer->vocab_size(), 1000);
  EXPECT_GT(c->train_documents, 500);
  EXPECT_GT(c->heldout_documents, 10);
  // Every document ends with the EOS id; ids are in the vocabulary.
  int64_t eos = 0;
  for (int64_t i = 0; i < c->train.size(); ++i) {
    ASSERT_LT(c->train[i], 1000);
    eos += c->train[i] == 2;
  }
  EXPECT_EQ(eos, c->train_documents);
  EXPECT_EQ(c->train[c->train.size() - 1], 2);
  // The first training document (record 0 unless held out) decodes back to its text.
  std::vector<int32_t> first;
  for (int64_t i = 0; c->train[i] != 2; ++i) first.push_back(static_cast<int32_t>(c->train[i]));
  absl::StatusOr<std::string> text = c->tokenizer->Decode(first);
  ASSERT_TRUE(text.ok());
  EXPECT_FALSE(text->empty());
  // Recorded with the job, and a second load (a restart) reuses it: same tokens.
  struct stat st;
  EXPECT_EQ(::stat((dir + "/ckpt/tokenizer.model").c_str(), &st), 0);
  EXPECT_EQ(::stat((dir + "/ckpt/tokenizer_config.json").c_str(), &st), 0);
  absl::StatusOr<Corpus> again = LoadCorpus(SentencePieceJsonl(path, dir + "/ckpt"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->train == c->train);
  EXPECT_TRUE(again->heldout == c->heldout);
}

TEST(CorpusFormatsTest, TokenizerMustFitModelConfig) {
  const std::string dir = TmpDir("jsonl_fit");
  const std::string path = FortunesJsonl(dir);
  CorpusOptions o = SentencePieceJsonl(path, dir + "/ckpt");
  o.vocab_size = 512;
  EXPECT_THAT(LoadCorpus(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                      "model.config.vocab_size: 512 < the tokenizer's 1000"));
  o.vocab_size = 1024;
  o.bos_token_id = 5;
  EXPECT_THAT(LoadCorpus(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                      "model.config.bos_token_id: 5 but the tokenizer's bos id is 1"));
}

TEST(CorpusFormatsTest, InvalidUtf8TextWithSentencePieceNamesFileAndOffset) {
  const std::string dir = TmpDir("bad_utf8");
  {
    std::ofstream f(dir + "/a.txt");
    f << "fine text\n%\nmore\n%\n";
    std::ofstream g(dir + "/b.txt");
    g << "ok\n%\nbad \xff byte\n%\n";
  }
  CorpusOptions o;
  o.path = dir;
  o.tokenizer.kind = "sentencepiece";
  o.tokenizer.vocab_size = 100;
  EXPECT_THAT(LoadCorpus(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                      "dataset.path: " + dir + "/b.txt: invalid UTF-8 at byte offset 9"));
}

TEST(CorpusFormatsTest, JsonlErrorsNameFileAndLine) {
  const std::string dir = TmpDir("jsonl_bad");
  const std::string path = dir + "/d.jsonl";
  std::ofstream(path) << "{\"text\": \"a\"}\n{\"text\": \"b\", \n";
  CorpusOptions o;
  o.path = path;
  o.format = "jsonl";
  EXPECT_THAT(LoadCorpus(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                      "dataset.path: " + path + ":2: invalid JSON"));
  std::ofstream(path) << "{\"text\": \"a\"}\n{\"text\": \"b\"}\n{\"title\": \"c\"}\n";
  EXPECT_THAT(LoadCorpus(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                      path + ":3: no string field \"text\""));
}

TEST(CorpusFormatsTest, JsonlEmptyAfterTheHoldoutSplitNamesTheFile) {
  const std::string dir = TmpDir("jsonl_one");
  const std::string path = dir + "/one.jsonl";
  std::ofstream(path) << "{\"text\": \"the only document\"}\n";
  CorpusOptions o;
  o.path = path;
  o.format = "jsonl";
  EXPECT_THAT(LoadCorpus(o), StatusIs(absl::StatusCode::kFailedPrecondition,
                                      "dataset.path: " + path + " has 1 documents; the "
                                      "train/held-out split left one side empty"));
}

void WriteU16(const std::string& path, const std::vector<uint16_t>& ids) {
  std::ofstream f(path, std::ios::binary);
  for (uint16_t id : ids) {
    f.put(static_cast<char>(id & 0xff));
    f.put(static_cast<char>(id >> 8));
  }
}

CorpusOptions Tokens(const std::string& path) {
  CorpusOptions o;
  o.path = path;
  o.format = "tokens";
  o.token_dtype = "uint16";
  o.vocab_size = 1000;
  o.eos_token_id = 2;
  o.holdout_fraction = 0.25;
  return o;
}

// 8 documents of 5 tokens each (ids 100 + 10 d + j, j < 4, then EOS 2) = 40 tokens, at `path`.
void WriteEightDocuments(const std::string& path) {
  std::vector<uint16_t> ids;
  for (int d = 0; d < 8; ++d) {
    for (int j = 0; j < 4; ++j) ids.push_back(static_cast<uint16_t>(100 + d * 10 + j));
    ids.push_back(2);
  }
  WriteU16(path, ids);
}

TEST(CorpusFormatsTest, TokenFilesSplitAtADocumentEnd) {
  const std::string path = TmpDir("tok") + "/train.bin";
  WriteEightDocuments(path);
  absl::StatusOr<Corpus> c = LoadCorpus(Tokens(path));
  ASSERT_TRUE(c.ok()) << c.status();
  // 40 * 0.75 = 30: token 29 is the EOS ending document 5, so documents 6 and 7 are held out.
  ASSERT_EQ(c->train.size(), 30);
  ASSERT_EQ(c->heldout.size(), 10);
  EXPECT_EQ(c->train[0], 100);
  EXPECT_EQ(c->heldout.Slice(0, 5), (std::vector<int64_t>{160, 161, 162, 163, 2}));
}

// Token files have no recorded document starts: a packed sample's positions restart after
// every EOS (model.config.eos_token_id), by the same file as above.
TEST(CorpusFormatsTest, PackedPositionsOfTokenFilesRestartAfterEachEos) {
  const std::string path = TmpDir("tokpack") + "/train.bin";
  WriteEightDocuments(path);
  absl::StatusOr<Corpus> c = LoadCorpus(Tokens(path));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->train_document_starts.empty());
  EXPECT_EQ(c->end_of_document_id, 2);
  // Tokens 3..13: 103, 2 | 110 111 112 113 2 | 120 121 122 123.
  EXPECT_EQ(PackedPositions(c->train, TrainBoundaries(*c), 3, 11),
            (std::vector<int64_t>{0, 1, 0, 1, 2, 3, 4, 0, 1, 2, 3}));
  // A held-out window starting at an EOS: the token after it starts a document.
  EXPECT_EQ(PackedPositions(c->heldout, HeldOutBoundaries(*c), 4, 3),
            (std::vector<int64_t>{0, 0, 1}));
}

TEST(CorpusFormatsTest, TokenIdOutOfVocabIsFoundByTheRankWhoseShareHoldsIt) {
  const std::string path = TmpDir("tok_vocab") + "/t.bin";
  std::vector<uint16_t> ids(100, 7);
  ids[80] = 1000;  // in rank 1's half of 2
  WriteU16(path, ids);
  CorpusOptions o = Tokens(path);
  o.world_size = 2;
  o.rank = 0;
  EXPECT_TRUE(LoadCorpus(o).ok());
  o.rank = 1;
  EXPECT_THAT(LoadCorpus(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "dataset.path: " + path + " byte offset 160: token id 1000 >= vocab_size 1000"));
}

TEST(CorpusFormatsTest, TokenFileWidthAndEmptySplitErrorsNameTheFile) {
  const std::string dir = TmpDir("tok_bad");
  const std::string odd = dir + "/odd.bin";
  std::ofstream(odd, std::ios::binary) << "abc";
  EXPECT_THAT(LoadCorpus(Tokens(odd)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       odd + ": size 3 bytes is not a multiple of the token width 2"));
  const std::string one = dir + "/one.bin";
  WriteU16(one, {5});
  EXPECT_THAT(LoadCorpus(Tokens(one)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "dataset.path: " + one + " has 1 tokens; the hold-out split"));
}

TEST(CorpusFormatsTest, ByteTokenizerTextIsTheFileBytes) {
  const std::string path = TmpDir("bytes") + "/c.txt";
  std::string text;
  for (int i = 0; i < 100; ++i) text += absl::StrCat("record ", i, "\n%\n");
  std::ofstream(path) << text;
  CorpusOptions o;
  o.path = path;
  o.holdout_fraction = 0.2;
  absl::StatusOr<Corpus> c = LoadCorpus(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->tokenizer->is_byte());
  // Every byte token is the byte of a record ("record N\n"); no separators are added.
  EXPECT_EQ(c->train.size() + c->heldout.size(), static_cast<int64_t>(text.size() - 200));
  EXPECT_EQ(c->train.Slice(0, 7), (std::vector<int64_t>{'r', 'e', 'c', 'o', 'r', 'd', ' '}));
}

}  // namespace
}  // namespace loom::data
