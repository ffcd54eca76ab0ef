// The avx512 path of init_normal.h (this translation unit's ISA flags: src/model/CMakeLists.txt).
#include "model/init_normal.h"
#include "model/init_normal_kernel.inc"

namespace zoe::model::initk {

NormalFn normal_avx512() { return &normal_fill; }

}  // namespace zoe::model::initk
