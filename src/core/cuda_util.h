// CUDA runtime helpers shared by the translation units that call CUDA (include only where
// ZOE_HAVE_CUDA; this header includes cuda_runtime_api.h): runtime errors as Status values, and
// a scope that makes one GPU current.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "zoe/status.h"

namespace zoe {

// "cudaMemcpyAsync: cudaErrorInvalidValue (invalid argument)". Out of memory is kOutOfBudget, no
// device or an old driver kUnsupported, the rest kIoError. Clears the thread's last error, so that
// a later unrelated check does not report it again (sticky errors stay, as CUDA keeps them).
inline Status cuda_error(const char* call, cudaError_t err) {
  (void)cudaGetLastError();
  StatusCode code = StatusCode::kIoError;
  if (err == cudaErrorMemoryAllocation) code = StatusCode::kOutOfBudget;
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) code = StatusCode::kUnsupported;
  return Status(code,
                std::string(call) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

// Makes `ordinal` the calling thread's current device for a scope, restoring the previous one.
class CurrentDevice {
 public:
  explicit CurrentDevice(int ordinal) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (prev_ != ordinal) changed_ = cudaSetDevice(ordinal) == cudaSuccess;
  }
  ~CurrentDevice() {
    if (changed_ && prev_ >= 0) (void)cudaSetDevice(prev_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int prev_ = -1;
  bool changed_ = false;
};

}  // namespace zoe

// Returns the CUDA error of `call` as a Status from the enclosing function.
#define ZOE_CUDA_TRY(call)                                                            \
  do {                                                                                \
    cudaError_t zoe_cuda_err_ = (call);                                               \
    if (zoe_cuda_err_ != cudaSuccess) return ::zoe::cuda_error(#call, zoe_cuda_err_); \
  } while (0)
