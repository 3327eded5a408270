#include "worker/engine/optim/host_worker.h"

#include <utility>

namespace loom::engine::optim {

HostWorker::HostWorker() : thread_([this] { Loop(); }) {}

HostWorker::~HostWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_one();
  thread_.join();
}

int64_t HostWorker::Post(Queue& q, std::function<void()> task) {
  int64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    q.tasks.push_back(std::move(task));
    ticket = ++q.posted;
  }
  work_cv_.notify_one();
  return ticket;
}

int64_t HostWorker::PostUrgent(std::function<void()> task) {
  return Post(urgent_, std::move(task));
}

int64_t HostWorker::PostBackground(std::function<void()> task) {
  return Post(background_, std::move(task));
}

void HostWorker::Wait(const Queue& q, int64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return q.done >= ticket; });
}

void HostWorker::WaitUrgent(int64_t ticket) { Wait(urgent_, ticket); }
void HostWorker::WaitBackground(int64_t ticket) { Wait(background_, ticket); }

void HostWorker::WaitAll() {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t u = urgent_.posted, b = background_.posted;
  done_cv_.wait(lock, [&] { return urgent_.done >= u && background_.done >= b; });
}

bool HostWorker::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return urgent_.done < urgent_.posted || background_.done < background_.posted;
}

void HostWorker::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] {
      return stop_ || !urgent_.tasks.empty() || !background_.tasks.empty();
    });
    // Strict priority: a background task only when no urgent one is queued.
    Queue* q = !urgent_.tasks.empty() ? &urgent_ : (!background_.tasks.empty() ? &background_
                                                                                : nullptr);
    if (q == nullptr) return;  // stop_ with nothing left
    std::function<void()> task = std::move(q->tasks.front());
    q->tasks.pop_front();
    lock.unlock();
    task();
    lock.lock();
    ++q->done;
    done_cv_.notify_all();
  }
}

}  // namespace loom::engine::optim
