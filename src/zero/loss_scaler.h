// LossScaler: fp16 loss scaling, static or dynamic with DeepSpeed's rules (window, hysteresis).
#pragma once

#include <cstdint>

namespace zoe::zero {

// The update computes with the scale in fp32 (optim::compute_step_scale): a scale must be a
// normal positive fp32 number, which the config's range checks ensure for the keys that set one.
// A dynamic scale stays within [min_scale, kMaxScale]: doubling past fp32's largest power of two
// would make it infinite, and every step after that would overflow.
class LossScaler {
 public:
  static constexpr double kMaxScale = 0x1p127;
  // Whether `scale` (a loaded checkpoint's, say) is a positive normal fp32 number.
  static bool fits_fp32(double scale);

  struct Options {
    double static_scale = 0;  // > 0: a fixed scale; 0: dynamic
    int initial_scale_power = 16;
    int window = 1000;
    int hysteresis = 2;
    bool consecutive_hysteresis = false;
    double min_scale = 1;
  };
  LossScaler() = default;
  explicit LossScaler(const Options& o);

  double scale() const { return scale_; }
  // After each step: overflow lowers the scale (once hysteresis is used up); `window` steps
  // without overflow double it.
  void update(bool overflow);

  // The dynamic state, for checkpoints.
  struct State {
    double scale;
    int64_t iter, last_overflow;
    int delayed_shift;
  };
  State state() const { return {scale_, iter_, last_overflow_, delayed_shift_}; }
  void set_state(const State& s) {
    scale_ = s.scale;
    iter_ = s.iter;
    last_overflow_ = s.last_overflow;
    delayed_shift_ = s.delayed_shift;
  }

 private:
  Options o_;
  bool dynamic_ = false;
  double scale_ = 1.0;
  int64_t iter_ = 0;
  int64_t last_overflow_ = -1;
  int delayed_shift_ = 1;
};

}  // namespace zoe::zero
