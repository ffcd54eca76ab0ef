// HostPinner: how host memory is pinned for a device's DMA (CUDA: cudaHostRegister). The device
// layer implements it; io's buffers use it for PinMode::kDevice, so io/ never calls a device API.
#pragma once

#include <cstddef>

#include "zoe/status.h"

namespace zoe {

class HostPinner {
 public:
  virtual ~HostPinner() = default;
  // Pins [p, p + bytes) for the device's copies. Thread-safe.
  virtual Status pin(void* p, size_t bytes) = 0;
  // Undoes pin(p, ...). Thread-safe.
  virtual void unpin(void* p) = 0;
};

// The process's device pinner: set by the device layer when it creates a device that pins host
// memory (a CUDA device); nullptr until then (buffers asking for PinMode::kDevice are then
// mlock'ed). The pinner must live until the process ends. Thread-safe.
void set_host_pinner(HostPinner* p);
HostPinner* host_pinner();

}  // namespace zoe
