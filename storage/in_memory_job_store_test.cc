#include "storage/in_memory_job_store.h"

#include <memory>

#include "gtest/gtest.h"
#include "storage/job_store_conformance.h"

namespace loom {
namespace {

INSTANTIATE_TEST_SUITE_P(InMemory, JobStoreConformanceTest,
                         ::testing::Values(JobStoreFactory{
                             "in_memory", [](const std::string&) -> std::unique_ptr<JobStore> {
                               return std::make_unique<InMemoryJobStore>();
                             }}));

}  // namespace
}  // namespace loom
