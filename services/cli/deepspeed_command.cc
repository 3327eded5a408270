#include "services/cli/deepspeed_command.h"

#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/cli/terminal_text.h"
#include "storage/checkpoint/consolidate.h"
#include "storage/checkpoint/deepspeed_consolidate.h"

namespace loom::cli {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "loomctl: %s: %s\n", absl::StatusCodeToString(s.code()).c_str(),
               TerminalSafe(s.message()).c_str());
  return static_cast<int>(s.code());
}

}  // namespace

void NormalizeDashedFlags(int argc, char** argv, std::vector<std::string>* storage) {
  struct Spelling {
    const char* dashed;
    const char* flag;
  };
  static constexpr Spelling kSpellings[] = {{"--from-deepspeed", "--from_deepspeed"},
                                            {"-from-deepspeed", "--from_deepspeed"},
                                            {"--dry-run", "--dry_run"},
                                            {"-dry-run", "--dry_run"}};
  // At most one entry per argument: no reallocation moves the strings argv points into.
  storage->reserve(argc);
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    for (const Spelling& s : kSpellings) {
      const size_t n = std::strlen(s.dashed);
      if (std::strncmp(a, s.dashed, n) == 0 && (a[n] == '\0' || a[n] == '=')) {
        storage->push_back(absl::StrCat(s.flag, a + n));
        argv[i] = storage->back().data();
        break;
      }
    }
  }
}

int RunDeepSpeedConsolidate(const std::string& dir, const std::string& output_dir,
                            const std::string& max_shard_size) {
  if (output_dir.empty()) {
    std::fprintf(stderr, "loomctl consolidate --from-deepspeed: --output_dir is required\n");
    return 2;
  }
  loom::storage::DeepSpeedConsolidateOptions options;
  auto shard = loom::storage::ParseShardSize(max_shard_size);
  if (!shard.ok()) return Fail(shard.status());
  options.max_shard_size_bytes = *shard;
  auto r = loom::storage::ConsolidateDeepSpeed(dir, output_dir, options);
  if (!r.ok()) return Fail(r.status());
  std::printf("consolidated DeepSpeed ZeRO-%d checkpoint %s (%d ranks): %lld tensors, %lld "
              "bytes, F32, %.2f s\n",
              r->zero_stage, TerminalSafe(r->checkpoint_dir).c_str(), r->world_size,
              static_cast<long long>(r->num_tensors), static_cast<long long>(r->tensor_bytes),
              r->seconds);
  for (const std::string& f : r->files) std::printf("safetensors: %s\n", TerminalSafe(f).c_str());
  if (!r->index_path.empty()) std::printf("index:       %s\n", TerminalSafe(r->index_path).c_str());
  if (!r->skipped_tensors.empty()) {
    std::printf("tied, stored once (not written): %s\n",
                TerminalSafe(absl::StrJoin(r->skipped_tensors, ", ")).c_str());
  }
  return 0;
}

}  // namespace loom::cli
