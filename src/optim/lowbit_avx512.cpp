// The AVX-512 path of the low-bit state kernels, 16 lanes. Compiled with the AVX-512 flags and
// -ffp-contract=off (no FMA, no AVX512-BF16 rounding: the same bits as the scalar path); called
// only after cpuid says so.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "optim/kernels.h"

namespace zoe::optim::kern {
namespace {

#include "optim/simd_avx512.inc"

#include "optim/lowbit_body.inc"

const LowbitTable kTable = {"avx512", &pick_lowbit_adam, &pick_quantize, &pick_dequantize};

}  // namespace

const LowbitTable* avx512_lowbit_table() { return &kTable; }

}  // namespace zoe::optim::kern
