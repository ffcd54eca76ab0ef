// Aligned host buffers for O_DIRECT, optionally pinned (mlock, or the device layer's pinner:
// cudaHostRegister once a CUDA device exists; io/ itself never calls a device API).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "zoe/status.h"

namespace zoe::io {

enum class PinMode : uint8_t {
  kNone,    // pageable memory
  kLock,    // mlock: stays resident, DMA-able by the kernel without faults
  kDevice,  // pinned by the process's HostPinner (core/host_pinner.h: CUDA) when set, else mlock
};

// One 4 KiB-aligned allocation. Sizes of 2 MiB and more are mmap'ed 2 MiB-aligned with
// MADV_HUGEPAGE so that large O_DIRECT transfers hit physically contiguous memory (fewer
// segments per block request). Not thread-safe; move-only.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  // Fails with a message that explains RLIMIT_MEMLOCK when pinning is refused.
  static Result<AlignedBuffer> allocate(size_t bytes, PinMode pin = PinMode::kNone);

  void* data() const { return data_; }
  char* bytes() const { return static_cast<char*>(data_); }
  size_t size() const { return size_; }
  PinMode pinned() const { return pinned_; }

 private:
  void release();

  void* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;  // bytes mmap'ed (0 when from aligned_alloc)
  PinMode pinned_ = PinMode::kNone;
};

// Fixed-size buffers carved from one allocation, handed out and returned. acquire() blocks
// until a buffer is free; try_acquire() does not. Thread-safe.
class BufferPool {
 public:
  static Result<std::unique_ptr<BufferPool>> create(size_t buffer_bytes, size_t count, PinMode pin);

  size_t buffer_bytes() const { return buffer_bytes_; }
  size_t count() const { return count_; }
  char* buffer(size_t i) const { return storage_.bytes() + i * buffer_bytes_; }
  // The whole pool as one region, for registering with an I/O engine.
  void* base() const { return storage_.data(); }
  size_t total_bytes() const { return storage_.size(); }

  char* acquire();
  char* try_acquire();
  void release(char* buf);
  size_t free_count();

 private:
  BufferPool() = default;
  AlignedBuffer storage_;
  size_t buffer_bytes_ = 0;
  size_t count_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char*> free_;
};

}  // namespace zoe::io
