// The data set's identity (data/dataset_identity.h): what it records for each format, that a
// restart on the same bytes passes (also with a new modification time), and that a changed,
// truncated, same-length-rewritten, added or removed file is a dataset error naming the file
// and what changed. Regression tests for issue 42 defect 5.
#include "data/dataset_identity.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"
#include "data/dataset_error.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::data {
namespace {

using ::loom::testing::IsOk;
using ::loom::testing::StatusIs;
using ::testing::HasSubstr;

std::string TmpDir(const std::string& name) {
  std::string d = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  ::mkdir(d.c_str(), 0755);
  return d;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Sets the file's modification time (seconds since the epoch).
void SetMtime(const std::string& path, int64_t seconds) {
  struct timespec times[2] = {{seconds, 0}, {seconds, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

CorpusOptions Text(const std::string& path) {
  CorpusOptions o;
  o.path = path;
  o.format = "text";
  return o;
}

TEST(DatasetIdentityTest, Sha256OfKnownContent) {
  const std::string f = TmpDir("sha") + "/abc";
  Write(f, "abc");
  int64_t size = 0;
  EXPECT_EQ(*Sha256OfFile(f, &size),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");  // FIPS 180-2
  EXPECT_EQ(size, 3);
  Write(f, "");
  EXPECT_EQ(*Sha256OfFile(f), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_THAT(Sha256OfFile(TmpDir("sha") + "/missing"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(Sha256OfFile(TmpDir("sha")), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                    "is not a regular file"));
}

// The files are those LoadCorpus reads, per format, in its order; tokenizer_model last.
TEST(DatasetIdentityTest, RecordsTheFilesTheLoaderReads) {
  const std::string dir = TmpDir("formats");
  Write(dir + "/b.txt", "bbbb");
  Write(dir + "/a.txt", "aa");
  Write(dir + "/a.dat", "index");  // a fortune index: not read as text
  Write(dir + "/x.jsonl", "{\"text\": \"x\"}\n");
  Write(dir + "/t.bin", std::string(8, '\1'));
  absl::StatusOr<DatasetIdentity> text = ComputeDatasetIdentity(Text(dir));
  ASSERT_THAT(text, IsOk());
  ASSERT_EQ(text->files.size(), 4u);  // a.txt b.txt t.bin x.jsonl (name order), no a.dat
  EXPECT_EQ(text->files[0].path, dir + "/a.txt");
  EXPECT_EQ(text->files[0].size_bytes, 2);
  EXPECT_EQ(text->files[0].field, "dataset.path");
  EXPECT_EQ(text->files[0].sha256, *Sha256OfFile(dir + "/a.txt"));
  EXPECT_EQ(text->total_bytes(), 2 + 4 + 8 + 14);

  CorpusOptions jsonl = Text(dir);
  jsonl.format = "jsonl";
  ASSERT_EQ(ComputeDatasetIdentity(jsonl)->files.size(), 1u);
  CorpusOptions tokens = Text(dir);
  tokens.format = "tokens";
  tokens.tokenizer.kind = "sentencepiece";
  tokens.tokenizer.model_path = dir + "/a.txt";  // any file: only its bytes are identified
  absl::StatusOr<DatasetIdentity> t = ComputeDatasetIdentity(tokens);
  ASSERT_THAT(t, IsOk());
  ASSERT_EQ(t->files.size(), 2u);
  EXPECT_EQ(t->files[0].path, dir + "/t.bin");
  EXPECT_EQ(t->files[1].field, "dataset.tokenizer_model");
  tokens.tokenizer.model_path = dir + "/none.model";
  EXPECT_THAT(ComputeDatasetIdentity(tokens),
              StatusIs(absl::StatusCode::kNotFound, "dataset.tokenizer_model: "));
  EXPECT_THAT(ComputeDatasetIdentity(Text(dir + "/none")),
              StatusIs(absl::StatusCode::kNotFound, "dataset.path: "));
}

TEST(DatasetIdentityTest, JsonRoundTripAndRefusals) {
  DatasetIdentity id;
  id.path = "/data/d";
  id.format = "jsonl";
  id.files.push_back({"dataset.path", "/data/d/a.jsonl", 542789, 1764927600123456789,
                      std::string(64, 'a')});
  absl::StatusOr<DatasetIdentity> back = DatasetIdentityFromJson(DatasetIdentityToJson(id), "m");
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->path, id.path);
  EXPECT_EQ(back->format, id.format);
  ASSERT_EQ(back->files.size(), 1u);
  EXPECT_EQ(back->files[0].size_bytes, 542789);
  EXPECT_EQ(back->files[0].mtime_ns, 1764927600123456789);
  EXPECT_EQ(back->files[0].sha256, std::string(64, 'a'));
  EXPECT_THAT(DatasetIdentityFromJson("{", "m.json"),
              StatusIs(absl::StatusCode::kInvalidArgument, "m.json: not a JSON object"));
  EXPECT_THAT(DatasetIdentityFromJson(R"({"version": 2})", "m.json"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a version 1"));
}

// First start records; a start on the same bytes verifies, also after `touch`; every kind of
// change is a dataset error naming the file.
TEST(DatasetIdentityTest, RecordsAtFirstStartAndRefusesEveryChangeAtRestart) {
  const std::string data = TmpDir("changes");
  const std::string ckpt = TmpDir("changes_ckpt") + "/job";  // created by the first start
  const std::string file = data + "/corpus.txt";
  const std::string original(542789 % 5000 + 4000, 'x');
  Write(file, original);
  SetMtime(file, 1764927600);
  const std::string manifest = ckpt + "/" + kDatasetIdentityFile;

  // A rank other than 0 never writes; rank 0 does.
  absl::StatusOr<DatasetIdentityCheck> first =
      CheckOrRecordDatasetIdentity(Text(file), ckpt, /*write=*/false, /*resuming=*/false);
  ASSERT_THAT(first, IsOk());
  EXPECT_FALSE(first->recorded);
  EXPECT_TRUE(first->identity.files.empty());  // nothing hashed for nothing
  EXPECT_FALSE(FileExists(manifest));
  first = CheckOrRecordDatasetIdentity(Text(file), ckpt, /*write=*/true, /*resuming=*/false);
  ASSERT_THAT(first, IsOk());
  EXPECT_TRUE(first->recorded);
  EXPECT_TRUE(first->warnings.empty());
  absl::StatusOr<DatasetIdentity> stored =
      DatasetIdentityFromJson(*ReadFile(manifest), manifest);
  ASSERT_THAT(stored, IsOk());
  ASSERT_EQ(stored->files.size(), 1u);
  EXPECT_EQ(stored->files[0].size_bytes, static_cast<int64_t>(original.size()));
  EXPECT_EQ(stored->files[0].mtime_ns, int64_t{1764927600} * 1000000000);

  auto restart = [&] {
    return CheckOrRecordDatasetIdentity(Text(file), ckpt, /*write=*/true, /*resuming=*/true);
  };
  absl::StatusOr<DatasetIdentityCheck> same = restart();
  ASSERT_THAT(same, IsOk());
  EXPECT_TRUE(same->verified);
  EXPECT_TRUE(same->warnings.empty());
  // Every rank verifies at a restart, also those that do not write.
  same = CheckOrRecordDatasetIdentity(Text(file), ckpt, /*write=*/false, /*resuming=*/true);
  ASSERT_THAT(same, IsOk());
  EXPECT_TRUE(same->verified);

  SetMtime(file, 1764931200);  // touched: same bytes, a warning only
  same = restart();
  ASSERT_THAT(same, IsOk());
  ASSERT_EQ(same->warnings.size(), 1u);
  EXPECT_THAT(same->warnings[0], HasSubstr("modification time changed"));
  EXPECT_THAT(same->warnings[0], HasSubstr("2025-12-05T09:40:00+00:00 -> "));

  // Replaced by other content.
  Write(file, std::string(3000, 'y'));
  absl::Status changed = restart().status();
  EXPECT_TRUE(IsDatasetError(changed)) << changed;
  EXPECT_THAT(changed.message(),
              HasSubstr(absl::StrCat("dataset.path: ", file, " changed since the job first "
                                     "started: size ", original.size(), " -> 3000 bytes, sha256 ",
                                     stored->files[0].sha256.substr(0, 16), ".. -> ")));
  EXPECT_THAT(changed.message(), HasSubstr(manifest));

  // Truncated.
  Write(file, original.substr(0, 100));
  changed = restart().status();
  EXPECT_TRUE(IsDatasetError(changed)) << changed;
  EXPECT_THAT(changed.message(), HasSubstr(absl::StrCat("size ", original.size(), " -> 100 bytes")));

  // Rewritten in place with the same length and the recorded modification time: size and mtime
  // cannot tell, the hash does.
  std::string flipped = original;
  flipped[1234] = 'z';
  Write(file, flipped);
  SetMtime(file, 1764927600);
  changed = restart().status();
  EXPECT_TRUE(IsDatasetError(changed)) << changed;
  EXPECT_THAT(changed.message(),
              HasSubstr(absl::StrCat("size ", original.size(), " bytes (unchanged), sha256 ")));
  EXPECT_THAT(changed.message(), HasSubstr("modification time unchanged"));

  // Removed.
  ASSERT_EQ(std::remove(file.c_str()), 0);
  changed = restart().status();
  EXPECT_TRUE(IsDatasetError(changed)) << changed;
  EXPECT_THAT(changed.message(), HasSubstr(absl::StrCat("dataset.path: ", file, " does not exist")));
  EXPECT_THAT(changed.message(), HasSubstr("the data changed since the job first started"));

  // Restored: the job goes on.
  Write(file, original);
  EXPECT_THAT(restart(), IsOk());
}

TEST(DatasetIdentityTest, AFileAddedToOrRemovedFromADirectoryIsAChange) {
  const std::string data = TmpDir("dir_changes");
  const std::string ckpt = TmpDir("dir_changes_ckpt");
  Write(data + "/a", "one\n\ntwo\n");
  Write(data + "/b", "three\n");
  ASSERT_THAT(CheckOrRecordDatasetIdentity(Text(data), ckpt, true, false), IsOk());
  Write(data + "/c", "four\n");
  absl::Status s = CheckOrRecordDatasetIdentity(Text(data), ckpt, true, true).status();
  EXPECT_TRUE(IsDatasetError(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(
                               "dataset.path: ", data, "/c was added since the job first started "
                               "(5 bytes)")));
  ASSERT_EQ(std::remove((data + "/c").c_str()), 0);
  ASSERT_EQ(std::remove((data + "/b").c_str()), 0);
  s = CheckOrRecordDatasetIdentity(Text(data), ckpt, true, true).status();
  EXPECT_TRUE(IsDatasetError(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("dataset.path: ", data,
                                                  "/b was removed since the job first started "
                                                  "(it had 6 bytes")));
}

// A job whose checkpoints were written before identities: recorded now, with a warning when it
// resumes; later starts are checked against that record.
TEST(DatasetIdentityTest, ACheckpointFromBeforeIdentitiesRecordsOneAndContinues) {
  const std::string data = TmpDir("old_job");
  const std::string ckpt = TmpDir("old_job_ckpt");
  Write(data + "/corpus.txt", "old job\n");
  absl::StatusOr<DatasetIdentityCheck> c =
      CheckOrRecordDatasetIdentity(Text(data + "/corpus.txt"), ckpt, true, /*resuming=*/true);
  ASSERT_THAT(c, IsOk());
  EXPECT_TRUE(c->recorded);
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_THAT(c->warnings[0], HasSubstr("predate dataset identities"));
  EXPECT_TRUE(FileExists(ckpt + "/" + kDatasetIdentityFile));
}

TEST(DatasetIdentityTest, AnUnreadableManifestIsADatasetErrorNamingIt) {
  const std::string data = TmpDir("bad_manifest");
  const std::string ckpt = TmpDir("bad_manifest_ckpt");
  Write(data + "/corpus.txt", "text\n");
  Write(ckpt + "/" + kDatasetIdentityFile, "{\"version\": 1, \"files\": 3}");
  absl::Status s = CheckOrRecordDatasetIdentity(Text(data + "/corpus.txt"), ckpt, true, true).status();
  EXPECT_TRUE(IsDatasetError(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(ckpt + "/" + kDatasetIdentityFile));
  EXPECT_THAT(s.message(), HasSubstr("delete the file"));
}

}  // namespace
}  // namespace loom::data
