#include "worker/trainer/monitor_writers.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "proto/tensorboard_event.pb.h"

namespace loom::trainer {
namespace {

constexpr char kTrainLoss[] = "Train/Samples/train_loss";
constexpr char kLr[] = "Train/Samples/lr";
constexpr char kLossScale[] = "Train/Samples/loss_scale";
constexpr char kEvalLoss[] = "Train/Samples/eval_loss";

// The reflected Castagnoli polynomial 0x82F63B78, one table of 256 entries.
std::array<uint32_t, 256> Crc32cTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

std::string Dir(const std::string& job_dir, const spec::MonitorBlock& b) {
  std::string dir = job_dir.empty() ? std::string(".") : job_dir;
  if (!b.output_path.empty()) absl::StrAppend(&dir, "/", b.output_path);
  absl::StrAppend(&dir, "/", b.job_name);
  return dir;
}

absl::Status IoError(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t Crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = Crc32cTable();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t MaskedCrc32c(const void* data, size_t size) {
  const uint32_t c = Crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

absl::StatusOr<std::unique_ptr<MonitorWriters>> MonitorWriters::Open(
    const spec::MonitorConfig& config, const std::string& job_dir, int64_t samples_per_step,
    bool fp16, std::function<absl::Time()> now) {
  if (!config.tensorboard.enabled && !config.csv_monitor.enabled) return nullptr;
  std::unique_ptr<MonitorWriters> w(new MonitorWriters());
  w->now_ = std::move(now);
  w->samples_per_step_ = std::max<int64_t>(1, samples_per_step);
  w->fp16_ = fp16;
  if (config.tensorboard.enabled) {
    w->tb_dir_ = Dir(job_dir, config.tensorboard);
    if (absl::Status s = MakeDirs(w->tb_dir_); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("deepspeed_config.tensorboard: ", s.message()));
    }
    char host[256] = "localhost";
    gethostname(host, sizeof(host) - 1);
    w->tb_path_ = absl::StrFormat("%s/events.out.tfevents.%d.%s.%d.0", w->tb_dir_,
                                  absl::ToUnixSeconds(w->now_()), host, getpid());
    w->tb_ = std::fopen(w->tb_path_.c_str(), "ab");
    if (w->tb_ == nullptr) return IoError("deepspeed_config.tensorboard: cannot open", w->tb_path_);
    loom::tensorboard::Event first;
    first.set_wall_time(absl::ToDoubleSeconds(w->now_() - absl::UnixEpoch()));
    first.set_file_version("brain.Event:2");
    RETURN_IF_ERROR(w->TensorBoardRecord(first.SerializeAsString()));
  }
  if (config.csv_monitor.enabled) {
    w->csv_dir_ = Dir(job_dir, config.csv_monitor);
    if (absl::Status s = MakeDirs(w->csv_dir_); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("deepspeed_config.csv_monitor: ", s.message()));
    }
  }
  return w;
}

MonitorWriters::~MonitorWriters() {
  if (tb_ != nullptr) std::fclose(tb_);
}

absl::Status MonitorWriters::TensorBoardRecord(const std::string& bytes) {
  std::string header;
  PutLe(&header, bytes.size(), 8);
  std::string record = header;
  PutLe(&record, MaskedCrc32c(header.data(), header.size()), 4);
  record += bytes;
  PutLe(&record, MaskedCrc32c(bytes.data(), bytes.size()), 4);
  if (std::fwrite(record.data(), 1, record.size(), tb_) != record.size() || std::fflush(tb_) != 0) {
    return IoError("cannot write", tb_path_);
  }
  return absl::OkStatus();
}

absl::Status MonitorWriters::Scalar(const std::string& tag, double value, int64_t samples) {
  if (tb_ != nullptr) {
    loom::tensorboard::Event e;
    e.set_wall_time(absl::ToDoubleSeconds(now_() - absl::UnixEpoch()));
    e.set_step(samples);
    loom::tensorboard::SummaryValue* v = e.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
    RETURN_IF_ERROR(TensorBoardRecord(e.SerializeAsString()));
  }
  if (!csv_dir_.empty()) {
    const std::string name = absl::StrReplaceAll(tag, {{"/", "_"}, {" ", "_"}});
    const std::string path = absl::StrCat(csv_dir_, "/", name, ".csv");
    std::FILE* f = std::fopen(path.c_str(), "a");
    if (f == nullptr) return IoError("cannot open", path);
    std::string rows;
    if (!csv_started_.count(name) && std::ftell(f) == 0) {
      absl::StrAppend(&rows, "step,", tag.substr(tag.rfind('/') + 1), "\n");
    }
    csv_started_.insert(name);
    // The shortest text that reads back as the same double, as Python's csv.writer prints a
    // float (repr) in DeepSpeed's files.
    char number[32];
    const auto [end, ec] = std::to_chars(number, number + sizeof(number), value);
    absl::StrAppend(&rows, samples, ",", absl::string_view(number, end - number), "\n");
    const bool ok = std::fwrite(rows.data(), 1, rows.size(), f) == rows.size();
    if (std::fclose(f) != 0 || !ok) return IoError("cannot write", path);
  }
  return absl::OkStatus();
}

absl::Status MonitorWriters::Write(const loom::TrainerEvent& event) {
  if (event.has_step()) {
    const loom::TrainerEvent::Step& s = event.step();
    const int64_t samples = s.step() * samples_per_step_;
    RETURN_IF_ERROR(Scalar(kTrainLoss, s.loss(), samples));
    RETURN_IF_ERROR(Scalar(kLr, s.lr(), samples));
    if (fp16_) RETURN_IF_ERROR(Scalar(kLossScale, s.loss_scale(), samples));
  } else if (event.has_eval()) {
    RETURN_IF_ERROR(Scalar(kEvalLoss, event.eval().loss(), event.eval().step() * samples_per_step_));
  }
  return absl::OkStatus();
}

}  // namespace loom::trainer
