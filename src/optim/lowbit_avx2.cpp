// The AVX2 path of the low-bit state kernels, 8 lanes. Compiled with -mavx2 -mfma -mf16c
// -ffp-contract=off (no FMA anywhere: the same bits as the scalar path); called only after cpuid says so.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "optim/kernels.h"

namespace zoe::optim::kern {
namespace {

#include "optim/simd_avx2.inc"

#include "optim/lowbit_body.inc"

const LowbitTable kTable = {"avx2", &pick_lowbit_adam, &pick_quantize, &pick_dequantize};

}  // namespace

const LowbitTable* avx2_lowbit_table() { return &kTable; }

}  // namespace zoe::optim::kern
