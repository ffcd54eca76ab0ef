// The scalar path: the same kernel code as the SIMD paths with one lane and no FMA (mul+add).
// Compiled with the baseline ISA, -fno-math-errno (sqrt inline) and -ffp-contract=off.
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "optim/kernels.h"

namespace zoe::optim::kern {
namespace {

struct V {
  static constexpr size_t W = 1;
  using F = float;
  using I = uint32_t;
  using R = uint32_t;
  struct Acc {
    double a;
  };

  static F load_f32(const float* p) { return *p; }
  static F load_bf16(const uint16_t* p) { return bf16_to_f32(*p); }
  static F load_f16(const uint16_t* p) { return f16_to_f32(*p); }
  static void store_f32(float* p, F x) { *p = x; }
  static void fence() {}
  template <bool kNt = false>
  static void store_f16(uint16_t* p, F x) {
    *p = f32_to_f16(x);
  }
  template <bool kHw, bool kNt = false>
  static void store_bf16(uint16_t* p, F x) {
    *p = f32_to_bf16(x);
  }
  template <bool kHw>
  static void store_bf16_sr(uint16_t* p, F x, I rnd16) {
    *p = f32_to_bf16_stochastic(x, static_cast<uint16_t>(rnd16));
  }

  static F set1(float a) { return a; }
  static F mul(F a, F b) { return a * b; }
  static F div(F a, F b) { return a / b; }
  static F sqrt(F a) { return __builtin_sqrtf(a); }
  static F fmadd(F a, F b, F c) { return a * b + c; }
  static F fnmadd(F a, F b, F c) { return c - a * b; }

  static I hash(uint32_t seed, uint32_t index) {
    uint32_t x = index + seed;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
  }
  static I lo16(I h) { return h & 0xffffu; }
  static I hi16(I h) { return h >> 16; }

  static Acc acc_zero() { return {0.0}; }
  static void acc_sq(Acc& acc, F x) { acc.a += static_cast<double>(x) * static_cast<double>(x); }
  static double acc_sum(const Acc& acc) { return acc.a; }

  static R load_raw32(const void* p) {
    uint32_t x;
    __builtin_memcpy(&x, p, 4);
    return x;
  }
  static R load_raw16(const void* p) {
    uint16_t x;
    __builtin_memcpy(&x, p, 2);
    return x;
  }
  static void store_raw32(void* p, R x) { __builtin_memcpy(p, &x, 4); }
  template <bool kNt>
  static void store_raw16(void* p, R x) {
    uint16_t y = static_cast<uint16_t>(x);
    __builtin_memcpy(p, &y, 2);
  }
  static R add_raw(R a, R b) { return a + b; }
  static R and_raw(R a, R b) { return a & b; }
  static R set1_raw(int a) { return static_cast<uint32_t>(a); }
};

#include "optim/kernel_body.inc"

AdamFn pick_adam(int g, int s, int o, bool) { return pick_adam_hw<false>(g, s, o); }
ConvertFn pick_convert(int s, int d, bool norm, bool) { return pick_convert_hw<false>(s, d, norm); }
ScaleFn pick_scale(int d, bool) { return pick_scale_hw<false>(d); }

const Table kTable = {"scalar", &pick_adam, &pick_norm, &pick_convert, &pick_scale, &pick_roofline};

}  // namespace

const Table& scalar_table() { return kTable; }

}  // namespace zoe::optim::kern
