#include "worker/engine/buffer_pool.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace loom::engine {
namespace {

TEST(BufferPoolTest, ReusesBySizeAndDtypeAndAccountsEveryByte) {
  int64_t accounted = 0, in_use = 0;
  BufferPool pool([&](int64_t u, int64_t i) {
    accounted += u + i;
    in_use += u;
  });
  at::Tensor a = pool.Get(1000, at::kFloat);
  EXPECT_EQ(a.numel(), 1000);
  EXPECT_EQ(accounted, 4000);
  void* ptr = a.data_ptr();
  pool.Put(std::move(a));
  EXPECT_EQ(pool.idle_bytes(), 4000);
  at::Tensor b = pool.Get(1000, at::kFloat);  // the same storage comes back
  EXPECT_EQ(b.data_ptr(), ptr);
  at::Tensor c = pool.Get(1000, at::kHalf);  // another dtype: a new buffer
  EXPECT_NE(c.data_ptr(), ptr);
  at::Tensor d = pool.Get(999, at::kFloat);  // another size: a new buffer
  EXPECT_EQ(accounted, 4000 + 2000 + 3996);
  EXPECT_EQ(in_use, accounted);
  EXPECT_EQ(pool.in_use_bytes(), accounted);
  pool.Put(std::move(b));
  pool.Put(std::move(c));
  pool.Put(std::move(d));
  EXPECT_EQ(pool.idle_bytes(), accounted);
  EXPECT_EQ(in_use, 0);
}

TEST(BufferPoolTest, TrimFreesWhatWasNotUsedForAWholePeriod) {
  int64_t accounted = 0, in_use = 0;
  BufferPool pool([&](int64_t u, int64_t i) {
    accounted += u + i;
    in_use += u;
  });
  at::Tensor x = pool.Get(256, at::kFloat), y = pool.Get(256, at::kFloat);
  pool.Put(std::move(x));
  pool.Put(std::move(y));
  pool.Trim();  // both were used in this period: kept
  EXPECT_EQ(pool.idle_bytes(), 2048);
  at::Tensor z = pool.Get(256, at::kFloat);  // only one is needed in the next period
  pool.Put(std::move(z));
  pool.Trim();
  EXPECT_EQ(pool.idle_bytes(), 1024);
  EXPECT_EQ(accounted, 1024);
  pool.Trim();  // unused for a whole period: freed
  EXPECT_EQ(pool.idle_bytes(), 0);
  EXPECT_EQ(accounted, 0);
}

TEST(BufferPoolTest, ABufferStillViewedElsewhereIsNotReused) {
  int64_t accounted = 0, in_use = 0;
  BufferPool pool([&](int64_t u, int64_t i) {
    accounted += u + i;
    in_use += u;
  });
  at::Tensor a = pool.Get(64, at::kFloat);
  at::Tensor view = a.narrow(0, 0, 8);  // e.g. saved by someone
  void* ptr = a.data_ptr();
  pool.Put(std::move(a));
  EXPECT_EQ(pool.idle_bytes(), 0);
  EXPECT_EQ(accounted, 0);
  at::Tensor b = pool.Get(64, at::kFloat);
  EXPECT_NE(b.data_ptr(), ptr);  // the viewed storage was never handed out again
  view.fill_(1.0f);              // and is still valid
  EXPECT_EQ(view.sum().item<float>(), 8.0f);
}

}  // namespace
}  // namespace loom::engine
