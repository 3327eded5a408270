// File: storage/job_store_conformance.h
//
// The contract of JobStore (job_store.h) as one value-parameterized gtest suite, run against
// every implementation so the in-memory fake cannot drift from SQLite (docs/design/STYLE.md habit
// 7). A test file instantiates it with a factory:
//
//   INSTANTIATE_TEST_SUITE_P(Sqlite, JobStoreConformanceTest,
//                            ::testing::Values(JobStoreFactory{"sqlite", &MakeSqliteStore}));
//
// Testonly.
#ifndef LOOM_STORAGE_JOB_STORE_CONFORMANCE_H_
#define LOOM_STORAGE_JOB_STORE_CONFORMANCE_H_

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "gtest/gtest.h"
#include "storage/job_store.h"

namespace loom {

struct JobStoreFactory {
  std::string name;
  // Returns a fresh, empty store. `dir` is a directory private to the test (under $TEST_TMPDIR).
  std::function<std::unique_ptr<JobStore>(const std::string& dir)> make;
};

inline std::ostream& operator<<(std::ostream& os, const JobStoreFactory& f) { return os << f.name; }

class JobStoreConformanceTest : public ::testing::TestWithParam<JobStoreFactory> {
 protected:
  void SetUp() override;
  std::unique_ptr<JobStore> store_;
  std::string dir_;
};

// A fully populated job record (every field non-default) for round-trip checks.
JobRecord SampleJob(const std::string& id, int64_t sequence);
// A node record with a CPU inventory of `slots` slots.
NodeRecord SampleNode(const std::string& id, int slots);

}  // namespace loom

#endif  // LOOM_STORAGE_JOB_STORE_CONFORMANCE_H_
