// File: common/problems.h
//
// Every problem of a submission in one answer (issue 47, "One answer with every problem"):
// validators add each problem they find ("<field path>: <what was found, what is expected>") to a
// Problems collector instead of returning the first, and hand back Problems::ToStatus():
//
//   * no problem: OK;
//   * one problem: INVALID_ARGUMENT "<path>: <what>", the message a first-error validator gave;
//   * n > 1: INVALID_ARGUMENT "<n> problems:\n  <path>: <what>\n  <path>: <what>...", one line
//     each, in the order they were added (the order of the spec). A field is named once, with
//     the first problem added for it (later checks of a field usually follow from the first).
//
// The problems also travel as the status's payload kBadRequestTypeUrl: the wire bytes of a
// google.rpc.BadRequest with one FieldViolation {field: path, description: what} per problem
// (encoded here by hand: Debian's packages hold no google/rpc protos). ToGrpcStatus
// (common/grpc_status.h) forwards it in the gRPC status details, where the REST gateway and
// loomctl read it back, so a message cut to fit gRPC's trailer loses no problem.
//
// Thread-compatible (a Problems is one validator's); the free functions are thread-safe.
#ifndef LOOM_COMMON_PROBLEMS_H_
#define LOOM_COMMON_PROBLEMS_H_

#include <cstddef>
#include <cstdint>  // SIZE_MAX
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace loom {

// absl::Status payload type URL (also the google.protobuf.Any type URL in gRPC status details).
inline constexpr char kBadRequestTypeUrl[] = "type.googleapis.com/google.rpc.BadRequest";

struct Problem {
  std::string path;  // "resources.num_ranks"; "" when the problem names no field
  std::string what;  // "must be in [1, 65536], got 0"
  bool operator==(const Problem& o) const { return path == o.path && what == o.what; }
};

class Problems {
 public:
  // One problem at `path` (its message line reads "<path>: <what>"); ignored when `path` already
  // has one (a problem without a path: when the same one was added).
  void Add(absl::string_view path, absl::string_view what);

  // Every problem `s` carries: the problems of its kBadRequestTypeUrl payload, or else one read
  // from its message (ProblemsOf). An INVALID_ARGUMENT status adds problems; any other error
  // (FAILED_PRECONDITION: a cluster setup problem, INTERNAL, ...) is kept aside, the first one
  // only, and answered by ToStatus when no problem was found. Returns s.ok(), so that a caller
  // can skip the checks that depend on what failed.
  bool Merge(const absl::Status& s);

  bool empty() const { return problems_.empty() && !other_.has_value(); }
  size_t size() const { return problems_.size(); }
  const std::vector<Problem>& problems() const { return problems_; }

  // See the file comment. With no problem but an error kept by Merge, that error.
  absl::Status ToStatus() const;

 private:
  std::vector<Problem> problems_;
  std::optional<absl::Status> other_;
};

// The message ToStatus gives for `problems` (non-empty).
std::string ProblemsMessage(const std::vector<Problem>& problems);

// The problems `s` carries (empty for OK): its kBadRequestTypeUrl payload's, or else one from
// its message, split at the first ": " when what precedes it is a path (no spaces); otherwise
// the whole message with path `fallback_path`.
std::vector<Problem> ProblemsOf(const absl::Status& s, absl::string_view fallback_path = "");

// google.rpc.BadRequest wire bytes: field_violations (1) {field (1), description (2)}. Encodes
// at most `max_bytes` (>= 64): when the next entry would not leave 64 bytes free, a last entry
// "<n> more problems not shown" ends it. Each field and description is cut at 1 KiB.
std::string EncodeBadRequest(const std::vector<Problem>& problems, size_t max_bytes = SIZE_MAX);
// The violations of BadRequest wire bytes; nullopt when `bytes` is not one (malformed).
std::optional<std::vector<Problem>> DecodeBadRequest(absl::string_view bytes);

// google.rpc.Status wire bytes {code (1), message (2), details (3): one google.protobuf.Any
// {type_url (1): kBadRequestTypeUrl, value (2): bad_request}}: what gRPC sends as status details
// (the grpc-status-details-bin trailer).
std::string EncodeRpcStatusWithBadRequest(int code, absl::string_view message,
                                          absl::string_view bad_request);
// The BadRequest bytes inside google.rpc.Status wire bytes; nullopt when there are none.
std::optional<std::string> BadRequestOfRpcStatus(absl::string_view rpc_status);

}  // namespace loom

#endif  // LOOM_COMMON_PROBLEMS_H_
