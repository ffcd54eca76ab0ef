// Export of a checkpoint of zoe's reference GPT (src/model/gpt.h) to the Hugging Face GPT-2
// layout: DIR/model.safetensors with GPT2LMHeadModel's parameter names and Conv1D layouts, and
// DIR/config.json, so that transformers' GPT2LMHeadModel.from_pretrained(DIR) loads it.
//
// Names and layouts (zoe's weights are [out, in] with y = x W^T + b; Conv1D's are [in, out] with
// y = x W + b, so every matrix of a block is transposed; the embeddings are not):
//   embed.wte [V, d]           -> transformer.wte.weight [V, d]   (the head is tied to it)
//   embed.wpe [P, d]           -> transformer.wpe.weight [P, d]
//   block.N.ln1_g / ln1_b      -> transformer.h.N.ln_1.weight / .bias
//   block.N.qkv_w [3d, d]      -> transformer.h.N.attn.c_attn.weight [d, 3d]  (q | k | v columns,
//                                 head h at columns h * d/heads of each, as GPT-2 splits them)
//   block.N.qkv_b [3d]         -> transformer.h.N.attn.c_attn.bias
//   block.N.proj_w [d, d]      -> transformer.h.N.attn.c_proj.weight [d, d] (transposed)
//   block.N.proj_b             -> transformer.h.N.attn.c_proj.bias
//   block.N.ln2_g / ln2_b      -> transformer.h.N.ln_2.weight / .bias
//   block.N.fc1_w [4d, d]      -> transformer.h.N.mlp.c_fc.weight [d, 4d]
//   block.N.fc1_b [4d]         -> transformer.h.N.mlp.c_fc.bias
//   block.N.fc2_w [d, 4d]      -> transformer.h.N.mlp.c_proj.weight [4d, d]
//   block.N.fc2_b [d]          -> transformer.h.N.mlp.c_proj.bias
//   final.lnf_g / lnf_b        -> transformer.ln_f.weight / .bias
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"

namespace zoe::ckpt {

// The model's dimensions, read from a manifest's module shapes (heads are not in them).
struct GptDims {
  int vocab = 0;
  int n_positions = 0;
  int n_embd = 0;
  int n_layer = 0;
};

// Checks that the manifest holds zoe's reference GPT: modules "embed", "block.0" ..
// "block.<L-1>", "final" in that order, each with the parameters (names, order, shapes) of
// src/model/gpt.h for one d, vocab and number of positions. Errors are kInvalidArgument naming
// the checkpoint, the module, the parameter and the shape found against the one expected.
Result<GptDims> gpt_dims(const Manifest& m, const std::string& where);

// config.json for the export: model_type gpt2, the dimensions, n_head, gelu_new, zoe's
// LayerNorm epsilon, tied embeddings, no dropout.
nlohmann::json hf_gpt2_config(const GptDims& dims, int n_head, const std::string& dtype);

struct HfGpt2Options {
  int n_head = 0;              // required: attention heads (must divide n_embd)
  std::string dtype = "fp32";  // fp32 | bf16 | fp16
  size_t piece_bytes = 64u << 20;
};

// Writes out_dir/model.safetensors (through write_safetensors: every byte checksummed on the
// way, bounded memory, atomic) and out_dir/config.json (atomic). out_dir is created when missing
// (its parent must exist); a path that exists and is not a directory is kInvalidArgument.
Status export_hf_gpt2(const Reader& r, const std::string& out_dir, const HfGpt2Options& o);

}  // namespace zoe::ckpt
