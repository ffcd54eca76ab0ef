// StagingPool: fixed host buffers through which NVMe <-> device transfers travel in pieces, plus
// one more reserved for the synchronous transfers of TierManager::read()/write(), so that those
// never wait for a buffer that a move holds (a move's completion may need the caller's lock).
//
// Thread-safe. Its locks are leaves: a job is run after the pool's lock is released.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "io/buffer.h"
#include "zoe/status.h"

namespace zoe::offload {

class StagingPool {
 public:
  // `count` shared buffers of `bytes` (a positive multiple of 4096) and the synchronous one.
  static Result<std::unique_ptr<StagingPool>> create(size_t bytes, size_t count, io::PinMode pin);

  size_t buffer_bytes() const { return pool_->buffer_bytes(); }
  // All count + 1 buffers as one region, for registering with an I/O engine.
  void* base() const { return pool_->base(); }
  size_t total_bytes() const { return pool_->total_bytes(); }

  // Runs job with a free shared buffer: now, on this thread, when one is free; otherwise later,
  // in FIFO order, on the thread whose release() frees one. The job owns the buffer until it
  // (or what it starts) calls release().
  void with_buffer(std::function<void(char*)> job);
  // Gives a shared buffer back; may run the next waiting job on this thread.
  void release(char* buf);

  // The synchronous buffer, held by one caller at a time for as long as the lease lives.
  struct SyncLease {
    std::unique_lock<std::mutex> lock;
    char* data = nullptr;
  };
  SyncLease lease_sync_buffer();

 private:
  StagingPool() = default;

  std::unique_ptr<io::BufferPool> pool_;
  std::mutex mu_;  // guards free_ and wait_
  std::vector<char*> free_;
  std::deque<std::function<void(char*)>> wait_;
  std::mutex sync_mu_;  // held by the sync buffer's lease
  char* sync_ = nullptr;
};

}  // namespace zoe::offload
