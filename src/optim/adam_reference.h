// The plain scalar reference every fast optimizer path is tested against (llm.c style).
//
// Written for clarity, not speed: one element at a time, no FMA (-ffp-contract=off), constants
// from make_adam_constants() like the fast paths, conversions from core/dtype.h. The norm is a
// single running double sum in index order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "optim/adam.h"

namespace zoe::optim::ref {

// The hash the fast paths use for stochastic rounding of element `index`.
uint32_t sr_hash(uint32_t seed, uint64_t index);

// Same contract as optim::adam_step; single-threaded. Errors: the same argument checks.
Status adam_step(const AdamArgs& args);
NormResult grad_norm_sq(const void* grad, DType dtype, size_t n);
NormResult convert_with_norm(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n);

// Element i of a buffer of `dtype`, as fp32.
float load(const void* base, DType dtype, size_t i);

}  // namespace zoe::optim::ref
