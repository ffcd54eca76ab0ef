// Export of a checkpoint the PyTorch front-end wrote from a Hugging Face transformers model to a
// folder AutoModelForCausalLM.from_pretrained loads: what engine.save_pretrained() writes, from
// the checkpoint alone. The front-end keeps in its trainer state (section "zoe_torch") the model's
// own name of every zoe parameter ("names": "<zoe module>.<param>" -> "model.layers.0.mlp...") and
// the model's config.json and generation_config.json ("hf"); a tied parameter is one zoe
// parameter, written once under the model's first name for it, as transformers keeps it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "checkpoint/checkpoint.h"

namespace zoe::ckpt {

struct HfTorchOptions {
  std::string dtype = "fp32";  // fp32 | bf16 | fp16
  // Above this many bytes of tensors, shards model-0000i-of-0000n.safetensors with
  // model.safetensors.index.json (transformers 5's default: 50 GB = 50e9 bytes).
  uint64_t max_shard_bytes = 50'000'000'000ull;
  size_t piece_bytes = 64u << 20;
};

// Writes out_dir/config.json (the stored config, its dtype the one written),
// generation_config.json (when stored), and the safetensors (through write_safetensors: every
// byte checksummed on the way, bounded memory, each file atomic). out_dir is created when missing
// (its parent must exist). Errors: kInvalidArgument when the checkpoint holds no front-end names
// or no Hugging Face config (naming what is missing and who writes it), or a zoe parameter has no
// model name.
Status export_hf_torch(const Reader& r, const std::string& out_dir, const HfTorchOptions& o);

}  // namespace zoe::ckpt
