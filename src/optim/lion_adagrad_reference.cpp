// Plain scalar references of Lion and Adagrad (see lion_adagrad_reference.h).
#include "optim/lion_adagrad_reference.h"

#include <cmath>
#include <limits>

#include "core/dtype.h"
#include "optim/adam_reference.h"

namespace zoe::optim::ref {
namespace {

void store_f16(void* base, DType dtype, size_t i, float x) {
  uint16_t* d = static_cast<uint16_t*>(base);
  d[i] = dtype == DType::kF16 ? f32_to_f16(x) : f32_to_bf16(x);
}

void store_state(const OneStateBuffers& b, const OneStateConstants& c, bool stochastic, size_t i, float x) {
  if (b.state_dtype == DType::kF32) {
    static_cast<float*>(b.state)[i] = x;
  } else if (stochastic) {
    uint32_t h = sr_hash(c.sr_seed, b.index_base + i);
    static_cast<uint16_t*>(b.state)[i] = f32_to_bf16_stochastic(x, static_cast<uint16_t>(h & 0xffff));
  } else {
    static_cast<uint16_t*>(b.state)[i] = f32_to_bf16(x);
  }
}

// lr * sign(c): sign(0) = 0; NaN for a non-finite c (lion_adagrad.h).
float lr_times_sign(float lr, float c) {
  if (!std::isfinite(c)) return std::numeric_limits<float>::quiet_NaN();
  if (c > 0.0f) return lr;
  if (c < 0.0f) return -lr;
  return 0.0f;
}

}  // namespace

Status lion_step(const LionArgs& args) {
  const OneStateBuffers& b = args.buf;
  ZOE_ASSIGN_OR_RETURN(OneStateConstants k, make_lion_constants(args.params, args.step, b.index_base));
  for (size_t i = 0; i < b.n; ++i) {
    float g = load(b.grad, b.grad_dtype, i) * k.grad_scale;
    float m = load(b.state, b.state_dtype, i);
    float c = k.beta1 * m + k.one_minus_beta1 * g;
    float p = b.param[i] * k.decay - lr_times_sign(k.lr, c);
    m = k.beta2 * m + k.one_minus_beta2 * g;
    b.param[i] = p;
    store_state(b, k, args.params.stochastic_rounding, i, m);
    if (b.param_out) store_f16(b.param_out, b.param_out_dtype, i, p);
  }
  return Status::ok();
}

Status adagrad_step(const AdagradArgs& args) {
  const OneStateBuffers& b = args.buf;
  ZOE_ASSIGN_OR_RETURN(OneStateConstants k, make_adagrad_constants(args.params, args.step, b.index_base));
  for (size_t i = 0; i < b.n; ++i) {
    float p = b.param[i];
    float g = load(b.grad, b.grad_dtype, i) * k.grad_scale;
    if (args.params.weight_decay > 0.0f) g = g + k.l2 * p;
    float sum = load(b.state, b.state_dtype, i) + g * g;
    p = p - (k.lr * g) / (std::sqrt(sum) + k.eps);
    b.param[i] = p;
    store_state(b, k, args.params.stochastic_rounding, i, sum);
    if (b.param_out) store_f16(b.param_out, b.param_out_dtype, i, p);
  }
  return Status::ok();
}

}  // namespace zoe::optim::ref
