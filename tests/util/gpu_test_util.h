// For the GPU tests: why no GPU can be used here (empty when one can), and a skip on that reason.
// Include only in tests built with CUDA.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>

namespace zoe::test {

inline std::string gpu_unavailable() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no usable GPU: cudaGetDeviceCount: ") + cudaGetErrorName(err) + " (" +
           cudaGetErrorString(err) + ")";
  }
  if (n == 0) return "no GPU: cudaGetDeviceCount reports 0 devices";
  return "";
}

}  // namespace zoe::test

#define ZOE_SKIP_WITHOUT_GPU()                               \
  do {                                                       \
    const std::string why_ = ::zoe::test::gpu_unavailable(); \
    if (!why_.empty()) GTEST_SKIP() << why_;                 \
  } while (0)
