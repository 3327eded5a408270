// The one place where absl::Status and grpc::Status convert into each other. The numeric codes
// are identical by design (absl/status/status.h), so the conversion keeps code and message;
// ToGrpcStatus cuts a message longer than kMaxGrpcStatusMessageBytes (see there). A status with
// problems (common/problems.h, payload kBadRequestTypeUrl) also carries them as gRPC status
// details, a google.rpc.Status holding one google.rpc.BadRequest, and FromGrpcStatus puts them
// back as the payload.
#ifndef LOOM_COMMON_GRPC_STATUS_H_
#define LOOM_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "common/problems.h"

namespace loom {

// The status message travels percent-encoded in the grpc-message trailer, and clients refuse
// metadata over 8 KiB (gRPC's default max_metadata_size) with RESOURCE_EXHAUSTED instead of the
// real code. Errors that echo a client's input (a 1 MiB queue name) are therefore cut to this
// many bytes (up to 3x when percent-encoded) plus a note.
inline constexpr size_t kMaxGrpcStatusMessageBytes = 1024;
// The status details (grpc-status-details-bin, base64: 4/3 of this) are bounded likewise, so the
// trailer stays under 8 KiB with the longest message: problems past this many bytes are
// summarised in one last "<n> more problems not shown".
inline constexpr size_t kMaxGrpcStatusDetailsBytes = 3072;

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  std::string message(s.message());
  if (message.size() > kMaxGrpcStatusMessageBytes) {
    // Cut at a UTF-8 character boundary (never before a continuation byte 10xxxxxx), so the
    // message stays valid UTF-8 for JSON encoders downstream (the REST gateway).
    size_t keep = kMaxGrpcStatusMessageBytes;
    while (keep > 0 && (static_cast<unsigned char>(message[keep]) & 0xC0) == 0x80) --keep;
    const size_t cut = message.size() - keep;
    message.resize(keep);
    message += "... (" + std::to_string(cut) + " more bytes)";
  }
  if (auto payload = s.GetPayload(kBadRequestTypeUrl)) {
    std::optional<std::vector<Problem>> problems = DecodeBadRequest(std::string(*payload));
    if (problems.has_value()) {
      std::string details = EncodeRpcStatusWithBadRequest(
          static_cast<int>(s.code()), message,
          EncodeBadRequest(*problems, kMaxGrpcStatusDetailsBytes - message.size() - 128));
      return grpc::Status(static_cast<grpc::StatusCode>(s.code()), message, std::move(details));
    }
  }
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::move(message));
}

inline absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  if (std::optional<std::string> bad_request = BadRequestOfRpcStatus(s.error_details())) {
    out.SetPayload(kBadRequestTypeUrl, absl::Cord(*bad_request));
  }
  return out;
}

}  // namespace loom

#endif  // LOOM_COMMON_GRPC_STATUS_H_
