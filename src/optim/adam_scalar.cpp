// The scalar path: the same kernel code as the SIMD paths with one lane and no FMA (mul+add).
// Compiled with the baseline ISA, -fno-math-errno (sqrt inline) and -ffp-contract=off.
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "optim/kernels.h"

namespace zoe::optim::kern {
namespace {

#include "optim/simd_scalar.inc"

#include "optim/kernel_body.inc"

AdamFn pick_adam(int g, int s, int o, bool) { return pick_adam_hw<false>(g, s, o); }
ConvertFn pick_convert(int s, int d, bool norm, bool) { return pick_convert_hw<false>(s, d, norm); }
ScaleFn pick_scale(int d, bool) { return pick_scale_hw<false>(d); }

const Table kTable = {"scalar", &pick_adam, &pick_norm, &pick_convert, &pick_scale, &pick_roofline};

}  // namespace

const Table& scalar_table() { return kTable; }

}  // namespace zoe::optim::kern
