// The avx512 path of init_normal.h (this translation unit's ISA flags: src/model/CMakeLists.txt).
#include "core/init_normal.h"
#include "core/init_normal_kernel.inc"

namespace zoe::initk {

NormalFn normal_avx512() { return &normal_fill; }

}  // namespace zoe::initk
