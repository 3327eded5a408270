// Collectives over c10d::ProcessGroupGloo (gloo_collectives.h): the rendezvous, subgroups over a
// c10d::PrefixStore, the point-to-point all-gather and reduce-scatter (rank-order sums, 16-bit
// values summed in fp32), and the handle that keeps a collective's tensors alive until Wait.
#include "worker/engine/gloo_collectives.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/engine/collectives_internal.h"

namespace loom::engine {
namespace collectives_internal {
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

// What Gloo moves for a tensor: bf16 as its 16-bit pattern (only bytes move point to point).
at::Tensor Wire(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? t.view(at::kHalf) : t;
}

bool Is16BitFloat(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
}

// A started Gloo work item plus what must stay alive until it completes and what to do after.
class GlooPending : public PendingCollective {
 public:
  GlooPending(const char* op, std::chrono::milliseconds timeout, double* blocked_seconds)
      : op_(op), timeout_(timeout), blocked_seconds_(blocked_seconds) {}
  ~GlooPending() override {
    if (!waited_) (void)Wait();
  }
  absl::Status Wait() override {
    if (waited_) return status_;
    waited_ = true;
    if (status_.ok() && !works_.empty()) {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        bool done = true;
        for (auto& w : works_) {
          if (!w->wait(timeout_)) {
            done = false;
            break;
          }
        }
        *blocked_seconds_ +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!done) {
          status_ = absl::DeadlineExceededError(absl::StrCat(op_, ": timed out"));
        } else if (finish_) {
          finish_();
        }
      } catch (const std::exception& e) {
        status_ = FromException(op_, e);
      }
    }
    if (!status_.ok()) {
      // Sends and receives not waited for may still be in the transport's hands: their work
      // items, tensors and scratch must never be freed or reused. The group is unusable after a
      // failure and the rank is about to exit, so they are deliberately leaked.
      struct Abandoned {
        std::vector<c10::intrusive_ptr<c10d::Work>> works;
        std::vector<at::Tensor> keep;
        std::function<void()> finish;
      };
      new Abandoned{std::move(works_), std::move(keep_), std::move(finish_)};  // NOLINT
    }
    // Drop every reference now (finish_ holds views of the caller's tensors), so the caller
    // can reuse its buffers as soon as Wait returns.
    works_.clear();
    keep_.clear();
    finish_ = nullptr;
    return status_;
  }

  const char* op_;
  std::chrono::milliseconds timeout_;
  double* blocked_seconds_;  // the owner's counter: time the caller spent waiting
  // Every work item of this collective (one for a Gloo collective; one per send and receive
  // for the point-to-point ones), waited in order.
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  absl::Status status_;
  bool waited_ = false;
  std::vector<at::Tensor> keep_;
  std::function<void()> finish_;
};

// Test only (GlooOptions::test_store_get_delay): the rendezvous store of a slow rank, whose
// every get waits first. Forwards everything else to the real store.
class SlowGetStore : public c10d::Store {
 public:
  SlowGetStore(c10::intrusive_ptr<c10d::Store> inner, absl::Duration delay)
      : inner_(std::move(inner)), delay_(delay) {}
  // c10d 2.x: a store another thread can use on its own connection (the same slowness).
  c10::intrusive_ptr<c10d::Store> clone() override {
    return c10::make_intrusive<SlowGetStore>(inner_->clone(), delay_);
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    inner_->set(key, value);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    absl::SleepFor(delay_);
    return inner_->get(key);
  }
  int64_t add(const std::string& key, int64_t value) override { return inner_->add(key, value); }
  bool deleteKey(const std::string& key) override { return inner_->deleteKey(key); }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }
  int64_t getNumKeys() override { return inner_->getNumKeys(); }
  void wait(const std::vector<std::string>& keys) override { inner_->wait(keys); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    inner_->wait(keys, timeout);
  }

 private:
  c10::intrusive_ptr<c10d::Store> inner_;
  absl::Duration delay_;
};

// Returns once every rank of `pg` has built its mesh; throws like any Gloo collective.
// Without it a rank could leave the rendezvous, fail in its set-up (a refused checkpoint) and exit
// while a slower peer is still connecting: with rank 0 gone its TCPStore is gone, and a peer that
// waits for a connection from the dead rank waits in Gloo's initial connect for 5x the timeout
// (gloo/transport/tcp/pair.h, waitUntil) instead of failing: 300 s at the tests' 60 s. After the
// barrier a rank's exit reaches its peers as a closed connection in their next collective.
void EveryRankConnected(c10d::ProcessGroupGloo& pg, std::chrono::milliseconds timeout) {
  auto work = pg.barrier();
  if (!work->wait(timeout)) throw std::runtime_error("barrier after the rendezvous timed out");
}

class GlooCollectives : public Collectives {
 public:
  using Device = std::shared_ptr<::gloo::transport::Device>;
  // `store`: this group's store (the TCPStore, or a PrefixStore over it for a subgroup);
  // `prefix`: its key prefix ("" for the world), the root of its subgroups' prefixes.
  GlooCollectives(c10::intrusive_ptr<c10d::Store> store,
                  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, Device device,
                  std::string prefix, int rank, int world, std::chrono::milliseconds timeout)
      : store_(std::move(store)), pg_(std::move(pg)), device_(std::move(device)),
        prefix_(std::move(prefix)), rank_(rank), world_(world), timeout_(timeout) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  // All-gather and reduce-scatter are point-to-point: every rank sends its chunks straight from
  // the caller's tensors and receives straight into them (Gloo's unbound-buffer send/recv, no
  // copy). ProcessGroupGloo's _allgather_base and _reduce_scatter_base (LibTorch 2.x) go through
  // full-size temporaries and were 2-5x slower at bucket sizes (collectives_bench.cc); the
  // copies and temporaries were a large part of ZeRO-3's step time and peak memory on CPU.
  std::unique_ptr<PendingCollective> StartAllGather(const at::Tensor& part,
                                                    at::Tensor& full) override {
    if (absl::Status s = CheckShapes(part, full, world_); !s.ok()) return Done(s);
    Record(kAllGather, part.numel(), full.numel());
    const int64_t p = part.numel();
    auto pending = std::make_unique<GlooPending>("allgather", timeout_, &blocked_seconds_);
    pending->keep_ = {part, full};
    bytes_communicated_ += part.nbytes();
    const int tag = NextTag();
    const at::Tensor wire_part = Wire(part), wire_full = Wire(full);
    for (int q = 0; q < world_; ++q) {
      if (q == rank_) continue;
      SendTo(*pending, wire_part, q, tag);
      RecvFrom(*pending, wire_full.narrow(0, q * p, p), q, tag);
    }
    full.narrow(0, rank_ * p, p).copy_(part);
    return pending;
  }

  std::unique_ptr<PendingCollective> StartReduceScatterSum(const at::Tensor& full,
                                                           at::Tensor& part) override {
    return StartReduceScatterSumCoalesced({full}, {part});
  }

  std::unique_ptr<PendingCollective> StartReduceScatterSumCoalesced(
      const std::vector<at::Tensor>& fulls, const std::vector<at::Tensor>& parts) override {
    if (absl::Status s = CheckCoalesced(fulls, parts, world_); !s.ok()) return Done(s);
    int64_t total = 0;
    for (const at::Tensor& f : fulls) total += f.numel();
    Record(kReduceScatter, total, total);
    auto pending = std::make_unique<GlooPending>("reduce_scatter", timeout_, &blocked_seconds_);
    pending->keep_ = fulls;
    pending->keep_.insert(pending->keep_.end(), parts.begin(), parts.end());
    // Chunk `rank_` of every peer's tensor k arrives in received[k][q] (rank q's copy). With two
    // ranks it arrives in parts[k] itself: a + b == b + a exactly, so the rank-order sum needs no
    // scratch. 16-bit floats travel as 16 bits and are summed in fp32 (rounded once).
    std::vector<std::vector<at::Tensor>> received(fulls.size());
    for (size_t k = 0; k < fulls.size(); ++k) {
      const int tag = NextTag();  // one per tensor: no reliance on Gloo's per-tag message order
      const int64_t p = parts[k].numel();
      bytes_communicated_ += fulls[k].nbytes();
      received[k].resize(world_);
      for (int q = 0; q < world_; ++q) {
        if (q == rank_) {
          received[k][q] = fulls[k].narrow(0, rank_ * p, p);
          continue;
        }
        SendTo(*pending, Wire(fulls[k]).narrow(0, q * p, p), q, tag);
        if (world_ == 2) {
          received[k][q] = parts[k];
        } else {
          received[k][q] = at::empty({p}, parts[k].options());
          pending->keep_.push_back(received[k][q]);  // kept (or leaked) with the rest
        }
        RecvFrom(*pending, Wire(received[k][q]), q, tag);
      }
    }
    const int world = world_, rank = rank_;
    std::vector<at::Tensor> outs = parts;
    // Sum in rank order so every rank's reduction is the same sequence of fp32 adds.
    pending->finish_ = [received = std::move(received), outs, world, rank]() {
      for (size_t k = 0; k < outs.size(); ++k) {
        at::Tensor out = outs[k];
        if (Is16BitFloat(out)) {  // fp32 accumulation in rank order, one rounding
          at::Tensor acc = received[k][0].to(at::kFloat);
          for (int q = 1; q < world; ++q) acc.add_(received[k][q].to(at::kFloat));
          out.copy_(acc);
          continue;
        }
        if (world == 2) {
          out.add_(received[k][rank]);  // out holds the peer's chunk
          continue;
        }
        out.copy_(received[k][0]);
        for (int q = 1; q < world; ++q) out.add_(received[k][q]);
      }
    };
    return pending;
  }

  std::unique_ptr<PendingCollective> StartAllReduce(at::Tensor& tensor, ReduceOp op) override {
    Record(kAllReduce, tensor.numel(), 2 * tensor.numel());
    auto pending = std::make_unique<GlooPending>("allreduce", timeout_, &blocked_seconds_);
    pending->keep_ = {tensor};
    std::vector<at::Tensor> tensors = {tensor};
    if (tensor.scalar_type() == at::kBFloat16) {  // Gloo has no bf16: reduce an fp32 copy
      at::Tensor wide = tensor.to(at::kFloat);
      tensors = {wide};
      pending->keep_.push_back(wide);
      at::Tensor out = tensor;
      pending->finish_ = [out, wide]() mutable { out.copy_(wide); };
    }
    c10d::AllreduceOptions opts;
    opts.reduceOp = op == ReduceOp::kSum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
    bytes_communicated_ += tensors[0].nbytes();
    Start(*pending, [&] { return pg_->allreduce(tensors, opts); });
    return pending;
  }

  absl::Status Broadcast(at::Tensor& tensor, int root) override {
    Record(kBroadcast, tensor.numel(), tensor.numel());
    std::vector<at::Tensor> tensors = {Wire(tensor)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    GlooPending pending("broadcast", timeout_, &blocked_seconds_);
    Start(pending, [&] { return pg_->broadcast(tensors, opts); });
    return pending.Wait();
  }

  absl::Status Barrier() override {
    Record(kBarrier, 0, 0);
    GlooPending pending("barrier", timeout_, &blocked_seconds_);
    Start(pending, [&] { return pg_->barrier(); });
    return pending.Wait();
  }

  std::unique_ptr<PendingCollective> StartAllToAll(const at::Tensor& input,
                                                   at::Tensor& output) override {
    if (absl::Status s = CheckAllToAll(input, output, world_); !s.ok()) return Done(s);
    Record(kAllToAll, input.numel(), input.numel());
    auto pending = std::make_unique<GlooPending>("alltoall", timeout_, &blocked_seconds_);
    pending->keep_ = {input, output};
    bytes_communicated_ += input.nbytes();
    at::Tensor wire_in = Wire(input), wire_out = Wire(output);
    std::vector<int64_t> equal_splits;  // empty: N equal chunks
    Start(*pending,
          [&] { return pg_->alltoall_base(wire_out, wire_in, equal_splits, equal_splits); });
    return pending;
  }

  absl::StatusOr<std::unique_ptr<Collectives>> NewSubgroup(const std::vector<int>& ranks,
                                                           absl::string_view name) override {
    if (absl::Status s = CheckSubgroup(ranks, name, world_); !s.ok()) return s;
    Record(kNewSubgroup, static_cast<int64_t>(ranks.size()), 0);
    // Unique on every rank because every rank counts the same NewSubgroup calls (c10d names
    // groups by a counter the same way).
    const std::string prefix = absl::StrCat(prefix_, name, "#", ++subgroups_, "/");
    const auto it = std::find(ranks.begin(), ranks.end(), rank_);
    if (it == ranks.end()) return std::unique_ptr<Collectives>();
    const int sub_rank = static_cast<int>(it - ranks.begin());
    const int sub_world = static_cast<int>(ranks.size());
    if (sub_world == 1) return CreateLocalCollectives();
    try {
      auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, store_);
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout_);
      opts->devices.push_back(device_);
      opts->threads = 1;
      auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, sub_rank, sub_world, opts);
      EveryRankConnected(*pg, timeout_);
      return std::unique_ptr<Collectives>(
          new GlooCollectives(store, pg, device_, prefix, sub_rank, sub_world, timeout_));
    } catch (const std::exception& e) {
      return FromException(absl::StrCat("subgroup ", name).c_str(), e);
    }
  }

 private:
  template <typename F>
  void Start(GlooPending& pending, F&& start) {
    if (!pending.status_.ok()) return;  // an earlier piece failed: issue nothing more
    try {
      pending.works_.push_back(start());
    } catch (const std::exception& e) {
      pending.status_ = FromException(pending.op_, e);
    }
  }

  // Point-to-point messages of one collective (of one tensor of a coalesced one) share a tag;
  // Gloo matches them by peer and tag. Every rank issues the same collective sequence, so the
  // counters agree. Tags stay
  // below 2^30, clear of the slots Gloo's own collectives build (prefix << 56).
  int NextTag() {
    tag_ = tag_ % (1 << 30) + 1;
    return tag_;
  }
  void SendTo(GlooPending& pending, const at::Tensor& t, int peer, int tag) {
    std::vector<at::Tensor> one = {t};
    Start(pending, [&] { return pg_->send(one, peer, tag); });
  }
  void RecvFrom(GlooPending& pending, const at::Tensor& t, int peer, int tag) {
    std::vector<at::Tensor> one = {t};
    Start(pending, [&] { return pg_->recv(one, peer, tag); });
  }

  int tag_ = 0;
  int subgroups_ = 0;  // NewSubgroup calls so far (every rank counts the same)
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  Device device_;
  std::string prefix_;
  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
};

}  // namespace
}  // namespace collectives_internal

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
    auto tcp_store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
    if (o.rank == 0 && o.on_listening) o.on_listening(tcp_store->getPort());
    c10::intrusive_ptr<c10d::Store> store = tcp_store;
    if (o.test_store_get_delay > absl::ZeroDuration()) {
      store = c10::make_intrusive<collectives_internal::SlowGetStore>(tcp_store,
                                                                      o.test_store_get_delay);
    }
    auto pg_opts = c10d::ProcessGroupGloo::Options::create(timeout);
    // The address given (the trainer passes its node's advertised address); no address is
    // inferred from master_addr here.
    const std::string& bind = o.bind_address;
    auto device = bind.empty() ? c10d::ProcessGroupGloo::createDefaultDevice()
                               : c10d::ProcessGroupGloo::createDeviceForHostname(bind);
    pg_opts->devices.push_back(device);
    pg_opts->threads = 1;
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, o.rank, o.world_size, pg_opts);
    collectives_internal::EveryRankConnected(*pg, timeout);
    return std::unique_ptr<Collectives>(
        new collectives_internal::GlooCollectives(store, pg, device, "", o.rank, o.world_size,
                                                  timeout));
  } catch (const std::exception& e) {
    return collectives_internal::FromException("rendezvous", e);
  }
}

}  // namespace loom::engine
