#include "tests/e2e/testing/netns.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace loom::e2e {
namespace {

constexpr char kNsPrefix[] = "lme2e-";  // lme2e-<pid>-hub, lme2e-<pid>-h<i>
constexpr char kLinkPrefix[] = "lme";   // lme<pid>: the test namespace's end into the hub

std::string IpBinary() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

// Runs `ip args...`, output to `log`; OK on exit 0, else INTERNAL with the output.
absl::Status RunIp(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> argv = {IpBinary()};
  argv.insert(argv.end(), args.begin(), args.end());
  if (argv[0].empty()) return absl::FailedPreconditionError("iproute2's ip is not installed");
  auto p = testing::Subprocess::Start(argv, log);
  if (!p.ok()) return p.status();
  const int status = p->Wait(absl::Seconds(30));
  if (testing::ExitCode(status) == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("ip ", absl::StrJoin(args, " "), " exited ",
                                          testing::ExitCode(status), ": ",
                                          testing::Tail(log, 1000)));
}

// `ip args...` output (empty on failure).
std::string IpOutput(const std::vector<std::string>& args, const std::string& log) {
  if (!RunIp(args, log).ok()) return "";
  auto text = ReadFile(log);
  return text.ok() ? *text : "";
}

bool PidAlive(int pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

std::string TmpLog(const std::string& what) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/netns-", ::getpid(), "-", what, ".log");
}

}  // namespace

absl::Status NetnsNetwork::Available() {
  if (::geteuid() != 0) {
    return absl::FailedPreconditionError("not root: network namespaces need CAP_SYS_ADMIN");
  }
  if (IpBinary().empty()) return absl::FailedPreconditionError("iproute2's ip is not installed");
  absl::Status s = RunIp({"netns", "list"}, TmpLog("available"));
  if (!s.ok()) return absl::FailedPreconditionError(absl::StrCat("`ip netns` fails: ", s.message()));
  return absl::OkStatus();
}

void NetnsNetwork::RemoveStale() {
  const std::string list = IpOutput({"netns", "list"}, TmpLog("stale-ns"));
  for (absl::string_view line : absl::StrSplit(list, '\n', absl::SkipEmpty())) {
    const std::string name(line.substr(0, line.find(' ')));  // "name (id: 3)"
    if (!absl::StartsWith(name, kNsPrefix)) continue;
    std::vector<std::string> parts = absl::StrSplit(name.substr(sizeof(kNsPrefix) - 1), '-');
    int pid = 0;
    if (parts.empty() || !absl::SimpleAtoi(parts[0], &pid) || PidAlive(pid)) continue;
    (void)RunIp({"netns", "delete", name}, TmpLog("stale-del"));
  }
  const std::string links = IpOutput({"-o", "link", "show"}, TmpLog("stale-links"));
  for (absl::string_view line : absl::StrSplit(links, '\n', absl::SkipEmpty())) {
    // "12: lme4242@if11: <...>"
    std::vector<std::string> fields = absl::StrSplit(line, absl::ByAnyChar(" :@"), absl::SkipEmpty());
    if (fields.size() < 2 || !absl::StartsWith(fields[1], kLinkPrefix)) continue;
    int pid = 0;
    if (!absl::SimpleAtoi(fields[1].substr(sizeof(kLinkPrefix) - 1), &pid) || PidAlive(pid)) {
      continue;
    }
    (void)RunIp({"link", "delete", fields[1]}, TmpLog("stale-link-del"));
  }
}

absl::StatusOr<std::unique_ptr<NetnsNetwork>> NetnsNetwork::Create(const std::string& dir) {
  const int pid = static_cast<int>(::getpid());
  // A /24 no interface of this machine is on (another run's, or a real network's).
  const std::string addrs = IpOutput({"-o", "-4", "addr", "show"}, TmpLog("addrs"));
  int subnet = -1;
  for (int k = 0; k < 250; ++k) {
    const int x = 1 + (pid + k) % 250;
    if (!absl::StrContains(addrs, absl::StrCat(" 10.213.", x, "."))) {
      subnet = x;
      break;
    }
  }
  if (subnet < 0) return absl::ResourceExhaustedError("every 10.213.x.0/24 is in use");
  std::unique_ptr<NetnsNetwork> net(new NetnsNetwork(dir, pid, subnet));
  net->hub_ = absl::StrCat(kNsPrefix, pid, "-hub");
  RETURN_IF_ERROR(net->Ip({"netns", "add", net->hub_}));
  // From here the destructor removes the hub (and whatever is in it).
  RETURN_IF_ERROR(net->Ip({"-n", net->hub_, "link", "add", "br0", "type", "bridge"}));
  RETURN_IF_ERROR(net->Ip({"-n", net->hub_, "link", "set", "br0", "up"}));
  const std::string root_link = absl::StrCat(kLinkPrefix, pid);
  RETURN_IF_ERROR(net->Ip({"link", "add", root_link, "type", "veth", "peer", "name", "vroot",
                           "netns", net->hub_}));
  RETURN_IF_ERROR(net->Ip({"-n", net->hub_, "link", "set", "vroot", "master", "br0", "up"}));
  RETURN_IF_ERROR(
      net->Ip({"addr", "add", absl::StrCat("10.213.", subnet, ".254/24"), "dev", root_link}));
  RETURN_IF_ERROR(net->Ip({"link", "set", root_link, "up"}));
  return net;
}

NetnsNetwork::~NetnsNetwork() {
  for (const std::string& host : hosts_) (void)Ip({"netns", "delete", host});
  if (!hub_.empty()) (void)Ip({"netns", "delete", hub_});  // its veth ends take their peers
  // Normally gone with its peer; deleted here in case the hub never got its end.
  const std::string root_link = absl::StrCat(kLinkPrefix, pid_);
  if (!IpOutput({"-o", "link", "show", root_link}, TmpLog("final")).empty()) {
    (void)Ip({"link", "delete", root_link});
  }
}

absl::StatusOr<int> NetnsNetwork::AddHost() {
  const int i = static_cast<int>(hosts_.size());
  const std::string ns = absl::StrCat(kNsPrefix, pid_, "-h", i);
  RETURN_IF_ERROR(Ip({"netns", "add", ns}));
  hosts_.push_back(ns);
  const std::string port = absl::StrCat("v", i);
  RETURN_IF_ERROR(
      Ip({"-n", hub_, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns}));
  RETURN_IF_ERROR(Ip({"-n", hub_, "link", "set", port, "master", "br0", "up"}));
  RETURN_IF_ERROR(Ip({"-n", ns, "addr", "add", absl::StrCat(address(i), "/24"), "dev", "eth0"}));
  RETURN_IF_ERROR(Ip({"-n", ns, "link", "set", "eth0", "up"}));
  RETURN_IF_ERROR(Ip({"-n", ns, "link", "set", "lo", "up"}));
  return i;
}

std::string NetnsNetwork::address(int host) const {
  return absl::StrCat("10.213.", subnet_, ".", host + 1);
}

absl::Status NetnsNetwork::LinkDown(int host) {
  return Ip({"-n", hub_, "link", "set", absl::StrCat("v", host), "down"});
}

absl::StatusOr<std::unique_ptr<testing::Subprocess>> NetnsNetwork::StartDaemon(
    int host, const std::string& name, const std::string& binary, std::vector<std::string> args,
    ReadyInfo* info) {
  const std::string ready = absl::StrCat(dir_, "/", name, ".ready.json");
  ::unlink(ready.c_str());  // a stale file from an earlier daemon must not count as ready
  std::vector<std::string> argv = {IpBinary(), "netns", "exec", hosts_.at(host),
                                   testing::RunfilePath(binary)};
  for (std::string& a : args) argv.push_back(std::move(a));
  argv.push_back(absl::StrCat("--ready_file=", ready));
  auto started = testing::Subprocess::Start(argv, absl::StrCat(dir_, "/", name, ".log"));
  if (!started.ok()) return started.status();
  auto process = std::make_unique<testing::Subprocess>(std::move(*started));
  absl::StatusOr<ReadyInfo> ready_info = testing::WaitReady(*process, ready);
  if (!ready_info.ok()) {
    return absl::Status(ready_info.status().code(),
                        absl::StrCat(name, ": ", ready_info.status().message()));
  }
  *info = *ready_info;
  return process;
}

absl::Status NetnsNetwork::Ip(const std::vector<std::string>& args) {
  return RunIp(args, absl::StrCat(dir_, "/ip-", commands_++, ".log"));
}

}  // namespace loom::e2e
