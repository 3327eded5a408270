// The data under a job cannot change silently (issue 42 defect 5), with real loom-trainer
// processes: a job trains and checkpoints on a text corpus; its restart from that checkpoint
//   * on the same bytes continues (also after the file was touched: a warning only);
//   * on a replaced or truncated file exits 66 (kTrainerExitDatasetError: the scheduler does not
//     restart it) on every rank, before training, with an error naming the file and what changed;
//   * from a checkpoint written before identities were recorded records one and continues, and a
//     corpus too short for the job ("do not fit the corpus") is the same non-retried error.
// Every child has a deadline (gang_test_util.h); on expiry all are killed and the test fails.
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "storage/checkpoint/shard_format.h"
#include "worker/trainer/exit_codes.h"
#include "worker/trainer/gang_test_util.h"

namespace {

using namespace loom::trainer_test;  // NOLINT: test helpers

constexpr char kIdentityFile[] = "dataset.identity.json";

// A deterministic text corpus of blank-line-separated paragraphs; `salt` changes every one.
std::string Paragraphs(int count, const std::string& salt) {
  std::string text;
  for (int i = 0; i < count; ++i) {
    absl::StrAppend(&text, "Paragraph ", i, salt, ": the quick brown fox jumps over the lazy dog ",
                    i * 7919 % 1000, " times.\n\n");
  }
  return text;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

// The tiny job of gang_test_util.h on `corpus` (format text, byte tokenizer).
std::string CorpusSpec(const std::string& name, int steps, const std::string& corpus) {
  const std::string path = WriteSpec(name, 1, steps);
  json spec = json::parse(*ReadText(path));
  spec["dataset"] = {{"path", corpus}, {"format", "text"}, {"tokenizer", "byte"}};
  std::ofstream(path, std::ios::trunc) << spec.dump(2);
  return path;
}

// A job that trained 2 steps on its own corpus, checkpointed in its own directory.
struct TrainedJob {
  std::string corpus;
  std::string dir;
  std::string original;
  std::string ResumeFrom() const { return dir + "/" + loom::storage::StepDirName(2); }
};

TrainedJob Train(const std::string& name, int world) {
  TrainedJob job;
  job.corpus = absl::StrCat(TmpDir(), "/", name, ".corpus.txt");
  job.dir = absl::StrCat(TmpDir(), "/", name, ".ckpt");
  job.original = Paragraphs(400, "");
  WriteFile(job.corpus, job.original);
  GangResult r = RunGang(name, CorpusSpec(name, 2, job.corpus), world,
                         {"--checkpoint_dir=" + job.dir});
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_EQ(r.exit_codes[rank], 0) << name << " rank " << rank << ": see " << name << ".rank"
                                     << rank << ".stderr";
  }
  // The first start recorded the identity of the one file it trains on.
  const std::string manifest = ReadText(job.dir + "/" + kIdentityFile).value_or("");
  json m = json::parse(manifest, nullptr, false);
  EXPECT_FALSE(m.is_discarded()) << manifest;
  if (!m.is_discarded()) {
    EXPECT_EQ(m["files"].size(), 1u) << m;
    EXPECT_EQ(m["files"][0]["path"], job.corpus);
    EXPECT_EQ(m["files"][0]["size_bytes"].get<int64_t>(),
              static_cast<int64_t>(job.original.size()));
    EXPECT_EQ(m["files"][0]["sha256"].get<std::string>().size(), 64u);
  }
  return job;
}

// The restart of `job` (2 more steps, from its step-2 checkpoint, in its directory).
GangResult Restart(const TrainedJob& job, const std::string& name, int world) {
  return RunGang(name, CorpusSpec(name, 4, job.corpus), world,
                 {"--checkpoint_dir=" + job.dir, "--resume_from=" + job.ResumeFrom()});
}

std::vector<std::string> WarningsWith(const GangResult& r, int rank, const std::string& needle) {
  std::vector<std::string> out;
  for (const json& w : r.Of(rank, "warning")) {
    const std::string m = w["message"];
    if (m.find(needle) != std::string::npos) out.push_back(m);
  }
  return out;
}

// The attempt ended as a dataset error on every rank: exit 66, no training, one error event
// containing each of `needles`.
void ExpectDatasetError(const GangResult& r, int world, const std::vector<std::string>& needles) {
  ASSERT_FALSE(r.timed_out);
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_EQ(r.exit_codes[rank], loom::kTrainerExitDatasetError) << "rank " << rank;
    EXPECT_TRUE(r.Of(rank, "started").empty()) << "rank " << rank << " must not train";
    EXPECT_TRUE(r.Of(rank, "step").empty()) << "rank " << rank << " must not train";
    const std::vector<json> errors = r.Of(rank, "error");
    ASSERT_EQ(errors.size(), 1u) << "rank " << rank;
    const std::string msg = errors[0]["message"];
    for (const std::string& n : needles) {
      EXPECT_NE(msg.find(n), std::string::npos) << "rank " << rank << ": " << msg;
    }
  }
}

TEST(TrainerDatasetTest, RestartOnTheSameDataContinuesAndATouchOnlyWarns) {
  const TrainedJob job = Train("same_data", 1);
  GangResult r = Restart(job, "same_data_restart", 1);
  ASSERT_EQ(r.exit_codes[0], 0) << "see same_data_restart.rank0.stderr";
  ASSERT_EQ(r.Of(0, "started").size(), 1u);
  EXPECT_EQ(r.Of(0, "started")[0]["start_step"].get<int64_t>(), 2);
  EXPECT_EQ(r.Of(0, "step").size(), 2u);
  EXPECT_TRUE(WarningsWith(r, 0, "dataset").empty());

  // Written again with the same bytes (a new modification time): the same data, a warning.
  WriteFile(job.corpus, job.original);
  struct timespec times[2] = {{1764927600, 0}, {1764927600, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, job.corpus.c_str(), times, 0), 0);
  r = Restart(job, "same_data_touched", 1);
  ASSERT_EQ(r.exit_codes[0], 0) << "see same_data_touched.rank0.stderr";
  EXPECT_EQ(r.Of(0, "started")[0]["start_step"].get<int64_t>(), 2);
  const std::vector<std::string> warned = WarningsWith(r, 0, "modification time changed");
  ASSERT_EQ(warned.size(), 1u);
  EXPECT_NE(warned[0].find(job.corpus), std::string::npos) << warned[0];
}

// The defect: the file replaced by another corpus under a running job; its restart trained on
// it with no warning (exit 0).
TEST(TrainerDatasetTest, RestartOnAReplacedFileIsANonRetriedDatasetErrorNamingIt) {
  const TrainedJob job = Train("replaced", 2);
  const std::string other = Paragraphs(300, " (revised)");
  WriteFile(job.corpus, other);
  GangResult r = Restart(job, "replaced_restart", 2);
  ExpectDatasetError(r, 2,
                     {absl::StrCat("dataset.path: ", job.corpus,
                                   " changed since the job first started: size ",
                                   job.original.size(), " -> ", other.size(), " bytes, sha256 "),
                      job.dir + "/" + kIdentityFile});
}

// A truncated file: was "do not fit the corpus" with exit 1, retried until the user's restarts
// were spent; a truncation that still fits trained on the shorter corpus.
TEST(TrainerDatasetTest, RestartOnATruncatedFileIsANonRetriedDatasetErrorNamingIt) {
  const TrainedJob job = Train("truncated", 1);
  for (const int64_t keep : {int64_t{40}, static_cast<int64_t>(job.original.size()) / 2}) {
    ASSERT_EQ(::truncate(job.corpus.c_str(), keep), 0);
    ASSERT_EQ(FileSize(job.corpus), keep);
    GangResult r = Restart(job, absl::StrCat("truncated_", keep), 1);
    ExpectDatasetError(r, 1, {absl::StrCat("dataset.path: ", job.corpus,
                                           " changed since the job first started: size ",
                                           job.original.size(), " -> ", keep, " bytes")});
    WriteFile(job.corpus, job.original);
  }
}

// Checkpoints from before this change have no identity: the restart records one and continues
// (with a warning). Without one, a corpus that no longer fits the job (the truncation,
// seen as "do not fit the corpus" with exit 1 and retried) is the same non-retried error.
TEST(TrainerDatasetTest, ACheckpointWithoutAnIdentityRecordsOneAndAShortCorpusIsNotRetried) {
  const TrainedJob job = Train("old_job", 1);
  const std::string manifest = job.dir + "/" + kIdentityFile;
  ASSERT_EQ(std::remove(manifest.c_str()), 0);
  GangResult r = Restart(job, "old_job_restart", 1);
  ASSERT_EQ(r.exit_codes[0], 0) << "see old_job_restart.rank0.stderr";
  EXPECT_EQ(r.Of(0, "started")[0]["start_step"].get<int64_t>(), 2);
  EXPECT_EQ(WarningsWith(r, 0, "predate dataset identities").size(), 1u);
  EXPECT_GT(FileSize(manifest), 0) << manifest << " was not recorded again";

  // Truncated to part of one paragraph: one document, nothing to hold out.
  ASSERT_EQ(std::remove(manifest.c_str()), 0);
  ASSERT_EQ(::truncate(job.corpus.c_str(), 40), 0);
  r = Restart(job, "old_job_truncated", 1);
  ExpectDatasetError(r, 1, {absl::StrCat("dataset.path: ", job.corpus, " has 1 documents")});

  // Short documents: the held-out side is shorter than training.sequence_length + 1 tokens.
  ASSERT_EQ(std::remove(manifest.c_str()), 0);
  std::string tiny;
  for (int i = 0; i < 100; ++i) {
    absl::StrAppend(&tiny, std::string(1, static_cast<char>('a' + i % 26)), "\n\n");
  }
  WriteFile(job.corpus, tiny);
  r = Restart(job, "old_job_short", 1);
  ExpectDatasetError(r, 1, {absl::StrCat("dataset.path: ", job.corpus,
                                         ": training.sequence_length 32 + 1 tokens do not fit "
                                         "the corpus (")});
}

}  // namespace
