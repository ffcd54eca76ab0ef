// Step statistics: see step_clock.h.
#include "zero/step_clock.h"

#include <algorithm>

namespace zoe::zero {

void StepClock::collect(const ResourceReadings& r, uint64_t t_enter, uint64_t params, StepStats* st) {
  const uint64_t now = now_ns();
  const double wall = static_cast<double>(now - last_step_ns) * 1e-9;
  const double in_engine = t_engine + static_cast<double>(now - t_enter) * 1e-9;
  st->t_comm = t_comm;
  st->t_io_stall = t_io;
  st->t_optimizer = t_opt;
  st->t_update_overlapped = t_opt_overlapped;
  st->t_newton_schulz = t_newton_schulz;
  st->t_compute = std::max(0.0, wall - in_engine);
  st->high_water[0] = r.device_high_water;
  st->high_water[1] = r.host_high_water;
  st->high_water[2] = r.nvme_high_water;
  st->bytes_nvme_read = r.nvme_read;
  st->bytes_nvme_write = r.nvme_write;
  st->bytes_host_to_device = r.host_to_device;
  st->bytes_device_to_host = r.device_to_host;
  const uint64_t now_bytes[4] = {st->bytes_nvme_read, st->bytes_nvme_write, st->bytes_host_to_device,
                                 st->bytes_device_to_host};
  uint64_t* step_bytes[4] = {&st->step_bytes_nvme_read, &st->step_bytes_nvme_write,
                             &st->step_bytes_host_to_device, &st->step_bytes_device_to_host};
  double* per_param[4] = {&st->per_param_nvme_read, &st->per_param_nvme_write, &st->per_param_host_to_device,
                          &st->per_param_device_to_host};
  const double np = static_cast<double>(std::max<uint64_t>(1, params));
  for (int k = 0; k < 4; ++k) {
    *step_bytes[k] = now_bytes[k] - last_link_bytes[k];
    *per_param[k] = static_cast<double>(*step_bytes[k]) / np;
    last_link_bytes[k] = now_bytes[k];
  }
  if (r.acts) collect_activations(*r.acts, st);
  st->gathers_prefetched = gathers_prefetched;
  st->gathers_on_demand = gathers_on_demand;
  gathers_prefetched = gathers_on_demand = 0;
  t_comm = t_io = t_opt = t_engine = t_opt_overlapped = t_newton_schulz = 0;
  last_step_ns = now;
}

void StepClock::collect_activations(const ActivationStats& a, StepStats* st) {
  st->activation_checkpoint_bytes = a.checkpoint_bytes;
  for (int k = 0; k < 3; ++k) st->activation_tier_bytes[k] = a.tier_bytes[k];
  st->activation_high_water[0] = a.high_water_device;
  st->activation_high_water[1] = a.high_water_host;
  st->activation_high_water[2] = a.high_water_nvme;
  st->high_water[1] += a.high_water_host;
  st->high_water[2] += a.high_water_nvme;
  const uint64_t now[4] = {a.bytes_device_to_host, a.bytes_host_to_device, a.bytes_nvme_write,
                           a.bytes_nvme_read};
  uint64_t* out[4] = {&st->activation_bytes_device_to_host, &st->activation_bytes_host_to_device,
                      &st->activation_bytes_nvme_write, &st->activation_bytes_nvme_read};
  for (int k = 0; k < 4; ++k) {
    *out[k] = now[k] - last_act_link[k];
    last_act_link[k] = now[k];
  }
  st->t_activation_stall = a.t_stall - last_act_stall;
  last_act_stall = a.t_stall;
}

}  // namespace zoe::zero
