// The AVX2 path (AVX2 + FMA + F16C; bf16 rounding in integer code), 8 lanes.
// Compiled with -mavx2 -mfma -mf16c; called only after cpuid says so.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "optim/kernels.h"

namespace zoe::optim::kern {
namespace {

#include "optim/simd_avx2.inc"

#include "optim/kernel_body.inc"

AdamFn pick_adam(int g, int s, int o, bool) { return pick_adam_hw<false>(g, s, o); }
ConvertFn pick_convert(int s, int d, bool norm, bool) { return pick_convert_hw<false>(s, d, norm); }
ScaleFn pick_scale(int d, bool) { return pick_scale_hw<false>(d); }

const Table kTable = {"avx2", &pick_adam, &pick_norm, &pick_convert, &pick_scale, &pick_roofline};

}  // namespace

const Table* avx2_table() { return &kTable; }

}  // namespace zoe::optim::kern
