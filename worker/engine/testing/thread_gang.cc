#include "worker/engine/testing/thread_gang.h"

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/engine/gloo_collectives.h"

namespace loom::engine::testing {

namespace {

// Shared by RunGang and the rank threads; a detached (hung) thread keeps it alive.
struct GangState {
  std::mutex mu;
  std::condition_variable cv;
  int port = 0;  // rank 0's TCPStore port once it listens; -1 when rank 0 failed first
  int running = 0;
  std::vector<absl::Status> statuses;
  std::vector<char> done;
  std::function<absl::Status(int, Collectives&)> body;
};

void RunRank(const std::shared_ptr<GangState>& st, int rank, int world,
             std::chrono::steady_clock::time_point deadline, absl::Duration timeout) {
  absl::Status status;
  std::unique_ptr<Collectives> group;
  GlooOptions o;
  o.bind_address = "127.0.0.1";  // in-process ranks: the gang's own address is loopback
  o.rank = rank;
  o.world_size = world;
  o.timeout = timeout;
  if (rank == 0) {
    o.on_listening = [&](int p) {
      std::lock_guard<std::mutex> l(st->mu);
      st->port = p;
      st->cv.notify_all();
    };
  } else {
    std::unique_lock<std::mutex> l(st->mu);
    if (!st->cv.wait_until(l, deadline, [&] { return st->port != 0; })) {
      status = absl::DeadlineExceededError("rank 0 never listened");
    } else if (st->port < 0) {
      status = absl::UnavailableError("rank 0 failed before listening");
    }
    o.master_port = st->port;
  }
  if (status.ok()) {
    absl::StatusOr<std::unique_ptr<Collectives>> c = CreateGlooCollectives(o);
    if (!c.ok()) {
      status = c.status();
    } else {
      group = std::move(*c);
    }
  }
  if (rank == 0 && !status.ok()) {
    std::lock_guard<std::mutex> l(st->mu);
    if (st->port == 0) st->port = -1;
    st->cv.notify_all();
  }
  if (status.ok()) {
    try {
      status = st->body(rank, *group);
    } catch (const std::exception& e) {
      status = absl::InternalError(absl::StrCat("exception escaped the body: ", e.what()));
    }
  }
  std::unique_lock<std::mutex> l(st->mu);
  st->statuses[rank] = std::move(status);
  st->done[rank] = 1;
  --st->running;
  st->cv.notify_all();
  // Keep the group (and rank 0's store server) until every rank is done.
  st->cv.wait_until(l, deadline, [&] { return st->running == 0; });
  l.unlock();
  group.reset();
}

}  // namespace

std::vector<absl::Status> RunGang(int world_size,
                                  const std::function<absl::Status(int rank, Collectives&)>& body,
                                  const GangOptions& options) {
  if (world_size < 1) {
    return {absl::InvalidArgumentError(absl::StrCat("world_size ", world_size, " < 1"))};
  }
  auto st = std::make_shared<GangState>();
  st->running = world_size;
  st->statuses.assign(world_size, absl::OkStatus());
  st->done.assign(world_size, 0);
  st->body = body;
  const auto deadline =
      std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(options.deadline);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back(RunRank, st, r, world_size, deadline, options.collective_timeout);
  }
  std::vector<absl::Status> out;
  std::vector<char> finished;
  {
    std::unique_lock<std::mutex> l(st->mu);
    st->cv.wait_until(l, deadline, [&] { return st->running == 0; });
    for (int r = 0; r < world_size; ++r) {
      out.push_back(st->done[r] ? st->statuses[r]
                                : absl::DeadlineExceededError(absl::StrCat(
                                      "rank ", r, " still running after the gang's deadline of ",
                                      absl::FormatDuration(options.deadline))));
    }
    finished = st->done;
  }
  for (int r = 0; r < world_size; ++r) {
    if (!finished[r]) {
      threads[r].detach();  // ends at its collective timeout; `st` outlives it
    } else {
      threads[r].join();
    }
  }
  return out;
}

absl::Status FirstFailure(const std::vector<absl::Status>& statuses) {
  for (size_t r = 0; r < statuses.size(); ++r) {
    if (!statuses[r].ok()) {
      return absl::Status(statuses[r].code(),
                          absl::StrCat("rank ", r, ": ", statuses[r].message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::engine::testing
