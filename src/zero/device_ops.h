// DeviceOps: the copies and kernels the engine runs on its device's memory, in order on one
// stream that the device created for them (the Device owns every stream).
//
// Asynchronous, as a stream is: every op is enqueued in order and may still be running (CUDA) or
// not yet started (the CPU ops' deferred mode, below) when it returns. synchronize() waits for
// every op enqueued so far and returns the first error any of them met. So, for a caller:
//   * host memory handed to an op (to_device's source, to_host's destination, accumulate_with_norm's
//     partials) must stay valid and must not be read or written by anyone else until synchronize();
//   * device memory an op reads or writes must not be touched by any other agent (host code on a
//     host-addressable device, a tier move, a collective on another stream, the other thread's ops,
//     a free) until synchronize(); and the engine's callers must have synchronized their own work on
//     parameters and gradients before they hand them back (release, reduce_grads);
//   * ops see each other's results in the order they were enqueued (one stream).
// An error returned by an op itself is a bad argument found before enqueueing. Every public Engine
// call returns with its ops synchronized, so nothing here is visible outside the engine. OpsFence
// synchronizes on every exit path of a scope (its host buffers die with the scope).
//
// Backends: CpuDevice memory is host memory, so the CPU ops are memcpy/memset and optim's
// kernels on the engine's thread pool, working on device pointers directly (host_addressable()).
// They run as they are called, or, in the deferred mode (set_deferred_device_ops, a test hook),
// only at synchronize(): a hand-off the engine forgot to synchronize then reads stale bytes, so the
// CPU tests check the engine against this contract bit for bit, GPU or not. The CUDA ops (built
// with CUDA) are cudaMemcpyAsync/cudaMemsetAsync and the kernels of optim/adam_cuda.h on the ops'
// stream; accumulate_with_norm waits for its stream (its sum is needed on the host), the others
// only enqueue.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>

#include "core/dtype.h"
#include "device/device.h"
#include "optim/adam.h"
#include "optim/lion_adagrad.h"
#include "zoe/status.h"

namespace zoe::zero {

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  // True when device memory is host memory (host code may read and write it directly).
  virtual bool host_addressable() const = 0;
  virtual Status zero(void* dev, size_t bytes) = 0;
  virtual Status to_device(void* dev, const void* host, size_t bytes) = 0;
  virtual Status to_host(void* host, const void* dev, size_t bytes) = 0;
  virtual Status copy(void* dst_dev, const void* src_dev, size_t bytes) = 0;
  // acc (+)= float(g) over n elements of device memory, as optim::accumulate_with_norm; the sums
  // of squares go to partials[0, optim::norm_chunks(n)) (the CUDA ops put the whole sum in
  // partials[0] and zeros after it: only the total is used).
  virtual Status accumulate_with_norm(float* acc, const void* g, DType g_dtype, size_t n, bool first,
                                      double* partials) = 0;
  // optim::adam_step over buffers in device memory (param_out too, when set).
  virtual Status adam_step(const optim::AdamArgs& args) = 0;
  // optim::lion_step / optim::adagrad_step over buffers in device memory: CPU kernels, so only on a
  // host-addressable device (the others refuse; the Updater refuses their states on such a device).
  virtual Status lion_step(const optim::LionArgs& args);
  virtual Status adagrad_step(const optim::AdagradArgs& args);
  // Waits for every op enqueued so far; the first error any of them met since the last call.
  virtual Status synchronize() = 0;
  // Makes the ops' device current on the calling thread (CUDA: its ordinal, which a new thread
  // does not have), so that thread's allocations and ops land on it. The CPU ops need nothing.
  virtual Status bind_thread() { return Status::ok(); }

  // dst <- src, each in device memory or host memory as flagged. Host to host is a memcpy now,
  // outside the stream (as on CUDA, where the ops' kernels touch no host memory); a copy that
  // touches device memory is enqueued.
  Status put(void* dst, bool dst_dev, const void* src, bool src_dev, size_t bytes) {
    if (bytes == 0) return Status::ok();
    if (!dst_dev && !src_dev) {
      memcpy(dst, src, bytes);
      return Status::ok();
    }
    if (host_addressable() || (dst_dev && src_dev)) return copy(dst, src, bytes);
    return dst_dev ? to_device(dst, src, bytes) : to_host(dst, src, bytes);
  }
};

// Synchronizes `ops` when the scope ends, whatever the exit path (an error return included), so no
// op outlives the host buffers of the scope. wait() is the normal exit's synchronize, with its
// status. Declare it after the buffers it protects (it is destroyed first).
class OpsFence {
 public:
  explicit OpsFence(DeviceOps& ops) : ops_(&ops) {}
  OpsFence(const OpsFence&) = delete;
  OpsFence& operator=(const OpsFence&) = delete;
  ~OpsFence() {
    if (ops_ != nullptr) (void)ops_->synchronize();
  }
  Status wait() {
    DeviceOps* o = ops_;
    ops_ = nullptr;
    return o->synchronize();
  }

 private:
  DeviceOps* ops_;
};

// deferred: every op runs only at synchronize() (set_deferred_device_ops's test mode).
std::unique_ptr<DeviceOps> make_cpu_ops(optim::CpuPool* pool, bool deferred = false);
// On CUDA device `ordinal`, on a stream created by `dev` (the engine's CudaDevice for that
// ordinal, which must outlive the ops). kUnsupported without CUDA.
Result<std::unique_ptr<DeviceOps>> make_cuda_ops(device::Device& dev, int ordinal);

}  // namespace zoe::zero
