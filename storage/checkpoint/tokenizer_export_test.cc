#include "storage/checkpoint/tokenizer_export.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "common/file_util.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

std::string Dir(const std::string& name) {
  std::string d = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  ::mkdir(d.c_str(), 0755);
  return d;
}

TEST(StageTokenizerFilesTest, NoRecordedTokenizerLeavesTheExportAlone) {
  nlohmann::json config = {{"bos_token_id", 1}, {"eos_token_id", 2}};
  absl::StatusOr<std::vector<std::string>> files =
      StageTokenizerFiles(Dir("none"), Dir("none_staging"), &config);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_TRUE(files->empty());
  EXPECT_EQ(config, (nlohmann::json{{"bos_token_id", 1}, {"eos_token_id", 2}}));
}

TEST(StageTokenizerFilesTest, CopiesBothFilesAndTakesTheTokenizersIds) {
  const std::string ckpt = Dir("ckpt"), staging = Dir("staging");
  std::ofstream(ckpt + "/tokenizer.model", std::ios::binary) << std::string("\x0a\x03m\x00x", 5);
  std::ofstream(ckpt + "/tokenizer_config.json")
      << R"({"bos_token_id": 5, "eos_token_id": 6, "pad_token_id": null})";
  nlohmann::json config = {{"bos_token_id", 1}, {"eos_token_id", 2}, {"pad_token_id", 0},
                           {"vocab_size", 100}};
  absl::StatusOr<std::vector<std::string>> files = StageTokenizerFiles(ckpt, staging, &config);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(*files, (std::vector<std::string>{"tokenizer_config.json", "tokenizer.model"}));
  EXPECT_EQ(config, (nlohmann::json{{"bos_token_id", 5}, {"eos_token_id", 6}, {"vocab_size", 100}}));
  absl::StatusOr<std::string> model = ReadFile(staging + "/tokenizer.model");
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(*model, std::string("\x0a\x03m\x00x", 5));
}

TEST(StageTokenizerFilesTest, MissingOrMalformedConfigNamesTheFile) {
  const std::string ckpt = Dir("bad");
  std::ofstream(ckpt + "/tokenizer.model") << "m";
  nlohmann::json config = nlohmann::json::object();
  absl::StatusOr<std::vector<std::string>> files =
      StageTokenizerFiles(ckpt, Dir("bad_staging"), &config);
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(files.status().message().find(ckpt + "/tokenizer_config.json"), std::string::npos);
  std::ofstream(ckpt + "/tokenizer_config.json") << R"({"eos_token_id": "two"})";
  files = StageTokenizerFiles(ckpt, Dir("bad_staging"), &config);
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(files.status().message().find("eos_token_id"), std::string::npos);
}

}  // namespace
}  // namespace loom
