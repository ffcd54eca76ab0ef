// The cost model: for one placement, the bytes each link moves per optimizer step on one rank and
// the predicted step time as the critical path of the pipeline the engine runs (not a plain sum
// of transfers, nor their max). docs/cost-model.md derives every term and the overlap rules.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "plan/calibration.h"
#include "zero/placement.h"

namespace zoe::plan {

// What a step is busy with. NVMe reads and writes share one resource (the same drives).
enum class Resource : uint8_t { kCompute, kNvme, kPcie, kNetwork, kCpu, kDeviceMem };
inline constexpr int kResources = 6;
const char* resource_name(Resource r);  // "compute", "nvme", "pcie", "network", "cpu_adam", "device_mem"

// Activation checkpointing: the backward recomputes each block's forward, and the block inputs the
// activation store keeps off the device (zoe/activations.h) move on the links each micro-batch:
// device -> host (and host -> NVMe) in the forward, back in the backward, read ahead of use. They
// share the NVMe and host <-> device links with parameter prefetch and optimizer swap
// (docs/cost-model.md, "Activations").
struct ActivationTraffic {
  bool recompute = false;     // checkpointing: one more forward in every backward
  uint64_t host_bytes = 0;    // checkpoint bytes per micro-batch the store keeps in host memory
  uint64_t nvme_bytes = 0;    // ... and on NVMe (through host memory)
  uint64_t tensor_bytes = 0;  // one checkpointed tensor (a block's input): the I/O request size
};

struct Workload {
  uint64_t params = 0;      // for FLOPs: 6 x params x tokens per step (8 x with recompute)
  int64_t micro_batch = 1;  // sequences per micro-batch per rank
  int64_t seq = 1024;       // tokens per sequence
  int64_t grad_accum = 1;   // micro-batches per step
  // zoe.schedule "layer-major": each module's parameters loaded once per step in each pass (every
  // micro-batch's compute under them), its NVMe gradient sums written once after its last
  // micro-batch and never read back (include/zoe/engine.h). The compute, the reductions, the
  // accumulation's CPU passes and the activation traffic are the micro-batches' as before.
  bool layer_major = false;
  // Stage 3: gathers of each module (in the placement's order) per forward and per backward.
  // Empty: once each.
  std::vector<int> fetches_per_pass;
  ActivationTraffic act;
};

struct Topology {
  int nodes = 1, gpus_per_node = 1;
  int world() const { return nodes * gpus_per_node; }
};

// The device the engine runs on, as far as the model cares.
struct DeviceKind {
  bool host_addressable = false;  // the CPU device: device memory is host memory (no staging copies)
};

// Bytes per step on one rank (steady state: every step after the first).
struct LinkBytes {
  uint64_t nvme_read = 0, nvme_write = 0;
  uint64_t host_to_device = 0, device_to_host = 0;  // parameter partitions and staging copies
  uint64_t network = 0;                             // sent by this rank in collectives (ring)
  uint64_t collectives = 0;                         // collectives this rank takes part in
  uint64_t cpu_optimizer = 0;                       // bytes the CPU's Adam and accumulation touch
  uint64_t device_optimizer = 0;                    // the same on the device
  double flops = 0;
  // Of the link bytes above, the activation store's (checkpointed activations offloaded).
  uint64_t act_nvme_read = 0, act_nvme_write = 0, act_host_to_device = 0, act_device_to_host = 0;
};

struct StepCost {
  LinkBytes bytes;
  double busy_s[kResources] = {};      // seconds each resource works per step
  double critical_s[kResources] = {};  // seconds of the critical path each resource accounts for
  double step_s = 0;                   // the sum of critical_s
  Resource bottleneck = Resource::kCompute;
  double bottleneck_share = 0;  // critical_s[bottleneck] / step_s
};

// The per-step cost of `pl` (planned from `cfg` for rank 0 of topo.world()). Stage-3 partitions
// offloaded from the device are followed through the tier manager's device cache (its budget
// pl.tm_device_budget, Belady eviction over the recorded fetch order) to count which fetches
// move bytes.
StepCost estimate_step(const config::Config& cfg, const zero::Placement& pl, const Workload& w,
                       const Topology& topo, const LinkRates& rates, const DeviceKind& dev = {});

}  // namespace zoe::plan
