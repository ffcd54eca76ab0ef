// Internal: the normal-variate kernel of gpt_init (model/gpt.h), one per SIMD path (scalar, AVX2,
// AVX-512), each in its own translation unit compiled with that ISA's flags.
//
// Every path computes the same IEEE operations in the same order (no FMA, no contraction, no libm:
// its own log, sin and cos polynomials), so a value depends on (key, index) only, never on the CPU
// or the path: two machines initialise the same model.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/cpu.h"

namespace zoe::initk {

// out[0, n) = std_dev * z(first + i), the standard normals of the stream `key` at elements
// [first, first + n). Element 2j and 2j + 1 are the cosine and sine sides of one Box-Muller pair,
// from splitmix64(key + j * golden): 24 bits for the radius, 24 for the angle.
using NormalFn = void (*)(uint64_t key, uint64_t first, size_t n, float std_dev, float* out);

NormalFn normal_scalar();
// nullptr when the build did not compile that path (not x86-64).
NormalFn normal_avx2();
NormalFn normal_avx512();
// The path of `level`, or the best one below it that was built.
NormalFn normal_for(SimdLevel level);

}  // namespace zoe::initk
