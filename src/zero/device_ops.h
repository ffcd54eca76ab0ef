// DeviceOps: the copies and kernels the engine runs on its device's memory.
//
// CpuDevice memory is host memory: the CPU ops are memcpy/memset and optim's kernels on the
// engine's thread pool, working on device pointers directly (host_addressable()). The CUDA ops
// (built with CUDA) use cudaMemcpy/cudaMemset and the kernels of optim/adam_cuda.h on one
// stream that the device created for them (the Device owns every stream); every call returns
// when its work is done, so the engine needs no events. The engine's callers must have finished
// (synchronized) their own work on parameters and gradients before they hand them back (release,
// reduce_grads).
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>

#include "core/dtype.h"
#include "device/device.h"
#include "optim/adam.h"
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

  // dst <- src, each in device memory or host memory as flagged.
  Status put(void* dst, bool dst_dev, const void* src, bool src_dev, size_t bytes) {
    if (bytes == 0) return Status::ok();
    if (host_addressable() || (!dst_dev && !src_dev)) {
      memcpy(dst, src, bytes);
      return Status::ok();
    }
    if (dst_dev && src_dev) return copy(dst, src, bytes);
    return dst_dev ? to_device(dst, src, bytes) : to_host(dst, src, bytes);
  }
};

std::unique_ptr<DeviceOps> make_cpu_ops(optim::CpuPool* pool);
// On CUDA device `ordinal`, on a stream created by `dev` (the engine's CudaDevice for that
// ordinal, which must outlive the ops). kUnsupported without CUDA.
Result<std::unique_ptr<DeviceOps>> make_cuda_ops(device::Device& dev, int ordinal);

}  // namespace zoe::zero
