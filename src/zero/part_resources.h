// What the engine's parts are handed besides their own state: the run's shape (fixed at creation)
// and the memory they allocate from. The engine (Engine::Impl, engine_context.h) owns every
// resource; each part receives only the handles it uses, in its constructor (see each part's
// Resources), so a part can be built and tested alone.
#pragma once

#include <cstddef>
#include <vector>

#include "core/dtype.h"
#include "device/device.h"
#include "device/device_buffer.h"
#include "io/buffer.h"
#include "zero/device_ops.h"
#include "zero/module_table.h"
#include "zoe/status.h"
#include "zoe/tensor.h"

namespace zoe::zero {

// The run's shape: this rank, the job's size, the ZeRO stage and the compute dtype.
struct RunShape {
  int rank = 0, world = 1, stage = 0;
  DType cdt = DType::kF32;
  size_t esize() const { return dtype_size(cdt); }
};

// Zeroed device memory within the device's budget (zoe.device_budget), and per-parameter views
// of a module's flat buffer. Caller's thread only (it zeroes through the caller's ops).
class DeviceMemory {
 public:
  DeviceMemory(device::Device& dev, DeviceOps& ops, DType cdt) : dev_(dev), ops_(ops), cdt_(cdt) {}
  // Zeroed device memory; out of budget names the keys that change it.
  Result<device::DeviceBuffer> zeroed(size_t bytes);
  // Per-parameter views of module `mod`'s flat buffer (compute dtype) at `flat`.
  ModuleParams views(const ModuleLayout& mod, void* flat) const;
  device::Device& device() const { return dev_; }

 private:
  device::Device& dev_;
  DeviceOps& ops_;
  DType cdt_;
};

// Zeroed host memory kept until the arena goes (a part's host-resident states), and its total.
class HostArena {
 public:
  explicit HostArena(io::PinMode pin = io::PinMode::kNone) : pin_(pin) {}
  Result<void*> zeroed(size_t bytes);
  uint64_t bytes() const { return bytes_; }

 private:
  io::PinMode pin_;
  std::vector<io::AlignedBuffer> bufs_;
  uint64_t bytes_ = 0;
};

}  // namespace zoe::zero
