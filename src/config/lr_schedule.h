// The learning-rate schedule: DeepSpeed's WarmupLR / WarmupDecayLR section of the config and the
// pure function that gives the rate of an update (no I/O, no state; the optimizer calls it).
#pragma once

#include <cstdint>
#include <string>

namespace zoe::config {

// The "scheduler" section (type "" = no scheduler: every update uses optimizer.lr).
struct SchedulerConfig {
  std::string type;  // "", "WarmupLR" or "WarmupDecayLR"
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;
  int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";  // "log" or "linear"
  int64_t total_num_steps = 0;      // WarmupDecayLR

  bool operator==(const SchedulerConfig&) const = default;
};

// The schedule at DeepSpeed's last_batch_iteration `iteration` (>= 0; below 0: warmup_min_lr).
// No scheduler: base_lr (optimizer.lr).
double lr_at_iteration(const SchedulerConfig& s, double base_lr, int64_t iteration);

// The learning rate of optimizer update `step` (1-based; updates skipped for fp16 overflow do
// not count), the value DeepSpeed's scheduler gives that update: DeepSpeed sets the schedule's
// iteration -1 value (warmup_min_lr) at start and advances the scheduler after each update, so
// update k uses the schedule at iteration k-2 (updates 1 and 2 both run at warmup_min_lr).
double lr_at_step(const SchedulerConfig& s, double base_lr, int64_t step);

}  // namespace zoe::config
