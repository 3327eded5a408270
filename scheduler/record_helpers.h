// File: scheduler/record_helpers.h
//
// Small read-only helpers over the scheduler's stored records (storage/job_store.h), shared by
// the scheduler facade and its pure pieces (admission_cycle.h). Thread-safety: pure functions.
#ifndef LOOM_SCHEDULER_RECORD_HELPERS_H_
#define LOOM_SCHEDULER_RECORD_HELPERS_H_

#include <string>

#include "absl/time/time.h"
#include "proto/common.pb.h"
#include "storage/job_store.h"

namespace loom {

// A rank that SUCCEEDED, FAILED or STOPPED holds no slot any more.
bool RankEnded(loom::v1::RankState s);
// PENDING or RECOVERING: the job waits for a placement.
bool Waiting(const JobRecord& job);
// The queue name of a spec ("" means "default").
const std::string& QueueOf(const loom::v1::JobSpec& spec);
// The message the job's current phase began with (its history's last entry: a waiting job's
// in-memory message is overwritten by every scheduling cycle's pending reason).
const std::string& PhaseMessage(const JobRecord& job);
// "2026-01-02T03:04:05Z".
std::string Utc(absl::Time t);

}  // namespace loom

#endif  // LOOM_SCHEDULER_RECORD_HELPERS_H_
