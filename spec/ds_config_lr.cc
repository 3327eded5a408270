// LearningRateAtStep (spec/ds_config.h): DeepSpeed's lr schedules (runtime/lr_schedules.py) and
// Hugging Face Trainer's (transformers/optimization.py), step by step.
#include <algorithm>
#include <cmath>

#include "spec/ds_config.h"

namespace loom::spec {

double LearningRateAtStep(const DeepSpeedConfig& config, int64_t step) {
  const SchedulerConfig& s = config.scheduler;
  const int64_t it = step - 1;  // the scheduler's last_batch_iteration during this step
  const double W = static_cast<double>(std::max<int64_t>(2, s.warmup_num_steps));
  auto warmup_gamma = [&](int64_t i) {
    return s.warmup_log ? std::log(static_cast<double>(i + 1)) / std::log(W)
                        : static_cast<double>(i) / W;
  };
  switch (s.type) {
    case SchedulerConfig::Type::kNone:
      return config.optimizer.lr;
    case SchedulerConfig::Type::kHfLinear:
    case SchedulerConfig::Type::kHfCosine:
    case SchedulerConfig::Type::kHfConstant:
    case SchedulerConfig::Type::kHfConstantWithWarmup: {
      // transformers/optimization.py's lambdas, evaluated at current_step = step.
      const double w = static_cast<double>(s.warmup_num_steps);
      const double t = static_cast<double>(s.total_num_steps);
      const double x = static_cast<double>(step);
      double lambda = 1.0;
      if (s.type == SchedulerConfig::Type::kHfConstant) {
        lambda = 1.0;
      } else if (x < w) {
        lambda = x / std::max(1.0, w);
      } else if (s.type == SchedulerConfig::Type::kHfLinear) {
        lambda = std::max(0.0, (t - x) / std::max(1.0, t - w));
      } else if (s.type == SchedulerConfig::Type::kHfCosine) {
        const double progress = (x - w) / std::max(1.0, t - w);
        lambda = std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
      }
      return config.optimizer.lr * lambda;
    }
    case SchedulerConfig::Type::kWarmupLR:
    case SchedulerConfig::Type::kWarmupDecayLR: {
      if (it < 0) return s.warmup_min_lr;
      double gamma;
      if (it < W) {
        gamma = warmup_gamma(it);
      } else if (s.type == SchedulerConfig::Type::kWarmupLR) {
        gamma = 1.0;
      } else {
        gamma = std::max(0.0, static_cast<double>(s.total_num_steps - it) /
                                  std::max(1.0, static_cast<double>(s.total_num_steps) - W));
      }
      return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma;
    }
    case SchedulerConfig::Type::kWarmupCosineLR: {
      if (it < 0) return 0.0;
      double ratio;
      if (it < W) {
        ratio = s.warmup_min_ratio + warmup_gamma(it) * (1.0 - s.warmup_min_ratio);
      } else {
        const double real_last = static_cast<double>(it) - W + 1;
        const double real_total = static_cast<double>(s.total_num_steps) - W;
        ratio = (1 + std::cos(M_PI * real_last / real_total)) / 2;
        ratio = std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * ratio);
      }
      return config.optimizer.lr * ratio;
    }
  }
  return config.optimizer.lr;
}

}  // namespace loom::spec
