#include "common/testing/status_matchers.h"

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::testing {
namespace {

using ::testing::Not;

// What gMock would print for `value` against `m`: the match result and the explanation.
template <typename M, typename T>
std::pair<bool, std::string> Explain(const M& m, const T& value) {
  ::testing::StringMatchResultListener listener;
  const bool matched = ::testing::ExplainMatchResult(m, value, &listener);
  return {matched, listener.str()};
}

TEST(StatusIsTest, MatchesCodeAndSubstringOfAbslStatus) {
  const absl::Status s = absl::NotFoundError("job job-7 does not exist");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound, "job-7"));
  EXPECT_THAT(s, Not(StatusIs(absl::StatusCode::kNotFound, "job-8")));
  EXPECT_THAT(s, Not(StatusIs(absl::StatusCode::kInvalidArgument, "job-7")));
  EXPECT_THAT(s, Not(IsOk()));
  EXPECT_THAT(absl::OkStatus(), IsOk());
  EXPECT_THAT(absl::OkStatus(), Not(StatusIs(absl::StatusCode::kNotFound)));
  // Case-sensitive substring.
  EXPECT_THAT(s, Not(StatusIs(absl::StatusCode::kNotFound, "JOB-7")));
}

TEST(StatusIsTest, MatchesStatusOr) {
  absl::StatusOr<int> bad = absl::InvalidArgumentError("spec.steps: must be >= 1");
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument, "spec.steps"));
  EXPECT_THAT(bad, Not(IsOk()));
  absl::StatusOr<int> good = 3;
  EXPECT_THAT(good, IsOk());
  EXPECT_THAT(good, Not(StatusIs(absl::StatusCode::kInvalidArgument)));
}

TEST(StatusIsTest, MatchesGrpcStatusWithEitherCodeType) {
  const grpc::Status s(grpc::StatusCode::PERMISSION_DENIED, "token lacks admin");
  EXPECT_THAT(s, StatusIs(grpc::StatusCode::PERMISSION_DENIED, "admin"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kPermissionDenied, "admin"));
  EXPECT_THAT(s, Not(StatusIs(grpc::StatusCode::UNAUTHENTICATED)));
  EXPECT_THAT(grpc::Status::OK, IsOk());
}

TEST(StatusIsTest, DescribesExpectationAndActualStatus) {
  auto [matched, why] = Explain(StatusIs(absl::StatusCode::kNotFound, "x"),
                                absl::InternalError("disk on fire"));
  EXPECT_FALSE(matched);
  EXPECT_EQ(why, "whose status is INTERNAL: disk on fire");
  std::tie(matched, why) = Explain(StatusIs(absl::StatusCode::kNotFound), absl::OkStatus());
  EXPECT_FALSE(matched);
  EXPECT_EQ(why, "whose status is OK");
  EXPECT_EQ(::testing::DescribeMatcher<absl::Status>(
                StatusIs(absl::StatusCode::kNotFound, "job-7")),
            "has status code NOT_FOUND and a message containing \"job-7\"");
  EXPECT_EQ(::testing::DescribeMatcher<absl::Status>(StatusIs(absl::StatusCode::kNotFound),
                                                     /*negation=*/true),
            "does not have status code NOT_FOUND");
}

}  // namespace
}  // namespace loom::testing
