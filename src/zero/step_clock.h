// Step statistics and timing: the seconds each part spends waiting (collectives, I/O, the
// optimizer, the engine itself) and the gathers it ran, since the last step(); collect() turns
// them and the resources' counters into the StepStats step() returns, then starts the next
// step's count. A leaf: the other parts add to it, it calls none of them. Caller's thread only
// (the overlapped update keeps its own clock and hands its totals over when it is joined).
#pragma once

#include <cstdint>

#include "core/clock.h"
#include "zoe/activations.h"
#include "zoe/step_stats.h"

namespace zoe::zero {

// Adds the seconds of its lifetime to *acc.
struct Timer {
  explicit Timer(double* acc) : acc_(acc), t0_(now_ns()) {}
  ~Timer() { *acc_ += static_cast<double>(now_ns() - t0_) * 1e-9; }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  double* acc_;
  uint64_t t0_;
};

// The resources' counters at step(), read by the engine (which owns the resources).
struct ResourceReadings {
  uint64_t device_high_water = 0, host_high_water = 0, nvme_high_water = 0;
  uint64_t nvme_read = 0, nvme_write = 0, host_to_device = 0, device_to_host = 0;
  const ActivationStats* acts = nullptr;  // null: no activation store

  // The link byte counters of an earlier reading (the step's bytes end there).
  void take_link_bytes(const ResourceReadings& o) {
    nvme_read = o.nvme_read;
    nvme_write = o.nvme_write;
    host_to_device = o.host_to_device;
    device_to_host = o.device_to_host;
  }
};

struct StepClock {
  double t_comm = 0, t_io = 0, t_opt = 0, t_engine = 0;
  double t_opt_overlapped = 0;  // the previous overlapped update's time on its thread
  double t_newton_schulz = 0;   // Muon's orthogonalization (part of t_opt)
  uint64_t gathers_prefetched = 0, gathers_on_demand = 0;
  // The link counters at the previous step() (NVMe read, NVMe write, host->device, device->host).
  uint64_t last_link_bytes[4] = {0, 0, 0, 0};
  uint64_t last_step_ns = 0;
  // The activation store's link counters and stall at the previous step() (the same order).
  uint64_t last_act_link[4] = {0, 0, 0, 0};
  double last_act_stall = 0;

  // Fills st's times, high-water marks, bytes and gathers (st.grad_norm, lr, skipped, step,
  // loss_scale and the speculative counts are the step's own), then resets the counts.
  // t_enter: when step() began; params: the model's parameter count.
  void collect(const ResourceReadings& r, uint64_t t_enter, uint64_t params, StepStats* st);
  // The activation store's part of st (collect() calls it).
  void collect_activations(const ActivationStats& a, StepStats* st);
};

}  // namespace zoe::zero
