#include "storage/safetensors/safetensors.h"

#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/file_util.h"
#include "common/testing/status_matchers.h"

namespace loom::safetensors {
namespace {

using ::loom::testing::StatusIs;

std::string TmpPath(absl::string_view name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

std::string LengthPrefix(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

// A file = prefix(len(json)) + json + data (no padding unless the caller adds it).
std::string WriteRaw(absl::string_view name, absl::string_view json, absl::string_view data) {
  std::string path = TmpPath(name);
  std::string bytes = LengthPrefix(json.size());
  bytes.append(json.data(), json.size());
  bytes.append(data.data(), data.size());
  EXPECT_TRUE(WriteFileAtomically(path, bytes).ok());
  return path;
}

std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

bool DirHasTmpFiles(const std::string& dir, absl::string_view prefix) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return false;
  bool found = false;
  while (struct dirent* e = ::readdir(d)) {
    absl::string_view n(e->d_name);
    if (n.substr(0, prefix.size()) == prefix && n.find(".tmp.") != absl::string_view::npos) {
      found = true;
    }
  }
  ::closedir(d);
  return found;
}

void ExpectError(const absl::StatusOr<std::unique_ptr<Reader>>& r, absl::StatusCode code,
                 absl::string_view substring) {
  EXPECT_THAT(r, StatusIs(code, std::string(substring)));
}

// docs/design/TECHNIQUES.md §5.3 worked example, byte for byte.
TEST(SafetensorsWriterTest, WorkedExampleByteForByte) {
  std::string path = TmpPath("worked.safetensors");
  const std::string data = {'\x01', '\x02', '\x03', '\x04', '\x05', '\x06'};
  auto size = WriteFile(path, {TensorData{{"bias", "BF16", {3}}, data}});
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, 110);
  auto bytes = ReadFile(path);
  ASSERT_TRUE(bytes.ok());
  ASSERT_EQ(bytes->size(), 110u);
  const std::string json =
      R"({"__metadata__":{"format":"pt"},"bias":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]}})";
  ASSERT_EQ(json.size(), 89u);
  const std::string expected_prefix("\x60\x00\x00\x00\x00\x00\x00\x00", 8);
  EXPECT_EQ(bytes->substr(0, 8), expected_prefix);
  EXPECT_EQ(bytes->substr(8, 89), json);
  EXPECT_EQ(bytes->substr(97, 7), std::string(7, ' '));
  EXPECT_EQ(bytes->substr(104), data);
  EXPECT_EQ(*bytes, expected_prefix + json + std::string(7, ' ') + data);
}

// Test vectors of the reference writer's own tests (safetensors tensor.rs, no metadata).
TEST(SafetensorsWriterTest, MatchesReferenceVectorsWithoutMetadata) {
  WriterOptions no_meta;
  no_meta.metadata.clear();
  const std::string data = FloatBytes({0, 1, 2, 3, 4, 5});

  std::string p1 = TmpPath("ref1.safetensors");
  ASSERT_TRUE(WriteFile(p1, {TensorData{{"attn.0", "F32", {1, 2, 3}}, data}}, no_meta).ok());
  const std::string j1 = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  ASSERT_EQ(j1.size(), 64u);  // already a multiple of 8: no padding
  EXPECT_EQ(*ReadFile(p1), LengthPrefix(64) + j1 + data);

  std::string p2 = TmpPath("ref2.safetensors");
  ASSERT_TRUE(WriteFile(p2, {TensorData{{"attn0", "F32", {1, 1, 2, 3}}, data}}, no_meta).ok());
  const std::string j2 = R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})";
  ASSERT_EQ(j2.size(), 65u);
  EXPECT_EQ(*ReadFile(p2), LengthPrefix(72) + j2 + std::string(7, ' ') + data);

  // No tensors at all: "{}" padded to 8.
  std::string p3 = TmpPath("ref3.safetensors");
  ASSERT_TRUE(WriteFile(p3, std::vector<TensorData>{}, no_meta).ok());
  EXPECT_EQ(*ReadFile(p3), LengthPrefix(8) + "{}      ");
}

TEST(SafetensorsWriterTest, OrdersByDtypeAlignmentDescendingThenName) {
  auto header = PlanHeader({{"b", "F32", {2}},
                            {"x", "U8", {3}},
                            {"a", "F32", {1}},
                            {"z", "BF16", {2}},
                            {"c", "I64", {1}},
                            {"w", "F64", {}}},
                           {{"format", "pt"}});
  ASSERT_TRUE(header.ok()) << header.status();
  std::vector<std::string> names;
  for (const TensorEntry& e : header->tensors) names.push_back(e.name);
  // I64 (rank 20) > F64 (19) > F32 (17) > BF16 (14) > U8 (4), names ascending within a dtype.
  EXPECT_EQ(names, (std::vector<std::string>{"c", "w", "a", "b", "z", "x"}));
  std::vector<std::pair<int64_t, int64_t>> offsets;
  for (const TensorEntry& e : header->tensors) offsets.emplace_back(e.begin, e.end);
  EXPECT_EQ(offsets, (std::vector<std::pair<int64_t, int64_t>>{
                         {0, 8}, {8, 16}, {16, 20}, {20, 28}, {28, 32}, {32, 35}}));
  EXPECT_EQ(header->data_bytes, 35);
  auto text = SerializeHeader(*header);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->size() % 8, 0u);
  EXPECT_EQ(text->rfind(R"({"__metadata__":{"format":"pt"},"c":{"dtype":"I64")", 0), 0u);
}

TEST(SafetensorsWriterTest, RejectsBadSpecs) {
  auto dup = PlanHeader({{"a", "F32", {1}}, {"a", "F16", {1}}}, {});
  EXPECT_THAT(dup, StatusIs(absl::StatusCode::kInvalidArgument, "duplicate tensor name 'a'"));

  auto dtype = PlanHeader({{"a", "F31", {1}}}, {});
  EXPECT_THAT(dtype, StatusIs(absl::StatusCode::kInvalidArgument, "unknown dtype 'F31'"));

  auto neg = PlanHeader({{"a", "F32", {2, -1}}}, {});
  EXPECT_THAT(neg, StatusIs(absl::StatusCode::kInvalidArgument, "negative dimension"));

  auto reserved = PlanHeader({{"__metadata__", "F32", {1}}}, {});
  EXPECT_EQ(reserved.status().code(), absl::StatusCode::kInvalidArgument);

  auto utf8 = PlanHeader({{"bad\xff", "F32", {1}}}, {});
  EXPECT_THAT(utf8, StatusIs(absl::StatusCode::kInvalidArgument, "not UTF-8"));

  // F4 packs two elements per byte: 3 elements is not a whole number of bytes.
  EXPECT_EQ(TensorByteSize("F4", {3}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*TensorByteSize("F4", {2, 2}), 2);
  EXPECT_EQ(*TensorByteSize("F6_E2M3", {4}), 3);
  EXPECT_EQ(*TensorByteSize("BOOL", {5}), 5);
  EXPECT_EQ(*TensorByteSize("C64", {}), 8);
  EXPECT_EQ(*TensorByteSize("F32", {0, 7}), 0);
  EXPECT_EQ(TensorByteSize("F64", {int64_t{1} << 40, int64_t{1} << 40}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsWriterTest, SourceProducingWrongByteCountLeavesNoFile) {
  std::string dir = TmpPath("wrongcount");
  ASSERT_TRUE(MakeDirs(dir).ok());
  std::string path = dir + "/model.safetensors";
  auto short_source = [](const TensorEntry& e, const ByteSink& sink) {
    std::string b(static_cast<size_t>(e.size_bytes() - 1), 'x');
    return sink(b.data(), b.size());
  };
  auto r = WriteFile(path, {{"a", "F32", {4}}}, short_source);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(r.status().message().find("tensor 'a' produced 15 bytes, tensor has 16"),
            absl::string_view::npos)
      << r.status();
  EXPECT_EQ(ReadFile(path).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(DirHasTmpFiles(dir, "model.safetensors"));

  auto long_source = [](const TensorEntry& e, const ByteSink& sink) {
    std::string b(static_cast<size_t>(e.size_bytes() + 4), 'x');
    return sink(b.data(), b.size());
  };
  EXPECT_EQ(WriteFile(path, {{"a", "F32", {4}}}, long_source).status().code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(ReadFile(path).status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsWriterTest, FailingSourceMidwayKeepsPreviousFile) {
  std::string dir = TmpPath("midway");
  ASSERT_TRUE(MakeDirs(dir).ok());
  std::string path = dir + "/model.safetensors";
  ASSERT_TRUE(WriteFileAtomically(path, "previous").ok());
  int calls = 0;
  auto source = [&](const TensorEntry& e, const ByteSink& sink) -> absl::Status {
    if (++calls == 2) return absl::UnavailableError("disk went away");
    std::string b(static_cast<size_t>(e.size_bytes()), 'y');
    return sink(b.data(), b.size());
  };
  auto r = WriteFile(path, {{"a", "F32", {4}}, {"b", "F32", {4}}, {"c", "F32", {4}}}, source);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(*ReadFile(path), "previous");
  EXPECT_FALSE(DirHasTmpFiles(dir, "model.safetensors"));
}

TEST(SafetensorsRoundTripTest, SeveralDtypesShapesZeroDimAndZeroSize) {
  std::vector<TensorData> tensors;
  tensors.push_back({{"scalar", "F32", {}}, FloatBytes({3.5f})});
  tensors.push_back({{"empty", "F32", {0}}, ""});
  tensors.push_back({{"empty2d", "BF16", {4, 0}}, ""});
  tensors.push_back({{"matrix", "F32", {2, 3}}, FloatBytes({1, 2, 3, 4, 5, 6})});
  tensors.push_back({{"half", "F16", {3}}, std::string("\x00\x3c\x00\x40\x00\xc2", 6)});
  tensors.push_back({{"ids", "I64", {2}}, std::string("\x07\0\0\0\0\0\0\0\xff\xff\xff\xff\xff\xff\xff\xff", 16)});
  tensors.push_back({{"mask", "BOOL", {3}}, std::string("\x01\x00\x01", 3)});
  tensors.push_back({{"u8", "U8", {2, 2, 1}}, "abcd"});
  tensors.push_back({{"model.layers.0.self_attn.q_proj.weight", "F64", {1}}, std::string(8, '\x11')});
  WriterOptions options;
  options.metadata = {{"format", "pt"}, {"producer", "loom"}};
  std::string path = TmpPath("roundtrip.safetensors");
  auto size = WriteFile(path, tensors, options);
  ASSERT_TRUE(size.ok()) << size.status();

  auto reader = Reader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const Reader& r = **reader;
  EXPECT_EQ(r.file_bytes(), *size);
  EXPECT_EQ(r.header_bytes() % 8, 0);
  EXPECT_EQ(r.metadata(), options.metadata);
  EXPECT_TRUE(r.header().has_metadata);
  ASSERT_EQ(r.tensors().size(), tensors.size());
  EXPECT_EQ(8 + r.header_bytes() + r.header().data_bytes, r.file_bytes());
  for (const TensorData& t : tensors) {
    const TensorEntry* e = r.Find(t.spec.name);
    ASSERT_NE(e, nullptr) << t.spec.name;
    EXPECT_EQ(e->dtype, t.spec.dtype);
    EXPECT_EQ(e->shape, t.spec.shape);
    auto bytes = r.ReadTensor(t.spec.name);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(*bytes, t.bytes) << t.spec.name;
  }
  EXPECT_EQ(r.Find("scalar")->numel(), 1);
  EXPECT_EQ(r.Find("empty2d")->numel(), 0);

  // Partial reads.
  const TensorEntry* m = r.Find("matrix");
  float two[2];
  ASSERT_TRUE(r.ReadTensorRange(*m, 12, two, sizeof(two)).ok());
  EXPECT_EQ(two[0], 4.0f);
  EXPECT_EQ(two[1], 5.0f);
  EXPECT_EQ(r.ReadTensorRange(*m, 20, two, sizeof(two)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.ReadTensor("nope").status().code(), absl::StatusCode::kNotFound);
}

// A file as Python's `safetensors.torch.save_file({"weight": torch.tensor([[1., -2.5],
// [3.25, .5]]), "ids": torch.tensor([7, -1])}, metadata={"format": "pt"})` writes it, hand-written
// byte by byte: I64 sorts before F32, header 150 bytes + 2 spaces = 152 = 0x98.
TEST(SafetensorsReaderTest, ReadsReferenceWrittenFile) {
  const unsigned char kFile[] = {
      0x98, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // N = 152
      // {"__metadata__":{"format":"pt"},"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},
      // "weight":{"dtype":"F32","shape":[2,2],"data_offsets":[16,32]}}
      '{', '"', '_', '_', 'm', 'e', 't', 'a', 'd', 'a', 't', 'a', '_', '_', '"', ':', '{', '"',
      'f', 'o', 'r', 'm', 'a', 't', '"', ':', '"', 'p', 't', '"', '}', ',', '"', 'i', 'd', 's',
      '"', ':', '{', '"', 'd', 't', 'y', 'p', 'e', '"', ':', '"', 'I', '6', '4', '"', ',', '"',
      's', 'h', 'a', 'p', 'e', '"', ':', '[', '2', ']', ',', '"', 'd', 'a', 't', 'a', '_', 'o',
      'f', 'f', 's', 'e', 't', 's', '"', ':', '[', '0', ',', '1', '6', ']', '}', ',', '"', 'w',
      'e', 'i', 'g', 'h', 't', '"', ':', '{', '"', 'd', 't', 'y', 'p', 'e', '"', ':', '"', 'F',
      '3', '2', '"', ',', '"', 's', 'h', 'a', 'p', 'e', '"', ':', '[', '2', ',', '2', ']', ',',
      '"', 'd', 'a', 't', 'a', '_', 'o', 'f', 'f', 's', 'e', 't', 's', '"', ':', '[', '1', '6',
      ',', '3', '2', ']', '}', '}', ' ', ' ',
      // ids: 7, -1 (int64 little-endian)
      0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
      // weight: 1.0, -2.5, 3.25, 0.5 (f32 little-endian)
      0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc0, 0x00, 0x00, 0x50, 0x40, 0x00, 0x00, 0x00, 0x3f};
  static_assert(sizeof(kFile) == 192, "8 + 152 + 32");
  const std::string file(reinterpret_cast<const char*>(kFile), sizeof(kFile));
  std::string path = TmpPath("python.safetensors");
  ASSERT_TRUE(WriteFileAtomically(path, file).ok());

  auto reader = Reader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const Reader& r = **reader;
  EXPECT_EQ(r.header_bytes(), 152);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  ASSERT_EQ(r.tensors().size(), 2u);
  EXPECT_EQ(r.tensors()[0].name, "ids");
  EXPECT_EQ(r.tensors()[1].name, "weight");
  EXPECT_EQ(r.Find("weight")->shape, (std::vector<int64_t>{2, 2}));
  auto w = r.ReadTensor("weight");
  ASSERT_TRUE(w.ok());
  std::vector<float> vals(4);
  std::memcpy(vals.data(), w->data(), 16);
  EXPECT_EQ(vals, (std::vector<float>{1.0f, -2.5f, 3.25f, 0.5f}));
  auto ids = r.ReadTensor("ids");
  ASSERT_TRUE(ids.ok());
  int64_t id[2];
  std::memcpy(id, ids->data(), 16);
  EXPECT_EQ(id[0], 7);
  EXPECT_EQ(id[1], -1);

  // And our writer produces exactly these bytes from the same tensors.
  std::string ours = TmpPath("python_ours.safetensors");
  ASSERT_TRUE(WriteFile(ours, {TensorData{{"weight", "F32", {2, 2}}, file.substr(176, 16)},
                               TensorData{{"ids", "I64", {2}}, file.substr(160, 16)}})
                  .ok());
  EXPECT_EQ(*ReadFile(ours), file);
}

TEST(SafetensorsReaderTest, AcceptsAnyKeyOrderAndWhitespace) {
  // Tensors listed out of offset order, metadata last, spaces inside the JSON, no padding.
  std::string json =
      R"({ "b": {"data_offsets": [4, 12], "shape": [2], "dtype": "F32"},)"
      R"( "a": {"dtype": "I32", "shape": [], "data_offsets": [0, 4]}, "__metadata__": {}})";
  std::string path = WriteRaw("order.safetensors", json, std::string(12, '\0'));
  auto r = Reader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ((*r)->tensors().size(), 2u);
  EXPECT_EQ((*r)->tensors()[0].name, "a");
  EXPECT_EQ((*r)->tensors()[1].name, "b");
  EXPECT_TRUE((*r)->header().has_metadata);
  EXPECT_TRUE((*r)->metadata().empty());
}

class SafetensorsRejectTest : public ::testing::Test {
 protected:
  // A valid two-tensor file's bytes.
  std::string ValidFile() {
    std::string path = TmpPath("valid.safetensors");
    EXPECT_TRUE(WriteFile(path, {TensorData{{"a", "F32", {2}}, FloatBytes({1, 2})},
                                 TensorData{{"b", "F32", {3}}, FloatBytes({3, 4, 5})}})
                    .ok());
    return *ReadFile(path);
  }
  absl::StatusOr<std::unique_ptr<Reader>> OpenBytes(absl::string_view name,
                                                    const std::string& bytes) {
    std::string path = TmpPath(name);
    EXPECT_TRUE(WriteFileAtomically(path, bytes).ok());
    return Reader::Open(path);
  }
};

TEST_F(SafetensorsRejectTest, ValidFileOpens) {
  EXPECT_TRUE(OpenBytes("ok.safetensors", ValidFile()).ok());
}

TEST_F(SafetensorsRejectTest, TruncatedData) {
  std::string f = ValidFile();
  f.pop_back();
  ExpectError(OpenBytes("trunc.safetensors", f), absl::StatusCode::kDataLoss,
              "trunc.safetensors: truncated safetensors file: tensor 'b' ends at data byte 20 but "
              "the file holds only 19");
}

TEST_F(SafetensorsRejectTest, ShorterThanLengthPrefix) {
  ExpectError(OpenBytes("tiny.safetensors", std::string(5, '\0')), absl::StatusCode::kDataLoss,
              "5 bytes, shorter than the 8-byte header length");
  ExpectError(Reader::Open(TmpPath("absent.safetensors")), absl::StatusCode::kNotFound,
              "absent.safetensors");
}

TEST_F(SafetensorsRejectTest, HeaderLengthLargerThanFile) {
  std::string f = ValidFile();
  std::string bad = LengthPrefix(f.size()) + f.substr(8);
  ExpectError(OpenBytes("hdrlen.safetensors", bad), absl::StatusCode::kDataLoss,
              absl::StrCat("header length ", f.size(), " but only ", f.size() - 8, " bytes follow"));
}

TEST_F(SafetensorsRejectTest, HeaderLengthOverLimit) {
  std::string f = ValidFile();
  std::string bad = LengthPrefix(100'000'001) + f.substr(8);
  ExpectError(OpenBytes("huge.safetensors", bad), absl::StatusCode::kInvalidArgument,
              "length 100000001 exceeds the limit 100000000");
}

TEST_F(SafetensorsRejectTest, OverlappingOffsets) {
  std::string path = WriteRaw(
      "overlap.safetensors",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      std::string(12, '\0'));
  ExpectError(Reader::Open(path), absl::StatusCode::kInvalidArgument,
              "tensor 'b' data_offsets [4,12] overlap tensor 'a' [0,8]");
}

TEST_F(SafetensorsRejectTest, GappedOffsets) {
  std::string path = WriteRaw(
      "gap.safetensors",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
      std::string(20, '\0'));
  ExpectError(Reader::Open(path), absl::StatusCode::kInvalidArgument,
              "gap of 4 bytes between tensor 'a' (ends at 8) and tensor 'b' (begins at 12)");
  std::string path2 = WriteRaw(
      "gap0.safetensors", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      std::string(12, '\0'));
  ExpectError(Reader::Open(path2), absl::StatusCode::kInvalidArgument,
              "first tensor 'a' begins at 4, not 0");
}

TEST_F(SafetensorsRejectTest, TrailingBytes) {
  ExpectError(OpenBytes("trailing.safetensors", ValidFile() + "X"),
              absl::StatusCode::kInvalidArgument,
              "1 trailing bytes after the last tensor (data ends at 20)");
}

TEST_F(SafetensorsRejectTest, UnknownDtype) {
  std::string path = WriteRaw("dtype.safetensors",
                              R"({"w":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})",
                              std::string(4, '\0'));
  ExpectError(Reader::Open(path), absl::StatusCode::kInvalidArgument,
              "dtype.safetensors: invalid safetensors header: tensor 'w': unknown dtype 'F31'");
}

TEST_F(SafetensorsRejectTest, SizeMismatch) {
  std::string path = WriteRaw("size.safetensors",
                              R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                              std::string(8, '\0'));
  ExpectError(Reader::Open(path), absl::StatusCode::kInvalidArgument,
              "tensor 'w': data_offsets [0,8] span 8 bytes but F32 [3] needs 12");
}

TEST_F(SafetensorsRejectTest, DuplicateName) {
  std::string path = WriteRaw(
      "dup.safetensors",
      R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
      std::string(8, '\0'));
  ExpectError(Reader::Open(path), absl::StatusCode::kInvalidArgument, "duplicate tensor name 'w'");
}

TEST_F(SafetensorsRejectTest, MalformedHeaders) {
  ExpectError(Reader::Open(WriteRaw("notjson.safetensors", "{\"w\":", "")),
              absl::StatusCode::kInvalidArgument, "not UTF-8 JSON");
  ExpectError(Reader::Open(WriteRaw("array.safetensors", " {}", "")),
              absl::StatusCode::kInvalidArgument, "does not start with '{'");
  ExpectError(Reader::Open(WriteRaw("utf8.safetensors", "{\"\xc3\x28\":{}}", "")),
              absl::StatusCode::kInvalidArgument, "not UTF-8 JSON");
  ExpectError(Reader::Open(WriteRaw("meta.safetensors", R"({"__metadata__":{"format":1}})", "")),
              absl::StatusCode::kInvalidArgument, "__metadata__ value of 'format' is not a string");
  ExpectError(Reader::Open(WriteRaw("negshape.safetensors",
                                    R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})",
                                    "")),
              absl::StatusCode::kInvalidArgument, "tensor 'w': shape [-1] is not a list");
  ExpectError(Reader::Open(WriteRaw("offsets.safetensors",
                                    R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})",
                                    std::string(4, '\0'))),
              absl::StatusCode::kInvalidArgument, "tensor 'w': \"data_offsets\" is not");
  ExpectError(Reader::Open(WriteRaw("backwards.safetensors",
                                    R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})",
                                    std::string(4, '\0'))),
              absl::StatusCode::kInvalidArgument, "end before begin");
}

}  // namespace
}  // namespace loom::safetensors
