// Shared helpers of the optimizer tests: SIMD paths to run, typed buffers, comparisons that
// name the first mismatching index.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/cpu.h"
#include "core/dtype.h"
#include "optim/adam.h"

namespace zoe::optim::test {

struct Path {
  const char* name;
  SimdLevel level;
  bool hw_bf16;
};
inline const std::vector<Path>& all_paths() {
  static const std::vector<Path> p = {{"scalar", SimdLevel::kScalar, false},
                                      {"avx2", SimdLevel::kAvx2, false},
                                      {"avx512", SimdLevel::kAvx512, false},
                                      {"avx512bf16", SimdLevel::kAvx512, true}};
  return p;
}
// Empty when this CPU can run the path, else why not (for GTEST_SKIP).
inline std::string path_unavailable(const Path& p) {
  if (!simd_level_supported(p.level)) return std::string(p.name) + ": CPU lacks " + simd_level_name(p.level);
  if (p.hw_bf16 && !cpu_features().avx512_bf16) return std::string(p.name) + ": CPU lacks AVX512-BF16";
  return "";
}
inline Exec exec_for(const Path& p, CpuPool* pool = nullptr, std::optional<bool> stream_out = std::nullopt) {
  Exec e;
  e.pool = pool;
  e.simd = p.level;
  e.hw_bf16 = p.hw_bf16;
  e.stream_param_out = stream_out;
  return e;
}

// n elements of `dtype` starting `offset` elements into an owned 64-byte aligned allocation
// (offset 0: aligned for every vector width and for streaming stores; offset 1: misaligned).
class Buf {
 public:
  Buf() = default;
  Buf(DType dtype, size_t n, size_t offset = 0)
      : dtype_(dtype), n_(n), off_(offset), bytes_((n + offset) * dtype_size(dtype) + 64) {
    mem_.reset(static_cast<unsigned char*>(std::aligned_alloc(64, (bytes_ + 63) / 64 * 64)));
    std::memset(mem_.get(), 0, bytes_);
  }
  void* data() { return mem_.get() + off_ * dtype_size(dtype_); }
  const void* data() const { return mem_.get() + off_ * dtype_size(dtype_); }
  float* f32() { return static_cast<float*>(data()); }
  const uint16_t* u16() const { return static_cast<const uint16_t*>(data()); }
  uint16_t* u16() { return static_cast<uint16_t*>(data()); }
  size_t size() const { return n_; }
  DType dtype() const { return dtype_; }
  float get(size_t i) const {
    if (dtype_ == DType::kF32) return static_cast<const float*>(data())[i];
    uint16_t h = u16()[i];
    return dtype_ == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
  }
  void set(size_t i, float x) {
    if (dtype_ == DType::kF32)
      f32()[i] = x;
    else
      u16()[i] = dtype_ == DType::kF16 ? f32_to_f16(x) : f32_to_bf16(x);
  }
  bool same_bytes(const Buf& o) const {
    return n_ == o.n_ && std::memcmp(data(), o.data(), n_ * dtype_size(dtype_)) == 0;
  }

 private:
  DType dtype_ = DType::kF32;
  size_t n_ = 0, off_ = 0, bytes_ = 0;
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::unique_ptr<unsigned char[], Free> mem_;
};

// Compares fp32 arrays: |got - want| <= bound(i) (NaN matches NaN). Reports the first bad index.
template <typename Bound>
::testing::AssertionResult near_f32(const char* what, const float* got, const float* want, size_t n,
                                    Bound bound) {
  size_t bad = 0, first = n;
  for (size_t i = 0; i < n; ++i) {
    float a = got[i], b = want[i];
    bool ok = (std::isnan(a) && std::isnan(b)) || a == b || std::fabs(double(a) - double(b)) <= bound(i);
    if (!ok) {
      if (first == n) first = i;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << bad << " of " << n << " elements differ; first at index " << first << ": got "
         << got[first] << " want " << want[first] << " (diff "
         << std::fabs(double(got[first]) - double(want[first])) << ", bound " << bound(first) << ")";
}

// Compares 16-bit float arrays within max_ulp units in the last place.
inline ::testing::AssertionResult near_half(const char* what, const uint16_t* got, const uint16_t* want,
                                            size_t n, DType dtype, uint32_t max_ulp) {
  size_t bad = 0, first = n;
  for (size_t i = 0; i < n; ++i) {
    if (half_ulp_distance(got[i], want[i], dtype) > max_ulp) {
      if (first == n) first = i;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  char buf[160];
  snprintf(buf, sizeof(buf), "got 0x%04x want 0x%04x", got[first], want[first]);
  return ::testing::AssertionFailure()
         << what << " (" << dtype_name(dtype) << "): " << bad << " of " << n << " elements more than "
         << max_ulp << " ulp apart; first at index " << first << ": " << buf;
}

}  // namespace zoe::optim::test
