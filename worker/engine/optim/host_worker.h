// HostWorker: one thread that runs posted tasks in two priority classes, for the host side of an
// optimizer pipeline (ZenFlow's CPU side, zenflow_pipeline.h): "urgent" tasks (the per-step
// gradient accumulation, which the next backward waits for) always run before "background" ones
// (the chunks of an interval's CPU Adam step, which may take several training steps). Within a
// class tasks run in the order posted. A background task is taken only when no urgent task is
// queued, so every urgent task posted before a background task has finished when that one starts
// (the accumulation of an interval's last step completes before the interval's CPU step reads
// the buffer).
//
// Why not a library pool: the ordering guarantee above (strict priority on one thread, FIFO
// within a class, tickets to wait for one class's progress) is the whole point, and Abseil and
// the standard library have no executor with it; offload::ThreadPool is a fork-join ParallelFor.
//
// Tickets: Post* returns the task's 1-based number within its class; Wait*(n) blocks until the
// first n tasks of that class have run (0 returns at once). Tasks must not throw and must not
// post or wait on the same worker.
//
// Thread-safety: Post*, Wait* and WaitAll may be called from any thread other than the worker's.
// The destructor runs every queued task, then joins.
#ifndef LOOM_WORKER_ENGINE_OPTIM_HOST_WORKER_H_
#define LOOM_WORKER_ENGINE_OPTIM_HOST_WORKER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace loom::engine::optim {

class HostWorker {
 public:
  HostWorker();
  ~HostWorker();
  HostWorker(const HostWorker&) = delete;
  HostWorker& operator=(const HostWorker&) = delete;

  int64_t PostUrgent(std::function<void()> task);
  int64_t PostBackground(std::function<void()> task);
  void WaitUrgent(int64_t ticket);
  void WaitBackground(int64_t ticket);
  // Until every task posted so far has run.
  void WaitAll();
  // Tasks posted and not yet finished (both classes).
  bool busy() const;

 private:
  struct Queue {
    std::deque<std::function<void()>> tasks;
    int64_t posted = 0, done = 0;
  };
  int64_t Post(Queue& q, std::function<void()> task);
  void Wait(const Queue& q, int64_t ticket);
  void Loop();

  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  Queue urgent_, background_;  // guarded by mu_
  bool stop_ = false;          // guarded by mu_
  std::thread thread_;
};

}  // namespace loom::engine::optim

#endif  // LOOM_WORKER_ENGINE_OPTIM_HOST_WORKER_H_
