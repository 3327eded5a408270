#include "worker/engine/collectives.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <exception>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace loom::engine {

namespace {

absl::Status FromException(const char* what_op, const std::exception& e) {
  std::string msg = e.what();
  // c10::Error messages carry a long backtrace after the first line.
  if (auto pos = msg.find("\nException raised from"); pos != std::string::npos) msg.resize(pos);
  if (absl::StrContains(msg, "imed out") || absl::StrContains(msg, "Timeout") ||
      absl::StrContains(msg, "timeout")) {
    return absl::DeadlineExceededError(absl::StrCat(what_op, ": ", msg));
  }
  return absl::UnavailableError(absl::StrCat(what_op, ": ", msg));
}

absl::Status CheckShapes(const at::Tensor& part, const at::Tensor& full, int world) {
  if (!part.is_contiguous() || !full.is_contiguous() || part.dim() != 1 || full.dim() != 1 ||
      full.numel() != part.numel() * world || part.scalar_type() != full.scalar_type()) {
    return absl::InvalidArgumentError(
        absl::StrCat("collective: expected contiguous 1-d part [p] and full [", world,
                     "*p] of one dtype, got ", part.numel(), " and ", full.numel()));
  }
  return absl::OkStatus();
}

class LocalCollectives : public Collectives {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  absl::Status AllGather(const at::Tensor& part, at::Tensor& full) override {
    if (absl::Status s = CheckShapes(part, full, 1); !s.ok()) return s;
    full.copy_(part);
    return absl::OkStatus();
  }
  absl::Status ReduceScatterSum(const at::Tensor& full, at::Tensor& part) override {
    if (absl::Status s = CheckShapes(part, full, 1); !s.ok()) return s;
    part.copy_(full);
    return absl::OkStatus();
  }
  absl::Status AllReduce(at::Tensor&, ReduceOp) override { return absl::OkStatus(); }
  absl::Status Broadcast(at::Tensor&, int root) override {
    if (root != 0) return absl::InvalidArgumentError("broadcast: root must be 0");
    return absl::OkStatus();
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
};

class GlooCollectives : public Collectives {
 public:
  GlooCollectives(c10::intrusive_ptr<c10d::Store> store,
                  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, int rank, int world,
                  std::chrono::milliseconds timeout)
      : store_(std::move(store)), pg_(std::move(pg)), rank_(rank), world_(world),
        timeout_(timeout) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  absl::Status AllGather(const at::Tensor& part, at::Tensor& full) override {
    if (absl::Status s = CheckShapes(part, full, world_); !s.ok()) return s;
    const int64_t p = part.numel();
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < world_; ++r) outputs[0].push_back(full.narrow(0, r * p, p));
    std::vector<at::Tensor> inputs = {part};
    bytes_communicated_ += part.nbytes();
    return Run("allgather", [&] { return pg_->allgather(outputs, inputs); });
  }

  absl::Status ReduceScatterSum(const at::Tensor& full, at::Tensor& part) override {
    if (absl::Status s = CheckShapes(part, full, world_); !s.ok()) return s;
    const int64_t p = part.numel();
    // alltoall with even splits: chunk j of the output is rank j's chunk `rank_`.
    at::Tensor input = full;
    at::Tensor received = at::empty_like(full);
    std::vector<int64_t> out_counts, in_counts;  // empty: even splits
    bytes_communicated_ += full.nbytes();
    absl::Status s = Run("reduce_scatter(alltoall)", [&] {
      return pg_->alltoall_base(received, input, out_counts, in_counts);
    });
    if (!s.ok()) return s;
    // Sum in rank order so every rank's reduction is the same sequence of fp32 adds.
    at::Tensor acc = received.narrow(0, 0, p).clone();
    for (int r = 1; r < world_; ++r) acc.add_(received.narrow(0, r * p, p));
    part.copy_(acc);
    return absl::OkStatus();
  }

  absl::Status AllReduce(at::Tensor& tensor, ReduceOp op) override {
    std::vector<at::Tensor> tensors = {tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = op == ReduceOp::kSum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
    bytes_communicated_ += tensor.nbytes();
    return Run("allreduce", [&] { return pg_->allreduce(tensors, opts); });
  }

  absl::Status Broadcast(at::Tensor& tensor, int root) override {
    std::vector<at::Tensor> tensors = {tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    return Run("broadcast", [&] { return pg_->broadcast(tensors, opts); });
  }

  absl::Status Barrier() override {
    return Run("barrier", [&] { return pg_->barrier(); });
  }

 private:
  template <typename F>
  absl::Status Run(const char* op, F&& start) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c10::intrusive_ptr<c10d::Work> work = start();
      const bool done = work->wait(timeout_);
      blocked_seconds_ +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!done) return absl::DeadlineExceededError(absl::StrCat(op, ": timed out"));
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return FromException(op, e);
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
};

bool IsLoopback(const std::string& addr) {
  return addr == "localhost" || absl::StartsWith(addr, "127.") || addr == "::1";
}

}  // namespace

std::unique_ptr<Collectives> CreateLocalCollectives() {
  return std::make_unique<LocalCollectives>();
}

absl::StatusOr<std::unique_ptr<Collectives>> CreateGlooCollectives(const GlooOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", o.rank, " is not in [0, world_size ", o.world_size, ")"));
  }
  if (o.master_port < 0 || o.master_port > 65535 || (o.rank != 0 && o.master_port == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "master_port: ", o.master_port, " is invalid (0 is allowed only on rank 0)"));
  }
  const auto timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(o.timeout));
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(o.master_port);
    so.isServer = o.rank == 0;
    so.numWorkers = o.world_size;
    so.waitWorkers = false;  // report the port first; the process group waits for peers
    so.timeout = timeout;
    auto store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
    if (o.rank == 0 && o.on_listening) o.on_listening(store->getPort());
    auto pg_opts = c10d::ProcessGroupGloo::Options::create(timeout);
    std::string bind = o.bind_address;
    if (bind.empty() && IsLoopback(o.master_addr)) bind = "127.0.0.1";
    pg_opts->devices.push_back(bind.empty()
                                   ? c10d::ProcessGroupGloo::createDefaultDevice()
                                   : c10d::ProcessGroupGloo::createDeviceForHostname(bind));
    pg_opts->threads = 1;
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, o.rank, o.world_size, pg_opts);
    return std::unique_ptr<Collectives>(
        new GlooCollectives(store, pg, o.rank, o.world_size, timeout));
  } catch (const std::exception& e) {
    return FromException("rendezvous", e);
  }
}

}  // namespace loom::engine
