// Device / Stream / Event: the accelerator abstraction the tier manager moves bytes through.
//
// A Device owns "device memory" under a hard byte budget, creates Streams (in-order queues of
// asynchronous copies and host callbacks) and Events (points in a stream that others can wait
// for). CpuDevice is host RAM posing as HBM with worker-thread streams; it is a real backend
// (CPU training runs on it) and the one every test uses. CudaDevice is built when CUDA is found.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "zoe/status.h"

namespace zoe::device {

enum class DeviceKind : uint8_t { kCpu, kCuda };

class Event {
 public:
  virtual ~Event() = default;
  // True when all work recorded before this event has finished (or nothing was recorded).
  virtual bool query() = 0;
  // Blocks until then.
  virtual Status synchronize() = 0;
};

// In-order queue of work. Methods are thread-safe; work runs in the order it was enqueued.
// Pointers handed to copies must stay valid until the stream has run the copy.
class Stream {
 public:
  virtual ~Stream() = default;  // waits for queued work, then releases the stream
  virtual Status copy_h2d(void* dst_device, const void* src_host, size_t bytes) = 0;
  virtual Status copy_d2h(void* dst_host, const void* src_device, size_t bytes) = 0;
  virtual Status copy_d2d(void* dst_device, const void* src_device, size_t bytes) = 0;
  // Runs fn on a host thread once all earlier work on this stream is done. fn must not block on
  // this stream (CUDA: cudaLaunchHostFunc rules: no CUDA calls inside fn).
  virtual Status enqueue_host(std::function<void()> fn) = 0;
  virtual Status record(Event& e) = 0;
  // Work enqueued on this stream after this call starts only after e completes.
  virtual Status wait_event(Event& e) = 0;
  virtual Status synchronize() = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;

  // Device memory under the budget. allocate() never overshoots: when the bytes would exceed
  // the budget it fails with kOutOfBudget naming the bytes requested, in use and the budget.
  // Thread-safe. Alignment: at least 256 bytes.
  virtual Result<void*> allocate(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  virtual uint64_t budget_bytes() const = 0;
  virtual uint64_t used_bytes() const = 0;
  virtual uint64_t high_water_bytes() const = 0;

  virtual Result<std::unique_ptr<Stream>> create_stream() = 0;
  virtual Result<std::unique_ptr<Event>> create_event() = 0;

  // Synchronous helpers for tests and setup (on an internal stream).
  virtual Status copy_to_device(void* dst_device, const void* src_host, size_t bytes) = 0;
  virtual Status copy_to_host(void* dst_host, const void* src_device, size_t bytes) = 0;
};

// Host RAM posing as device memory under a hard budget; streams run on worker threads.
Result<std::unique_ptr<Device>> create_cpu_device(uint64_t budget_bytes);
// GPU `ordinal` with a stream-ordered pool (cudaMallocAsync) under the same budget rule. Fails
// with kUnsupported when zoe was built without CUDA or no GPU is present.
Result<std::unique_ptr<Device>> create_cuda_device(int ordinal, uint64_t budget_bytes);
// Number of CUDA devices, 0 when none or not built (the reason in *why when non-null).
int cuda_device_count(std::string* why = nullptr);

}  // namespace zoe::device
