// The AVX-512 path (F+BW+VL+DQ; AVX512-BF16 conversions when the CPU has them), 16 lanes.
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mfma -mf16c; called
// only after cpuid says so.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "optim/kernels.h"

namespace zoe::optim::kern {
namespace {

#include "optim/simd_avx512.inc"

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
