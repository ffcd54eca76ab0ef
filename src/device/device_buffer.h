// DeviceBuffer: one allocation of device memory, owned. Freed when the buffer is destroyed or
// reset, so no error path can leak device memory or forget to give its bytes back to the budget.
#pragma once

#include <cstddef>
#include <utility>

#include "device/device.h"

namespace zoe::device {

// Move-only. The Device must outlive every buffer it allocated. Not thread-safe (like a
// unique_ptr): one owner at a time; the memory itself may be used from any stream.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Allocates `bytes` (> 0) under the device's budget; the allocation's errors as they are.
  static Result<DeviceBuffer> allocate(Device& dev, size_t bytes) {
    auto p = dev.allocate(bytes);
    if (!p.is_ok()) return p.status();
    return DeviceBuffer(&dev, p.value(), bytes);
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : dev_(o.dev_), ptr_(o.ptr_), bytes_(o.bytes_) { o.release(); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      dev_ = o.dev_;
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.release();
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Frees the memory now (a no-op when empty). No queued work may still use it.
  void reset() {
    if (ptr_) dev_->free(ptr_);
    release();
  }
  void* get() const { return ptr_; }
  char* bytes_ptr() const { return static_cast<char*>(ptr_); }
  size_t size() const { return bytes_; }
  explicit operator bool() const { return ptr_ != nullptr; }

 private:
  DeviceBuffer(Device* dev, void* p, size_t bytes) : dev_(dev), ptr_(p), bytes_(bytes) {}
  void release() {
    dev_ = nullptr;
    ptr_ = nullptr;
    bytes_ = 0;
  }
  Device* dev_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace zoe::device
