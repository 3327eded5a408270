// fp16 dynamic loss scaling, exactly DeepSpeed's DynamicLossScaler.update_scale
// (deepspeed/runtime/fp16/loss_scaler.py; docs/design/TECHNIQUES.md §0):
//   overflow:  if hysteresis is exhausted (delayed_shift == 1 or cur_hysteresis == 1) the scale
//              becomes max(scale / 2, min_loss_scale); otherwise cur_hysteresis -= 1.
//              last_overflow_iter = cur_iter.
//   clean:     if consecutive_hysteresis, cur_hysteresis = hysteresis; when
//              (cur_iter - last_overflow_iter) % loss_scale_window == 0 the scale doubles (and,
//              without consecutive_hysteresis, cur_hysteresis is restored).
//   cur_iter += 1 after each update.
// A static scale (fp16.loss_scale > 0) never changes. Torch-free; not thread-safe.
#ifndef LOOM_WORKER_ENGINE_LOSS_SCALER_H_
#define LOOM_WORKER_ENGINE_LOSS_SCALER_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "spec/ds_config.h"

namespace loom::engine {

class LossScaler {
 public:
  // Disabled (fp16 off): scale 1 forever.
  LossScaler() = default;
  explicit LossScaler(const spec::Fp16Config& c)
      : enabled_(c.enabled),
        dynamic_(c.enabled && c.loss_scale == 0),
        scale_(!c.enabled ? 1.0
               : c.loss_scale > 0 ? c.loss_scale
                                  : std::ldexp(1.0, static_cast<int>(c.initial_scale_power))),
        window_(c.loss_scale_window),
        delayed_shift_(c.hysteresis),
        cur_hysteresis_(c.hysteresis),
        consecutive_hysteresis_(c.consecutive_hysteresis),
        min_scale_(c.min_loss_scale) {}

  bool enabled() const { return enabled_; }
  double scale() const { return scale_; }

  void Update(bool overflow) {
    if (!dynamic_) return;
    if (overflow) {
      if (delayed_shift_ == 1 || cur_hysteresis_ == 1) {
        scale_ = std::max(scale_ / 2.0, min_scale_);
      } else {
        --cur_hysteresis_;
      }
      last_overflow_iter_ = cur_iter_;
    } else {
      if (consecutive_hysteresis_) cur_hysteresis_ = delayed_shift_;
      if ((cur_iter_ - last_overflow_iter_) % window_ == 0) {
        if (!consecutive_hysteresis_) cur_hysteresis_ = delayed_shift_;
        scale_ *= 2.0;
      }
    }
    ++cur_iter_;
  }

  // State for checkpoints: (scale, cur_iter, last_overflow_iter, cur_hysteresis).
  struct State {
    double scale;
    int64_t cur_iter, last_overflow_iter, cur_hysteresis;
  };
  State state() const { return {scale_, cur_iter_, last_overflow_iter_, cur_hysteresis_}; }
  void set_state(const State& s) {
    scale_ = s.scale;
    cur_iter_ = s.cur_iter;
    last_overflow_iter_ = s.last_overflow_iter;
    cur_hysteresis_ = s.cur_hysteresis;
  }

 private:
  bool enabled_ = false;
  bool dynamic_ = false;
  double scale_ = 1.0;
  int64_t window_ = 1000;
  int64_t delayed_shift_ = 2;
  int64_t cur_hysteresis_ = 2;
  bool consecutive_hysteresis_ = false;
  double min_scale_ = 1.0;
  int64_t cur_iter_ = 0;
  int64_t last_overflow_iter_ = -1;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_LOSS_SCALER_H_
