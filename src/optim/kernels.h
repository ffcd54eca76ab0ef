// Internal: the table of kernels each SIMD path (scalar, AVX2, AVX-512) provides.
//
// Each path lives in its own translation unit compiled with that ISA's flags. Those units keep
// everything but their table getter in an anonymous namespace and call no inline function of
// a shared header, so no weak symbol compiled for a wider ISA can leak into code that runs on
// a CPU without it. Element types are passed as ints (0 fp32, 1 fp16, 2 bf16: DType's values).
//
// Every kernel works on the element range [begin, end) of buffers given by their base
// pointers, so callers split work into chunks without pointer arithmetic on void*.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zoe::optim::kern {

// Constants of one Adam step (see make_adam_constants in adam.h, which fills them in double
// precision and rounds each to float once).
struct Constants {
  float grad_scale;
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float eps;
  float decay;       // AdamW: 1 - lr*wd; Adam: 1
  float l2;          // Adam: wd; AdamW: 0
  uint32_t sr_seed;  // stochastic rounding: hash of (sr_seed, step)
};

// Output of adam: 0 none, 1 fp16, 2 bf16, 4 fp16 and 5 bf16 written with non-temporal stores
// (out must then be 32-byte aligned). State: 0 fp32, 2 bf16 (RNE), 3 bf16 (stochastic).
using AdamFn = void (*)(const Constants& c, float* p, const void* g, void* m, void* v, void* out,
                        size_t begin, size_t end);
// Sum of squares in double of src[begin, end).
using NormFn = double (*)(const void* src, size_t begin, size_t end);
// dst = convert(src) over [begin, end); returns the sum of squares of src when the kernel was
// picked with norm=true, else 0.
using ConvertFn = double (*)(const void* src, void* dst, size_t begin, size_t end);
using ScaleFn = void (*)(void* data, float scale, size_t begin, size_t end);
// The memory yardstick: same streams as AdamFn, trivial integer arithmetic.
using RooflineFn = void (*)(float* p, const void* g, void* m, void* v, void* out, size_t begin, size_t end);

struct Table {
  const char* name;
  AdamFn (*adam)(int grad, int state, int out, bool hw_bf16);
  NormFn (*norm)(int dtype);
  ConvertFn (*convert)(int src, int dst, bool norm, bool hw_bf16);
  ScaleFn (*scale)(int dtype, bool hw_bf16);
  // out_bytes: 0 none, 2 a 16-bit copy, 3 that copy with non-temporal stores.
  RooflineFn (*roofline)(int grad_bytes, int state_bytes, int out_bytes);
};

const Table& scalar_table();
// Defined only when the build compiled that path (x86-64 with a compiler that knows the flags).
const Table* avx2_table();
const Table* avx512_table();

}  // namespace zoe::optim::kern
