// The reference GPT (decoder-only transformer) that `zoe train` runs through the engine, and
// its CPU forward/backward kernels.
//
// Architecture: token + position embeddings; `layers` pre-LayerNorm blocks, each
//   x = x + proj(attn(ln1(x)))   causal multi-head self-attention, heads = d_model / head_dim
//   x = x + fc2(gelu(fc1(ln2(x)))) MLP of width 4 * d_model, tanh-approximated GELU
// a final LayerNorm, and a head tied to the token embedding (logits = lnf(x) . wte^T), with
// the mean cross-entropy over every position as the loss.
//
// Engine modules, in forward order (the parameter order inside each module is fixed):
//   0          "embed":   wte [vocab, d], wpe [seq, d]
//   1..layers  "block.i": ln1_g [d], ln1_b [d], qkv_w [3d, d], qkv_b [3d], proj_w [d, d],
//                         proj_b [d], ln2_g [d], ln2_b [d], fc1_w [4d, d], fc1_b [4d],
//                         fc2_w [d, 4d], fc2_b [d]
//   layers+1   "final":   lnf_g [d], lnf_b [d]
// Weights are row-major [out, in]: y = x W^T + b. The embed module is used twice per step
// (embedding lookup and the tied head); its gradients from both are summed.
//
// GptCpu keeps the activations of one micro-batch (batch x seq tokens) on the host between the
// forward and the backward pass (with activation checkpointing, one block's and the block inputs
// the caller hands back: GptKernels::checkpointing()). Parameters and gradients are passed as fp32 pointers,
// one per parameter in the order above. Matrix products go through BLAS (cblas_sgemm); the other kernels are
// parallel over rows. Backward functions *add* into the gradient buffers (the caller zeroes).
//
// Determinism: every result is bit-identical whatever `threads` is. Work is cut into pieces whose
// boundaries depend only on the shapes (never on the thread count), each piece is computed by one
// thread, and no sum is split across threads. OpenBLAS is set to one thread for the process
// (openblas_set_num_threads(1)) when a GptCpu is created: our own loops supply the parallelism.
// Not thread-safe: one caller at a time per GptCpu. Calls go in order (embed, blocks 0..L-1, head,
// then head, blocks L-1..0, embed backward; a new embed_forward may start over at any point, e.g.
// for evaluation); a call out of order aborts through ZOE_CHECK, since the backward keeps one
// running residual gradient between calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zoe/status.h"

namespace zoe::model {

// Index of each parameter inside a "block.i" module (the order documented above).
enum BlockParam : size_t {
  kLn1G,
  kLn1B,
  kQkvW,
  kQkvB,
  kProjW,
  kProjB,
  kLn2G,
  kLn2B,
  kFc1W,
  kFc1B,
  kFc2W,
  kFc2B,
  kBlockParams  // how many
};

struct GptConfig {
  int vocab = 256;
  int seq = 64;  // the longest sequence the model handles (wpe rows)
  int d_model = 128;
  int heads = 4;
  int layers = 4;

  Status validate() const;  // d_model % heads == 0, all positive, ...
  // Parameters in all.
  uint64_t num_params() const;
};

// The named model sizes of `zoe train --preset` (and `zoe plan`, `zoe ckpt consolidate`).
struct GptPreset {
  const char* name;
  int layers, d_model, heads, context;
};
const std::vector<GptPreset>& gpt_presets();
// The preset called `name`, or nullptr; *names (when given) lists them all, comma-separated.
const GptPreset* find_gpt_preset(const std::string& name, std::string* names = nullptr);

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  size_t numel() const;
};
struct ModuleSpec {
  std::string name;
  std::vector<TensorSpec> params;
};
// The engine modules of the model, in forward order.
std::vector<ModuleSpec> gpt_modules(const GptConfig& c);

// Deterministic initial value of every element (GPT-2 style: N(0, 0.02) weights, residual
// projections scaled by 1/sqrt(2 * layers), zero biases, unit LayerNorm gains), from `seed`.
// Element i of the tensor depends only on (seed, module, param, i): a splitmix64 counter hash
// turned into a normal by Box-Muller (core/init_normal.h: the same values on every SIMD level and
// CPU), so any shard can be initialised on its own.
void gpt_init(const GptConfig& c, uint64_t seed, size_t module, size_t param, float* data, size_t n);
// Elements [first, first + n) of the same tensor (for a shard); gpt_init is first = 0.
void gpt_init_range(const GptConfig& c, uint64_t seed, size_t module, size_t param, uint64_t first,
                    float* data, size_t n);

// The kernel set the CPU model's numbers depend on: zoe's SIMD level (the optimizer's dispatch,
// core/cpu.h) and the BLAS core type OpenBLAS chose (by CPU, and by OPENBLAS_CORETYPE when set).
// Two runs on the CPU device give bit-identical losses when both agree; with another kernel set
// they agree to rounding only (a GEMM sums in another order).
struct CpuKernelSet {
  std::string simd;  // "avx512", "avx2" or "scalar"
  std::string blas;  // e.g. "openblas SkylakeX", "openblas Haswell"
  std::string key() const { return simd + "/" + blas; }
};
CpuKernelSet cpu_kernel_set();

// Host bytes GptCpu allocates for one micro-batch (activations and backward scratch, the sizes of
// its constructor), in double so that an absurd shape cannot wrap. With checkpointing, the model's
// own bytes: one block's workspace, not every block's (the block inputs, checkpoint_bytes_estimate
// in all, are in the engine's activation store).
double activation_bytes_estimate(const GptConfig& c, int batch, int T, bool checkpointing = false);
// With checkpointing, the bytes of the block inputs one micro-batch keeps: layers x batch x T x
// d_model x 4 (what the activation store holds, wherever it places them).
double checkpoint_bytes_estimate(const GptConfig& c, int batch, int T);

// The model's forward and backward kernels, whatever runs them (GptCpu: host memory; GptCuda in
// model/gpt_cuda.h: device memory). Parameters and gradients are fp32, one pointer per parameter
// in the order above, in the implementation's memory; tokens and targets are host arrays.
class GptKernels {
 public:
  virtual ~GptKernels() = default;

  // Forward. tokens: batch x T token ids (< vocab). params: the module's parameter pointers.
  virtual void embed_forward(const int32_t* tokens, const float* const* embed_params) = 0;
  virtual void block_forward(int layer, const float* const* block_params) = 0;
  // Final LayerNorm and the tied head; returns the mean cross-entropy against targets
  // (batch x T ids; a target < 0 is ignored). embed_params supplies wte.
  virtual float head_forward(const float* const* final_params, const float* const* embed_params,
                             const int32_t* targets) = 0;
  // The logits of the last head_forward (batch x T x vocab, host memory), for evaluation and
  // generation.
  virtual const float* logits() const = 0;

  // Backward, in reverse order: head (grads of final, and wte of embed), blocks, embedding.
  // Gradients are added to.
  virtual void head_backward(const float* const* final_params, const float* const* embed_params,
                             float* const* final_grads, float* const* embed_grads) = 0;
  virtual void block_backward(int layer, const float* const* block_params, float* const* block_grads) = 0;
  virtual void embed_backward(float* const* embed_grads) = 0;

  // Bytes of activations the model holds for one micro-batch (with the backward scratch buffers),
  // in the implementation's memory. With checkpointing, the block inputs the caller keeps are not
  // included (checkpoint_bytes() each, layers of them).
  virtual size_t activation_bytes() const = 0;

  // Activation checkpointing (a model created with it on). The model then holds the residual
  // stream entering the current block and the final one, and the intermediates of one block (a
  // workspace every block reuses), not every block's. Each block's input is the caller's to keep
  // (in the engine's activation store, zoe/activations.h):
  //   forward:  copy checkpoint_input(l) away, then block_forward(l)
  //   backward: copy the saved input back into checkpoint_input(l), then block_backward(l), which
  //             recomputes the block's intermediates from it (the same kernels in the same order
  //             as the forward) and runs the block's backward.
  // Losses and gradients are bit-identical to the model without checkpointing. The reference
  // GPT has no dropout and nothing random in its forward, so the recompute has no RNG state to
  // replay (the PyTorch front-end saves and restores it for models with dropout).
  virtual bool checkpointing() const = 0;
  // Where block `layer`'s input lies (batch x T x d_model floats, the implementation's memory):
  // in the forward before block_forward(layer), in the backward (where the caller writes it
  // back) before block_backward(layer). Calling it out of that order, or without checkpointing,
  // aborts through ZOE_CHECK; block_backward(layer) aborts when checkpoint_input(layer) was not
  // asked for first in the backward.
  virtual float* checkpoint_input(int layer) = 0;
  // Bytes of one block's input: batch x T x d_model x 4.
  virtual size_t checkpoint_bytes() const = 0;
};

// What GptCpu's block_forward and block_backward tell their caller, so that it can hold fewer fp32
// copies of a block's tensors at once: the caller may give several parameters (or several
// gradients) the same memory, fill a parameter only when it is needed, and take each gradient
// away as soon as it is complete. Called on the thread that called the block function.
class BlockTensorHooks {
 public:
  virtual ~BlockTensorHooks() = default;
  // The block function is about to read parameter p (a BlockParam): its pointer's memory must
  // hold its values until the next need() of a parameter sharing that memory. Parameters read
  // together (a weight and its bias, a LayerNorm's gain and bias) are each needed first, so they
  // must not share memory; no two weights are read together.
  virtual void need(size_t p) = 0;
  // block_backward has finished adding to gradient p: it neither reads nor writes it again in
  // this call, so its memory may be taken (and zeroed) for another gradient.
  virtual void grad_done(size_t p) = 0;
};

class GptCpu : public GptKernels {
 public:
  // The hooks block_forward and block_backward call from now on (nullptr: none; not owned).
  virtual void set_block_hooks(BlockTensorHooks* hooks) = 0;
  // batch sequences of `tokens_per_seq` (<= c.seq) tokens per micro-batch; threads 0: all cores;
  // checkpointing: activation checkpointing (GptKernels::checkpointing()).
  static Result<std::unique_ptr<GptCpu>> create(const GptConfig& c, int batch, int tokens_per_seq,
                                                int threads = 0, bool checkpointing = false);
  // Threads the kernels run on: the one asked for, at most the host's cores.
  virtual int threads() const = 0;
};

}  // namespace zoe::model
