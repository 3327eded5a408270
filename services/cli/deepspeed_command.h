// `loomctl consolidate --from-deepspeed DIR --output_dir=OUT [--max_shard_size=5GB]`: offline
// (no service) streaming consolidation of a DeepSpeed ZeRO checkpoint directory into safetensors
// (storage/checkpoint/deepspeed_consolidate.h).
#ifndef LOOM_SERVICES_CLI_DEEPSPEED_COMMAND_H_
#define LOOM_SERVICES_CLI_DEEPSPEED_COMMAND_H_

#include <string>
#include <vector>

namespace loom::cli {

// Rewrites the dashed spellings "--from-deepspeed[=V]" (DeepSpeed's) and "--dry-run[=V]" to
// "--from_deepspeed[=V]" / "--dry_run[=V]" in place (argv[i] then points into `storage`, which
// must outlive argv's use), so absl's flag parser accepts both spellings.
void NormalizeDashedFlags(int argc, char** argv, std::vector<std::string>* storage);

// Runs the consolidation and prints what was written. Returns the exit status: 0, 2 for a usage
// error (no --output_dir, bad --max_shard_size), else the absl status code (3 INVALID_ARGUMENT,
// 5 NOT_FOUND, 9 FAILED_PRECONDITION, 12 UNIMPLEMENTED, 15 DATA_LOSS); the message names the
// file concerned.
int RunDeepSpeedConsolidate(const std::string& dir, const std::string& output_dir,
                            const std::string& max_shard_size);

}  // namespace loom::cli

#endif  // LOOM_SERVICES_CLI_DEEPSPEED_COMMAND_H_
