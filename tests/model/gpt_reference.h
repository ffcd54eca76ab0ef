// A plain-loop, double-precision forward of the GPT: the reference the fp32 kernels answer to.
#pragma once

#include <cstdint>
#include <vector>

#include "model/gpt.h"

namespace zoe::model::testing {

// params[module][param] holds the tensor, in the layout of gpt_modules().
using RefParams = std::vector<std::vector<std::vector<double>>>;

struct RefOutput {
  double loss = 0.0;           // mean cross-entropy over positions with target >= 0
  std::vector<double> logits;  // [batch * T, vocab]
};

RefOutput gpt_reference_forward(const GptConfig& c, int batch, int T, const RefParams& params,
                                const int32_t* tokens, const int32_t* targets);

}  // namespace zoe::model::testing
