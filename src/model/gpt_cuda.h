// GptCuda: the reference GPT's forward and backward on a GPU (matrix products through cuBLAS).
//
// The same model, call order and semantics as GptCpu (model/gpt.h): pre-LayerNorm blocks with
// causal multi-head attention and a tanh-GELU MLP of width 4d, a final LayerNorm, the head tied to
// wte, the mean cross-entropy over positions whose target is >= 0; backward functions *add* into
// the gradient buffers. The differences:
//   * parameter and gradient pointers are device memory (fp32), one per parameter in gpt.h's
//     order, passed as host arrays of device pointers; tokens and targets are host arrays (copied
//     in, checked on the host like GptCpu does);
//   * activations live in device memory (one allocation made by create());
//   * every call enqueues its work on the model's own stream and returns; head_forward() waits
//     for it (it returns the loss) and logits() copies to the host and waits. The stream is a
//     blocking one (ordered with the legacy default stream, so plain cudaMemcpy/cudaMemset of the
//     parameters are ordered with the model's work); callers that touch the parameters or
//     gradients from non-blocking streams order themselves with stream();
//   * a CUDA or cuBLAS failure does not abort: the first one is kept (status()), later calls do
//     nothing, head_forward returns NaN. Check status() or synchronize() after a step.
// Matrix products are fp32 cuBLAS (CUBLAS_DEFAULT_MATH: no TF32); the other kernels are plain:
// one block per row for LayerNorm, softmax and log-sum-exp, one thread per column for column
// sums, so every result is the same from run to run on one GPU. Results agree with GptCpu to
// fp32 rounding (different summation orders), not bit for bit.
// Not thread-safe: one caller at a time. Calls out of order abort through ZOE_CHECK, as in GptCpu.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "model/gpt.h"
#include "zoe/status.h"

namespace zoe::model {

class GptCuda {
 public:
  // batch sequences of tokens_per_seq (<= c.seq) tokens per micro-batch, on GPU device_ordinal.
  // Errors: the config's and the shape's as GptCpu::create; kUnsupported when no GPU is present
  // (with the runtime's reason); kInvalidArgument for an ordinal out of range; kOutOfBudget when
  // the activations do not fit in device memory; other CUDA/cuBLAS failures name the call.
  static Result<std::unique_ptr<GptCuda>> create(const GptConfig& c, int batch, int tokens_per_seq,
                                                 int device_ordinal = 0);
  virtual ~GptCuda() = default;

  // Forward. tokens: host, batch x T ids (< vocab). Params: device pointers.
  virtual void embed_forward(const int32_t* tokens, const float* const* embed_params) = 0;
  virtual void block_forward(int layer, const float* const* block_params) = 0;
  // Final LayerNorm, the tied head and the mean cross-entropy against targets (host, batch x T;
  // < 0 ignored). Waits for the stream. NaN once status() is an error.
  virtual float head_forward(const float* const* final_params, const float* const* embed_params,
                             const int32_t* targets) = 0;
  // A host copy of the logits of the last head_forward (batch x T x vocab); waits for the stream.
  // Valid until the next call.
  virtual const float* logits() const = 0;

  // Backward, in reverse order; gradients (device pointers) are added to.
  virtual void head_backward(const float* const* final_params, const float* const* embed_params,
                             float* const* final_grads, float* const* embed_grads) = 0;
  virtual void block_backward(int layer, const float* const* block_params, float* const* block_grads) = 0;
  virtual void embed_backward(float* const* embed_grads) = 0;

  // Device bytes of activations and backward scratch kept for one micro-batch.
  virtual size_t activation_bytes() const = 0;
  virtual int device_ordinal() const = 0;
  // The cudaStream_t every call enqueues on.
  virtual void* stream() const = 0;
  // The first CUDA/cuBLAS error met so far (OK when none). Errors of kernels themselves show up
  // once the stream has been waited for (head_forward, logits, synchronize).
  virtual Status status() const = 0;
  // Waits for the stream; returns status().
  virtual Status synchronize() = 0;
};

}  // namespace zoe::model
