// Loom's Gloo reduce-scatter and all-gather (point-to-point between the caller's tensors,
// collectives.cc) against c10d's native ProcessGroupGloo::_reduce_scatter_base and
// _allgather_base (which LibTorch 2.x has and 1.13 lacked), on two real processes over loopback.
// It decides which one GlooCollectives uses: docs/benchmarks.md has the figures.
//
//   bazel run -c opt //worker/engine:collectives_bench -- --sizes=1048576,6553600 --iters=20
//
// Prints one line per (operation, size, implementation): the median and min/max seconds per
// call of rank 0 over --iters calls after 3 warm-up calls, and GB/s of the full tensor.
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "worker/engine/collectives.h"
#include "worker/engine/gloo_collectives.h"

ABSL_FLAG(std::string, sizes, "1048576,6553600,16777216",
          "Elements of the full (world x shard) fp32 tensor, comma-separated.");
ABSL_FLAG(int, iters, 20, "Timed calls per case.");

namespace {

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

template <typename F>
void Time(int rank, const char* what, int64_t n, const char* impl, int iters, F&& call) {
  for (int i = 0; i < 3; ++i) call();
  std::vector<double> s;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  if (rank == 0) {
    std::printf("%-14s n=%-9lld %-8s median %.5f s  (min %.5f, max %.5f)  %.2f GB/s\n", what,
                static_cast<long long>(n), impl, s[s.size() / 2], s.front(), s.back(),
                n * 4.0 / s[s.size() / 2] / 1e9);
    std::fflush(stdout);
  }
}

int RunRank(int rank, int world, int loom_port, int native_port) {
  at::set_num_threads(1);
  loom::engine::GlooOptions o;
  o.rank = rank;
  o.world_size = world;
  o.master_port = loom_port;
  o.bind_address = "127.0.0.1";
  o.timeout = absl::Seconds(120);
  auto loom = loom::engine::CreateGlooCollectives(o);
  if (!loom.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, loom.status().ToString().c_str());
    return 1;
  }
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(native_port);
  so.isServer = rank == 0;
  so.numWorkers = world;
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(120));
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  opts->threads = 1;
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, opts);

  const int iters = absl::GetFlag(FLAGS_iters);
  for (absl::string_view v : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(v, &n) || n % world != 0) return 2;
    at::Tensor full = at::randn({n});
    at::Tensor part = at::empty({n / world});
    Time(rank, "reduce_scatter", n, "loom", iters, [&] {
      (void)(*loom)->StartReduceScatterSum(full, part)->Wait();
    });
    Time(rank, "reduce_scatter", n, "native", iters, [&] {
      c10d::ReduceScatterOptions ro;
      pg->_reduce_scatter_base(part, full, ro)->wait();
    });
    Time(rank, "all_gather", n, "loom", iters, [&] {
      (void)(*loom)->StartAllGather(part, full)->Wait();
    });
    Time(rank, "all_gather", n, "native", iters, [&] {
      pg->_allgather_base(full, part)->wait();
    });
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int world = 2;
  const int loom_port = FreePort(), native_port = FreePort();
  std::vector<pid_t> children;
  for (int r = 1; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) _exit(RunRank(r, world, loom_port, native_port));
    children.push_back(pid);
  }
  int rc = RunRank(0, world, loom_port, native_port);
  for (pid_t pid : children) {
    int st = 0;
    ::waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  return rc;
}
