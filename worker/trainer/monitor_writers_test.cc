// worker/trainer/monitor_writers.h: CRC-32C against RFC 3720's test vectors (B.4), and the CSV
// files as DeepSpeed's csv_monitor lays them out (a header once per file, samples on the x axis,
// loss_scale only with fp16). That TensorBoard reads the event files is checked by the real
// tensorboard library (tests/python/monitor_test.py).
#include "worker/trainer/monitor_writers.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "gtest/gtest.h"

namespace loom::trainer {
namespace {

TEST(MonitorWritersTest, Crc32cMatchesRfc3720) {
  const std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xff);
  std::vector<unsigned char> up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<unsigned char>(i);
    down[i] = static_cast<unsigned char>(31 - i);
  }
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(up.data(), up.size()), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(down.data(), down.size()), 0x113FDB5Cu);
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
}

loom::TrainerEvent Step(int64_t step, double loss, double lr, double scale) {
  loom::TrainerEvent e;
  e.mutable_step()->set_step(step);
  e.mutable_step()->set_loss(loss);
  e.mutable_step()->set_lr(lr);
  e.mutable_step()->set_loss_scale(scale);
  return e;
}

TEST(MonitorWritersTest, CsvFilesAsDeepSpeedWritesThem) {
  const std::string job = std::string(std::getenv("TEST_TMPDIR")) + "/job";
  spec::MonitorConfig config;
  config.csv_monitor.enabled = true;
  config.csv_monitor.output_path = "ds_logs";
  config.csv_monitor.job_name = "run1";
  for (int restart = 0; restart < 2; ++restart) {  // a restarted trainer appends, no 2nd header
    absl::StatusOr<std::unique_ptr<MonitorWriters>> w =
        MonitorWriters::Open(config, job, /*samples_per_step=*/16, /*fp16=*/true);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_NE(*w, nullptr);
    EXPECT_EQ((*w)->csv_dir(), job + "/ds_logs/run1");
    ASSERT_TRUE((*w)->Write(Step(1 + restart, 5.5, 0.001, 65536)).ok());
    loom::TrainerEvent eval;
    eval.mutable_eval()->set_step(1 + restart);
    eval.mutable_eval()->set_loss(4.25);
    ASSERT_TRUE((*w)->Write(eval).ok());
  }
  EXPECT_EQ(*ReadFile(job + "/ds_logs/run1/Train_Samples_train_loss.csv"),
            "step,train_loss\n16,5.5\n32,5.5\n");
  EXPECT_EQ(*ReadFile(job + "/ds_logs/run1/Train_Samples_lr.csv"), "step,lr\n16,0.001\n32,0.001\n");
  EXPECT_EQ(*ReadFile(job + "/ds_logs/run1/Train_Samples_loss_scale.csv"),
            "step,loss_scale\n16,65536\n32,65536\n");
  EXPECT_EQ(*ReadFile(job + "/ds_logs/run1/Train_Samples_eval_loss.csv"),
            "step,eval_loss\n16,4.25\n32,4.25\n");

  spec::MonitorConfig none;
  absl::StatusOr<std::unique_ptr<MonitorWriters>> off = MonitorWriters::Open(none, job, 16, false);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(*off, nullptr);
}

}  // namespace
}  // namespace loom::trainer
