// The cost of a dataset identity (data/dataset_identity.h: a full SHA-256 of every file) for
// corpora of the given sizes, page cache warm. A measurement, not a test:
//   bazel run -c opt //data:dataset_identity_bench -- 542789 1073741824
// prints one line per size: bytes, seconds, MB/s.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "data/dataset_identity.h"

int main(int argc, char** argv) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string f = std::string(tmp != nullptr ? tmp : "/tmp") + "/loom_identity_bench.bin";
  for (int i = 1; i < argc; ++i) {
    const long long bytes = std::atoll(argv[i]);
    {
      std::ofstream out(f, std::ios::binary | std::ios::trunc);
      std::string block(1 << 20, '\0');
      for (size_t k = 0; k < block.size(); ++k) block[k] = static_cast<char>(k * 131 + 7);
      for (long long left = bytes; left > 0; left -= static_cast<long long>(block.size())) {
        out.write(block.data(), std::min<long long>(left, block.size()));
      }
    }
    loom::data::CorpusOptions o;
    o.path = f;
    (void)loom::data::ComputeDatasetIdentity(o);  // warm the page cache
    const auto t0 = std::chrono::steady_clock::now();
    auto id = loom::data::ComputeDatasetIdentity(o);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!id.ok()) {
      std::fprintf(stderr, "%s\n", id.status().ToString().c_str());
      return 1;
    }
    std::printf("%lld bytes: %.4f s, %.0f MB/s\n", bytes, s, bytes / s / 1e6);
  }
  std::remove(f.c_str());
  return 0;
}
