// Non-x86 builds: only the scalar path exists.
#include "optim/kernels.h"

namespace zoe::optim::kern {
const Table* avx2_table() { return nullptr; }
const Table* avx512_table() { return nullptr; }
const LowbitTable* avx2_lowbit_table() { return nullptr; }
const LowbitTable* avx512_lowbit_table() { return nullptr; }
const OneStateTable* avx2_one_state_table() { return nullptr; }
const OneStateTable* avx512_one_state_table() { return nullptr; }
}  // namespace zoe::optim::kern
