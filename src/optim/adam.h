// CPU Adam/AdamW over offloaded shards: one fused pass per step, gradient norms, conversions.
//
// The step the engine runs on a shard that lives in host memory:
//   1. the gradient norm: grad_norm_sq() over the shard (or convert_with_norm() while the
//      gradients arrive), all-reduced over shards/ranks by the caller;
//   2. compute_step_scale(): overflow check, 1/loss_scale x clip coefficient;
//   3. adam_step(): one pass over memory that reads p, g, m, v and writes p, m, v and
//      (optionally) a bf16/fp16 copy of p for the compute parameters.
// adam_full_step() chains the three for a single buffer (one shard, one rank).
//
// Every kernel has an AVX-512, an AVX2+FMA+F16C and a scalar version, picked at run time by
// cpuid (active_simd_level()), and a plain scalar reference (adam_reference.h) that each of
// them is tested against. Work is split into fixed kChunkElems-sized chunks whose boundaries
// do not depend on the thread count, and partial norms are combined in chunk order: results
// are bit-identical for any number of threads (for a given SIMD level).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "core/cpu.h"
#include "core/dtype.h"
#include "optim/cpu_pool.h"
#include "optim/kernels.h"
#include "zoe/status.h"

namespace zoe::optim {

// Elements per unit of parallel work: 16 Ki elements, 256 KiB of fp32 p+g+m+v (fits L2).
inline constexpr size_t kChunkElems = 16384;

// Hyperparameters of one parameter group.
struct AdamParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  // true: AdamW, decoupled decay p -= lr*wd*p. false: Adam with L2, g += wd*p.
  bool adamw = true;
  // bf16 m/v only: round the stored m and v stochastically instead of to nearest even.
  // The random bits are a hash of (sr_seed, step, element index): deterministic.
  bool stochastic_rounding = false;
  uint64_t sr_seed = 0;
};

// What changes from step to step.
struct AdamStep {
  int64_t step = 1;         // 1-based count of updates including this one; bias correction uses it
  float grad_scale = 1.0f;  // multiplies every gradient: 1/loss_scale x clip coefficient
};

// A parameter group: hyperparameters and its own step counter (advanced by adam_full_step,
// or by the caller before each adam_step).
struct AdamGroup {
  AdamParams params;
  int64_t step = 0;  // updates applied so far
};

// The memory of one shard. Pointers need no particular alignment; the buffers must not overlap.
struct AdamBuffers {
  size_t n = 0;
  float* param = nullptr;  // fp32 master parameters, updated in place
  const void* grad = nullptr;
  DType grad_dtype = DType::kF32;
  void* exp_avg = nullptr;               // m
  void* exp_avg_sq = nullptr;            // v
  DType state_dtype = DType::kF32;       // kF32 or kBF16 (m and v rounded to bf16 after each update)
  void* param_out = nullptr;             // optional: updated params also written here ...
  DType param_out_dtype = DType::kBF16;  // ... as kBF16 or kF16 (RNE)
};

struct AdamArgs {
  AdamBuffers buf;
  AdamParams params;
  AdamStep step;
};

// How to run a kernel. The default runs on the calling thread at active_simd_level().
struct Exec {
  CpuPool* pool = nullptr;        // null: the calling thread only
  std::optional<SimdLevel> simd;  // force a level (tests, benchmarks); must be supported here
  bool hw_bf16 = true;            // AVX-512: use AVX512-BF16 instructions when the CPU has them
  // Write param_out with non-temporal (streaming) stores, which skip the read-for-ownership of
  // a write-only stream. Unset: when param_out is 32-byte aligned and at least
  // kStreamOutMinElems long (a copy that size leaves the caches anyway). true: whenever it is
  // aligned. false: never.
  std::optional<bool> stream_param_out;
};
inline constexpr size_t kStreamOutMinElems = size_t(1) << 21;

// The level kernels use when Exec::simd is unset: detected_simd_level(), lowered by the
// environment variable ZOE_SIMD=scalar|avx2|avx512 (read once) or set_simd_override().
SimdLevel active_simd_level();
// Forces the default level for the whole process; fails if this CPU lacks it. nullopt: undo.
Status set_simd_override(std::optional<SimdLevel> level);
// Whether kernels for `level` can run on this CPU.
bool simd_level_supported(SimdLevel level);
// Name of the path a call with `exec` uses, e.g. "avx512+bf16", "avx2", "scalar".
const char* kernel_path_name(const Exec& exec = {});

// Constants of one step, computed in double from (params, step) and rounded to float once.
// Shared by the reference and the fast paths so both use exactly the same values.
using AdamConstants = kern::Constants;
// Fails for step < 1, beta outside [0, 1), eps <= 0, lr < 0, wd < 0, or non-finite values.
Result<AdamConstants> make_adam_constants(const AdamParams& params, const AdamStep& step);

// One fused Adam/AdamW pass over buf:
//   g = grad * grad_scale;  (Adam: g += wd*p)
//   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
//   p = p*decay - step_size * m / (sqrt(v)*inv_sqrt_bc2 + eps);   param_out = convert(p)
// The fast paths use FMA where the reference does mul+add: results agree to a few fp32 ulps
// (see tests/optim). Non-finite gradients are not checked here: check the norm first
// (compute_step_scale) and skip the step, or the states fill with inf/NaN.
// Errors: invalid arguments (null buffer with n > 0, unsupported dtype, bad hyperparameters).
Status adam_step(const AdamArgs& args, const Exec& exec = {});

struct NormResult {
  double sum_sq = 0.0;  // sum of squares of the values read, accumulated in double
  // false when any value was inf or NaN (then sum_sq is inf or NaN): loss-scale overflow.
  bool finite = true;
};

// Sum of squares of n gradients of type dtype (any of the three).
Result<NormResult> grad_norm_sq(const void* grad, DType dtype, size_t n, const Exec& exec = {});

// dst[i] = convert(src[i]) (RNE when narrowing; any pair of the three types, in place not
// allowed), returning the sum of squares of the src values in the same pass: the pass that
// receives gradients (e.g. bf16 from the device into an fp32 accumulation buffer) also yields
// their norm, so the step needs no separate norm pass. compute_norm=false skips the sum.
Result<NormResult> convert_with_norm(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n,
                                     bool compute_norm = true, const Exec& exec = {});

// Gradient accumulation that also yields the norm: acc[i] = (first ? 0 : acc[i]) + float(src[i])
// over [0, n), and for every kChunkElems chunk c of [0, n) the sum of squares (double) of the
// new acc values in partials[c] (partials holds ceil(n / kChunkElems) entries). The caller sums
// the partials of all its chunks in one fixed order, so the norm of a buffer accumulated in
// pieces (whose starts are multiples of kChunkElems) has the same bits as one accumulated
// whole: no pass over the gradients is needed just for the norm. An inf/NaN shows as a
// non-finite partial. acc and src must not overlap.
Status accumulate_with_norm(float* acc, const void* src, DType src_dtype, size_t n, bool first,
                            double* partials, const Exec& exec = {});
inline size_t norm_chunks(size_t n) { return (n + kChunkElems - 1) / kChunkElems; }

// data[i] *= scale in place (the "scale" pass of an unfused step; kept for comparison).
Status scale_in_place(void* data, DType dtype, size_t n, float scale, const Exec& exec = {});

// What to multiply gradients by this step, from their global sum of squares (of the loss-scaled
// gradients, over all shards and ranks).
struct StepScale {
  bool overflow = false;    // inf/NaN gradients: skip the step, lower the loss scale
  double grad_norm = 0.0;   // of the unscaled gradients
  float clip_coef = 1.0f;   // max_grad_norm / (grad_norm + 1e-6) when above the limit, else 1
  float grad_scale = 1.0f;  // clip_coef / loss_scale: AdamStep::grad_scale
};
// max_grad_norm <= 0 disables clipping. loss_scale must be > 0.
StepScale compute_step_scale(const NormResult& norm, float loss_scale, float max_grad_norm);

struct AdamResult {
  bool skipped = false;  // overflow: nothing written, group.step unchanged
  StepScale scale;
};
// Norm pass + fused Adam pass for one shard: grad_norm_sq, compute_step_scale, and when the
// gradients are finite ++group.step and adam_step. Buffers are untouched on overflow.
Result<AdamResult> adam_full_step(AdamGroup& group, const AdamBuffers& buf, float loss_scale,
                                  float max_grad_norm, const Exec& exec = {});

// Memory-bound yardstick with adam_step's exact access pattern for `buf` (reads p, g, m, v;
// writes p, m, v and param_out when set) and trivial integer arithmetic (it adds a zero the
// compiler cannot see, so p, g, m, v keep their values; param_out gets p's low 16 bits).
// For benchmarks: the roofline a fused kernel is measured against.
Status roofline_pass(const AdamBuffers& buf, const Exec& exec = {});

}  // namespace zoe::optim
