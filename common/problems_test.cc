#include "common/problems.h"

#include <string>
#include <vector>

#include "absl/strings/cord.h"
#include "common/grpc_status.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

TEST(ProblemsTest, NoProblemIsOk) {
  Problems p;
  EXPECT_TRUE(p.empty());
  EXPECT_TRUE(p.ToStatus().ok());
}

TEST(ProblemsTest, OneProblemReadsAsAFirstErrorValidatorsMessage) {
  Problems p;
  p.Add("resources.num_ranks", "must be in [1, 65536], got 0");
  const absl::Status s = p.ToStatus();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "resources.num_ranks: must be in [1, 65536], got 0");
  EXPECT_EQ(ProblemsOf(s), (std::vector<Problem>{{"resources.num_ranks",
                                                   "must be in [1, 65536], got 0"}}));
}

TEST(ProblemsTest, SeveralProblemsAreCountedAndListedInOrderEachFieldOnce) {
  Problems p;
  p.Add("name", "bad");
  p.Add("deepspeed_config.foo", "unknown key");
  p.Add("name", "bad");  // the same problem twice is one
  p.Add("name", "also too long");  // and a field's first problem is its only one
  p.Add("", "no path");
  const absl::Status s = p.ToStatus();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "3 problems:\n  name: bad\n  deepspeed_config.foo: unknown key\n  no path");
  EXPECT_EQ(ProblemsOf(s), (std::vector<Problem>{
                               {"name", "bad"}, {"deepspeed_config.foo", "unknown key"},
                               {"", "no path"}}));
}

TEST(ProblemsTest, MergeTakesEveryProblemOfAStatusAndKeepsOtherErrorsAside) {
  Problems inner;
  inner.Add("a", "one");
  inner.Add("b", "two");
  Problems p;
  EXPECT_TRUE(p.Merge(absl::OkStatus()));
  EXPECT_FALSE(p.Merge(inner.ToStatus()));
  EXPECT_FALSE(p.Merge(absl::InvalidArgumentError("model.config.vocab_size: required")));
  EXPECT_FALSE(p.Merge(absl::InvalidArgumentError("a message without a path: here")));
  EXPECT_EQ(p.size(), 4u);
  EXPECT_EQ(p.problems()[2], (Problem{"model.config.vocab_size", "required"}));
  EXPECT_EQ(p.problems()[3], (Problem{"", "a message without a path: here"}));

  Problems setup;
  EXPECT_FALSE(setup.Merge(absl::FailedPreconditionError("dataset.name: no corpus")));
  EXPECT_FALSE(setup.Merge(absl::InternalError("later")));
  EXPECT_EQ(setup.ToStatus(), absl::FailedPreconditionError("dataset.name: no corpus"));
  setup.Add("name", "bad");  // the user's problems come first
  EXPECT_EQ(setup.ToStatus().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(setup.ToStatus().message(), "name: bad");
}

TEST(ProblemsTest, BadRequestWireBytesAreGoogleRpcs) {
  // field_violations {field: "a" description: "b"}: tag 0x0A, length 6, then 0x0A 1 'a' 0x12 1 'b'.
  EXPECT_EQ(EncodeBadRequest({{"a", "b"}}), std::string("\x0a\x06\x0a\x01" "a" "\x12\x01" "b", 8));
  const std::vector<Problem> problems = {{"x.y", "too big"}, {"", std::string(300, 'z')}};
  EXPECT_EQ(DecodeBadRequest(EncodeBadRequest(problems)), problems);
  EXPECT_FALSE(DecodeBadRequest(std::string("\x0a\x09\x0a", 3)).has_value());  // cut short
}

TEST(ProblemsTest, EncodingIsBoundedAndSaysWhatItLeftOut) {
  std::vector<Problem> many;
  for (int i = 0; i < 100; ++i) {
    many.push_back({"deepspeed_config.key" + std::to_string(i), "unknown key"});
  }
  const std::string bytes = EncodeBadRequest(many, 1000);
  EXPECT_LE(bytes.size(), 1000u);
  std::optional<std::vector<Problem>> decoded = DecodeBadRequest(bytes);
  ASSERT_TRUE(decoded.has_value());
  ASSERT_GT(decoded->size(), 10u);
  const size_t shown = decoded->size() - 1;
  EXPECT_EQ(decoded->back(),
            (Problem{"", std::to_string(100 - shown) + " more problems not shown"}));
  EXPECT_EQ((*decoded)[shown - 1], many[shown - 1]);
}

TEST(ProblemsTest, ProblemsTravelInGrpcStatusDetails) {
  Problems p;
  p.Add("resources.num_ranks", "must be >= 1");
  p.Add("training.steps", "must be >= 1, got 0");
  const grpc::Status g = ToGrpcStatus(p.ToStatus());
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(g.error_message(),
            "2 problems:\n  resources.num_ranks: must be >= 1\n"
            "  training.steps: must be >= 1, got 0");
  ASSERT_FALSE(g.error_details().empty());
  std::optional<std::string> bad_request = BadRequestOfRpcStatus(g.error_details());
  ASSERT_TRUE(bad_request.has_value());
  EXPECT_EQ(DecodeBadRequest(*bad_request), p.problems());
  // And back: the payload is restored, so ProblemsOf sees every problem.
  EXPECT_EQ(ProblemsOf(FromGrpcStatus(g)), p.problems());
  // A status without problems has no details.
  EXPECT_TRUE(ToGrpcStatus(absl::NotFoundError("job-1")).error_details().empty());
}

}  // namespace
}  // namespace loom
