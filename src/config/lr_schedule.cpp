// DeepSpeed's WarmupLR and WarmupDecayLR, as pure functions of the scheduler section.
#include "config/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "config/value_used.h"

namespace zoe::config {

double lr_at_iteration(const SchedulerConfig& s, double base_lr, int64_t iteration) {
  if (s.type.empty()) return base_lr;
  if (iteration < 0) return s.warmup_min_lr;
  const int64_t warmup = value_used(
      "scheduler.params.warmup_num_steps", s.warmup_num_steps, std::max<int64_t>(2, s.warmup_num_steps),
      "warmups last at least 2 steps, as DeepSpeed's do, so that log(warmup) is never 0");
  double gamma = 1.0;
  if (iteration < warmup) {
    gamma = s.warmup_type == "linear"
                ? static_cast<double>(iteration) / static_cast<double>(warmup)
                : std::log(static_cast<double>(iteration + 1)) / std::log(static_cast<double>(warmup));
  } else if (s.type == "WarmupDecayLR") {
    const double left = static_cast<double>(s.total_num_steps - iteration);
    const double span = std::max(1.0, static_cast<double>(s.total_num_steps - warmup));
    gamma = std::max(0.0, left / span);
  }
  return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma;
}

double lr_at_step(const SchedulerConfig& s, double base_lr, int64_t step) {
  return lr_at_iteration(s, base_lr, step - 2);
}

}  // namespace zoe::config
