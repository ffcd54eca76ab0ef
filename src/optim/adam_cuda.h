// GPU Adam/AdamW and gradient norms over device buffers: the CUDA versions of adam.h's kernels.
//
// Same contracts as the CPU kernels in adam.h, element for element:
//   * adam_step: the reference's operations in the reference's order, each rounded on its own
//     (__fmul_rn/__fadd_rn/__fdiv_rn/__fsqrt_rn: never contracted into FMA whatever nvcc's flags),
//     with the constants of make_adam_constants() computed on the host. So a GPU step is meant to
//     give the bits of ref::adam_step (tests allow a few ulps). m/v fp32 or bf16 (RNE, or
//     stochastic with the reference's hash of (seed, step, index)); param_out bf16/fp16 (RNE);
//     conversions are the integer algorithms of core/dtype.h (NaN, inf, subnormals alike).
//   * the norms: squares summed in double over a fixed partition that depends on n only (a grid of
//     norm_blocks(n) blocks of kNormThreads threads, each thread striding over the grid, a fixed
//     tree in each block, then one block summing the block partials in a fixed tree). The result is
//     bit-identical from run to run and across GPUs of one architecture; it differs from the CPU's
//     chunk-ordered sum by rounding only (relative ~1e-13 for 1e6 elements).
//   * finite is false when any value read was inf or NaN (the sum is then inf or NaN).
//
// Every pointer is device memory (cudaMalloc/cudaMallocAsync/managed, or pinned host memory that
// the device can address), aligned to its element size; buffers must not overlap. `stream` is a
// cudaStream_t (nullptr: the legacy default stream). Work is enqueued on it in order:
//   * adam_step only enqueues (asynchronous; errors of the kernel itself surface at the next
//     synchronization of the stream);
//   * the functions returning a NormResult wait for the stream (the host needs the value), using
//     a stream-ordered scratch buffer (cudaMallocAsync) of at most 8 KiB.
// Errors: kInvalidArgument for bad arguments (null or misaligned buffers, a host-only pointer,
// unsupported dtype, bad hyperparameters); a CUDA failure names the call and carries
// cudaGetErrorName/cudaGetErrorString ("cudaMallocAsync: cudaErrorMemoryAllocation (out of
// memory)"), kOutOfBudget for out-of-memory, kUnsupported when no GPU is present, else kIoError.
// Thread-safe: calls keep no state between them.
#pragma once

#include <cstddef>

#include "core/dtype.h"
#include "optim/adam.h"
#include "zoe/status.h"

namespace zoe::optim::cuda {

// Threads per block of every kernel here.
inline constexpr int kThreads = 256;
// The norm's partition: norm_blocks(n) blocks of kNormThreads threads, one block per
// kNormElemsPerBlock elements, at most kNormMaxBlocks (the second level is one block reading
// <= 1024 partials).
inline constexpr int kNormThreads = 256;
inline constexpr size_t kNormElemsPerBlock = size_t(kNormThreads) * 16;
inline constexpr int kNormMaxBlocks = 1024;
constexpr int norm_blocks(size_t n) {
  size_t b = (n + kNormElemsPerBlock - 1) / kNormElemsPerBlock;
  return b == 0 ? 1 : b > size_t(kNormMaxBlocks) ? kNormMaxBlocks : static_cast<int>(b);
}

// One fused Adam/AdamW pass over args.buf (device pointers), as optim::adam_step. Enqueued on
// `stream`; returns once enqueued.
Status adam_step(const AdamArgs& args, void* stream);

// Sum of squares of n values of `dtype` (as optim::grad_norm_sq). Waits for `stream`.
Result<NormResult> grad_norm_sq(const void* grad, DType dtype, size_t n, void* stream);

// dst[i] = convert(src[i]) (RNE when narrowing), returning the sum of squares of the src values
// when compute_norm (as optim::convert_with_norm; src != dst). Waits for `stream`.
Result<NormResult> convert_with_norm(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n,
                                     bool compute_norm, void* stream);

// Gradient accumulation over micro-batches, fused with the norm:
//   acc[i] = (first ? 0 : acc[i]) + float(g[i])
// (first: acc[i] = float(g[i]) exactly; acc's old contents are never read, so it may hold garbage)
// returning the sum of squares of the new acc values (fp32 values, summed in double).
// Waits for `stream`.
Result<NormResult> accumulate_with_norm(float* acc, const void* g, DType g_dtype, size_t n, bool first,
                                        void* stream);

}  // namespace zoe::optim::cuda
