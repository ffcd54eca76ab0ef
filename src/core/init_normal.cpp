// Picks the path of init_normal.h for a SIMD level.
#include "core/init_normal.h"

namespace zoe::initk {

#ifndef ZOE_INIT_NORMAL_X86
NormalFn normal_avx2() { return nullptr; }
NormalFn normal_avx512() { return nullptr; }
#endif

NormalFn normal_for(SimdLevel level) {
  NormalFn f = nullptr;
  if (level >= SimdLevel::kAvx512) f = normal_avx512();
  if (!f && level >= SimdLevel::kAvx2) f = normal_avx2();
  return f ? f : normal_scalar();
}

}  // namespace zoe::initk
