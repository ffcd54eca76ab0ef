// Element types zoe stores (fp32, fp16, bf16) and exact scalar conversions between them.
//
// Contracts shared by every conversion here (the SIMD kernels in src/optim answer to these):
//   * fp32 -> bf16/fp16 rounds to nearest, ties to even (RNE), independent of the FP environment
//     (fp16 subnormals use one float add, so they assume the default rounding mode and no FTZ/DAZ).
//   * Overflow rounds to +-inf as IEEE says; +-inf stays +-inf; signed zeros keep their sign.
//   * NaN stays NaN: sign and the top payload bits are kept and the quiet bit is set
//     (the result of vcvtneps2bf16 / vcvtps2ph for a NaN input).
//   * fp32 subnormals convert exactly like normals (software path). Note: the AVX512-BF16
//     instruction vcvtneps2bf16 flushes fp32 subnormal inputs (|x| < 2^-126) to a signed zero;
//     kernels that use it document the difference.
//   * bf16/fp16 -> fp32 is exact.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "zoe/dtype.h"

namespace zoe {

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

constexpr size_t dtype_size(DType d) { return d == DType::kF32 ? 4 : 2; }

constexpr const char* dtype_name(DType d) {
  return d == DType::kF32 ? "fp32" : d == DType::kF16 ? "fp16" : "bf16";
}

// "fp32"/"f32"/"float32"/"float", "fp16"/"f16"/"float16"/"half", "bf16"/"bfloat16".
// Returns false for anything else.
inline bool parse_dtype(std::string_view s, DType* out) {
  if (s == "fp32" || s == "f32" || s == "float32" || s == "float") {
    *out = DType::kF32;
  } else if (s == "fp16" || s == "f16" || s == "float16" || s == "half") {
    *out = DType::kF16;
  } else if (s == "bf16" || s == "bfloat16") {
    *out = DType::kBF16;
  } else {
    return false;
  }
  return true;
}

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Stochastic rounding to bf16: adds 16 random bits below the kept mantissa and truncates, so
// the result rounds up with probability equal to the dropped fraction. NaN as in f32_to_bf16.
inline uint16_t f32_to_bf16_stochastic(float f, uint16_t random16) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += random16;
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0x1f) return f32_from_bits(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    float r = static_cast<float>(m) * 0x1p-24f;  // exact: m < 2^10
    return sign ? -r : r;
  }
  return f32_from_bits(sign | ((e + 112) << 23) | (m << 13));
}

inline uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (a >= 0x38800000u) {                                              // fp16 normal range
    uint32_t r = a - 0x38000000u;                                      // rebias 127 -> 15
    r += 0xfffu + ((r >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  // Below 2^-14: fp16 subnormals are multiples of 2^-24, the ulp of 0.5f, so one RNE float add
  // rounds |f| to that grid (a result of 0x400 is the smallest normal, encoded correctly too).
  float t = f32_from_bits(a) + 0.5f;
  return static_cast<uint16_t>(sign | (f32_bits(t) - 0x3f000000u));
}

// Distance in units in the last place between two 16-bit floats of the same format
// (bf16 or fp16), counting across zero; NaNs are never close (returns UINT32_MAX unless
// both are NaN, which gives 0).
inline uint32_t half_ulp_distance(uint16_t a, uint16_t b, DType d) {
  uint16_t exp_mask = d == DType::kBF16 ? 0x7f80 : 0x7c00;
  auto is_nan = [&](uint16_t x) { return (x & exp_mask) == exp_mask && (x & ~exp_mask & 0x7fff); };
  if (is_nan(a) || is_nan(b)) return is_nan(a) && is_nan(b) ? 0 : UINT32_MAX;
  auto ordered = [](uint16_t x) -> int32_t { return (x & 0x8000) ? -static_cast<int32_t>(x & 0x7fff) : x; };
  int32_t d2 = ordered(a) - ordered(b);
  return static_cast<uint32_t>(d2 < 0 ? -d2 : d2);
}

// dst (n elements of dt) = src (fp32), rounded to nearest even: the scalar reference the SIMD
// conversions (optim::convert_with_norm) answer to.
inline void store_compute(void* dst, const float* src, DType dt, size_t n) {
  if (dt == DType::kF32) {
    std::memcpy(dst, src, n * 4);
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < n; ++i) d[i] = dt == DType::kBF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
}

// The one place the public ComputeDType (zoe/dtype.h) and DType meet: the same numeric values,
// so the mapping is a cast.
static_assert(static_cast<int>(ComputeDType::kF32) == static_cast<int>(DType::kF32) &&
                  static_cast<int>(ComputeDType::kF16) == static_cast<int>(DType::kF16) &&
                  static_cast<int>(ComputeDType::kBF16) == static_cast<int>(DType::kBF16),
              "ComputeDType and DType must keep the same values");
constexpr ComputeDType public_dtype(DType d) { return static_cast<ComputeDType>(d); }
constexpr DType internal_dtype(ComputeDType d) { return static_cast<DType>(d); }

}  // namespace zoe
