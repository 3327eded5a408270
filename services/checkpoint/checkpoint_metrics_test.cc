// loom-checkpoint's metrics before any request (issue 53): loom_checkpoint_consolidations_total
// exists at 0 for every result it can ever carry ("ok" and each lower-case canonical error code),
// so increase() counts a result's first occurrence, a failed consolidation included.
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "gtest/gtest.h"
#include "services/checkpoint/checkpoint_service.h"

namespace loom {
namespace {

TEST(CheckpointMetricsTest, EveryConsolidationResultStartsAtZero) {
  prometheus::Registry registry;
  CheckpointServiceOptions options;
  options.checkpoint_root = ::testing::TempDir();
  CheckpointServiceImpl service(options, registry);
  const std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  for (int code = 0; code <= 16; ++code) {
    const std::string result =
        code == 0 ? "ok"
                  : absl::AsciiStrToLower(
                        absl::StatusCodeToString(static_cast<absl::StatusCode>(code)));
    const std::string line = "loom_checkpoint_consolidations_total{result=\"" + result + "\"} 0\n";
    EXPECT_NE(text.find(line), std::string::npos) << line << " missing:\n" << text;
  }
}

}  // namespace
}  // namespace loom
