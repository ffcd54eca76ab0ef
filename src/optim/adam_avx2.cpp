// The AVX2 path (AVX2 + FMA + F16C; bf16 rounding in integer code), 8 lanes.
// Compiled with -mavx2 -mfma -mf16c; called only after cpuid says so.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "optim/kernels.h"

namespace zoe::optim::kern {
namespace {

struct V {
  static constexpr size_t W = 8;
  using F = __m256;
  using I = __m256i;
  using R = __m256i;
  struct Acc {
    __m256d a, b;
  };

  static F load_f32(const float* p) { return _mm256_loadu_ps(p); }
  static F load_bf16(const uint16_t* p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static F load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store_f32(float* p, F x) { _mm256_storeu_ps(p, x); }
  template <bool kNt>
  static void store_h(uint16_t* p, __m128i h) {
    if constexpr (kNt)
      _mm_stream_si128(reinterpret_cast<__m128i*>(p), h);
    else
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
  }
  static void fence() { _mm_sfence(); }
  template <bool kNt = false>
  static void store_f16(uint16_t* p, F x) {
    store_h<kNt>(p, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // r holds 8 values < 2^16 in 32-bit lanes; NaN lanes get the top half with the quiet bit.
  template <bool kNt = false>
  static void store_narrow(uint16_t* p, F x, __m256i r) {
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, q, nan);
    store_h<kNt>(p, _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
  }
  template <bool kHw, bool kNt = false>
  static void store_bf16(uint16_t* p, F x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    store_narrow<kNt>(p, x, r);
  }
  template <bool kHw>
  static void store_bf16_sr(uint16_t* p, F x, I rnd16) {
    store_narrow(p, x, _mm256_srli_epi32(_mm256_add_epi32(_mm256_castps_si256(x), rnd16), 16));
  }

  static F set1(float a) { return _mm256_set1_ps(a); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }

  static I hash(uint32_t seed, uint32_t index) {
    __m256i x = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(index + seed)),
                                 _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x7feb352du)));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x846ca68bu)));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  }
  static I lo16(I h) { return _mm256_and_si256(h, _mm256_set1_epi32(0xffff)); }
  static I hi16(I h) { return _mm256_srli_epi32(h, 16); }

  static Acc acc_zero() { return {_mm256_setzero_pd(), _mm256_setzero_pd()}; }
  static void acc_sq(Acc& acc, F x) {
    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    acc.a = _mm256_fmadd_pd(lo, lo, acc.a);
    acc.b = _mm256_fmadd_pd(hi, hi, acc.b);
  }
  static double acc_sum(const Acc& acc) {
    alignas(32) double t[4];
    _mm256_store_pd(t, _mm256_add_pd(acc.a, acc.b));
    return (t[0] + t[1]) + (t[2] + t[3]);
  }

  static R load_raw32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static R load_raw16(const void* p) {
    return _mm256_cvtepu16_epi32(_mm_loadu_si128(static_cast<const __m128i*>(p)));
  }
  static void store_raw32(void* p, R x) { _mm256_storeu_si256(static_cast<__m256i*>(p), x); }
  template <bool kNt>
  static void store_raw16(void* p, R x) {
    x = _mm256_and_si256(x, _mm256_set1_epi32(0xffff));
    store_h<kNt>(static_cast<uint16_t*>(p),
                 _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1)));
  }
  static R add_raw(R a, R b) { return _mm256_add_epi32(a, b); }
  static R and_raw(R a, R b) { return _mm256_and_si256(a, b); }
  static R set1_raw(int a) { return _mm256_set1_epi32(a); }
};

#include "optim/kernel_body.inc"

AdamFn pick_adam(int g, int s, int o, bool) { return pick_adam_hw<false>(g, s, o); }
ConvertFn pick_convert(int s, int d, bool norm, bool) { return pick_convert_hw<false>(s, d, norm); }
ScaleFn pick_scale(int d, bool) { return pick_scale_hw<false>(d); }

const Table kTable = {"avx2", &pick_adam, &pick_norm, &pick_convert, &pick_scale, &pick_roofline};

}  // namespace

const Table* avx2_table() { return &kTable; }

}  // namespace zoe::optim::kern
