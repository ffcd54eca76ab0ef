// The AVX2 path of the Lion and Adagrad kernels, 8 lanes. Compiled with -mavx2 -mfma -mf16c and
// -ffp-contract=off (no FMA: the same bits as the scalar path); called only after cpuid says so.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "optim/kernels.h"

namespace zoe::optim::kern {
namespace {

#include "optim/simd_avx2.inc"

#include "optim/lion_adagrad_body.inc"

const OneStateTable kTable = {"avx2", &pick_lion, &pick_adagrad, &pick_one_state_roofline};

}  // namespace

const OneStateTable* avx2_one_state_table() { return &kTable; }

}  // namespace zoe::optim::kern
