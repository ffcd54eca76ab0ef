// The scalar path of the low-bit state kernels (one lane; the same bits as the SIMD paths).
// Compiled with the baseline ISA, -fno-math-errno and -ffp-contract=off.
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "optim/kernels.h"

namespace zoe::optim::kern {
namespace {

#include "optim/simd_scalar.inc"

#include "optim/lowbit_body.inc"

const LowbitTable kTable = {"scalar", &pick_lowbit_adam, &pick_quantize, &pick_dequantize};

}  // namespace

const LowbitTable& scalar_lowbit_table() { return kTable; }

}  // namespace zoe::optim::kern
