// GradSink: what the gradient reduction hands the update, and nothing else. GradReducer owns the
// per-micro-batch buffers and their reduction over the ranks; the sums over the micro-batches
// live with the optimizer states (wherever the Updater keeps them: device, host RAM or NVMe), so
// the reducer hands each reduced range over through this interface instead of reaching into the
// Updater's states or its swapper.
#pragma once

#include <cstdint>
#include <vector>

#include "zero/module_table.h"
#include "zoe/status.h"

namespace zoe::zero {

// One micro-batch's reduced gradients of a module's owned range, handed to add_grads().
struct GradBatch {
  const void* src = nullptr;  // opt_n elements, compute dtype, device memory (valid during the call)
  bool first = false;         // the step's first micro-batch for this module: the sums start here
  bool last = false;          // the step's last micro-batch: the sums are final after this one
  // With `last`: per parameter, 1 when no micro-batch of the step gave it a gradient on this rank.
  const std::vector<uint8_t>* untouched = nullptr;
  // Out: the sum of squares of the new sums, per optim::kChunkElems chunk of the owned range.
  double* norm = nullptr;
};

class GradSink {
 public:
  // Adds b's gradients to module m's sums (first: replaces them), computing their norm in the
  // same pass. Caller's thread; waits for an overlapped update that still reads the sums.
  virtual Status add_grads(ModuleId m, const GradBatch& b) = 0;
  // Module m got no gradient in this step: its sums are zero.
  virtual Status zero_grads(ModuleId m) = 0;

 protected:
  ~GradSink() = default;
};

}  // namespace zoe::zero
