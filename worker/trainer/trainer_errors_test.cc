// loom-trainer's refusals and signals with real processes: an unusable nvme_path and
// parameter-only NVMe offload, an invalid config and spec fields outside the schema (exit 78 and
// an error event naming the field), SIGTERM (all ranks stop at one step boundary, exit 143) and
// SIGUSR1 to one rank (an agreed checkpoint, exit 0); dataset.pack_documents' micro-batch refusal
// and its windows without a target. Independent tests, split from
// trainer_test.cc so that Bazel runs them beside it.
// Every child has a deadline; on expiry all children are killed and the test fails.
#include <signal.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "storage/checkpoint/shard_format.h"
#include "worker/trainer/exit_codes.h"
#include "worker/trainer/gang_test_util.h"

namespace {

using namespace loom::trainer_test;  // NOLINT: test helpers


TEST(TrainerErrorsTest, UnusableNvmePathIsAnErrorNamingIt) {
  GangResult r = RunGang(
      "bad_nvme",
      WriteSpec("bad_nvme", 6, 2, R"({"zero_optimization": {"stage": 3,
          "offload_optimizer": {"device": "nvme", "nvme_path": "/proc/loom_no_nvme"}}})"),
      1, {});
  EXPECT_EQ(r.exit_codes[0], 1);
  std::vector<json> errors = r.Of(0, "error");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0]["message"].get<std::string>().find("/proc/loom_no_nvme"),
            std::string::npos)
      << errors[0]["message"];
  // Parameters on NVMe need the optimizer (which owns the fp32 master) offloaded too.
  GangResult p = RunGang(
      "param_only_nvme",
      WriteSpec("param_only_nvme", 6, 2, R"({"zero_optimization": {"stage": 3,
          "offload_param": {"device": "nvme", "nvme_path": "/tmp"}}})"),
      1, {});
  EXPECT_EQ(p.exit_codes[0], loom::kTrainerExitConfigError);
  ASSERT_EQ(p.Of(0, "error").size(), 1u);
  EXPECT_NE(p.Of(0, "error")[0]["message"].get<std::string>().find(
                "deepspeed_config.zero_optimization.offload_param.device"),
            std::string::npos);
}

TEST(TrainerErrorsTest, InvalidConfigExitsWithTheConfigErrorCodeAndAnErrorEvent) {
  GangResult r = RunGang(
      "bad", WriteSpec("bad", 2, 3, R"({"zero_optimization": {"stage": 3, "zenflow": {}}})"), 1,
      {});
  EXPECT_EQ(r.exit_codes[0], loom::kTrainerExitConfigError);
  std::vector<json> errors = r.Of(0, "error");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0]["message"].get<std::string>().find(
                "deepspeed_config.zero_optimization.zenflow"),
            std::string::npos);
  EXPECT_TRUE(r.Of(0, "started").empty());
}

// The spec is read by protobuf's parser: a field loom.v1.JobSpec does not have (here a misspelt
// training.steps) and an unsupported model family are config errors naming the field, before
// anything is built.
TEST(TrainerErrorsTest, SpecFieldsOutsideTheSchemaAndUnsupportedModelTypesAreConfigErrors) {
  for (const auto& [name, key, value, needle] :
       {std::tuple<const char*, const char*, const char*, const char*>{
            "misspelt", "training", R"({"stpes": "3"})", "stpes"},
        {"gpt2", "model", R"({"model_type": "gpt2"})",
         "model.config.model_type: \"gpt2\" is not supported (supported: llama, qwen2, qwen3, "
         "mistral)"}}) {
    json spec = json::parse(*ReadText(WriteSpec(name, 2, 3)));
    if (std::string(key) == "model") {
      spec["model"]["config"].update(json::parse(value));
    } else {
      spec[key].update(json::parse(value));
    }
    const std::string path = absl::StrCat(TmpDir(), "/", name, ".edited.spec.json");
    std::ofstream(path) << spec.dump();
    GangResult r = RunGang(name, path, 1, {});
    EXPECT_EQ(r.exit_codes[0], loom::kTrainerExitConfigError) << name;
    std::vector<json> errors = r.Of(0, "error");
    ASSERT_EQ(errors.size(), 1u) << name;
    EXPECT_NE(errors[0]["message"].get<std::string>().find(needle), std::string::npos)
        << errors[0]["message"];
    EXPECT_TRUE(r.Of(0, "started").empty()) << name;
  }
}

// A GPU accelerator kind on a machine without a CUDA device (this one, and CI's) is the job's
// configuration error naming the field: exit 78 before the rendezvous, not an abort in CUDA.
TEST(TrainerErrorsTest, AGpuAcceleratorWithoutACudaDeviceIsAConfigErrorNamingTheField) {
  json spec = json::parse(*ReadText(WriteSpec("h100_here", 2, 3)));
  spec["resources"]["accelerator"] = "ACCELERATOR_KIND_H100";
  const std::string path = absl::StrCat(TmpDir(), "/h100_here.edited.spec.json");
  std::ofstream(path) << spec.dump();
  GangResult r = RunGang("h100_here", path, 1, {});
  EXPECT_EQ(r.exit_codes[0], loom::kTrainerExitConfigError);
  std::vector<json> errors = r.Of(0, "error");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0]["message"].get<std::string>().find("resources.accelerator: h100"),
            std::string::npos)
      << errors[0]["message"];
  EXPECT_TRUE(r.Of(0, "started").empty());
}

// dataset.pack_documents: the trainer refuses a micro-batch of 2 (one packed sample per
// micro-batch) naming the key; and a corpus of one-token documents, where every target crosses a
// document boundary, trains with zero (not NaN) losses instead of corrupting the weights.
TEST(TrainerErrorsTest, PackDocumentsRefusesMicroBatchTwoAndSurvivesWindowsWithNoTarget) {
  auto packed_spec = [](const std::string& name, int micro, const std::string& corpus) {
    const std::string path = WriteSpec(name, micro, 2);
    json spec = json::parse(*ReadText(path));
    spec["dataset"] = {{"path", corpus}, {"format", "jsonl"}, {"tokenizer", "byte"},
                       {"pack_documents", true}};
    spec["training"]["sequence_length"] = 16;
    std::ofstream(path) << spec.dump(2);
    return path;
  };
  const std::string corpus = TmpDir() + "/one_token_docs.jsonl";
  {
    std::ofstream f(corpus);
    for (int i = 0; i < 2000; ++i) f << "{\"text\": \"" << static_cast<char>('a' + i % 26) << "\"}\n";
  }
  GangResult refused = RunGang("packed_micro2", packed_spec("packed_micro2", 2, corpus), 1, {});
  EXPECT_EQ(refused.exit_codes[0], loom::kTrainerExitConfigError);
  ASSERT_EQ(refused.Of(0, "error").size(), 1u);
  EXPECT_NE(refused.Of(0, "error")[0]["message"].get<std::string>().find(
                "dataset.pack_documents: needs deepspeed_config.train_micro_batch_size_per_gpu 1"),
            std::string::npos)
      << refused.Of(0, "error")[0]["message"];

  GangResult r = RunGang("packed_no_target", packed_spec("packed_no_target", 1, corpus), 1, {});
  ASSERT_EQ(r.exit_codes[0], 0) << "see packed_no_target.rank0.stderr";
  const std::vector<json> steps = r.Of(0, "step");
  ASSERT_EQ(steps.size(), 2u);
  for (const json& s : steps) {  // protobuf's JSON omits a 0; a NaN would be the string "NaN"
    for (const char* key : {"loss", "grad_norm"}) {
      ASSERT_TRUE(!s.contains(key) || s[key].is_number()) << s;
      EXPECT_EQ(s.value(key, 0.0), 0.0) << s;
    }
  }
}

TEST(TrainerErrorsTest, SigtermStopsAllRanksAtAStepBoundary) {
  GangResult r = RunGang("sigterm", WriteSpec("sigterm", 1, 100000), 2, {}, SIGTERM);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(r.exit_codes[rank], 143) << rank;
    std::vector<json> stopped = r.Of(rank, "stopped");
    ASSERT_EQ(stopped.size(), 1u) << rank;
    EXPECT_EQ(stopped[0]["step"], r.Of(0, "stopped")[0]["step"]);  // the same boundary
  }
}

// SIGUSR1 (the worker's graceful stop) reaching only one rank: both agree on a step boundary,
// write a complete checkpoint of it, and exit 0 after a "stopped" event naming it.
TEST(TrainerErrorsTest, SigusrOneCheckpointsAtAnAgreedStepAndExitsZero) {
  const std::string dir = TmpDir() + "/ckpt_graceful";
  GangResult r = RunGang("graceful", WriteSpec("graceful", 1, 100000), 2,
                         {"--checkpoint_dir=" + dir}, SIGUSR1, /*per_rank=*/{},
                         /*collective_timeout_s=*/60, /*signal_only_rank=*/1);
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.Of(0, "stopped").size(), 1u);
  const int64_t step = r.Of(0, "stopped")[0]["checkpoint_step"].get<int64_t>();
  EXPECT_GE(step, 1);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(r.exit_codes[rank], 0) << rank;
    std::vector<json> stopped = r.Of(rank, "stopped");
    ASSERT_EQ(stopped.size(), 1u) << rank;
    EXPECT_EQ(stopped[0]["step"].get<int64_t>(), step) << rank;
    EXPECT_EQ(stopped[0]["checkpoint_step"].get<int64_t>(), step) << rank;
    EXPECT_TRUE(r.Of(rank, "done").empty());
    // Its shard of the final checkpoint is there and reads back.
    auto manifest = loom::storage::ReadManifest(dir + "/" + loom::storage::StepDirName(step), rank);
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    EXPECT_EQ(manifest->step, step);
    EXPECT_EQ(manifest->world_size, 2);
  }
}

}  // namespace
