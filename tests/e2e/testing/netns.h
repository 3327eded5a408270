// File: tests/e2e/testing/netns.h
//
// Hosts made of Linux network namespaces for the multi-host end-to-end test: a hub namespace
// holding a bridge, and per host a namespace joined to it by a veth pair (its end "eth0" in the
// host, "v<i>" on the hub's bridge), with an address on a private /24 the network picks
// (10.213.<x>.0/24, x unused by any interface of this machine when picked, so that parallel
// runs do not clash). The test process reaches the hosts through one more veth pair from its
// own namespace into the hub ("lme<pid>", address 10.213.<x>.254). Traffic never leaves the
// machine. Daemons run in a host with `ip netns exec`.
//
// Names carry the creating process's pid ("lme2e-<pid>-hub", "lme2e-<pid>-h<i>"); RemoveStale
// deletes every namespace and root-side veth of that prefix whose pid is no longer alive (a run
// killed before its cleanup). The destructor removes everything this network created, on every
// path (deleting a namespace deletes the veths in it and their peers; the bridge lives in the
// hub).
//
// Requires root and iproute2's `ip` (Available() says why not). Thread-safety: one thread.
// Errors: INTERNAL with the failing `ip` command and its output.
#ifndef LOOM_TESTS_E2E_TESTING_NETNS_H_
#define LOOM_TESTS_E2E_TESTING_NETNS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/daemon.h"
#include "tests/testing/subprocess.h"

namespace loom::e2e {

class NetnsNetwork {
 public:
  // OK when network namespaces can be made here (root, `ip netns` works); else
  // FAILED_PRECONDITION saying what is missing (the test skips with that message).
  static absl::Status Available();
  // Deletes namespaces "lme2e-<pid>-*" and links "lme<pid>" of processes no longer alive.
  static void RemoveStale();

  // The hub, its bridge, and the link from the test's namespace. `dir` holds command logs.
  static absl::StatusOr<std::unique_ptr<NetnsNetwork>> Create(const std::string& dir);
  ~NetnsNetwork();  // deletes every namespace it made (and with them their veths and bridge)

  // Adds host i (= the number of hosts so far): namespace, veth into the bridge, address
  // 10.213.<x>.<i + 1>/24, lo and eth0 up. Returns i.
  absl::StatusOr<int> AddHost();
  const std::string& ns(int host) const { return hosts_.at(host); }
  std::string address(int host) const;  // "10.213.<x>.<host + 1>"
  // Sets the hub side of host i's link down: the host is cut off from every other.
  absl::Status LinkDown(int host);

  // Starts `binary` (a runfiles path) in host i's namespace with `args` plus
  // --ready_file=<dir>/<name>.ready.json, logging to <dir>/<name>.log; waits until ready.
  absl::StatusOr<std::unique_ptr<testing::Subprocess>> StartDaemon(
      int host, const std::string& name, const std::string& binary,
      std::vector<std::string> args, ReadyInfo* info);

 private:
  NetnsNetwork(std::string dir, int pid, int subnet) : dir_(dir), pid_(pid), subnet_(subnet) {}
  absl::Status Ip(const std::vector<std::string>& args);

  std::string dir_;
  int pid_;
  int subnet_;  // x in 10.213.x.0/24
  std::string hub_;
  std::vector<std::string> hosts_;
  int commands_ = 0;
};

}  // namespace loom::e2e

#endif  // LOOM_TESTS_E2E_TESTING_NETNS_H_
