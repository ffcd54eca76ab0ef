// What the other parts need of ParamHomes, as two narrow interfaces, so that each of those parts
// can be built and tested with a fake in its place: PartitionSource is ParamGather's view (the
// parameters to gather or hand out), UpdateTarget the Updater's (where the update writes the new
// compute parameters). ParamHomes implements both (param_homes.h has the contracts' details).
#pragma once

#include <deque>

#include "offload/tier_manager.h"
#include "zero/module_table.h"
#include "zoe/status.h"

namespace zoe::zero {

class PartitionSource {
 public:
  // Whether any module is partitioned (stage 3).
  virtual bool has_partitions() const = 0;
  // A persistent module's full compute parameters on the device.
  virtual void* persistent_params(ModuleId m) = 0;
  // Runs module m's owed gather of its updated partition, if any (at its fetch).
  virtual Status settle(ModuleId m) = 0;
  // Module m's partition, its latest bytes, into `dst` (device memory); pins nothing. Any thread.
  virtual Status read_partition(ModuleId m, void* dst) = 0;
  // Module m's partition pinned on the device until unpin_partition(m) (the wait adds to *t_io).
  virtual Result<void*> pin_partition(ModuleId m, double* t_io) = 0;
  virtual void unpin_partition(ModuleId m) = 0;
  // Starts moving module m's partition towards the device (a hint).
  virtual void prefetch_partition(ModuleId m) = 0;
  // The first iteration's fetch order is complete.
  virtual void end_trace() = 0;

 protected:
  ~PartitionSource() = default;
};

// The NVMe write-backs of updated partitions an update keeps in flight (at most kMax; the tier
// manager's host budget bounds the memory they hold). Owned by whoever runs the update.
class WritebackQueue {
 public:
  static constexpr size_t kMax = 4;
  // Adds h, first waiting for the oldest when kMax are in flight (the wait adds to *t_io).
  void push(offload::MoveHandle h, double* t_io);
  // Waits for all. A failure keeps its dirty copy: the tier manager's drain() reports it.
  void wait_all();

 private:
  std::deque<offload::MoveHandle> q_;
};

class UpdateTarget {
 public:
  // Where the compute parameters of module m's owned range are written after the update (pinned
  // until release_owned(m)); t_io: the running thread's stall clock. May run on the overlapped
  // update's thread, as may the next two.
  virtual Result<void*> owned_compute(ModuleId m, double* t_io) = 0;
  // Whether owned_compute(m) is device memory (else host memory).
  virtual bool owned_on_device(ModuleId m) const = 0;
  // Gives the updated range back (written home through `wb` where it lives on NVMe).
  virtual void release_owned(ModuleId m, double* t_io, WritebackQueue* wb) = 0;
  // Stage 1/2: all-gathers module m's updated partition into its full copy, now ...
  virtual Status gather_updated(ModuleId m) = 0;
  // ... or owed until its next fetch or the next sync point (behind an overlapped update).
  virtual void owe_gathers() = 0;
  virtual Status settle_all() = 0;
  // A frozen module's fp32 values (its owned range).
  virtual Status read_owned_f32(ModuleId m, float* out) = 0;
  // Elements [begin, begin + n) of module m's owned range in the compute dtype (a master stored in
  // the compute copy: Placement::master_in_compute). Between steps.
  virtual Status read_owned(ModuleId m, size_t begin, size_t n, void* dst) = 0;
  // Waits for every partition move in flight; the first error.
  virtual Status drain() = 0;

 protected:
  ~UpdateTarget() = default;
};

}  // namespace zoe::zero
