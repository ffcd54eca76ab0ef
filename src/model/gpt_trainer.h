// GptTrainer: the reference GPT (model/gpt.h) trained through zoe's public engine API, one
// micro-batch at a time: every module gathered for its forward and backward (scoped), its fp32
// gradients written in the compute dtype with the loss scale and reduced. `zoe train` is a thin
// CLI over it; it is written only against include/zoe/ (it needs no engine internals), as a
// user's own trainer would be.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "zoe/activations.h"
#include "zoe/zoe.h"

namespace zoe::model {

// Registers the GPT's modules (gpt_modules(c), in forward order) with the engine.
Status add_gpt_modules(Engine& e, const GptConfig& c);

// Not thread-safe (like the Engine and GptCpu it drives). The engine must hold gpt_modules(c) in
// that order, initialized; the model was created for micro-batches of T tokens.
//
// Activation checkpointing (a model created with it: GptKernels::checkpointing()): the trainer
// keeps each block's input in the engine's activation store (Engine::activations()). Each
// micro-batch announces its sizes (plan(): layers tensors of checkpoint_bytes()), saves block l's
// input before block l's forward, loads it back before block l's backward (in reverse order, where
// the model recomputes the block), and ends with end_micro_batch(). An evaluation forward saves
// nothing and ends the same way. Nothing is kept across micro-batches, nor across steps.
class GptTrainer {
 public:
  GptTrainer(Engine& e, GptCpu& m, const GptConfig& c, int T);
  ~GptTrainer();

  // One forward pass (evaluation: nothing is kept for a backward); returns the mean loss. Gathers
  // and releases every module.
  Result<float> forward(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets);
  // Forward and backward of one micro-batch, gradients (x the loss scale) reduced into the engine.
  Result<float> forward_backward(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets);
  // The forward and backward of a step's G micro-batches in the layer-major order (zoe.schedule
  // "layer-major"): each module gathered once in the forward and once in the backward, every
  // micro-batch run through it (the head's forward and backward under one gather), and its
  // gradients reduced micro-batch by micro-batch in micro-batch order, as forward_backward()
  // reduces them: the same bits as G forward_backward() calls. models[g] keeps micro-batch g's
  // activations (G models of this trainer's shape; models[0] may be the trainer's own). With
  // checkpointing, the G x layers block inputs go through the activation store as one batch of
  // saves, in the order the backward loads them back. Returns the G losses.
  Result<std::vector<float>> forward_backward_layer_major(const std::vector<std::vector<int32_t>>& tokens,
                                                          const std::vector<std::vector<int32_t>>& targets,
                                                          const std::vector<GptCpu*>& models);
  // Continues `prompt` by n bytes drawn one at a time from the model's next-byte distribution at
  // `temperature` (0: always the most likely byte), from a stream seeded by `seed`: one forward
  // pass of the model's micro-batch (`batch` rows of T) per byte, the context being the last T
  // bytes. Deterministic for a seed, and the same on every rank (the weights are); a collective
  // call under several ranks, like forward(). Returns the n new bytes.
  Result<std::string> sample(const std::string& prompt, int n, double temperature, uint64_t seed, int batch);

 private:
  // fp32 views of a module's parameters: the buffers themselves (fp32 and host-addressable) or a
  // converted copy in `scratch`.
  Result<std::vector<const float*>> as_f32(const ModuleParams& p, std::vector<float>* scratch);
  // fp32 gradient buffers for module m (zeroed).
  void reset_grads(size_t m, std::vector<float>* data, std::vector<float*>* ptrs) const;
  // Writes fp32 gradients (x scale) into module m's engine gradient buffers and reduces them.
  Status store_and_reduce(size_t m, const std::vector<float*>& g, double scale);
  // The forward; with `keep` and checkpointing, each block's input saved in the store (ids_).
  Result<float> forward_pass(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                             bool keep);
  // The backward of the head, the blocks (each block's input loaded back first with
  // checkpointing) and the embedding.
  Status backward_pass();
  Status block_backward(size_t layer, double scale);
  // forward_backward_layer_major's phases: the embedding and the blocks' forward; the head's
  // forward and backward; the blocks' and the embedding's backward.
  Status layer_major_forward(const std::vector<std::vector<int32_t>>& tokens,
                             const std::vector<GptCpu*>& models);
  Result<std::vector<float>> layer_major_head(const std::vector<std::vector<int32_t>>& targets,
                                              const std::vector<GptCpu*>& models, double scale);
  Status layer_major_backward(const std::vector<GptCpu*>& models, double scale);

  // A block's fp32 tensors for the model (its BlockTensorHooks): the weights one at a time.
  class BlockTensors;

  Engine& e_;
  GptCpu& m_;
  GptConfig c_;
  int T_;
  std::vector<ModuleSpec> specs_;
  std::vector<float> scratch_, scratch2_;
  std::vector<float> g_embed_, g_;
  std::vector<float*> g_embed_ptrs_, g_ptrs_;
  std::unique_ptr<BlockTensors> block_;  // set as the model's hooks while the trainer lives
  std::vector<ActivationId> ids_;        // checkpointing: the block inputs saved in this micro-batch
  // Layer-major: block l's input of micro-batch g saved at lm_ids_[l][g]; micro-batch g's embedding
  // gradients (from the head, then the embedding) in lm_embed_[g].
  std::vector<std::vector<ActivationId>> lm_ids_;
  std::vector<std::vector<float>> lm_embed_;
};

// The trainer state `zoe train` saves with a checkpoint: {"step", "seed", ...}. Reads step and
// seed (seed left alone when absent); an error names the checkpoint `from` and the field.
Status parse_trainer_state(const std::string& json_text, const std::string& from, int* step, uint64_t* seed);

}  // namespace zoe::model
