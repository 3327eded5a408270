#include "common/grpc_status.h"

#include "gtest/gtest.h"

namespace loom {
namespace {

TEST(GrpcStatusTest, CodesAndMessagesSurviveBothWays) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  for (int code = 1; code <= 16; ++code) {
    absl::Status s(static_cast<absl::StatusCode>(code), "shard 3 bad");
    grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    EXPECT_EQ(g.error_message(), "shard 3 bad");
    EXPECT_EQ(FromGrpcStatus(g), s);
  }
  EXPECT_EQ(ToGrpcStatus(absl::DataLossError("x")).error_code(), grpc::StatusCode::DATA_LOSS);
}

// Regression: an error echoing a 1 MiB client string reached the client as RESOURCE_EXHAUSTED
// ("received initial metadata size exceeds limit") instead of its own code.
TEST(GrpcStatusTest, LongMessagesAreCutToFitTheTrailer) {
  const std::string huge(1 << 20, 'q');
  grpc::Status g = ToGrpcStatus(absl::InvalidArgumentError("spec.queue: queue " + huge));
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(g.error_message(),
            "spec.queue: queue " + std::string(kMaxGrpcStatusMessageBytes - 18, 'q') + "... (" +
                std::to_string(18 + huge.size() - kMaxGrpcStatusMessageBytes) + " more bytes)");
  const std::string exact(kMaxGrpcStatusMessageBytes, 'e');
  EXPECT_EQ(ToGrpcStatus(absl::NotFoundError(exact)).error_message(), exact);
}

// The cut never splits a UTF-8 character (a JSON encoder would refuse the message).
TEST(GrpcStatusTest, CutKeepsUtf8Whole) {
  std::string text = "q";
  while (text.size() < 2 * kMaxGrpcStatusMessageBytes) text += "\xC3\xA9";  // e-acute, 2 bytes
  const std::string m = ToGrpcStatus(absl::InvalidArgumentError(text)).error_message();
  const size_t kept = m.find("... (");
  ASSERT_NE(kept, std::string::npos);
  EXPECT_LE(kept, kMaxGrpcStatusMessageBytes);
  EXPECT_EQ(kept % 2, 1u) << "the 'q' and whole 2-byte characters";
  EXPECT_EQ(static_cast<unsigned char>(m[kept - 1]), 0xA9);
}

}  // namespace
}  // namespace loom
