#include "data/jsonl_reader.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::data {
namespace {

using ::loom::testing::StatusIs;

TEST(JsonlReaderTest, ReadsTheNamedFieldSkippingBlankLines) {
  absl::StatusOr<std::vector<std::string>> d = ParseJsonlDocuments(
      "{\"text\": \"caf\\u00e9 one\", \"id\": 1}\n\n  \r\n{\"id\": 2, \"text\": \"two\\nlines\"}\r\n"
      "{\"text\":\"\xc3\xa9t\xc3\xa9\"}",
      "d.jsonl", "text");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(*d, ::testing::ElementsAre("caf\xc3\xa9 one", "two\nlines", "\xc3\xa9t\xc3\xa9"));
  d = ParseJsonlDocuments("{\"body\": \"x\"}\n", "d.jsonl", "body");
  ASSERT_TRUE(d.ok());
  EXPECT_THAT(*d, ::testing::ElementsAre("x"));
}

TEST(JsonlReaderTest, InvalidJsonNamesFileAndLine) {
  EXPECT_THAT(ParseJsonlDocuments("{\"text\": \"a\"}\n{\"text\": \"b\"\n", "/data/d.jsonl", "text"),
              StatusIs(absl::StatusCode::kInvalidArgument, "dataset.path: /data/d.jsonl:2: invalid JSON"));
  EXPECT_THAT(ParseJsonlDocuments("[1, 2]\n", "d.jsonl", "text"),
              StatusIs(absl::StatusCode::kInvalidArgument, "d.jsonl:1: not a JSON object"));
}

TEST(JsonlReaderTest, MissingTextFieldNamesFileAndLine) {
  EXPECT_THAT(
      ParseJsonlDocuments("{\"text\": \"a\"}\n{\"txt\": \"b\"}\n", "d.jsonl", "text"),
      StatusIs(absl::StatusCode::kInvalidArgument, "d.jsonl:2: no string field \"text\""));
  EXPECT_THAT(ParseJsonlDocuments("{\"text\": 5}\n", "d.jsonl", "text"),
              StatusIs(absl::StatusCode::kInvalidArgument, "d.jsonl:1: no string field"));
}

TEST(JsonlReaderTest, InvalidUtf8NamesFileLineAndByteOffset) {
  // Line 2 starts at byte 14; its 11th byte (offset 24) is a lone continuation byte.
  const std::string text = "{\"text\":\"ok\"}\n{\"text\":\"a\x80\"}\n";
  EXPECT_THAT(ParseJsonlDocuments(text, "d.jsonl", "text"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "dataset.path: d.jsonl:2: invalid UTF-8 at byte offset 24"));
}

TEST(JsonlReaderTest, ListsJsonlFilesOrNamesThePath) {
  EXPECT_THAT(ListJsonlFiles("/nonexistent.jsonl"),
              StatusIs(absl::StatusCode::kNotFound, "/nonexistent.jsonl"));
  EXPECT_THAT(ListJsonlFiles(std::getenv("TEST_TMPDIR")),
              StatusIs(absl::StatusCode::kFailedPrecondition, "holds no .jsonl files"));
}

}  // namespace
}  // namespace loom::data
