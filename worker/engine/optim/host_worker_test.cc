// HostWorker's ordering contract (host_worker.h) with a real thread: FIFO within a class, strict
// priority of urgent tasks over queued background ones, tickets, WaitAll, and the destructor
// running what is queued. The worker is held inside a task by a future the test releases, so
// the queue's state at the moment it chooses is known (no sleeps, no timing).
#include "worker/engine/optim/host_worker.h"

#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace loom::engine::optim {
namespace {

struct Log {
  std::mutex mu;
  std::vector<std::string> order;
  void Add(const std::string& s) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(s);
  }
};

TEST(HostWorkerTest, UrgentTasksOvertakeQueuedBackgroundTasks) {
  Log log;
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::promise<void> started;
  HostWorker w;
  // B1 holds the worker until the test has queued the rest.
  w.PostBackground([&, gate] {
    started.set_value();
    gate.wait();
    log.Add("B1");
  });
  started.get_future().wait();
  const int64_t b2 = w.PostBackground([&] { log.Add("B2"); });
  const int64_t b3 = w.PostBackground([&] { log.Add("B3"); });
  const int64_t u1 = w.PostUrgent([&] { log.Add("U1"); });
  const int64_t u2 = w.PostUrgent([&] { log.Add("U2"); });
  EXPECT_EQ(b2, 2);
  EXPECT_EQ(b3, 3);
  EXPECT_EQ(u1, 1);
  EXPECT_EQ(u2, 2);
  EXPECT_TRUE(w.busy());
  release.set_value();
  w.WaitUrgent(u2);
  w.WaitBackground(b3);
  EXPECT_FALSE(w.busy());
  EXPECT_EQ(log.order, (std::vector<std::string>{"B1", "U1", "U2", "B2", "B3"}));
}

TEST(HostWorkerTest, WaitUrgentDoesNotWaitForBackgroundWork) {
  Log log;
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  HostWorker w;
  // The urgent task is posted first, so it runs first; the background task behind it then holds
  // the worker until the test releases it, and WaitUrgent must return meanwhile.
  const int64_t u = w.PostUrgent([&] { log.Add("U"); });
  w.PostBackground([&, gate] {
    gate.wait();
    log.Add("B");
  });
  w.WaitUrgent(u);
  {
    std::lock_guard<std::mutex> lock(log.mu);
    EXPECT_EQ(log.order, std::vector<std::string>{"U"});
  }
  EXPECT_TRUE(w.busy());
  release.set_value();
  w.WaitAll();
  EXPECT_EQ(log.order, (std::vector<std::string>{"U", "B"}));
}

TEST(HostWorkerTest, WaitOnTicketZeroReturnsAndDestructorRunsQueuedTasks) {
  Log log;
  {
    HostWorker w;
    w.WaitUrgent(0);
    w.WaitBackground(0);
    w.WaitAll();
    for (int i = 0; i < 100; ++i) w.PostBackground([&, i] { log.Add(std::to_string(i)); });
  }
  ASSERT_EQ(log.order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(log.order[i], std::to_string(i));
}

}  // namespace
}  // namespace loom::engine::optim
