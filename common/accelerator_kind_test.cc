#include "common/accelerator_kind.h"

#include <gtest/gtest.h>

namespace loom {
namespace {

TEST(AcceleratorKindTest, NamesRoundTripAndUnknownsAreRefusedOrNumbered) {
  for (auto kind : {loom::v1::ACCELERATOR_KIND_CPU, loom::v1::ACCELERATOR_KIND_H100,
                    loom::v1::ACCELERATOR_KIND_H200, loom::v1::ACCELERATOR_KIND_GH200}) {
    absl::StatusOr<loom::v1::AcceleratorKind> back = ParseAcceleratorKind(AcceleratorKindName(kind));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, kind);
  }
  EXPECT_EQ(AcceleratorKindName(loom::v1::ACCELERATOR_KIND_GH200), "gh200");
  EXPECT_EQ(*ParseAcceleratorKind("H100"), loom::v1::ACCELERATOR_KIND_H100);
  EXPECT_EQ(ParseAcceleratorKind("unspecified").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseAcceleratorKind("tpu").status().code(), absl::StatusCode::kInvalidArgument);
  // A kind from a newer peer prints as its number instead of an empty name.
  EXPECT_EQ(AcceleratorKindName(static_cast<loom::v1::AcceleratorKind>(42)), "42");
}

}  // namespace
}  // namespace loom
