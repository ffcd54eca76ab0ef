// Adam-mini (Zhang et al. 2024, arXiv 2406.16793; the `adam-mini` package, version 1.1.1) on the
// CPU, for the engine's update of offloaded shards (zero/updater_adam_mini.cpp).
//
// THE UPDATE. Each parameter is cut into BLOCKS of consecutive elements that share one second
// moment, the mean of g^2 over the block (so v is one float a block, not one an element):
//   vmean = b2*vmean + (1 - b2)*mean_block(g^2)               once a step, per block
//   p     = p*(1 - lr*wd)                                     (wd 0 where the rule says so)
//   m     = lerp(m, g, 1 - b1)                                per element
//   p     = p - lr * m * ((1/bc1) / (sqrt(vmean)/sqrt(bc2) + eps))
// with bc1 = 1 - b1^step, bc2 = 1 - b2^step (the parameter's own step count).
//
// THE BLOCKS (adam_mini_partition), the package's rules on the lower-cased full name
// ("<module>.<param>"), in its order:
//   - a name with "bias": one block an element (plain Adam);
//   - "q_proj", "k_proj", "wq", "wk", "query", "key": one block a head, dim*dim/n_heads elements;
//   - "embed", "embd", "wte" (embeddings), "lm_head", "output", "final_layer" (outputs): one block
//     a row (a token); "v_proj", "wv", "value", "o_proj", "wo", "attn.proj", "feed_forward",
//     "linear", "mlp": one block a row (an output neuron);
//   - zoe's GPT (model/gpt.cpp), whose names the package does not know: "qkv_w" ([q; k; v]
//     stacked by rows) a head for q and k and a row for v; "proj_w", "fc1_w", "fc2_w" a row;
//     names ending "_b" (biases) an element;
//   - anything else (norms): the whole tensor one block.
// Weight decay is 0 for names with "norm", "ln" or "bias" (and zoe's GPT's "_b"), as the package.
//
// ARITHMETIC: fp32 per element in a fixed order with no FMA (this unit is compiled with
// -ffp-contract=off); the block means in double. The same bits on every CPU and any chunking.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zoe/status.h"

namespace zoe::optim {

// The model's attention shape, the package's `dim` and `n_heads` (optimizer.params.dim and
// optimizer.params.n_heads; the package's defaults).
struct AdamMiniShape {
  int64_t dim = 2048;
  int64_t n_heads = 32;
};

// `count` blocks of `elems` consecutive elements each.
struct BlockRun {
  size_t count = 0;
  size_t elems = 0;
};

// One parameter's blocks, in flat order (they cover its elements), and whether it decays.
struct AdamMiniParam {
  std::vector<BlockRun> runs;
  bool decay = true;
  size_t blocks() const;
};

// The blocks of the parameter `full_name` of `shape` (rules above). Error: a per-head rule whose
// element count is not a multiple of dim*dim/n_heads (naming optimizer.params.dim and n_heads).
Result<AdamMiniParam> adam_mini_partition(const std::string& full_name, const std::vector<int64_t>& shape,
                                          const AdamMiniShape& s);

struct AdamMiniParams {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// vmean = b2*vmean + (1 - b2)*mean, mean = float(sum_sq / elems) (the block's sum of g^2).
void adam_mini_vmean(float* vmean, double sum_sq, size_t elems, const AdamMiniParams& p);

// n elements of one block: gs = g[i]*grad_scale; p = p*(1 - lr*wd) (decay) ; m = lerp(m, gs, 1 -
// b1); p -= (m * stepsize) * lr with stepsize = (1/bc1) / (sqrt(vmean)/sqrt(bc2) + eps).
void adam_mini_block(float* param, const float* g, float grad_scale, float* m, size_t n, float vmean,
                     int64_t step, bool decay, const AdamMiniParams& p);

// acc + the sum of g[i]^2 over n elements, in double, added one by one in element order (so a
// block's sum is the same bits however its elements come in pieces, one after another).
double adam_mini_sum_sq(const float* g, size_t n, double acc);

}  // namespace zoe::optim
