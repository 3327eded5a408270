#include "worker/inventory.h"

#include <sys/utsname.h>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::worker {
namespace {

using ::loom::testing::StatusIs;

TEST(InventoryTest, ParsesLabels) {
  auto l = ParseLabels("zone=b, rack=r12,empty=");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->size(), 3u);
  EXPECT_EQ(l->at("zone"), "b");
  EXPECT_EQ(l->at("rack"), "r12");
  EXPECT_EQ(l->at("empty"), "");
  EXPECT_TRUE(ParseLabels("")->empty());
  EXPECT_NE(ParseLabels("zone").status().message().find("'zone' is not key=value"),
            std::string::npos);
  EXPECT_NE(ParseLabels("=x").status().message().find("not key=value"), std::string::npos);
  EXPECT_NE(ParseLabels("a=1,a=2").status().message().find("key 'a' given twice"),
            std::string::npos);
  EXPECT_THAT(ParseLabels(std::string(64, 'k') + "=v"),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(InventoryTest, CpuArchNames) {
  EXPECT_EQ(NormalizeCpuArch("amd64"), "x86_64");
  EXPECT_EQ(NormalizeCpuArch("arm64"), "aarch64");
  EXPECT_EQ(NormalizeCpuArch("aarch64"), "aarch64");
  EXPECT_EQ(NormalizeCpuArch("riscv64"), "riscv64");
  struct utsname u;
  ASSERT_EQ(::uname(&u), 0);
  EXPECT_EQ(DetectCpuArch(), NormalizeCpuArch(u.machine));
}

}  // namespace
}  // namespace loom::worker
