// Device / Stream / Event: the accelerator abstraction the tier manager moves bytes through.
//
// A Device owns "device memory" under a hard byte budget, creates Streams (in-order queues of
// asynchronous copies and host callbacks) and Events (points in a stream that others can wait
// for). CpuDevice is host RAM posing as HBM with worker-thread streams; it is a real backend
// (CPU training runs on it) and the one every test uses. CudaDevice is built when CUDA is found.
//
// Lifetimes: a Device must outlive the Streams it created (destroying a Device with live
// Streams is a programming error and aborts). Events may be destroyed at any time after the
// streams that recorded or wait on them have run past those points.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "zoe/status.h"

namespace zoe::device {

enum class DeviceKind : uint8_t { kCpu, kCuda };

// A point in a stream. Create with Device::create_event; record with Stream::record. Recording
// again moves the event to the new point: query/synchronize/wait_event then refer to the latest
// record made before the call (CUDA semantics). Thread-safe.
class Event {
 public:
  virtual ~Event() = default;
  // True when all work recorded before this event has finished (or nothing was recorded).
  // Never blocks. A device error reported while polling yields true, so pollers move on to
  // synchronize(), which returns the error.
  virtual bool query() = 0;
  // Blocks until query() would be true; fails when the device reported an error.
  virtual Status synchronize() = 0;
};

// In-order queue of work. Methods are thread-safe; work runs in the order it was enqueued
// (from one thread; across threads, in the order the calls returned).
// Pointers handed to copies must stay valid until the stream has run the copy. Copies of 0 bytes
// are no-ops. Host memory should be pinned (io::PinMode::kDevice) for copies to be asynchronous
// on CUDA: with pageable memory the call may wait until the stream reaches the copy, so never
// enqueue a pageable copy behind a host function that waits for the caller. Errors of enqueued work (a failed
// copy, an exception escaping a host function) surface at the next synchronize() of this stream.
class Stream {
 public:
  virtual ~Stream() = default;  // waits for queued work, then releases the stream
  // dst must lie inside one live allocation of this stream's device (CpuDevice checks this and
  // fails with kInvalidArgument; CUDA reports invalid pointers at enqueue or at synchronize()).
  virtual Status copy_h2d(void* dst_device, const void* src_host, size_t bytes) = 0;
  virtual Status copy_d2h(void* dst_host, const void* src_device, size_t bytes) = 0;
  virtual Status copy_d2d(void* dst_device, const void* src_device, size_t bytes) = 0;
  // Runs fn on a host thread once all earlier work on this stream is done; later work waits for
  // fn to return. fn must not block on this stream (CUDA: cudaLaunchHostFunc rules: no CUDA
  // calls inside fn). An exception escaping fn is caught and returned by synchronize().
  virtual Status enqueue_host(std::function<void()> fn) = 0;
  // Marks the current end of this stream in e. e must come from the same kind of device
  // (kInvalidArgument otherwise).
  virtual Status record(Event& e) = 0;
  // Work enqueued on this stream after this call starts only after e completes (as recorded at
  // the time of this call; a never-recorded event is complete). Does not block the caller.
  virtual Status wait_event(Event& e) = 0;
  // Blocks until all work enqueued before the call has finished; returns (and clears) the first
  // error of that work.
  virtual Status synchronize() = 0;
  // Optional (default nullptr): the backend's own handle of this stream (CUDA: its cudaStream_t),
  // for kernels, collectives and copies that other layers enqueue on it without creating streams
  // of their own (the Device is the one owner of streams). Valid as long as this Stream.
  virtual void* native_handle() const { return nullptr; }
};

class Device {
 public:
  virtual ~Device() = default;  // memory still allocated is released, with a warning
  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;

  // Device memory under the budget. allocate() never overshoots: when the bytes would exceed
  // the budget it fails with kOutOfBudget naming the tier ("device"), the bytes requested, in
  // use and the budget. The budget counts the bytes requested (not the backend's rounding).
  // A backend whose real memory runs out below the budget also fails with kOutOfBudget.
  // allocate(0) fails with kInvalidArgument. Thread-safe. Alignment: at least 256 bytes
  // (CpuDevice: 4096, so device memory can take O_DIRECT I/O). The memory is usable from every
  // stream of the device as soon as allocate() returns.
  virtual Result<void*> allocate(size_t bytes) = 0;
  // Returns p's bytes to the budget at once. No queued work may still use p (synchronize the
  // streams that touch it first, or use free_after). free(nullptr) is a no-op; freeing a pointer
  // this device did not allocate aborts. Thread-safe.
  virtual void free(void* p) = 0;
  // Optional (default: s.synchronize(), then free(p)). Frees p once the work enqueued on s so
  // far has finished, without blocking the caller; p's bytes return to the budget at that point,
  // so used_bytes() stays an upper bound of the memory in use. p must not be used by work
  // enqueued on any stream after this call. s must be a stream of this device.
  virtual Status free_after(Stream& s, void* p) {
    ZOE_RETURN_IF_ERROR(s.synchronize());
    free(p);
    return Status::ok();
  }
  virtual uint64_t budget_bytes() const = 0;
  // Bytes allocated and backed by memory: 0 while suspended.
  virtual uint64_t used_bytes() const = 0;
  virtual uint64_t high_water_bytes() const = 0;

  // Suspension (the engine's sleep()): the memory behind every live allocation goes back to the
  // system while each allocation keeps its address, so the pointers other layers hold stay valid
  // across suspend()/resume(). Its bytes are lost: the caller copies them out first (from
  // live_allocations()) and back after resume(). While suspended, used_bytes() is 0, allocate()
  // fails with kInvalidArgument, and no stream may touch device memory; free() still works.
  // suspend() needs every stream of the device idle. Backends that cannot keep addresses refuse
  // with kUnsupported (the default). Not thread-safe against allocate()/free() on other threads.
  virtual std::vector<std::pair<void*, uint64_t>> live_allocations() const { return {}; }
  virtual Status suspend() {
    return unsupported("%s device: suspend() is not supported (it cannot keep addresses)", name().c_str());
  }
  virtual Status resume() { return unsupported("%s device: resume() is not supported", name().c_str()); }

  virtual Result<std::unique_ptr<Stream>> create_stream() = 0;
  virtual Result<std::unique_ptr<Event>> create_event() = 0;

  // Synchronous helpers for tests and setup (on an internal stream). Not ordered with respect
  // to the device's other streams: synchronize those first.
  virtual Status copy_to_device(void* dst_device, const void* src_host, size_t bytes) = 0;
  virtual Status copy_to_host(void* dst_host, const void* src_device, size_t bytes) = 0;
};

// Fault injection for tests of error paths: when set, every CpuDevice::allocate() first asks
// fail(bytes); true makes it fail with kOutOfBudget ("injected allocation failure"). Process-wide;
// pass an empty function to clear. Thread-safe.
void set_cpu_allocation_fault(std::function<bool(size_t bytes)> fail);
// Bytes CpuDevices of this process still held when destroyed (memory nobody freed): a leak.
uint64_t cpu_device_leaked_bytes();

// Host RAM posing as device memory under a hard budget; streams run on worker threads (one per
// stream). kInvalidArgument when budget_bytes is 0.
Result<std::unique_ptr<Device>> create_cpu_device(uint64_t budget_bytes);
// GPU `ordinal` with a stream-ordered pool (cudaMallocAsync) under the same budget rule. Fails
// with kUnsupported when zoe was built without CUDA or no GPU is present (the message carries the
// runtime's reason), kInvalidArgument for an ordinal out of range or a budget of 0.
Result<std::unique_ptr<Device>> create_cuda_device(int ordinal, uint64_t budget_bytes);
// Number of CUDA devices, 0 when none or not built (the reason in *why when non-null).
int cuda_device_count(std::string* why = nullptr);

}  // namespace zoe::device
