// The scalar path of the Lion and Adagrad kernels (one lane; the same bits as the SIMD paths).
// Compiled with the baseline ISA, -fno-math-errno (sqrt inline) and -ffp-contract=off.
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "optim/kernels.h"

namespace zoe::optim::kern {
namespace {

#include "optim/simd_scalar.inc"

#include "optim/lion_adagrad_body.inc"

const OneStateTable kTable = {"scalar", &pick_lion, &pick_adagrad, &pick_one_state_roofline};

}  // namespace

const OneStateTable& scalar_one_state_table() { return kTable; }

}  // namespace zoe::optim::kern
