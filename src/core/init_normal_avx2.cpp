// The avx2 path of init_normal.h (this translation unit's ISA flags: src/model/CMakeLists.txt).
#include "core/init_normal.h"
#include "core/init_normal_kernel.inc"

namespace zoe::initk {

NormalFn normal_avx2() { return &normal_fill; }

}  // namespace zoe::initk
