// What `zoe plan` knows of a model: its exact parameter count and its engine modules (the shapes
// the engine would register, in forward order), from zoe's GPT, a bare parameter count, or a
// Hugging Face config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "zero/placement.h"
#include "zoe/status.h"

namespace zoe::plan {

// The most parameters a model zoe plans for may have (--params, --hf-config, the presets' shapes):
// 16 bytes of state each still fit in 64 bits.
constexpr uint64_t kMaxModelParams = 1000000000000000ull;  // 1e15

struct ModelDesc {
  std::string name;     // "zoe-gpt small", "llama (config.json)", "a model of 32 equal modules"
  uint64_t params = 0;  // exact: the sum over modules
  std::vector<zero::ModuleShape> modules;
  // Dimensions for FLOPs and activations; 0 where unknown (a bare parameter count).
  int layers = 0, d_model = 0, heads = 0, vocab = 0, context = 0;
  // Gathers of each module per forward (and per backward): zoe's GPT fetches its embedding twice
  // in each (the input and the tied output layer). Empty: once each.
  std::vector<int> fetches_per_pass;
  // zoe's reference GPT (model/gpt.h) of these dimensions: `zoe tune --verify` runs its kernels.
  bool zoe_gpt = false;
};

// zoe's GPT presets: model::gpt_presets() (src/model/gpt.h), the same as `zoe train --preset`.
using model::gpt_presets;
using model::GptPreset;

// zoe's GPT: the preset, with any non-zero override. Modules as model::gpt_modules() gives them
// (`zoe train` registers exactly these). Errors: an unknown preset (listing the presets), bad
// dimensions.
Result<ModelDesc> gpt_model(const std::string& preset, int layers = 0, int d_model = 0, int heads = 0,
                            int context = 0);
// Any GPT config (vocab included).
Result<ModelDesc> gpt_model(const model::GptConfig& c, const std::string& name);

// A model of exactly `params` parameters in `modules` modules of (nearly) equal size, named
// "block.i" (the first ones take the remainder). Errors: params 0, modules 0 or > params.
Result<ModelDesc> params_model(uint64_t params, int modules);

// Sum of a module list's parameters.
uint64_t count_params(const std::vector<zero::ModuleShape>& modules);

}  // namespace zoe::plan
