// Plain scalar reference implementations of the optimizer kernels (see adam_reference.h).
#include "optim/adam_reference.h"

#include <cmath>

#include "core/dtype.h"

namespace zoe::optim::ref {

uint32_t sr_hash(uint32_t seed, uint64_t index) {
  uint32_t s = seed ^ static_cast<uint32_t>(index >> 32) * 0x27d4eb2fu;
  // lowbias32 (C. Wellons' hash-prospector) of seed + index: low-bias, two multiplies.
  uint32_t x = static_cast<uint32_t>(index) + s;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  return x ^ (x >> 16);
}

float load(const void* base, DType dtype, size_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
  }
  return 0.0f;
}

namespace {

void store(void* base, DType dtype, size_t i, float x) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(base)[i] = x;
      break;
    case DType::kF16:
      static_cast<uint16_t*>(base)[i] = f32_to_f16(x);
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(base)[i] = f32_to_bf16(x);
      break;
  }
}

}  // namespace

Status adam_step(const AdamArgs& args) {
  const AdamBuffers& b = args.buf;
  ZOE_ASSIGN_OR_RETURN(AdamConstants c, make_adam_constants(args.params, args.step));
  if (b.n == 0) return Status::ok();
  if (b.state_dtype == DType::kF16) return invalid_argument("reference Adam: fp16 m/v not supported");
  const bool sr = args.params.stochastic_rounding && b.state_dtype == DType::kBF16;
  for (size_t i = 0; i < b.n; ++i) {
    float p = b.param[i];
    float g = load(b.grad, b.grad_dtype, i) * c.grad_scale;
    if (!args.params.adamw) g = g + c.l2 * p;
    float m = load(b.exp_avg, b.state_dtype, i);
    float v = load(b.exp_avg_sq, b.state_dtype, i);
    m = c.beta1 * m + c.one_minus_beta1 * g;
    v = c.beta2 * v + c.one_minus_beta2 * g * g;
    float denom = std::sqrt(v) * c.inv_sqrt_bc2 + c.eps;
    if (args.params.adamw) p = p * c.decay;
    p = p - c.step_size * (m / denom);
    b.param[i] = p;
    if (sr) {
      uint32_t h = sr_hash(c.sr_seed, i);
      static_cast<uint16_t*>(b.exp_avg)[i] = f32_to_bf16_stochastic(m, static_cast<uint16_t>(h & 0xffff));
      static_cast<uint16_t*>(b.exp_avg_sq)[i] = f32_to_bf16_stochastic(v, static_cast<uint16_t>(h >> 16));
    } else {
      store(b.exp_avg, b.state_dtype, i, m);
      store(b.exp_avg_sq, b.state_dtype, i, v);
    }
    if (b.param_out) store(b.param_out, b.param_out_dtype, i, p);
  }
  return Status::ok();
}

NormResult grad_norm_sq(const void* grad, DType dtype, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) {
    double x = load(grad, dtype, i);
    s += x * x;
  }
  return {s, std::isfinite(s)};
}

NormResult convert_with_norm(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  for (size_t i = 0; i < n; ++i) store(dst, dst_dtype, i, load(src, src_dtype, i));
  return grad_norm_sq(src, src_dtype, n);
}

}  // namespace zoe::optim::ref
