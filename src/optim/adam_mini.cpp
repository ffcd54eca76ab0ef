// Adam-mini: see adam_mini.h. Compiled with -ffp-contract=off (no FMA): the same bits everywhere.
#include "optim/adam_mini.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

namespace zoe::optim {

namespace {

bool has_any(const std::string& s, std::initializer_list<const char*> keys) {
  return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return s.find(k) != std::string::npos; });
}

bool ends_with(const std::string& s, const char* tail) {
  const size_t n = strlen(tail);
  return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
}

// The last component of a dotted name ("block3.qkv_w" -> "qkv_w").
std::string last_part(const std::string& s) {
  const size_t dot = s.rfind('.');
  return dot == std::string::npos ? s : s.substr(dot + 1);
}

}  // namespace

size_t AdamMiniParam::blocks() const {
  size_t n = 0;
  for (const BlockRun& r : runs) n += r.count;
  return n;
}

Result<AdamMiniParam> adam_mini_partition(const std::string& full_name, const std::vector<int64_t>& shape,
                                          const AdamMiniShape& s) {
  std::string name = full_name;
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  size_t numel = 1;
  for (int64_t d : shape) numel *= static_cast<size_t>(d);
  AdamMiniParam out;
  const std::string leaf = last_part(name);
  const bool zoe_bias = ends_with(leaf, "_b");
  out.decay = !has_any(name, {"norm", "ln", "bias"}) && !zoe_bias;
  if (numel == 0) return out;
  const size_t rows = shape.empty() ? 1 : static_cast<size_t>(shape[0]);
  const size_t cols = rows ? numel / rows : 0;
  auto head_elems = [&](size_t n) -> Result<size_t> {
    const int64_t d = s.dim, h = s.n_heads;
    if (d <= 0 || h <= 0 || (d * d) % h != 0 || n % static_cast<size_t>(d * d / h) != 0) {
      return invalid_argument(
          "Adam-mini: parameter %s (%zu elements) is split into heads of dim*dim/n_heads elements, and "
          "optimizer.params.dim %lld with optimizer.params.n_heads %lld does not divide it: give the model's "
          "hidden size and attention heads",
          full_name.c_str(), n, static_cast<long long>(d), static_cast<long long>(h));
    }
    return static_cast<size_t>(d * d / h);
  };
  if (has_any(name, {"bias"}) || zoe_bias) {
    out.runs.push_back({numel, 1});
  } else if (has_any(name, {"k_proj", "q_proj", "wq", "wk", "query", "key"})) {
    ZOE_ASSIGN_OR_RETURN(size_t he, head_elems(numel));
    out.runs.push_back({numel / he, he});
  } else if (has_any(name, {"embed", "embd", "wte", "lm_head", "output", "final_layer", "v_proj", "wv",
                            "value", "o_proj", "wo", "attn.proj", "feed_forward", "linear", "mlp"}) ||
             leaf == "proj_w" || leaf == "fc1_w" || leaf == "fc2_w") {
    out.runs.push_back({rows, cols});
  } else if (leaf == "qkv_w" && rows % 3 == 0) {
    const size_t qk = numel / 3 * 2;
    ZOE_ASSIGN_OR_RETURN(size_t he, head_elems(qk));
    out.runs.push_back({qk / he, he});
    out.runs.push_back({rows / 3, cols});
  } else {
    out.runs.push_back({1, numel});
  }
  return out;
}

void adam_mini_vmean(float* vmean, double sum_sq, size_t elems, const AdamMiniParams& p) {
  const float mean = static_cast<float>(sum_sq / static_cast<double>(elems));
  *vmean = *vmean * p.beta2 + mean * (1.0f - p.beta2);
}

void adam_mini_block(float* param, const float* g, float grad_scale, float* m, size_t n, float vmean,
                     int64_t step, bool decay, const AdamMiniParams& p) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(step));
  const float h = std::sqrt(vmean) / static_cast<float>(std::sqrt(bc2)) + p.eps;
  const float stepsize = static_cast<float>(1.0 / bc1) / h;
  const float keep = decay && p.weight_decay > 0.0f ? 1.0f - p.lr * p.weight_decay : 1.0f;
  const float w = 1.0f - p.beta1;
  if (w < 0.5f) {
    for (size_t i = 0; i < n; ++i) {
      const float gs = g[i] * grad_scale;
      m[i] = m[i] + w * (gs - m[i]);
      param[i] = param[i] * keep - (m[i] * stepsize) * p.lr;
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      const float gs = g[i] * grad_scale;
      m[i] = gs - (gs - m[i]) * (1.0f - w);
      param[i] = param[i] * keep - (m[i] * stepsize) * p.lr;
    }
  }
}

double adam_mini_sum_sq(const float* g, size_t n, double acc) {
  for (size_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(g[i]);
    acc += x * x;
  }
  return acc;
}

}  // namespace zoe::optim
