// Where loomctl finds a daemon's address (issue 49: loomctl worked only from the repository root,
// the one directory whose ./.loom/cluster held the local cluster's ready files). In order:
//   1. the flag (--scheduler, --checkpoint);
//   2. the environment variable ($LOOM_SCHEDULER, $LOOM_CHECKPOINT);
//   3. the ready file <name>.json of a local cluster's directory:
//      a. --cluster_dir, else $LOOM_HOME/cluster when LOOM_HOME is set (only there);
//      b. else .loom/cluster in the working directory or the nearest parent that has one (as git
//         finds .git);
//      c. else the cluster directory that scripts/local_cluster.sh start recorded last in
//         $XDG_CONFIG_HOME/loom/cluster (default ~/.config/loom/cluster; a one-line file holding
//         an absolute path, removed by its stop), so that loomctl finds it from any directory,
//         as kubectl finds its cluster through ~/.kube/config.
// Errors: UNAVAILABLE naming every place looked at and how to set one.
// Thread-safety: reads the environment and the file system; no shared state.
#ifndef LOOM_SERVICES_CLI_CLUSTER_ADDRESS_H_
#define LOOM_SERVICES_CLI_CLUSTER_ADDRESS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::cli {

// The local-cluster directories to try, in order (3a-3c above); `cwd` absolute.
std::vector<std::string> CandidateClusterDirs(const std::string& cluster_dir_flag,
                                              const std::string& cwd);

// The gRPC address of daemon `ready_name` ("scheduler", "checkpoint"): see the file comment.
// `flag_name` is the flag's name without dashes, `env` the variable's name.
absl::StatusOr<std::string> ResolveDaemonAddress(const std::string& flag_value,
                                                 const std::string& flag_name,
                                                 const std::string& env,
                                                 const std::string& ready_name,
                                                 const std::string& cluster_dir_flag);

// $XDG_CONFIG_HOME/loom/cluster, else $HOME/.config/loom/cluster ("" without either).
std::string CurrentClusterPointerPath();

}  // namespace loom::cli

#endif  // LOOM_SERVICES_CLI_CLUSTER_ADDRESS_H_
