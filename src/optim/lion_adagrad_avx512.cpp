// The AVX-512 path of the Lion and Adagrad kernels, 16 lanes. Compiled with the AVX-512 flags and
// -ffp-contract=off (no FMA, no AVX512-BF16 rounding: the same bits as the scalar path); called
// only after cpuid says so.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "optim/kernels.h"

namespace zoe::optim::kern {
namespace {

#include "optim/simd_avx512.inc"

#include "optim/lion_adagrad_body.inc"

const OneStateTable kTable = {"avx512", &pick_lion, &pick_adagrad, &pick_one_state_roofline};

}  // namespace

const OneStateTable* avx512_one_state_table() { return &kTable; }

}  // namespace zoe::optim::kern
