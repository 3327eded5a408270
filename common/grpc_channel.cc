#include "common/grpc_channel.h"

#include <grpc/grpc.h>
#include <grpcpp/create_channel.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace loom {

absl::Status ValidateReconnectBackoff(const std::string& flag, absl::Duration max_backoff) {
  if (max_backoff < absl::Milliseconds(10) || max_backoff > absl::Hours(1)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": must be in [10ms, 1h], got ",
                                                   absl::FormatDuration(max_backoff)));
  }
  return absl::OkStatus();
}

grpc::ChannelArguments ReconnectChannelArguments(absl::Duration max_backoff) {
  const int max_ms = static_cast<int>(absl::ToInt64Milliseconds(max_backoff));
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_ms);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(max_ms, 1000));
  return args;
}

std::shared_ptr<grpc::Channel> CreateReconnectingChannel(
    const std::string& target, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    absl::Duration max_backoff) {
  return grpc::CreateCustomChannel(target, credentials, ReconnectChannelArguments(max_backoff));
}

}  // namespace loom
