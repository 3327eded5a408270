#include "scheduler/job_events.h"

#include <algorithm>
#include <utility>

#include "scheduler/job_state.h"

namespace loom {

void Waker::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

bool Waker::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

void Waker::Run() {
  absl::MutexLock lock(&mu_);  // Close() waits for a running callback
  if (closed_) return;
  callback_();
}

WakeDispatcher::WakeDispatcher() : thread_([this] { Loop(); }) {}

WakeDispatcher::~WakeDispatcher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void WakeDispatcher::Wake(const std::shared_ptr<Waker>& waker) {
  absl::MutexLock lock(&mu_);
  if (waker->pending_) return;
  waker->pending_ = true;
  queue_.push_back(waker);
}

void WakeDispatcher::Loop() {
  while (true) {
    std::shared_ptr<Waker> next;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, nothing left
      next = std::move(queue_.front());
      queue_.pop_front();
      next->pending_ = false;  // a wake posted from now on runs the callback again
    }
    next->Run();
  }
}

void JobSubscription::Push(loom::v1::JobEvent event) {
  {
    absl::MutexLock lock(&mu_);
    if (ended_ || cancelled_) return;
    if (!queue_.empty() && queue_.back().type() == "Progress" && event.type() != "Snapshot") {
      queue_.pop_back();  // superseded: every event carries the whole job
    }
    // A replayed "History" event of an ended job is followed by its snapshot.
    if (IsTerminal(event.job().phase()) && event.type() != "History") ended_ = true;
    queue_.push_back(std::move(event));
    while (queue_.size() > kMaxQueuedJobEvents) {
      queue_.pop_front();
      ++dropped_;
    }
  }
  dispatcher_->Wake(waker_);
}

bool JobSubscription::Pop(loom::v1::JobEvent* event) {
  absl::MutexLock lock(&mu_);
  if (queue_.empty()) return false;
  *event = std::move(queue_.front());
  queue_.pop_front();
  return true;
}

bool JobSubscription::ended() const {
  absl::MutexLock lock(&mu_);
  return ended_;
}

void JobSubscription::Cancel() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    queue_.clear();
  }
  waker_->Close();
}

int64_t JobSubscription::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

JobLogBuffer::JobLogs& JobLogBuffer::Touch(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it != jobs_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return it->second;
  }
  while (jobs_.size() >= kMaxJobsWithLogs && EvictOne("")) {
  }
  lru_.push_front(job_id);
  JobLogs& logs = jobs_[job_id];
  logs.lru = lru_.begin();
  return logs;
}

bool JobLogBuffer::EvictOne(const std::string& keep) {
  // Least recently touched first; a followed job is never evicted (its follower's cursor and
  // its end mark live here), so the limits can be exceeded by the followed jobs' logs.
  for (auto it = lru_.end(); it != lru_.begin();) {
    --it;
    if (*it == keep || followers_.count(*it) > 0) continue;
    total_bytes_ -= jobs_.at(*it).bytes;
    jobs_.erase(*it);
    lru_.erase(it);
    return true;
  }
  return false;
}

void JobLogBuffer::WakeFollowers(const std::string& job_id) {
  auto [begin, end] = followers_.equal_range(job_id);
  for (auto it = begin; it != end; ++it) dispatcher_->Wake(it->second);
}

int JobLogBuffer::Append(const std::string& job_id, int32_t attempt, int32_t rank,
                         const google::protobuf::RepeatedPtrField<loom::v1::RankLogLine>& lines) {
  if (lines.empty()) return 0;
  absl::MutexLock lock(&mu_);
  JobLogs& logs = Touch(job_id);
  int64_t& last = logs.last_sequence[{attempt, rank}];
  int added = 0;
  for (const loom::v1::RankLogLine& in : lines) {
    if (in.sequence() <= last) continue;  // a retried heartbeat's line we already have
    last = in.sequence();
    loom::v1::LogLine line;
    line.set_rank(rank);
    line.set_attempt(attempt);
    line.set_sequence(in.sequence());
    line.set_text(in.text().substr(0, kMaxLogLineBytes));
    line.set_stream(in.stream());
    logs.bytes += line.text().size();
    total_bytes_ += line.text().size();
    logs.lines.push_back(std::move(line));
    ++added;
    while (logs.lines.size() > kMaxLogLinesPerJob ||
           (logs.bytes > kMaxLogBytesPerJob && logs.lines.size() > 1)) {
      logs.bytes -= logs.lines.front().text().size();
      total_bytes_ -= logs.lines.front().text().size();
      logs.lines.pop_front();
      ++logs.first_index;
    }
  }
  // Over the total: evict other jobs, least recently touched first (this one is the most recent).
  while (total_bytes_ > kMaxLogBytesTotal && EvictOne(job_id)) {
  }
  if (added > 0) WakeFollowers(job_id);
  return added;
}

std::vector<loom::v1::LogLine> JobLogBuffer::Read(const std::string& job_id,
                                                  const std::set<int32_t>& ranks,
                                                  int32_t tail_lines, size_t max_lines,
                                                  LogCursor* cursor, bool* more) {
  std::vector<loom::v1::LogLine> out;
  if (more != nullptr) *more = false;
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return out;
  const JobLogs& logs = it->second;
  const int64_t end = logs.first_index + static_cast<int64_t>(logs.lines.size());
  int64_t start = std::max(cursor->next_index, logs.first_index);
  auto matches = [&](int64_t index) {
    return ranks.empty() || ranks.count(logs.lines[index - logs.first_index].rank()) > 0;
  };
  if (tail_lines > 0) {
    // Walk back from the end until tail_lines matching lines are in.
    int64_t found = 0, i = end;
    while (i > start && found < tail_lines) {
      --i;
      if (matches(i)) ++found;
    }
    start = i;
  }
  int64_t i = start;
  for (; i < end; ++i) {
    if (!matches(i)) continue;
    if (out.size() == max_lines) {
      if (more != nullptr) *more = true;
      break;
    }
    out.push_back(logs.lines[i - logs.first_index]);
  }
  cursor->next_index = i;
  return out;
}

void JobLogBuffer::MarkEnded(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    // A job that never logged: remember the end only while someone follows it.
    if (followers_.count(job_id) == 0) return;
    Touch(job_id).ended = true;
  } else {
    it->second.ended = true;
  }
  WakeFollowers(job_id);
}

void JobLogBuffer::MarkResumed(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it != jobs_.end()) it->second.ended = false;
}

bool JobLogBuffer::Ended(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  return it != jobs_.end() && it->second.ended;
}

void JobLogBuffer::Follow(const std::string& job_id, const std::shared_ptr<Waker>& waker) {
  absl::MutexLock lock(&mu_);
  followers_.emplace(job_id, waker);
}

void JobLogBuffer::Unfollow(const std::string& job_id, const std::shared_ptr<Waker>& waker) {
  absl::MutexLock lock(&mu_);
  auto [begin, end] = followers_.equal_range(job_id);
  for (auto it = begin; it != end; ++it) {
    if (it->second == waker) {
      followers_.erase(it);
      break;
    }
  }
}

size_t JobLogBuffer::LineCount(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? 0 : it->second.lines.size();
}

}  // namespace loom
