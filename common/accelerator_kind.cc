#include "common/accelerator_kind.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace loom {

std::string AcceleratorKindName(loom::v1::AcceleratorKind kind) {
  absl::string_view name = loom::v1::AcceleratorKind_Name(kind);
  if (!absl::ConsumePrefix(&name, "ACCELERATOR_KIND_")) return absl::StrCat(static_cast<int>(kind));
  return absl::AsciiStrToLower(name);
}

absl::StatusOr<loom::v1::AcceleratorKind> ParseAcceleratorKind(const std::string& name) {
  loom::v1::AcceleratorKind kind;
  if (loom::v1::AcceleratorKind_Parse(
          absl::StrCat("ACCELERATOR_KIND_", absl::AsciiStrToUpper(name)), &kind) &&
      kind != loom::v1::ACCELERATOR_KIND_UNSPECIFIED) {
    return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown accelerator kind '", name, "' (cpu, h100, h200, gh200)"));
}

}  // namespace loom
