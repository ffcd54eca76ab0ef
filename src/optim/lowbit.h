// Low-bit optimizer states (8-bit and 4-bit blockwise m and v), a bf16 master, and the fused CPU
// AdamW pass that updates them: formats, byte counts, the tiling rule, the step, conversions.
//
// FORMATS (zoe.optimizer_states): "fp32", "bf16" (m and v as floats), "int8", "int4" (blockwise
// quantized). A packed state is a sequence of blocks, each [scale][codes]:
//
//   int8: blocks of 256 elements, 260 bytes: bytes [0, 4) the scale (fp32, little-endian), byte
//         4 + e the code of element e of the block.
//   int4: blocks of 128 elements, 68 bytes: bytes [0, 4) the scale, then element e in byte
//         4 + e/2, the low nibble for even e, the high nibble for odd e.
//   The last block of a buffer of n elements holds r = n mod B elements in 4 + ceil(r*bits/8)
//   bytes (an odd int4 tail leaves the last high nibble zero); state_bytes() counts exactly.
//   All-zero bytes are the zero state in every format (a fresh optimizer's m and v).
//
//   scale = the block's largest |m| (or largest v). Codes, with L the format's top level:
//   m (signed):   q in [-L, L] two's complement (int8 L=127; int4 L=7, a 4-bit field)
//                 m = scale * q*|q| / L^2                      (square-root companding)
//   v (>= 0):     int8: c in [0, 255], v = scale * c^4 / 255^4  (fourth-root companding)
//                 int4: c in [0, 15],  v = scale * c^2 / 225    (square-root companding)
//   Encoding, in fp32 operations (correctly rounded mul, div, sqrt; no FMA), clamped to L:
//     m:       q = round-half-even(sqrt(|m| * a)),       a = L^2 / scale
//     int8 v:  c = round-half-even(sqrt(sqrt(v) * a)),   a = L^2 / sqrt(scale)
//     int4 v:  c = round-half-even(sqrt(v) * a),         a = L / sqrt(scale)
//   a is computed once per block (a = 0 for a zero scale); for an m scale under 2^-64,
//   t = (|m| * 2^64) * (L^2 / (scale * 2^64)) keeps a finite. sqrt(v) is the one the update's
//   denominator takes, so an update costs three square roots (int8; two for int4) and a division.
//   The fused AdamW step (adam_step_lowbit) rounds int4 codes stochastically instead, unbiased in
//   the stored value: with r = sqrt(|m| * a) (v: sqrt(v) * a) and T = r^2 computed as |m| * a (v:
//   (sqrt(v) * a)^2), the code is lo = floor(r), or lo + 1 where u * (2 lo + 1) < (T - lo^2) * 2^16,
//   u the 16 bits of sr_hash(step seed, global element index) the bf16 states use (low half for
//   m, high half for v): reproducible, the same bits at every split. Why: with 7 or 15 levels a
//   step's change of an EMA (1 - beta2 = 0.1% of v; 10% of m) is far below a level's width, so
//   rounding to nearest leaves most codes where they were and v frozen at its first values;
//   unbiased rounding lets the moments move by their expected change. Measured on the Llama of
//   bench/lowbit_hf_quality.py (3 seeds): int4's held-out loss went from 10.5% above fp32's to
//   3.5% below; the int4 pass runs at about 0.75x its former speed (docs/benchmarks.md).
//   Conversions (quantize_state) and the other optimizers' packed states round to nearest.
//   Code 0 of v means exactly 0: a v > 0 always gets c >= 1, and
//   c >= 1 decodes to at least the smallest positive float, so v never comes back as zero where
//   it was not zero (2309.01507's zero-point problem, below).
//
// WHY THESE MAPS AND BLOCKS
//   * Dettmers et al., "8-bit Optimizers via Block-wise Quantization" (arXiv 2110.02861): 8-bit
//     Adam matches 32-bit Adam on language modelling, translation, GLUE and ImageNet only with
//     (a) block-wise absmax normalization, which confines an outlier's damage to one block, and
//     (b) a non-linear ("dynamic") map with fine steps for small magnitudes; linear 8-bit
//     quantization was unstable. They use blocks of 2048.
//   * Li et al., "Memory Efficient Optimizers with 4-bit States" (NeurIPS 2023, arXiv 2309.01507):
//     at 4 bits, blocks of 2048 miss the moments' outlier patterns and blocks of 128 are needed;
//     and v must never quantize to zero where it is not (the update m/sqrt(v) explodes: the
//     "zero-point problem"), so their v map excludes zero (linear (i+1)/16). We keep code 0 for
//     an exact zero only and round every v > 0 up to at least code 1: the same guarantee, and
//     untouched parameters (v == 0, m == 0) stay exactly zero.
//   * Our maps are power companding: m and sqrt(v) have the units of a gradient, and both are
//     stored as the square root of their normalized magnitude (int8 m: sqrt(|m|/s); int8 v:
//     sqrt(sqrt(v/s))), so the relative step is 2/code at every level, like the dynamic map's
//     fine steps near zero, and m and sqrt(v) each span four to five decades per block (int8:
//     1/127^2 and 1/255^2 of the block's largest) where the dynamic map's lowest decades hold
//     one or two codes. Unlike a table map they encode with sqrt and a rounding, exact IEEE
//     operations, so the scalar, AVX2 and AVX-512 paths give the same bits without a search.
//   * Measured once, by a throwaway experiment with one seed (AdamW on noisy quadratics whose
//     curvature spans 3 decades within a block, final loss against fp32 states): int8 blockwise
//     linear diverges (loss x1e5), the dynamic table map with a zero code diverges once v spans
//     more than its 7 decades within a block, these maps do not; int8 blocks of 256 beat 2048
//     (+18% vs +37% loss excess); for int4, the square-root v map beat the fourth-root one on the
//     milder quadratic only. Hence int8: 256-element blocks (scales cost 1.6%: 1.016 bytes per
//     element), int4: 128 (0.531 bytes per element). tests/optim/test_lowbit.cpp's
//     LowbitAdam.CloseToFp32States bounds the states' and parameters' error against fp32 states
//     over 10 steps; the training-quality comparison belongs to the engine's benchmark.
//
// MASTER (zoe.master_weights): "fp32" or "bf16". A bf16 master is updated in fp32 and rounded
// stochastically with 16 bits of sr_hash(seed, global element index) (adam_reference.h), the
// seed being make_adam_constants()'s (sr_seed, step) hash xor kMasterSeedSalt: deterministic,
// unbiased. "fp16" is refused (its 5-bit exponent cannot hold weights and their updates alike).
//
// THE STEP: adam_step_lowbit() runs, per block, two passes in cache: (1) decode m and v, the
// AdamW update in fp32 (no FMA: mul then add, the order of ref::adam_step), the new master
// (rounded when bf16), the new m and v into a block-sized scratch (3 KiB, L1), the block's new
// scales, and the finite check; (2) encode m and v with their new scales, store the master and
// param_out. The parameter update uses the unquantized new m and v (as bitsandbytes does). A
// non-finite new m, v or parameter (or a stored scale that is not finite) fails the step with
// a Status naming the elements, and leaves that block as it was.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/dtype.h"
#include "optim/adam.h"
#include "zoe/status.h"

namespace zoe::optim {

enum class StateFormat : uint8_t { kF32, kBF16, kInt8, kInt4 };
enum class MasterFormat : uint8_t { kF32, kBF16 };

// "fp32", "bf16", "int8", "int4" / "fp32", "bf16".
const char* state_format_name(StateFormat f);
const char* master_format_name(MasterFormat f);
// Errors name the key (zoe.optimizer_states / zoe.master_weights), the value and the choices.
Result<StateFormat> parse_state_format(std::string_view s);
Result<MasterFormat> parse_master_format(std::string_view s);

// Elements per quantization block: 1 (fp32, bf16), 256 (int8), 128 (int4). All divide kChunkElems.
size_t state_block_elems(StateFormat f);
// Bytes of one full block: 4, 2, 260, 68.
size_t state_block_bytes(StateFormat f);
// Exact bytes of one state (m or v) of n elements, partial last block included.
size_t state_bytes(StateFormat f, size_t n);
// Bytes per element of one state, scales included: 4, 2, 1.015625, 0.53125 (the planner's rate).
double state_bytes_per_element(StateFormat f);
double master_bytes_per_element(MasterFormat f);  // 4, 2
// Master + state_count states (AdamW's m and v: 2; Lion's m or Adagrad's sum: 1), as stored, per
// parameter: AdamW fp32/fp32 12, bf16/int8 4.03125, bf16/int4 3.0625; Lion fp32/fp32 8.
double optimizer_state_bytes_per_param(MasterFormat master, StateFormat states, int state_count = 2);
// The tiling rule: a range of a packed state that starts at element `elems` (a chunk's start or
// length, a shard's offset) must be a multiple of the block. Error names zoe.optimizer_states,
// `what` and the block size.
Status check_state_tiling(StateFormat f, size_t elems, const char* what);
inline constexpr uint32_t kMasterSeedSalt = 0x9e3779b9u;

struct LowbitBuffers {
  size_t n = 0;
  void* param = nullptr;  // the master: n floats, or n bf16 values (uint16)
  MasterFormat master = MasterFormat::kF32;
  const void* grad = nullptr;
  DType grad_dtype = DType::kF32;
  void* exp_avg = nullptr;     // m: state_bytes(states, n) bytes
  void* exp_avg_sq = nullptr;  // v: likewise
  StateFormat states = StateFormat::kInt8;
  void* param_out = nullptr;  // optional compute copy, kBF16 or kF16 (RNE of the stored master)
  DType param_out_dtype = DType::kBF16;
  // Global index of element 0 (a multiple of 16): the rounding hashes use base + i, so a
  // shard's bits do not depend on how the parameter was split.
  uint64_t index_base = 0;
};

struct LowbitAdamArgs {
  LowbitBuffers buf;
  AdamParams params;  // stochastic_rounding applies to bf16 states; sr_seed to every rounding
  AdamStep step;
};

// One fused AdamW (or Adam-L2) pass over buf, in kChunkElems chunks on exec's pool, at exec's
// SIMD level: the same bits at every level and thread count. exec.hw_bf16 and
// exec.stream_param_out are not used. For fp32/bf16 states with an fp32 master it computes the
// formulas of adam_step() without FMA (adam_step's bits are the ones existing runs resume with).
// Errors: invalid arguments (as adam_step, plus index_base); a non-finite result or stored scale
// (kInvalidArgument / kCorruption) naming the first failing block's elements, which keep their
// old values (other blocks may already hold the new ones).
Status adam_step_lowbit(const LowbitAdamArgs& args, const Exec& exec = {});

enum class StateKind : uint8_t { kExpAvg, kExpAvgSq };  // m (signed), v (>= 0)

// dst (state_bytes(f, n) bytes) = src (n floats) in format f. Fails on inf/NaN (and on a
// negative v), writing no block that holds one.
Status quantize_state(StateKind kind, StateFormat f, const float* src, void* dst, size_t n,
                      const Exec& exec = {});
// dst (n floats) = the values src (format f) stands for. Fails on a non-finite stored scale.
Status dequantize_state(StateKind kind, StateFormat f, const void* src, float* dst, size_t n,
                        const Exec& exec = {});

}  // namespace zoe::optim
