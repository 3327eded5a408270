// deepspeed_pickle.h on pickles produced by CPython 3.11's pickle.dumps(..., protocol=2) (the bytes
// below, printed by /opt/loom/venv/bin/python3), and on malformed or hostile input.
#include "storage/checkpoint/deepspeed_pickle.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::storage::deepspeed {
namespace {

using ::testing::HasSubstr;
using K = PyValue::Kind;

// pickle.dumps({'a': [1, -2, 300, 2**40, -2**40, -1], 'b': (1.5, None, True, False), 'c': 'xé',
//               'd': collections.OrderedDict([('k', torch.Size([2, 3]))])}, protocol=2)
const std::string kDict(
    "\x80\x02\x7d\x71\x00\x28\x58\x01\x00\x00\x00\x61\x71\x01\x5d\x71\x02\x28\x4b\x01\x4a\xfe\xff"
    "\xff\xff\x4d\x2c\x01\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x06\x00\x00\x00\x00\x00\xff\x4a\xff"
    "\xff\xff\xff\x65\x58\x01\x00\x00\x00\x62\x71\x03\x28\x47\x3f\xf8\x00\x00\x00\x00\x00\x00\x4e"
    "\x88\x89\x74\x71\x04\x58\x01\x00\x00\x00\x63\x71\x05\x58\x03\x00\x00\x00\x78\xc3\xa9\x71\x06"
    "\x58\x01\x00\x00\x00\x64\x71\x07\x63\x63\x6f\x6c\x6c\x65\x63\x74\x69\x6f\x6e\x73\x0a\x4f\x72"
    "\x64\x65\x72\x65\x64\x44\x69\x63\x74\x0a\x71\x08\x29\x52\x71\x09\x58\x01\x00\x00\x00\x6b\x71"
    "\x0a\x63\x74\x6f\x72\x63\x68\x0a\x53\x69\x7a\x65\x0a\x71\x0b\x4b\x02\x4b\x03\x86\x71\x0c\x85"
    "\x71\x0d\x52\x71\x0e\x73\x75\x2e",
    169);

// pickle.dumps(E(), protocol=2) where E.__reduce__ returns (os.system, ('true',)).
const std::string kSystem(
    "\x80\x02\x63\x70\x6f\x73\x69\x78\x0a\x73\x79\x73\x74\x65\x6d\x0a\x71\x00\x58\x04\x00\x00\x00"
    "\x74\x72\x75\x65\x71\x01\x85\x71\x02\x52\x71\x03\x2e",
    37);

TEST(UnpickleTest, ReadsWhatCPythonWrites) {
  auto v = Unpickle(kDict, "f.pt");
  ASSERT_TRUE(v.ok()) << v.status();
  const PyValue* a = (*v)->Get("a");
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->is(K::kList));
  std::vector<int64_t> ints;
  for (const auto& e : a->items) ints.push_back(e->i);
  EXPECT_THAT(ints, ::testing::ElementsAre(1, -2, 300, int64_t{1} << 40, -(int64_t{1} << 40), -1));
  const PyValue* b = (*v)->Get("b");
  ASSERT_TRUE(b != nullptr && b->is(K::kTuple) && b->items.size() == 4);
  EXPECT_EQ(b->items[0]->f, 1.5);
  EXPECT_TRUE(b->items[1]->is(K::kNone));
  EXPECT_TRUE(b->items[2]->b);
  EXPECT_FALSE(b->items[3]->b);
  EXPECT_EQ((*v)->Get("c")->s, "x\xc3\xa9");
  const PyValue* d = (*v)->Get("d");
  ASSERT_TRUE(d != nullptr && d->is(K::kDict));
  const PyValue* size = d->Get("k");
  ASSERT_TRUE(size != nullptr && size->is(K::kTuple) && size->items.size() == 2);
  EXPECT_EQ(size->items[0]->i, 2);
  EXPECT_EQ(size->items[1]->i, 3);
}

TEST(UnpickleTest, RefusesOtherGlobalsNamingFileAndByte) {
  auto v = Unpickle(kSystem, "/ckpt/zero_pp_rank_0_mp_rank_00_model_states.pt");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(v.status().message(), HasSubstr("/ckpt/zero_pp_rank_0_mp_rank_00_model_states.pt"));
  EXPECT_THAT(v.status().message(), HasSubstr("byte 2: GLOBAL 'posix system'"));
}

TEST(UnpickleTest, TruncatedUnknownOpcodeAndStackErrorsAreInvalidArgument) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{30}, kDict.size() - 1}) {
    auto v = Unpickle(kDict.substr(0, n), "f.pt");
    ASSERT_FALSE(v.ok()) << n;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << n;
    EXPECT_THAT(v.status().message(), HasSubstr("f.pt: data.pkl: byte ")) << n;
  }
  // INST ('i'): a protocol-0 way to call anything; not in the subset.
  auto inst = Unpickle(std::string("\x80\x02(iposix\nsystem\n.", 17), "f.pt");
  EXPECT_THAT(inst.status().message(), HasSubstr("opcode 0x69 is outside the subset"));
  // APPEND with nothing under it, SETITEM on a list.
  EXPECT_FALSE(Unpickle(std::string("\x80\x02K\x01" "a.", 6), "f.pt").ok());
  EXPECT_FALSE(Unpickle(std::string("\x80\x02]K\x01K\x02s.", 9), "f.pt").ok());
  // REDUCE of an allowed global with a bad argument.
  auto size = Unpickle(std::string("\x80\x02" "ctorch\nSize\nX\x01\x00\x00\x00x\x85R.", 24),
                       "f.pt");
  EXPECT_THAT(size.status().message(), HasSubstr("torch.Size of a non-int tuple"));
}

}  // namespace
}  // namespace loom::storage::deepspeed
