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

// ---- low-bit optimizer states (lowbit.h; kernels in lowbit_body.inc) ----------------------------

// One fused AdamW pass over packed states: the chunk's constants and base pointers. Element
// codes: state 0 fp32, 2 bf16 RNE, 3 bf16 stochastic, 4 int8, 5 int4; master 0 fp32, 2 bf16
// (stochastic); out 0 none, 1 fp16, 2 bf16.
struct LowbitArgs {
  const Constants* c;
  uint32_t master_seed;  // stochastic rounding of a bf16 master (sr_hash of this seed)
  uint64_t index_base;   // global element index of element 0, for the rounding hashes
  void* p;
  const void* g;
  void* m;
  void* v;
  void* out;
};
inline constexpr size_t kNoError = ~size_t(0);
// The first block of a range that failed: its first element (kNoError: none) and what failed
// (bits: 1 m, 2 v, 4 parameter non-finite or negative v; 8 m's, 16 v's stored scale non-finite).
struct BlockError {
  size_t begin;
  uint32_t what;
};
// Over the elements [begin, end); begin is a multiple of the format's block size.
using LowbitAdamFn = BlockError (*)(const LowbitArgs& a, size_t begin, size_t end);
using QuantizeFn = BlockError (*)(const float* src, void* dst, size_t begin, size_t end);
using DequantizeFn = BlockError (*)(const void* src, float* dst, size_t begin, size_t end);

struct LowbitTable {
  const char* name;
  LowbitAdamFn (*adam)(int grad, int state, int master, int out);
  QuantizeFn (*quantize)(int state, bool v);  // state 4 or 5; v: the second moment's map
  DequantizeFn (*dequantize)(int state, bool v);
};

const LowbitTable& scalar_lowbit_table();
const LowbitTable* avx2_lowbit_table();
const LowbitTable* avx512_lowbit_table();

// ---- Lion and Adagrad (lion_adagrad.h; kernels in lion_adagrad_body.inc) -----------------------

// Constants of one Lion or Adagrad step (make_lion_constants / make_adagrad_constants fill them,
// each rounded to float once) and the buffer's global index of element 0.
struct OneStateConstants {
  float grad_scale;
  float lr;
  float beta1, one_minus_beta1;  // Lion
  float beta2, one_minus_beta2;  // Lion
  float decay;                   // Lion: 1 - lr*wd
  float eps;                     // Adagrad
  float l2;                      // Adagrad: wd
  uint32_t sr_seed;              // stochastic rounding of a bf16 state: hash of (sr_seed, step)
  uint64_t index_base;           // global index of element 0 (a multiple of 16), for the hash
};

// One fused pass over [begin, end): p (fp32, in place), g, the one state s, out (optional).
// Codes: grad 0 fp32, 1 fp16, 2 bf16; state 0 fp32, 2 bf16 RNE, 3 bf16 stochastic; out 0 none,
// 1 fp16, 2 bf16, 4 fp16 and 5 bf16 with non-temporal stores (out then 32-byte aligned).
using OneStateFn = void (*)(const OneStateConstants& c, float* p, const void* g, void* s, void* out,
                            size_t begin, size_t end);
// The memory yardstick of a one-state pass: reads p, g, s; writes p, s and out (out_bytes: 0
// none, 2 a 16-bit copy, 3 that copy with non-temporal stores); trivial integer arithmetic.
using OneStateRooflineFn = void (*)(float* p, const void* g, void* s, void* out, size_t begin, size_t end);

struct OneStateTable {
  const char* name;
  OneStateFn (*lion)(int grad, int state, int out);
  // wd: the L2 term is applied (weight_decay > 0); without it p is not read into g.
  OneStateFn (*adagrad)(int grad, int state, int out, bool wd);
  OneStateRooflineFn (*roofline)(int grad_bytes, int state_bytes, int out_bytes);
};

const OneStateTable& scalar_one_state_table();
const OneStateTable* avx2_one_state_table();
const OneStateTable* avx512_one_state_table();

}  // namespace zoe::optim::kern
