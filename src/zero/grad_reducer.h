// Gradient reduction: the per-micro-batch gradient buffer of a module, its reduction over the
// ranks (reduce-scatter at stage 2/3, all-reduce at 0/1, in reduce_bucket_size buckets), and the
// hand-over of this rank's reduced range to the sums over the micro-batches through a GradSink
// (the Updater, which keeps the sums with the optimizer states), which computes the norm of the
// sums in the same pass.
//
// Device memory: the reduction runs in place in the module's gradient buffer (the collectives
// allow it), so beside that buffer it needs nothing, or, at stage 2/3 with buckets smaller than a
// partition, two bucket-packed send buffers (kReducePackBuffers, reduce_bucket_size elements at
// most each). At world size 1 nothing is reduced: reduce(m) accumulates straight from the buffer.
// A module's gradient buffer lives until its reduction has been accumulated, and grads() of the
// next module waits for that first, so one module's gradients are on the device at a time.
//
// Contract: grads(m) gives a zeroed device buffer valid until reduce(m); reduce(m) takes it over
// and returns at once (the reduction runs on the communicator's stream); the reduction's buffers
// are DeviceBuffers owned by its Pending entry until it has been accumulated (at the latest in
// the next grads() or step()), so no error path leaks them. Caller's thread only.
#pragma once

#include <deque>
#include <vector>

#include "comm/communicator.h"
#include "optim/adam.h"
#include "zero/grad_sink.h"
#include "zero/part_resources.h"
#include "zero/placement.h"  // kMaxPendingReductions, kReducePackBuffers
#include "zero/step_clock.h"

namespace zoe::zero {

class GradReducer {
 public:
  struct Resources {
    DeviceMemory* mem = nullptr;
    DeviceOps* ops = nullptr;             // the caller's
    comm::Communicator* dcomm = nullptr;  // device buffers: the reductions
    size_t reduce_bucket = 1;             // elements per bucket (reduce_bucket_size as planned)
    int64_t micro_batches = 1;            // gradient_accumulation_steps
  };
  GradReducer(const RunShape& shape, const ModuleTable& modules, GradSink& sink, StepClock& clock,
              const Resources& r);

  // grads() and reduce() refuse a frozen module (kInvalidArgument naming it; nothing changes).
  Result<ModuleParams> grads(ModuleId m);
  // has_grad (one flag per parameter, or null for all): the parameters that got a gradient in
  // this micro-batch; the others' part of the buffer is zero and does not count as one.
  Status reduce(ModuleId m, const std::vector<uint8_t>* has_grad = nullptr);
  // Per parameter of module m: 1 when no micro-batch of this step gave it a gradient on this
  // rank (a module no micro-batch reduced: all of them).
  std::vector<uint8_t> untouched(ModuleId m) const;
  // A hash of the modules reduced since the last step, in order: every rank must reduce the same
  // ones in the same order (the reductions are collectives, matched by order).
  uint32_t sequence_hash() const { return seq_hash_; }
  // Accumulates finished reductions (all: waits for each) until at most `keep` are in flight.
  Status complete(bool all, size_t keep = 0);
  // Whether a step is in progress: a gradient buffer was handed out or a micro-batch reduced since
  // the last step.
  bool in_step() const {
    for (size_t i = 0; i < acc_count_.size(); ++i)
      if (acc_count_[i] > 0 || grad_buf_[i]) return true;
    return !pending_.empty();
  }
  // Whether module m has a gradient buffer that was not reduced.
  bool unreduced(ModuleId m) const { return static_cast<bool>(grad_buf_[m.index]); }
  // The step's norm: this rank's sum of squares over its owned ranges (modules no micro-batch
  // reduced get zero gradients first), added in one fixed order.
  Result<optim::NormResult> local_norm();
  // After the step: the next reduction overwrites the accumulators.
  void end_step();
  // A checkpoint was loaded: gradients of a step in progress are not part of it.
  void forget_accumulated() {
    std::fill(acc_count_.begin(), acc_count_.end(), 0);
    for (auto& g : got_grad_) g.clear();
    seq_hash_ = 0;
  }
  // Waits for the reductions in flight (no accumulation) and frees device memory.
  void shutdown();

 private:
  // A reduction in flight: its buffers live until it has been accumulated.
  struct Pending {
    ModuleId m{0};
    comm::CommHandle h;
    device::DeviceBuffer grads;                     // the module's gradient buffer, reduced in place
    device::DeviceBuffer pack[kReducePackBuffers];  // bucket-packed sends (stage 2/3, small buckets)
    size_t offset = 0;                              // first element of this rank's range in grads
  };
  Status refuse_frozen(const char* what, ModuleId m) const;
  Status accumulate(ModuleId m, const void* src);
  Status reduce_scatter_buckets(ModuleId m, size_t per_rank, Pending* p);
  Status start_reduction(ModuleId m, Pending* p);
  bool last_micro_batch(ModuleId m) const;

  const RunShape& shape_;
  const ModuleTable& modules_;
  GradSink& sink_;
  StepClock& clock_;
  Resources r_;
  std::vector<device::DeviceBuffer> grad_buf_;  // per module: padded elements, compute dtype
  std::vector<int> acc_count_;                  // micro-batch reductions accumulated since the last step
  // Per module and parameter: a micro-batch reduced since the last step gave it a gradient
  // (empty: none reduced yet).
  std::vector<std::vector<uint8_t>> got_grad_;
  uint32_t seq_hash_ = 0;  // sequence_hash()
  // Sum of squares of the accumulated gradients per optim::kChunkElems chunk of the owned range,
  // computed by the pass that accumulates them (the step makes no norm pass).
  std::vector<std::vector<double>> norm_parts_;
  std::deque<Pending> pending_;
};

}  // namespace zoe::zero
