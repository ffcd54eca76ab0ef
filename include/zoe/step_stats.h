// What Engine::step() reports: every field declared once, in ZOE_STEP_STATS_FIELDS. From that one
// list come the struct's members, zoe::for_each_field() (which the Python front-end's stats dict
// and zoe::step_stats_json() walk) and so `zoe train --json`'s "step_stats". A new statistic is
// one line here and one assignment where the engine computes it.
#pragma once

#include <cstdint>
#include <string>

namespace zoe {

// Bytes per tier, indexed device 0, host 1, nvme 2.
using TierBytesArray = uint64_t[3];

// X(type, name, initial value, meaning), in the order they are reported.
#define ZOE_STEP_STATS_FIELDS(X)                                                                             \
  X(int64_t, step, 0, "optimizer steps taken so far")                                                        \
  X(bool, skipped, false, "fp16 overflow: no update, loss scale lowered")                                    \
  X(double, grad_norm, 0.0, "of the averaged, unscaled gradients (before clipping)")                         \
  X(double, loss_scale, 1.0, "the scale for the next step")                                                  \
  X(double, lr, 0.0, "used by this step")                                                                    \
  /* Seconds since the previous step() (or initialize()): time in each part of the engine. */                \
  X(double, t_compute, 0.0, "outside engine calls (the caller's forward/backward)")                          \
  X(double, t_comm, 0.0, "waiting for collectives")                                                          \
  X(double, t_io_stall, 0.0, "waiting for parameters to arrive from host/NVMe")                              \
  X(double, t_optimizer, 0.0,                                                                                \
    "the caller waiting for the optimizer: the step itself (norm, and the update unless it is "              \
    "overlapped) and fetches waiting for an update")                                                         \
  X(double, t_update_overlapped, 0.0,                                                                        \
    "the previous step's update on its own thread, behind this step's forward (zoe.overlap_step); 0 "        \
    "when serial")                                                                                           \
  X(double, t_newton_schulz, 0.0,                                                                            \
    "optimizer.type Muon: of t_optimizer, the seconds in Newton-Schulz (the matrices' orthogonalization)")   \
  X(TierBytesArray, high_water, {}, "high-water marks, bytes: device, host, nvme")                           \
  /* Bytes moved since initialize(): NVMe reads and writes (every tier's), host -> device and                \
     device -> host (parameter partitions, including those streamed from/to NVMe); with an overlapped        \
     update, read just before its thread starts. */                                                          \
  X(uint64_t, bytes_nvme_read, 0, "NVMe bytes read since initialize()")                                      \
  X(uint64_t, bytes_nvme_write, 0, "NVMe bytes written since initialize()")                                  \
  X(uint64_t, bytes_host_to_device, 0, "host -> device bytes since initialize()")                            \
  X(uint64_t, bytes_device_to_host, 0, "device -> host bytes since initialize()")                            \
  /* The same links, this step's part only (an overlapped update's counts at the next step), and             \
     those bytes per parameter of the model (this rank's bytes over num_params()). */                        \
  X(uint64_t, step_bytes_nvme_read, 0, "this step's NVMe bytes read")                                        \
  X(uint64_t, step_bytes_nvme_write, 0, "this step's NVMe bytes written")                                    \
  X(uint64_t, step_bytes_host_to_device, 0, "this step's host -> device bytes")                              \
  X(uint64_t, step_bytes_device_to_host, 0, "this step's device -> host bytes")                              \
  X(double, per_param_nvme_read, 0.0, "this step's NVMe bytes read per parameter")                           \
  X(double, per_param_nvme_write, 0.0, "this step's NVMe bytes written per parameter")                       \
  X(double, per_param_host_to_device, 0.0, "this step's host -> device bytes per parameter")                 \
  X(double, per_param_device_to_host, 0.0, "this step's device -> host bytes per parameter")                 \
  X(uint64_t, gathers_prefetched, 0,                                                                         \
    "stage 3, since the previous step(): fetches whose all-gather prefetch had already queued (world "       \
    "size 1, served in place: whose partition prefetch had started moving to the device)")                   \
  X(uint64_t, gathers_on_demand, 0, "stage 3, since the previous step(): fetches that gathered on the spot") \
  X(uint64_t, speculative_kept, 0,                                                                           \
    "zoe.speculative_step: modules whose update ran during the backward and stood")                          \
  X(uint64_t, speculative_undone, 0,                                                                         \
    "zoe.speculative_step: modules whose speculative update was undone (the step clipped or "                \
    "overflowed, or the states were read first)")                                                            \
  /* The activation store (Engine::activations()). Its traffic is in none of the bytes_* fields above        \
     (it has its own I/O engine and stream); high_water includes it: the device mark is the device's own     \
     (the store allocates there), the host and nvme marks add the store's marks below. */                    \
  X(uint64_t, activation_checkpoint_bytes, 0, "activation bytes saved in the last micro-batch, any tier")    \
  X(TierBytesArray, activation_tier_bytes, {},                                                               \
    "of which kept on the device, in pinned host memory, on NVMe")                                           \
  X(TierBytesArray, activation_high_water, {}, "activation store high-water marks over the run, bytes")      \
  X(uint64_t, activation_bytes_device_to_host, 0, "this step's activation bytes device -> host")             \
  X(uint64_t, activation_bytes_host_to_device, 0, "this step's activation bytes host -> device")             \
  X(uint64_t, activation_bytes_nvme_write, 0, "this step's activation bytes written to NVMe")                \
  X(uint64_t, activation_bytes_nvme_read, 0, "this step's activation bytes read from NVMe")                  \
  X(double, t_activation_stall, 0.0, "this step's seconds loads waited for activations still on their way")

struct StepStats {
#define ZOE_STEP_STATS_MEMBER_(type, name, init, doc) type name = init;
  ZOE_STEP_STATS_FIELDS(ZOE_STEP_STATS_MEMBER_)
#undef ZOE_STEP_STATS_MEMBER_
};

// Calls f(name, value) for every field of s, in the order above; value is an int64_t, bool,
// double, uint64_t or TierBytesArray (const uint64_t (&)[3]: device, host, nvme).
template <class F>
void for_each_field(const StepStats& s, F&& f) {
#define ZOE_STEP_STATS_VISIT_(type, name, init, doc) f(#name, s.name);
  ZOE_STEP_STATS_FIELDS(ZOE_STEP_STATS_VISIT_)
#undef ZOE_STEP_STATS_VISIT_
}

// The meaning of field `name` (its line above), or "" when there is no such field.
const char* step_stats_doc(const std::string& name);

// s as one JSON object: every field by name; high_water as {"device", "host", "nvme"}.
std::string step_stats_json(const StepStats& s);

}  // namespace zoe
