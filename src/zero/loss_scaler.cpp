// LossScaler: DeepSpeed's DynamicLossScaler semantics.
#include "zero/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace zoe::zero {

bool LossScaler::fits_fp32(double scale) {
  return scale >= static_cast<double>(std::numeric_limits<float>::min()) &&
         scale <= static_cast<double>(std::numeric_limits<float>::max());
}

LossScaler::LossScaler(const Options& o) : o_(o) {
  dynamic_ = o.static_scale <= 0;
  scale_ = dynamic_ ? std::ldexp(1.0, o.initial_scale_power) : o.static_scale;
  delayed_shift_ = std::max(1, o.hysteresis);
}

void LossScaler::update(bool overflow) {
  if (!dynamic_) return;
  if (overflow) {
    if (delayed_shift_ == 1 || o_.hysteresis <= 1) {
      scale_ = std::max(scale_ / 2, o_.min_scale);
    } else {
      delayed_shift_--;
    }
    last_overflow_ = iter_;
  } else {
    if (o_.consecutive_hysteresis) delayed_shift_ = std::max(1, o_.hysteresis);
    if ((iter_ - last_overflow_) % o_.window == 0) {
      if (!o_.consecutive_hysteresis) delayed_shift_ = std::max(1, o_.hysteresis);
      scale_ = std::min(scale_ * 2, kMaxScale);
    }
  }
  iter_++;
}

}  // namespace zoe::zero
