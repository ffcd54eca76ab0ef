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
//   * every call enqueues its work on the model's stream and returns; head_forward() waits for it
//     (it returns the loss) and logits() copies to the host and waits. The stream is the caller's
//     when create() is given one (a stream of the caller's device::Device, so compute is ordered
//     with the engine's copies and collectives by that device's events); else the model creates a
//     blocking one of its own (ordered with the legacy default stream, so plain cudaMemcpy/
//     cudaMemset of the parameters are ordered with the model's work). Callers that touch the
//     parameters or gradients from other streams order themselves with stream();
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

// The GptKernels of model/gpt.h on a GPU: parameters, gradients and activations in device
// memory; head_forward waits for the stream (it returns the loss, NaN once status() is an error);
// logits() is a host copy, valid until the next call, and waits for the stream too.
class GptCuda : public GptKernels {
 public:
  // batch sequences of tokens_per_seq (<= c.seq) tokens per micro-batch, on GPU device_ordinal.
  // stream: nullptr (the model creates and destroys its own), or the native handle
  // (device::Stream::native_handle(), a cudaStream_t) of a stream on that GPU that the caller
  // owns and keeps alive as long as the model. checkpointing: activation checkpointing
  // (GptKernels::checkpointing(); checkpoint_input() is device memory, written on stream()).
  // Errors: the config's and the shape's as GptCpu::create; kUnsupported when no GPU is present
  // (with the runtime's reason); kInvalidArgument for an ordinal out of range; kOutOfBudget when
  // the activations do not fit in device memory; other CUDA/cuBLAS failures name the call.
  static Result<std::unique_ptr<GptCuda>> create(const GptConfig& c, int batch, int tokens_per_seq,
                                                 int device_ordinal = 0, void* stream = nullptr,
                                                 bool checkpointing = false);

  virtual int device_ordinal() const = 0;
  // The cudaStream_t every call enqueues on (create()'s stream when it was given one).
  virtual void* stream() const = 0;
  // The first CUDA/cuBLAS error met so far (OK when none). Errors of kernels themselves show up
  // once the stream has been waited for (head_forward, logits, synchronize).
  virtual Status status() const = 0;
  // Waits for the stream; returns status().
  virtual Status synchronize() = 0;
};

}  // namespace zoe::model
