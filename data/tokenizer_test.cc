#include "data/tokenizer.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::data {
namespace {

using ::loom::testing::StatusIs;

std::string Tmp(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

// Fortune records of Debian's fortunes "computers" file (~240 KB): real English text.
std::vector<std::string> Documents() {
  absl::StatusOr<std::string> text = ReadFile("/usr/share/games/fortunes/computers");
  EXPECT_TRUE(text.ok()) << text.status();
  std::vector<std::string> docs;
  for (absl::string_view d : absl::StrSplit(*text, "\n%\n", absl::SkipWhitespace())) {
    docs.emplace_back(d);
  }
  return docs;
}

// `spm_encode --output_format=id` (the sentencepiece package's own tool): an independent encoder.
std::vector<int32_t> SpmEncode(const std::string& model, const std::string& line) {
  const std::string in = Tmp("spm_in.txt");
  std::ofstream(in) << line << "\n";
  const std::string cmd = absl::StrCat("spm_encode --model=", model, " --output_format=id < ", in);
  FILE* p = ::popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << cmd;
  std::vector<int32_t> ids;
  std::istringstream s(out);
  for (int32_t id; s >> id;) ids.push_back(id);
  return ids;
}

TEST(ByteTokenizerTest, BytesAreIdsAndThereAreNoSpecialTokens) {
  auto t = Tokenizer::Byte();
  std::vector<int32_t> ids;
  ASSERT_TRUE(t->Encode("A\xff\n", "x", &ids).ok());  // any bytes, not only UTF-8
  EXPECT_EQ(ids, (std::vector<int32_t>{65, 255, 10}));
  EXPECT_EQ(t->vocab_size(), 256);
  EXPECT_EQ(t->eos_id(), -1);
  EXPECT_TRUE(t->serialized_model().empty());
}

TEST(SentencePieceTest, TrainedBpeAgreesWithSpmEncodeAndRecordsSpecialIds) {
  TokenizerOptions o;
  o.kind = "sentencepiece";
  o.vocab_size = 1000;
  o.model_type = "bpe";
  const std::string dir = Tmp("record");
  absl::StatusOr<std::shared_ptr<const Tokenizer>> t =
      PrepareTokenizer(o, Documents(), dir, /*model_max_length=*/256);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->vocab_size(), 1000);
  EXPECT_EQ((*t)->unk_id(), 0);
  EXPECT_EQ((*t)->bos_id(), 1);
  EXPECT_EQ((*t)->eos_id(), 2);
  EXPECT_EQ((*t)->pad_id(), 3);

  const std::string line = "The computer is down; please reboot the mainframe. caf\xc3\xa9";
  std::vector<int32_t> ids;
  ASSERT_TRUE((*t)->Encode(line, "line", &ids).ok());
  EXPECT_GT(ids.size(), 5u);
  EXPECT_LT(ids.size(), line.size());  // merges, not bytes
  EXPECT_EQ(ids, SpmEncode(dir + "/tokenizer.model", line));
  absl::StatusOr<std::string> back = (*t)->Decode(ids);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, line);

  // tokenizer_config.json names the same ids and pieces.
  absl::StatusOr<std::string> cfg = ReadFile(dir + "/tokenizer_config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  nlohmann::json j = nlohmann::json::parse(*cfg);
  EXPECT_EQ(j["tokenizer_class"], "LlamaTokenizer");
  EXPECT_EQ(j["bos_token"], "<s>");
  EXPECT_EQ(j["eos_token"], "</s>");
  EXPECT_EQ(j["unk_token"], "<unk>");
  EXPECT_EQ(j["pad_token_id"], 3);
  EXPECT_EQ(j["model_max_length"], 256);

  // A restart reuses the recorded model: no documents to train on, same bytes.
  absl::StatusOr<std::shared_ptr<const Tokenizer>> again = PrepareTokenizer(o, {}, dir, 256);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->serialized_model(), (*t)->serialized_model());

  // Training is a function of the documents: a second training gives the same model.
  absl::StatusOr<std::shared_ptr<const Tokenizer>> fresh = TrainSentencePiece(Documents(), o);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ((*fresh)->serialized_model(), (*t)->serialized_model());

  // A given tokenizer_model is used as is (and recorded).
  TokenizerOptions given;
  given.kind = "sentencepiece";
  given.model_path = dir + "/tokenizer.model";
  absl::StatusOr<std::shared_ptr<const Tokenizer>> loaded =
      PrepareTokenizer(given, {}, Tmp("record2"), 256);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->serialized_model(), (*t)->serialized_model());
  struct stat st;
  EXPECT_EQ(::stat(Tmp("record2/tokenizer.model").c_str(), &st), 0);
}

TEST(SentencePieceTest, UnigramTrains) {
  TokenizerOptions o;
  o.kind = "sentencepiece";
  o.vocab_size = 800;
  o.model_type = "unigram";
  absl::StatusOr<std::shared_ptr<const Tokenizer>> t = TrainSentencePiece(Documents(), o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->vocab_size(), 800);
  EXPECT_EQ((*t)->eos_id(), 2);
}

TEST(SentencePieceTest, InvalidUtf8NamesWhereAndByteOffset) {
  TokenizerOptions o;
  o.kind = "sentencepiece";
  o.vocab_size = 500;
  absl::StatusOr<std::shared_ptr<const Tokenizer>> t = TrainSentencePiece(Documents(), o);
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<int32_t> ids;
  EXPECT_THAT((*t)->Encode("abc\xc3(", "/data/a.txt", &ids),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "/data/a.txt: invalid UTF-8 at byte offset 3"));
}

TEST(SentencePieceTest, BadOptionsAndFilesAreNamed) {
  TokenizerOptions o;
  o.kind = "sentencepiece";
  o.vocab_size = 0;
  EXPECT_THAT(TrainSentencePiece(Documents(), o),
              StatusIs(absl::StatusCode::kInvalidArgument, "dataset.vocab_size"));
  o.vocab_size = 500;
  o.model_type = "wordpiece";
  EXPECT_THAT(TrainSentencePiece(Documents(), o),
              StatusIs(absl::StatusCode::kInvalidArgument, "dataset.model_type"));
  o.model_type = "bpe";
  o.vocab_size = 50000;  // far more pieces than ~240 KB of text can give
  EXPECT_THAT(TrainSentencePiece(Documents(), o),
              StatusIs(absl::StatusCode::kInvalidArgument, "dataset.vocab_size"));
  o.model_path = "/nonexistent/tokenizer.model";
  EXPECT_THAT(PrepareTokenizer(o, {}, "", 0),
              StatusIs(absl::StatusCode::kNotFound, "dataset.tokenizer_model"));
  const std::string junk = Tmp("junk.model");
  std::ofstream(junk) << "not a protobuf";
  o.model_path = junk;
  EXPECT_THAT(PrepareTokenizer(o, {}, "", 0),
              StatusIs(absl::StatusCode::kInvalidArgument, junk + ": not a SentencePiece model"));
  o.kind = "wordpiece";
  EXPECT_THAT(PrepareTokenizer(o, {}, "", 0),
              StatusIs(absl::StatusCode::kInvalidArgument, "dataset.tokenizer"));
}

}  // namespace
}  // namespace loom::data
