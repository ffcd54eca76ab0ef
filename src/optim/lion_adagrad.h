// CPU Lion and Adagrad over offloaded shards: one fused pass per step, beside AdamW (adam.h).
//
// THE API THE ENGINE CALLS, per shard or swapped-in chunk, like adam_step():
//   lion_step(LionArgs{buf, params, step}, exec)        buf.state is Lion's momentum m
//   adagrad_step(AdagradArgs{buf, params, step}, exec)  buf.state is Adagrad's sum of g^2
// Each is one pass over memory that reads p (fp32 master), g (fp32, bf16 or fp16: the compute
// dtype, as adam_step takes it) and the one state (fp32 or bf16), and writes p, the state and,
// when buf.param_out is set, a bf16/fp16 copy of the new p for the compute parameters.
// AdamStep::grad_scale (1/loss_scale x clip coefficient, from compute_step_scale() over the
// gradient norm) multiplies every gradient inside the pass; AdamStep::step counts updates
// (1-based) and only seeds stochastic rounding: neither optimizer has bias correction. As with
// adam_step, non-finite gradients are not checked here: check the norm first and skip the step.
//
// SAME BITS EVERYWHERE. Every kernel has an AVX-512, an AVX2 and a scalar version picked at run
// time (exec.simd, or active_simd_level()). Unlike adam_step, whose fast paths use FMA, all three
// compute the same sequence of correctly rounded fp32 operations (mul, add, sub, div, sqrt; no
// FMA: each unit is compiled with -ffp-contract=off) and round 16-bit values in integer code,
// so the three paths give the same bits, equal to the plain reference's
// (lion_adagrad_reference.h) for the same constants. The work is split into kChunkElems chunks
// whose boundaries do not depend on the thread count: the same bits for any number of threads.
//
// LION (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", arXiv 2302.06675,
// Algorithm 2, decoupled weight decay), per element:
//   g = grad * grad_scale
//   c = b1*m + (1-b1)*g
//   p = p*(1 - lr*wd) - lr*sign(c)        sign(0) = 0, as torch.sign and lion-pytorch
//   m = b2*m + (1-b2)*g
// (lr*sign(c) is +lr, -lr or +0; where c is inf or NaN, p becomes NaN so that the overflow
// shows: torch.sign gives NaN for a NaN c only.)
// DeepSpeed's DeepSpeedCPULion (csrc/includes/cpu_lion.h) computes the same update but takes
// -copysign(lr, c), so where c is exactly 0 it still moves p by -lr (or +lr for c = -0); and
// it fuses the multiply-adds (FMA). Its defaults (deepspeed/ops/lion/cpu_lion.py, also what
// its engine uses for optimizer.type "lion"): lr 1e-3, betas (0.9, 0.999), weight_decay 0.
// lion-pytorch's defaults differ: lr 1e-4, betas (0.9, 0.99). LionParams follows DeepSpeed.
//
// ADAGRAD (Duchi et al. 2011; torch.optim.Adagrad with lr_decay 0 and initial_accumulator_value
// 0, the only ones DeepSpeed's DeepSpeedCPUAdagrad has), per element:
//   g = grad * grad_scale;  g = g + wd*p  (L2, only when wd > 0, as torch and DeepSpeed)
//   sum = sum + g*g
//   p = p - (lr*g) / (sqrt(sum) + eps)
// This is torch's operation order (addcmul_, sqrt().add_(eps), then addcdiv_(value=-lr), which
// computes p + (-lr*g)/std): the first step from a zero sum (wd = 0, grad_scale = 1) has torch
// 2.15's CPU bits. Later sums differ in the last bit: torch's CPU addcmul_ rounds sum + g*g
// once (FMA), zoe rounds g*g first; its L2 term g.add(p, alpha=wd) may fuse as well.
// DeepSpeed computes p + (g/std)*(-lr) with FMA, and sum with an FMA. DeepSpeed's defaults
// (deepspeed/ops/adagrad/cpu_adagrad.py): lr 1e-2, eps 1e-10, weight_decay 0; torch's are the
// same. AdagradParams follows them.
//
// STATES. state_dtype kF32, or kBF16: the state is rounded to bf16 after each update (to
// nearest even, or stochastically with params.stochastic_rounding: the low 16 bits of
// ref::sr_hash(seed, index_base + i), seed from (sr_seed, step)). The update itself always
// uses the unrounded new state, as adam_step does.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "optim/adam.h"
#include "optim/kernels.h"
#include "zoe/status.h"

namespace zoe::optim {

// Hyperparameters of a Lion parameter group; the DeepSpeed config's optimizer.params keys in
// comments, defaults DeepSpeed's.
struct LionParams {
  float lr = 1e-3f;                  // "lr"
  float beta1 = 0.9f;                // "betas"[0]: the interpolation that gives the update's sign
  float beta2 = 0.999f;              // "betas"[1]: the momentum's decay
  float weight_decay = 0.0f;         // "weight_decay": decoupled, p *= 1 - lr*wd
  bool stochastic_rounding = false;  // bf16 state only: round m stochastically (zoe's own)
  uint64_t sr_seed = 0;
};

// Hyperparameters of an Adagrad parameter group; the DeepSpeed config's keys, its defaults.
struct AdagradParams {
  float lr = 1e-2f;                  // "lr"
  float eps = 1e-10f;                // "eps": added to sqrt(sum)
  float weight_decay = 0.0f;         // "weight_decay": L2, g += wd*p
  bool stochastic_rounding = false;  // bf16 state only: round the sum stochastically (zoe's own)
  uint64_t sr_seed = 0;
};

// The memory of one shard (or chunk of one). Pointers need no particular alignment; the buffers
// must not overlap.
struct OneStateBuffers {
  size_t n = 0;
  float* param = nullptr;  // fp32 master parameters, updated in place
  const void* grad = nullptr;
  DType grad_dtype = DType::kF32;
  void* state = nullptr;                 // Lion: m (exp_avg); Adagrad: the sum (torch's "sum")
  DType state_dtype = DType::kF32;       // kF32 or kBF16
  void* param_out = nullptr;             // optional: updated params also written here ...
  DType param_out_dtype = DType::kBF16;  // ... as kBF16 or kF16 (RNE)
  // Global index of element 0, a multiple of 16: stochastic rounding hashes index_base + i, so a
  // shard's bits do not depend on how the parameter was split. Unused otherwise.
  uint64_t index_base = 0;
};

struct LionArgs {
  OneStateBuffers buf;
  LionParams params;
  AdamStep step;  // step (>= 1) and grad_scale
};

struct AdagradArgs {
  OneStateBuffers buf;
  AdagradParams params;
  AdamStep step;
};

// Constants of one step, computed in double and rounded to float once, shared by the kernels
// and the reference. Errors: step < 1; Lion: betas outside [0, 1); Adagrad: eps <= 0; lr < 0,
// weight_decay < 0, or a non-finite value (the message names the DeepSpeed key).
using OneStateConstants = kern::OneStateConstants;
Result<OneStateConstants> make_lion_constants(const LionParams& params, const AdamStep& step,
                                              uint64_t index_base = 0);
Result<OneStateConstants> make_adagrad_constants(const AdagradParams& params, const AdamStep& step,
                                                 uint64_t index_base = 0);

// One fused Lion / Adagrad pass over buf (formulas above), in kChunkElems chunks on exec's pool
// at exec's SIMD level; exec.hw_bf16 is not used (16-bit rounding is always in integer code),
// exec.stream_param_out as in adam_step. Errors: invalid arguments (null buffer with n > 0,
// unsupported dtype, param_out fp32, index_base not a multiple of 16, bad hyperparameters).
Status lion_step(const LionArgs& args, const Exec& exec = {});
Status adagrad_step(const AdagradArgs& args, const Exec& exec = {});

// Memory-bound yardstick with the exact streams of lion_step / adagrad_step on `buf` (reads p,
// g, state; writes p, state and param_out when set) and trivial integer arithmetic: values are
// unchanged except param_out. For benchmarks.
Status one_state_roofline_pass(const OneStateBuffers& buf, const Exec& exec = {});

}  // namespace zoe::optim
