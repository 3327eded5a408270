// gMock matchers for absl::Status, absl::StatusOr<T> and grpc::Status (testonly).
//
//   EXPECT_THAT(ParseThing(text), StatusIs(absl::StatusCode::kInvalidArgument, "thing.size"));
//   EXPECT_THAT(stub->Get(&ctx, req, &resp), StatusIs(grpc::StatusCode::NOT_FOUND, "job-7"));
//   EXPECT_THAT(WriteThing(path), IsOk());
//
// StatusIs(code, substring) matches a status (or the status of a StatusOr) whose code is `code`
// and whose message contains `substring` (case-sensitive; "" matches any message). `code` is an
// absl::StatusCode or a grpc::StatusCode (the numeric values are the same by design,
// absl/status/status.h). A grpc::Status is matched through its error_code() / error_message(),
// so this header needs no gRPC include. On a mismatch gMock prints the actual code and message.
// (absl/status/status_matchers.h, which has these, is newer than Debian 12's Abseil.)
// Thread-compatible, like gMock matchers.
#ifndef LOOM_COMMON_TESTING_STATUS_MATCHERS_H_
#define LOOM_COMMON_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "gmock/gmock.h"

namespace loom::testing {
namespace internal {

inline const absl::Status& AsStatus(const absl::Status& s) { return s; }

template <typename T>
const absl::Status& AsStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

// Anything with error_code() and error_message(): grpc::Status.
template <typename G>
auto AsStatus(const G& g) -> decltype(g.error_code(), g.error_message(), absl::Status()) {
  return absl::Status(static_cast<absl::StatusCode>(g.error_code()), g.error_message());
}

class StatusIsMatcher {
 public:
  StatusIsMatcher(absl::StatusCode code, std::string substring)
      : code_(code), substring_(std::move(substring)) {}

  template <typename T>
  bool MatchAndExplain(const T& value, ::testing::MatchResultListener* listener) const {
    const absl::Status s = AsStatus(value);  // a copy: AsStatus may build a temporary
    *listener << "whose status is " << (s.ok() ? "OK" : s.ToString());
    return s.code() == code_ && absl::StrContains(s.message(), substring_);
  }
  void DescribeTo(std::ostream* os) const {
    *os << "has status code " << absl::StatusCodeToString(code_);
    if (!substring_.empty()) *os << " and a message containing \"" << substring_ << "\"";
  }
  void DescribeNegationTo(std::ostream* os) const {
    *os << "does not have status code " << absl::StatusCodeToString(code_);
    if (!substring_.empty()) *os << " with a message containing \"" << substring_ << "\"";
  }

 private:
  absl::StatusCode code_;
  std::string substring_;
};

}  // namespace internal

inline ::testing::PolymorphicMatcher<internal::StatusIsMatcher> StatusIs(
    absl::StatusCode code, std::string substring = "") {
  return ::testing::MakePolymorphicMatcher(internal::StatusIsMatcher(code, std::move(substring)));
}

// grpc::StatusCode (or any other enum with absl's numbering).
template <typename Code,
          std::enable_if_t<std::is_enum_v<Code> && !std::is_same_v<Code, absl::StatusCode>,
                           int> = 0>
::testing::PolymorphicMatcher<internal::StatusIsMatcher> StatusIs(Code code,
                                                                  std::string substring = "") {
  return StatusIs(static_cast<absl::StatusCode>(code), std::move(substring));
}

// An OK status (or a StatusOr holding a value).
inline ::testing::PolymorphicMatcher<internal::StatusIsMatcher> IsOk() {
  return StatusIs(absl::StatusCode::kOk);
}

}  // namespace loom::testing

#endif  // LOOM_COMMON_TESTING_STATUS_MATCHERS_H_
