// Parameter gathering: fetch/release of a module's compute parameters, and at stage 3 the gathers
// of partitions from their tier, queued ahead of use in the recorded fetch order.
//
// Contract: fetch(m) returns module m's full parameters on the device, valid until release(m).
// A persistent module's are its home copy (ParamHomes). A partitioned one's are gathered into a
// buffer of this part's, except where the gathered bytes are the partition's own (world size 1):
// then fetch() serves the partition in place, pinned in the tier manager's device share until
// release(), and no gathered copy is made (prefetch moves those partitions towards the device
// instead of queueing gathers). The views are read-only either way. The first iteration records the fetch
// order; afterwards each fetch queues the gathers of the next modules (within the gather window and
// stage3_max_live_parameters) and moves partitions further ahead towards the device
// (stage3_prefetch_bucket_size). Every rank queues the same gathers in the same order, so the
// collectives line up. Behind an overlapped step a module is fetched only once its update is
// done (UpdateGate). Device memory of a fetch is owned by DeviceBuffers: an error at any point
// gives it back. Caller's thread only (a queued gather's host task runs on the communicator's
// thread and touches only that module's gather slot).
#pragma once

#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "core/trace.h"
#include "zero/home_views.h"
#include "zero/part_resources.h"
#include "zero/step_clock.h"
#include "zero/update_gate.h"

namespace zoe::zero {

class ParamGather {
 public:
  struct Resources {
    DeviceMemory* mem = nullptr;
    comm::Communicator* dcomm = nullptr;  // device buffers: the gathers
    TraceRecorder* trace = nullptr;
    // Elements of gathered modules prefetch may queue ahead of use (the placement's gather
    // window), and at most alive at once (stage3_max_live_parameters, as planned).
    size_t window = 0;
    size_t max_live = 0;
    int64_t prefetch_bucket = 0;  // zero_optimization.stage3_prefetch_bucket_size
    // Partition bytes modules served in place may hold pinned at once (Placement::in_place_pins).
    uint64_t in_place_pins = 0;
  };
  ParamGather(const RunShape& shape, const ModuleTable& modules, PartitionSource& homes,
              const UpdateGate& gate, StepClock& clock, const Resources& r)
      : shape_(shape), modules_(modules), homes_(homes), gate_(gate), clock_(clock), r_(r) {
    slots_.resize(modules.size());
  }

  // Frees device memory when a queued gather finds none (the engine completes the reductions
  // in flight); a gather that still finds none is an error. A rank that skipped a gather the
  // others run would fall out of step, so there is no skipping.
  using MakeRoom = std::function<Status()>;
  // Module m's parameters on the device.
  Result<ModuleParams> fetch(ModuleId m, const MakeRoom& make_room);
  Status release(ModuleId m);

  // Whether module m is fetched and partitioned (it may not be stepped or saved then).
  bool in_use(ModuleId m) const { return slots_[m.index].fetched && modules_[m].partitioned_params; }
  // Whether any module is fetched and not released.
  bool any_fetched() const {
    for (const Slot& s : slots_)
      if (s.fetched) return true;
    return false;
  }
  // Drops every queued gather (the fetch order changed, or the parameters are about to).
  Status discard();
  // The first step: the recorded order is complete.
  void end_recording();
  // Waits for queued gathers (no accumulation) and frees device memory.
  void shutdown();

 private:
  struct Slot {
    device::DeviceBuffer full;  // the gathered parameters (partitioned modules)
    void* pinned = nullptr;     // served in place: the partition, pinned until release()
    bool fetched = false;
    bool hinted = false;  // served in place: prefetch started its move since its last fetch
    // A gather queued ahead of fetch() (prefetch), into `full` from `send`.
    bool pending = false;
    comm::CommHandle handle;
    device::DeviceBuffer send;  // this rank's partition, copied for the gather
    Status error;               // set on the communicator's thread if the partition could not be read
    uint64_t begin_ns = 0;      // when the queued gather was started (for the timeline)
  };
  Status gather_now(ModuleId m);
  Status serve_in_place(ModuleId m);
  Status copy_now(ModuleId m);
  // Whether module m's gathered bytes are its partition's own (a gather would copy them).
  bool in_place(ModuleId m) const { return modules_[m].part == modules_[m].padded; }
  Status prefetch_after(ModuleId m, const MakeRoom& make_room);
  Status queue_gathers(const MakeRoom& make_room);
  Status start(ModuleId m);
  Status finish(ModuleId m);
  Status follow_order(ModuleId m);
  void prefetch_moves(ModuleId m);

  const RunShape& shape_;
  const ModuleTable& modules_;
  PartitionSource& homes_;
  const UpdateGate& gate_;
  StepClock& clock_;
  Resources r_;
  std::vector<Slot> slots_;
  std::vector<ModuleId> order_;  // fetch order recorded in the first iteration
  bool recording_ = true;
  size_t cursor_ = 0;
  size_t live_elems_ = 0;
  uint64_t pinned_bytes_ = 0;  // partitions served in place, pinned now
};

}  // namespace zoe::zero
