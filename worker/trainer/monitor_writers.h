// File: worker/trainer/monitor_writers.h
//
// DeepSpeed's `tensorboard` and `csv_monitor` blocks (spec/ds_config.h MonitorConfig), written
// by rank 0 as DeepSpeed's monitors write them (deepspeed/monitor/tensorboard.py, csv_monitor.py;
// the engine's and pipeline engine's event names), so that `tensorboard --logdir` and a user's
// CSV tooling read a Loom job as they read a DeepSpeed run:
//   Train/Samples/train_loss   each step's mean training loss
//   Train/Samples/lr           each step's learning rate
//   Train/Samples/loss_scale   each step's loss scale (fp16 only)
//   Train/Samples/eval_loss    each held-out evaluation
// against DeepSpeed's x axis, global samples (step x train_batch_size).
// Where: <job dir>/<output_path>/<job_name>/ (the job's checkpoint directory stands where
// DeepSpeed uses its launch directory). TensorBoard: one event file per process,
// events.out.tfevents.<unix seconds>.<host>.<pid>.0, TFRecord framing (length, masked CRC32C of
// it, the serialized Event, masked CRC32C of that), first record file_version "brain.Event:2".
// CSV: <tag with '/' and ' ' as '_'>.csv, a header "step,<last tag component>" when the file is
// new (DeepSpeed writes it again on every restart; Loom does not), then "samples,value" rows.
// Each record is flushed when written: a crash loses nothing before it.
//
// Thread-safety: not thread-safe (the trainer's event callback, one thread). Errors: IO errors
// name the file; the trainer logs them and stops writing that monitor (training goes on).
#ifndef LOOM_WORKER_TRAINER_MONITOR_WRITERS_H_
#define LOOM_WORKER_TRAINER_MONITOR_WRITERS_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/trainer_events.pb.h"
#include "spec/ds_config.h"

namespace loom::trainer {

// CRC-32C (Castagnoli) of `data`, and TFRecord's mask of it ((crc >> 15 | crc << 17) +
// 0xa282ead8). Hand-written: no C++ library on this platform offers CRC-32C (Debian bookworm's
// Abseil predates absl/crc, google/crc32c is not packaged); the test checks RFC 3720's vectors.
uint32_t Crc32c(const void* data, size_t size);
uint32_t MaskedCrc32c(const void* data, size_t size);

class MonitorWriters {
 public:
  // Opens the enabled monitors of `config` under `job_dir` (directories created). nullptr when
  // none is enabled. `samples_per_step`: train_batch_size. `now` gives wall time (tests).
  static absl::StatusOr<std::unique_ptr<MonitorWriters>> Open(
      const spec::MonitorConfig& config, const std::string& job_dir, int64_t samples_per_step,
      bool fp16, std::function<absl::Time()> now = absl::Now);
  ~MonitorWriters();

  // Writes what `event` carries for the monitors (step and eval events; others are ignored).
  absl::Status Write(const loom::TrainerEvent& event);

  const std::string& tensorboard_dir() const { return tb_dir_; }
  const std::string& csv_dir() const { return csv_dir_; }

 private:
  MonitorWriters() = default;
  absl::Status Scalar(const std::string& tag, double value, int64_t samples);
  absl::Status TensorBoardRecord(const std::string& bytes);

  std::function<absl::Time()> now_;
  int64_t samples_per_step_ = 1;
  bool fp16_ = false;
  std::string tb_dir_, tb_path_;
  std::FILE* tb_ = nullptr;
  std::string csv_dir_;
  std::set<std::string> csv_started_;
};

}  // namespace loom::trainer

#endif  // LOOM_WORKER_TRAINER_MONITOR_WRITERS_H_
