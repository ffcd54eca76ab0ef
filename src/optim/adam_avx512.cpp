// The AVX-512 path (F+BW+VL+DQ; AVX512-BF16 conversions when the CPU has them), 16 lanes.
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mfma -mf16c; called
// only after cpuid says so.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "optim/kernels.h"

namespace zoe::optim::kern {
namespace {

struct V {
  static constexpr size_t W = 16;
  using F = __m512;
  using I = __m512i;
  using R = __m512i;
  struct Acc {
    __m512d a, b;
  };

  static F load_f32(const float* p) { return _mm512_loadu_ps(p); }
  static F load_bf16(const uint16_t* p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static F load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void store_f32(float* p, F x) { _mm512_storeu_ps(p, x); }
  template <bool kNt>
  static void store_h(uint16_t* p, __m256i h) {
    if constexpr (kNt)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(p), h);
    else
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
  }
  static void fence() { _mm_sfence(); }
  template <bool kNt = false>
  static void store_f16(uint16_t* p, F x) {
    store_h<kNt>(p, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // NaN lanes: keep the top half, set the quiet bit (what vcvtneps2bf16 does).
  static __m512i bf16_nan_fix(F x, __m512i r) {
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(x), 16), _mm512_set1_epi32(0x40));
    return _mm512_mask_mov_epi32(r, nan, q);
  }
  template <bool kHw, bool kNt = false>
  static void store_bf16(uint16_t* p, F x) {
    if constexpr (kHw) {
      __m256bh h = _mm512_cvtneps_pbh(x);
      __m256i hi;
      __builtin_memcpy(&hi, &h, sizeof(hi));
      store_h<kNt>(p, hi);
    } else {
      __m512i u = _mm512_castps_si512(x);
      __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
      __m512i r =
          _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
      r = bf16_nan_fix(x, r);
      store_h<kNt>(p, _mm512_cvtepi32_epi16(r));
    }
  }
  // kHw: add the random bits, clear the dropped ones, and let vcvtneps2bf16 narrow the now exact
  // value (NaN lanes pass through unchanged so the instruction quiets them; like every use of it,
  // results below 2^-126 flush to zero).
  template <bool kHw>
  static void store_bf16_sr(uint16_t* p, F x, I rnd16) {
    if constexpr (kHw) {
      __m512i y = _mm512_and_si512(_mm512_add_epi32(_mm512_castps_si512(x), rnd16),
                                   _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
      __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
      store_bf16<true>(p, _mm512_mask_mov_ps(_mm512_castsi512_ps(y), nan, x));
      return;
    }
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_castps_si512(x), rnd16), 16);
    r = bf16_nan_fix(x, r);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
  }

  static F set1(float a) { return _mm512_set1_ps(a); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }

  // lowbias32 (two multiplies) of seed + element index.
  static I hash(uint32_t seed, uint32_t index) {
    __m512i x = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(index + seed)),
                                 _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x7feb352du)));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x846ca68bu)));
    return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  }
  static I lo16(I h) { return _mm512_and_si512(h, _mm512_set1_epi32(0xffff)); }
  static I hi16(I h) { return _mm512_srli_epi32(h, 16); }

  static Acc acc_zero() { return {_mm512_setzero_pd(), _mm512_setzero_pd()}; }
  static void acc_sq(Acc& acc, F x) {
    __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1));
    acc.a = _mm512_fmadd_pd(lo, lo, acc.a);
    acc.b = _mm512_fmadd_pd(hi, hi, acc.b);
  }
  static double acc_sum(const Acc& acc) {
    alignas(64) double t[8];
    _mm512_store_pd(t, _mm512_add_pd(acc.a, acc.b));
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
  }

  static R load_raw32(const void* p) { return _mm512_loadu_si512(p); }
  static R load_raw16(const void* p) {
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
  }
  static void store_raw32(void* p, R x) { _mm512_storeu_si512(p, x); }
  template <bool kNt>
  static void store_raw16(void* p, R x) {
    store_h<kNt>(static_cast<uint16_t*>(p), _mm512_cvtepi32_epi16(x));
  }
  static R add_raw(R a, R b) { return _mm512_add_epi32(a, b); }
  static R and_raw(R a, R b) { return _mm512_and_si512(a, b); }
  static R set1_raw(int a) { return _mm512_set1_epi32(a); }
};

#include "optim/kernel_body.inc"

AdamFn pick_adam(int g, int s, int o, bool hw) {
  return hw ? pick_adam_hw<true>(g, s, o) : pick_adam_hw<false>(g, s, o);
}
ConvertFn pick_convert(int s, int d, bool norm, bool hw) {
  return hw ? pick_convert_hw<true>(s, d, norm) : pick_convert_hw<false>(s, d, norm);
}
ScaleFn pick_scale(int d, bool hw) { return hw ? pick_scale_hw<true>(d) : pick_scale_hw<false>(d); }

const Table kTable = {"avx512", &pick_adam, &pick_norm, &pick_convert, &pick_scale, &pick_roofline};

}  // namespace

const Table* avx512_table() { return &kTable; }

}  // namespace zoe::optim::kern
