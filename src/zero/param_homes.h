// Parameter homes: where each module's compute parameters live between uses.
//  - A persistent module (stage 0-2, and stage-3 modules under stage3_param_persistence_threshold)
//    keeps its full compute parameters on the device, in a buffer this part owns.
//  - A partitioned module (stage 3) keeps this rank's partition in the tier manager, homed on
//    the device, in host RAM or on NVMe (ModuleLayout::param_home). This part is the only one
//    that names a partition's item in the tier manager: the others read, pin and prefetch a
//    partition through the calls below.
// The update writes each module's owned range here (owned_compute / release_owned); at stage
// 1/2 a persistent module's updated partition is then all-gathered into its full copy
// (gather_updated), at once after a serial step or, behind an overlapped step, owed until the
// module's next fetch or the next sync point (owe_gather / settle).
//
// Threads: owned_compute, owned_on_device and release_owned may run on the overlapped update's
// thread (they touch the tier manager, which is thread-safe, and the persistent buffers, which
// are not reallocated while training); everything else is the caller's thread.
#pragma once

#include <deque>
#include <vector>

#include "comm/communicator.h"
#include "offload/tier_manager.h"
#include "zero/home_views.h"
#include "zero/part_resources.h"
#include "zero/step_clock.h"

namespace zoe::zero {

class ParamHomes final : public PartitionSource, public UpdateTarget {
 public:
  struct Resources {
    DeviceMemory* mem = nullptr;
    DeviceOps* ops = nullptr;             // the caller's
    comm::Communicator* dcomm = nullptr;  // device buffers (gathers of updated partitions)
    offload::TierManager* tm = nullptr;   // null when no module is partitioned
    // zero_optimization.offload_param: where partitions are offloaded (kDevice: not offloaded).
    offload::Tier param_offload = offload::Tier::kDevice;
  };
  ParamHomes(const RunShape& shape, const ModuleTable& modules, StepClock& clock, const Resources& r)
      : shape_(shape), modules_(modules), clock_(clock), r_(r) {}

  // initialize(): module m's compute parameters (cbuf: the whole padded module in the compute
  // dtype) into its home.
  Status place(ModuleId m, const char* cbuf);
  // A persistent module's full compute parameters on the device.
  void* persistent_params(ModuleId m) override { return full_[m.index].get(); }

  // Where the compute parameters of module m's owned range are written after the update. Stage-3
  // partitions: pinned in the tier manager until release_owned(); t_io: the running thread's
  // stall clock.
  Result<void*> owned_compute(ModuleId m, double* t_io) override;
  // Whether owned_compute(m) is device memory (else pinned host memory of the host tier).
  bool owned_on_device(ModuleId m) const override;
  // Unpins the updated partition; NVMe-homed ones are written home (kept clean in host memory)
  // through `wb`.
  void release_owned(ModuleId m, double* t_io, WritebackQueue* wb) override;

  // Stage 1/2 (and persistent stage-3 modules): all-gathers the updated partition into the full copy.
  Status gather_updated(ModuleId m) override;
  // Behind an overlapped step: every persistent module's gather is owed (stage >= 1).
  void owe_gathers() override;
  // Runs module m's owed gather, if any (at its fetch).
  Status settle(ModuleId m) override;
  // Runs every owed gather in module order (a sync point: the same order on every rank).
  Status settle_all() override;

  // The fp32 values of module m's compute parameters in its owned range [opt_begin, +opt_n) (out:
  // opt_n floats), from wherever they live: a frozen module's values. Caller's thread, between
  // steps.
  Status read_owned_f32(ModuleId m, float* out) override;
  // Elements [begin, begin + n) of module m's owned range, in the compute dtype, into host
  // memory `dst` (checkpoints). A partition's range starts on a 4096-byte boundary and is whole
  // 4096-byte blocks unless it reaches the end (write_held's too). Between steps.
  Status read_owned(ModuleId m, size_t begin, size_t n, void* dst) override;
  // Elements [begin, begin + n) of what this rank holds of module m (its partition when
  // partitioned, else the whole padded module), from host memory `src` (checkpoints).
  Status write_held(ModuleId m, size_t begin, size_t n, const void* src);

  // Stage-3 partitions (ParamGather's gathers):
  // Whether any module is partitioned (the tier manager exists).
  bool has_partitions() const override { return r_.tm != nullptr; }
  // Module m's partition, its latest bytes from whichever tier holds them, into `dst` (device
  // memory of part elements); pins nothing. Any thread.
  Status read_partition(ModuleId m, void* dst) override;
  // Module m's partition pinned on the device (waits for it; the wait adds to *t_io) until
  // unpin_partition(m).
  Result<void*> pin_partition(ModuleId m, double* t_io) override;
  void unpin_partition(ModuleId m) override;
  // Starts moving module m's partition towards the device (a hint; never waits).
  void prefetch_partition(ModuleId m) override;
  // Partition pins held now (device and host tiers).
  uint64_t pins(ModuleId m) const;
  // The tier manager's record of the fetch order: begun after initialize(), ended after the first
  // iteration.
  void begin_trace();
  void end_trace() override;
  // Waits for every partition move in flight; the first error (a failed write-back).
  Status drain() override;

  void free_device_memory();

 private:
  offload::Tier update_tier() const {
    return r_.param_offload == offload::Tier::kDevice ? offload::Tier::kDevice : offload::Tier::kHost;
  }

  const RunShape& shape_;
  const ModuleTable& modules_;
  StepClock& clock_;
  Resources r_;
  std::vector<device::DeviceBuffer> full_;  // per module; persistent ones only
  std::vector<uint8_t> gather_owed_;  // persistent modules whose updated partitions are not gathered yet
};

}  // namespace zoe::zero
