// Admission checks that read the files a spec names (issue 18): dataset.path must be text the
// trainer can split, model.init_from's tensors must have the shapes model.config implies. On the
// main branch before these checks, every refused spec below was admitted (only existence was
// checked) and then failed on every attempt, or trained on ELF bytes.
#include <sys/stat.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "scheduler/job_spec_validation.h"
#include "scheduler/test_job_spec.h"
#include "storage/safetensors/safetensors.h"
#include "data/corpus.h"

namespace loom {
namespace {

using loom::v1::JobSpec;

std::string TmpDir(const std::string& name) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

JobSpecValidationOptions TestOptions() {
  JobSpecValidationOptions options;
  options.fortunes_dir = std::getenv("TEST_TMPDIR");
  return options;
}

void ExpectInvalid(const JobSpec& spec, const std::string& path, const std::string& detail) {
  absl::Status s = ValidateJobSpec(spec, TestOptions());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(std::string(s.message()).rfind(path + ": ", 0), 0u)
      << "want prefix '" << path << ": ': " << s;
  EXPECT_NE(s.message().find(detail), std::string::npos) << "want '" << detail << "': " << s;
}

JobSpec WithDataset(const std::string& path) {
  JobSpec spec = ValidTestJobSpec();  // sequence_length 64: windows of 65 tokens
  spec.mutable_dataset()->set_name("");
  spec.mutable_dataset()->set_path(path);
  return spec;
}

// `n` fortune records of about 40 bytes each.
std::string Fortunes(int n) {
  std::string text;
  for (int i = 0; i < n; ++i) absl::StrAppend(&text, "fortune ", i, ": a penny saved is a penny\n%\n");
  return text;
}

TEST(DatasetFilesTest, TextCorpusIsAdmitted) {
  const std::string dir = TmpDir("good");
  ASSERT_TRUE(WriteFileAtomically(dir + "/a", Fortunes(300)).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/b.dat", std::string("\0\0\0\1", 4)).ok());  // skipped
  ASSERT_TRUE(WriteFileAtomically(dir + "/c", "caf\xC3\xA9 \xE2\x82\xAC\n%\n").ok());  // UTF-8
  absl::Status s = ValidateJobSpec(WithDataset(dir), TestOptions());
  EXPECT_TRUE(s.ok()) << s;
  s = ValidateJobSpec(WithDataset(dir + "/a"), TestOptions());  // one file
  EXPECT_TRUE(s.ok()) << s;
}

// Regression: `dataset.path: /bin/ls` was admitted and the job trained on the ELF bytes.
TEST(DatasetFilesTest, BinaryFileIsRefusedNamingFileAndOffset) {
  const std::string dir = TmpDir("binary");
  const std::string elf = dir + "/prog";
  ASSERT_TRUE(WriteFileAtomically(elf, std::string("\x7f" "ELF\x02\x01\x01\x00\x00", 9)).ok());
  ExpectInvalid(WithDataset(elf), "dataset.path", absl::StrCat("'", elf, "' is not text: NUL byte at offset 7"));
  // In a directory, the offending file is named.
  const std::string mixed = TmpDir("mixed");
  ASSERT_TRUE(WriteFileAtomically(mixed + "/a-text", Fortunes(300)).ok());
  ASSERT_TRUE(WriteFileAtomically(mixed + "/b-latin1", "na\xEFve\n").ok());
  ExpectInvalid(WithDataset(mixed), "dataset.path",
                absl::StrCat("'", mixed, "/b-latin1' is not text: invalid UTF-8 at offset 2"));
  struct stat st;
  if (::stat("/bin/ls", &st) == 0) ExpectInvalid(WithDataset("/bin/ls"), "dataset.path", "is not text");
}

// Regression: an empty directory was admitted and failed only at run time.
TEST(DatasetFilesTest, DirectoryWithoutCorpusFilesIsRefused) {
  const std::string empty = TmpDir("empty");
  ExpectInvalid(WithDataset(empty), "dataset.path", "holds no corpus files");
  const std::string only_skipped = TmpDir("only-skipped");
  ASSERT_TRUE(WriteFileAtomically(only_skipped + "/x.dat", "1").ok());
  ASSERT_TRUE(MakeDirs(only_skipped + "/subdir").ok());
  ASSERT_EQ(::symlink("/etc/hostname", (only_skipped + "/link").c_str()), 0);
  ExpectInvalid(WithDataset(only_skipped), "dataset.path", "holds no corpus files");
}

TEST(DatasetFilesTest, FifoIsRefusedWithoutBlocking) {
  const std::string fifo = TmpDir("fifo") + "/pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ExpectInvalid(WithDataset(fifo), "dataset.path", "neither a regular file nor a directory");
}

// The split is checked by the trainer's own LoadCorpus; this test's expectation is computed from
// the documented rule (document i is held out iff Mix64(i ^ 0x6c6f6f6d) / 2^64 < fraction).
TEST(DatasetFilesTest, SplitLeavingASideEmptyIsRefused) {
  // The first held-out document index under the default fraction 0.05.
  int first_heldout = 0;
  while (static_cast<double>(data::Mix64(static_cast<uint64_t>(first_heldout) ^ 0x6c6f6f6dULL)) >=
         0.05 * 18446744073709551616.0) {
    ++first_heldout;
  }
  ASSERT_GT(first_heldout, 0);
  const std::string dir = TmpDir("few");
  // `first_heldout` documents: all go to training, none is held out.
  ASSERT_TRUE(WriteFileAtomically(dir + "/f", Fortunes(first_heldout)).ok());
  ExpectInvalid(WithDataset(dir), "dataset.path", "left one side empty");
  // One more document and the held-out side has one (~40 bytes, shorter than a 65-token window).
  ASSERT_TRUE(WriteFileAtomically(dir + "/f", Fortunes(first_heldout + 1)).ok());
  ExpectInvalid(WithDataset(dir), "training.sequence_length", "does not fit the corpus");
  JobSpec spec = WithDataset(dir);
  spec.mutable_training()->set_sequence_length(8);
  absl::Status s = ValidateJobSpec(spec, TestOptions());
  EXPECT_TRUE(s.ok()) << s;
}

// ---- model.init_from ----

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype = "F32";
};

// The HF tensors of ValidTestJobSpec's model, written out by hand (vocab 256, hidden 64,
// intermediate 176, 2 layers, 4 heads of 16, 2 KV heads, tied embeddings).
std::vector<Tensor> TestModelTensors(int layers = 2, int64_t hidden = 64) {
  std::vector<Tensor> t = {{"model.embed_tokens.weight", {256, hidden}}};
  for (int i = 0; i < layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    t.push_back({p + "input_layernorm.weight", {hidden}});
    t.push_back({p + "self_attn.q_proj.weight", {64, hidden}});
    t.push_back({p + "self_attn.k_proj.weight", {32, hidden}});
    t.push_back({p + "self_attn.v_proj.weight", {32, hidden}});
    t.push_back({p + "self_attn.o_proj.weight", {hidden, 64}});
    t.push_back({p + "post_attention_layernorm.weight", {hidden}});
    t.push_back({p + "mlp.gate_proj.weight", {176, hidden}});
    t.push_back({p + "mlp.up_proj.weight", {176, hidden}});
    t.push_back({p + "mlp.down_proj.weight", {hidden, 176}});
  }
  t.push_back({"model.norm.weight", {hidden}});
  return t;
}

void WriteSafetensors(const std::string& path, const std::vector<Tensor>& tensors) {
  std::vector<safetensors::TensorData> data;
  for (const Tensor& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    data.push_back({{t.name, t.dtype, t.shape},
                    std::string(static_cast<size_t>(n) * (t.dtype == "F32" ? 4 : 2), '\0')});
  }
  ASSERT_TRUE(safetensors::WriteFile(path, data).ok()) << path;
}

JobSpec WithInitFrom(const std::string& dir) {
  JobSpec spec = ValidTestJobSpec();
  spec.mutable_model()->set_init_from(dir);
  return spec;
}

TEST(InitFromShapesTest, MatchingExportIsAdmitted) {
  const std::string dir = TmpDir("export-ok");
  std::vector<Tensor> tensors = TestModelTensors();
  tensors[1].dtype = "BF16";
  tensors.push_back({"lm_head.weight", {256, 64}});  // HF writes it even when tied
  WriteSafetensors(dir + "/model.safetensors", tensors);
  absl::Status s = ValidateJobSpec(WithInitFrom(dir), TestOptions());
  EXPECT_TRUE(s.ok()) << s;
}

// Regression: an export of another model was admitted and failed identically on every attempt.
TEST(InitFromShapesTest, ShapeMismatchIsRefusedNamingTheTensor) {
  const std::string dir = TmpDir("export-hidden32");
  WriteSafetensors(dir + "/model.safetensors", TestModelTensors(2, /*hidden=*/32));
  ExpectInvalid(WithInitFrom(dir), "model.init_from",
                "tensor 'model.embed_tokens.weight' has shape [256, 32]");
  ExpectInvalid(WithInitFrom(dir), "model.init_from", "model.config implies [256, 64]");
}

TEST(InitFromShapesTest, MissingAndExtraLayersAreRefused) {
  const std::string shallow = TmpDir("export-1layer");
  WriteSafetensors(shallow + "/model.safetensors", TestModelTensors(1));
  ExpectInvalid(WithInitFrom(shallow), "model.init_from",
                "tensor 'model.layers.1.input_layernorm.weight' (shape [64] for model.config) is "
                "missing");
  const std::string deep = TmpDir("export-3layers");
  WriteSafetensors(deep + "/model.safetensors", TestModelTensors(3));
  ExpectInvalid(WithInitFrom(deep), "model.init_from",
                "tensor 'model.layers.2.input_layernorm.weight'");
  ExpectInvalid(WithInitFrom(deep), "model.init_from", "num_hidden_layers 2");
}

TEST(InitFromShapesTest, WrongDtypeIsRefused) {
  const std::string dir = TmpDir("export-f16");
  std::vector<Tensor> tensors = TestModelTensors();
  tensors[0].dtype = "F16";
  WriteSafetensors(dir + "/model.safetensors", tensors);
  ExpectInvalid(WithInitFrom(dir), "model.init_from",
                "tensor 'model.embed_tokens.weight' is F16");
}

TEST(InitFromShapesTest, ShardedExportIsCheckedAcrossShards) {
  const std::string dir = TmpDir("export-sharded");
  std::vector<Tensor> all = TestModelTensors();
  all.back().shape = {65};  // model.norm.weight, in the second shard
  const std::vector<Tensor> first(all.begin(), all.begin() + 10);
  const std::vector<Tensor> second(all.begin() + 10, all.end());
  WriteSafetensors(dir + "/model-00001-of-00002.safetensors", first);
  WriteSafetensors(dir + "/model-00002-of-00002.safetensors", second);
  std::string index = R"({"metadata": {}, "weight_map": {)";
  for (size_t i = 0; i < all.size(); ++i) {
    absl::StrAppend(&index, i ? ", " : "", "\"", all[i].name, "\": \"model-0000", i < 10 ? 1 : 2,
                    "-of-00002.safetensors\"");
  }
  absl::StrAppend(&index, "}}");
  ASSERT_TRUE(WriteFileAtomically(dir + "/model.safetensors.index.json", index).ok());
  ExpectInvalid(WithInitFrom(dir), "model.init_from",
                "tensor 'model.norm.weight' has shape [65] in " + dir +
                    "/model-00002-of-00002.safetensors");
}

TEST(InitFromShapesTest, CorruptHeaderIsRefusedNamingTheFile) {
  const std::string dir = TmpDir("export-garbage");
  ASSERT_TRUE(WriteFileAtomically(dir + "/model.safetensors", std::string(64, 'x')).ok());
  ExpectInvalid(WithInitFrom(dir), "model.init_from", dir + "/model.safetensors");
}

}  // namespace
}  // namespace loom
