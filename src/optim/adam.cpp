// Argument checks, SIMD dispatch and chunked parallel execution of the optimizer kernels.
#include "optim/adam.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#include "core/log.h"

namespace zoe::optim {
namespace {

int code(DType d) { return static_cast<int>(d); }

std::mutex g_override_mu;
std::optional<SimdLevel> g_override;

const kern::Table* table_for(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      return kern::avx512_table();
    case SimdLevel::kAvx2:
      return kern::avx2_table();
    case SimdLevel::kScalar:
      return &kern::scalar_table();
  }
  return nullptr;
}

struct Dispatch {
  const kern::Table* table = nullptr;
  bool hw_bf16 = false;
};

Result<Dispatch> dispatch(const Exec& exec) {
  SimdLevel level = exec.simd ? *exec.simd : active_simd_level();
  if (!simd_level_supported(level)) {
    return unsupported("SIMD level %s: not supported by this CPU or build", simd_level_name(level));
  }
  Dispatch d;
  d.table = table_for(level);
  d.hw_bf16 = level == SimdLevel::kAvx512 && exec.hw_bf16 && cpu_features().avx512_bf16;
  return d;
}

bool stream_out(const AdamBuffers& b, const Exec& exec) {
  if (b.param_out == nullptr || reinterpret_cast<uintptr_t>(b.param_out) % 32 != 0) return false;
  return exec.stream_param_out.value_or(b.n >= kStreamOutMinElems);
}

size_t chunk_count(size_t n) { return (n + kChunkElems - 1) / kChunkElems; }

// Runs fn(begin, end) over the fixed chunks of [0, n), on the pool when there is one.
template <typename Fn>
void for_each_chunk(const Exec& exec, size_t n, Fn&& fn) {
  size_t chunks = chunk_count(n);
  auto one = [&](size_t c) {
    size_t b = c * kChunkElems;
    size_t e = b + kChunkElems < n ? b + kChunkElems : n;
    fn(c, b, e);
  };
  if (exec.pool == nullptr || exec.pool->threads() <= 1 || chunks <= 1) {
    for (size_t c = 0; c < chunks; ++c) one(c);
  } else {
    exec.pool->for_each(chunks, one);
  }
}

// Chunk partial sums combined in chunk order: the same bits for any thread count.
template <typename Fn>
NormResult chunked_norm(const Exec& exec, size_t n, Fn&& partial) {
  std::vector<double> parts(chunk_count(n));
  for_each_chunk(exec, n, [&](size_t c, size_t b, size_t e) { parts[c] = partial(b, e); });
  double s = 0.0;
  for (double p : parts) s += p;
  return {s, std::isfinite(s)};
}

bool finite(float x) { return std::isfinite(x); }

Status check_buffers(const AdamBuffers& b) {
  if (b.n == 0) return Status::ok();
  if (b.param == nullptr || b.grad == nullptr || b.exp_avg == nullptr || b.exp_avg_sq == nullptr) {
    return invalid_argument("adam: param, grad, exp_avg and exp_avg_sq must be set for n=%zu", b.n);
  }
  if (b.state_dtype != DType::kF32 && b.state_dtype != DType::kBF16) {
    return invalid_argument("adam: m/v dtype %s not supported (fp32 or bf16)", dtype_name(b.state_dtype));
  }
  if (b.param_out != nullptr && b.param_out_dtype == DType::kF32) {
    return invalid_argument("adam: param_out must be bf16 or fp16 (the master params are the fp32 copy)");
  }
  return Status::ok();
}

}  // namespace

SimdLevel active_simd_level() {
  std::lock_guard<std::mutex> lock(g_override_mu);
  return g_override ? *g_override : environment_simd_level();
}

Status set_simd_override(std::optional<SimdLevel> level) {
  if (level && !simd_level_supported(*level)) {
    return unsupported("SIMD level %s: not supported by this CPU or build", simd_level_name(*level));
  }
  std::lock_guard<std::mutex> lock(g_override_mu);
  g_override = level;
  return Status::ok();
}

bool simd_level_supported(SimdLevel level) {
  return static_cast<int>(level) <= static_cast<int>(detected_simd_level()) && table_for(level) != nullptr;
}

const char* kernel_path_name(const Exec& exec) {
  auto d = dispatch(exec);
  if (!d.is_ok()) return "unsupported";
  if (d->hw_bf16) return "avx512+bf16";
  return d->table->name;
}

Result<AdamConstants> make_adam_constants(const AdamParams& p, const AdamStep& s) {
  if (s.step < 1)
    return invalid_argument("adam: step must be >= 1 (got %lld)", static_cast<long long>(s.step));
  if (!(p.beta1 >= 0.0f && p.beta1 < 1.0f) || !(p.beta2 >= 0.0f && p.beta2 < 1.0f)) {
    return invalid_argument("adam: betas must lie in [0, 1) (got %g, %g)", p.beta1, p.beta2);
  }
  if (!(p.eps > 0.0f) || !finite(p.eps)) return invalid_argument("adam: eps must be > 0 (got %g)", p.eps);
  if (!(p.lr >= 0.0f) || !finite(p.lr)) return invalid_argument("adam: lr must be >= 0 (got %g)", p.lr);
  if (!(p.weight_decay >= 0.0f) || !finite(p.weight_decay)) {
    return invalid_argument("adam: weight_decay must be >= 0 (got %g)", p.weight_decay);
  }
  if (!finite(s.grad_scale))
    return invalid_argument("adam: grad_scale must be finite (got %g)", s.grad_scale);
  const double t = static_cast<double>(s.step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), t);
  AdamConstants c{};
  c.grad_scale = s.grad_scale;
  c.beta1 = p.beta1;
  c.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(p.beta1));
  c.beta2 = p.beta2;
  c.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(p.beta2));
  c.step_size = static_cast<float>(static_cast<double>(p.lr) / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.eps = p.eps;
  c.decay = p.adamw ? static_cast<float>(1.0 - static_cast<double>(p.lr) * p.weight_decay) : 1.0f;
  c.l2 = p.adamw ? 0.0f : p.weight_decay;
  uint64_t h = p.sr_seed ^ (static_cast<uint64_t>(s.step) * 0x9e3779b97f4a7c15ull);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  c.sr_seed = static_cast<uint32_t>(h);
  return c;
}

Status adam_step(const AdamArgs& args, const Exec& exec) {
  const AdamBuffers& b = args.buf;
  ZOE_RETURN_IF_ERROR(check_buffers(b));
  ZOE_ASSIGN_OR_RETURN(AdamConstants c, make_adam_constants(args.params, args.step));
  if (b.n == 0) return Status::ok();
  ZOE_ASSIGN_OR_RETURN(Dispatch d, dispatch(exec));
  int state = b.state_dtype == DType::kF32 ? 0 : (args.params.stochastic_rounding ? 3 : 2);
  int out = b.param_out == nullptr ? 0 : code(b.param_out_dtype) + (stream_out(b, exec) ? 3 : 0);
  kern::AdamFn fn = d.table->adam(code(b.grad_dtype), state, out, d.hw_bf16);
  ZOE_CHECK(fn != nullptr);
  for_each_chunk(exec, b.n, [&](size_t, size_t lo, size_t hi) {
    fn(c, b.param, b.grad, b.exp_avg, b.exp_avg_sq, b.param_out, lo, hi);
  });
  return Status::ok();
}

Result<NormResult> grad_norm_sq(const void* grad, DType dtype, size_t n, const Exec& exec) {
  if (n == 0) return NormResult{};
  if (grad == nullptr) return invalid_argument("grad_norm_sq: null buffer for n=%zu", n);
  ZOE_ASSIGN_OR_RETURN(Dispatch d, dispatch(exec));
  kern::NormFn fn = d.table->norm(code(dtype));
  return chunked_norm(exec, n, [&](size_t lo, size_t hi) { return fn(grad, lo, hi); });
}

Result<NormResult> convert_with_norm(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n,
                                     bool compute_norm, const Exec& exec) {
  if (n == 0) return NormResult{};
  if (src == nullptr || dst == nullptr)
    return invalid_argument("convert_with_norm: null buffer for n=%zu", n);
  if (src == dst) return invalid_argument("convert_with_norm: src and dst must differ");
  ZOE_ASSIGN_OR_RETURN(Dispatch d, dispatch(exec));
  kern::ConvertFn fn = d.table->convert(code(src_dtype), code(dst_dtype), compute_norm, d.hw_bf16);
  return chunked_norm(exec, n, [&](size_t lo, size_t hi) { return fn(src, dst, lo, hi); });
}

Status accumulate_with_norm(float* acc, const void* src, DType src_dtype, size_t n, bool first,
                            double* partials, const Exec& exec) {
  if (n == 0) return Status::ok();
  if (acc == nullptr || src == nullptr || partials == nullptr) {
    return invalid_argument("accumulate_with_norm: null buffer for n=%zu", n);
  }
  if (static_cast<const void*>(acc) == src)
    return invalid_argument("accumulate_with_norm: acc and src must differ");
  ZOE_ASSIGN_OR_RETURN(Dispatch d, dispatch(exec));
  if (first) {
    // float(src) is exact, so the norm of src is the norm of the new acc.
    kern::ConvertFn fn = d.table->convert(code(src_dtype), code(DType::kF32), true, d.hw_bf16);
    for_each_chunk(exec, n, [&](size_t c, size_t lo, size_t hi) { partials[c] = fn(src, acc, lo, hi); });
    return Status::ok();
  }
  kern::ConvertFn to_f32 = d.table->convert(code(src_dtype), code(DType::kF32), false, d.hw_bf16);
  kern::NormFn norm = d.table->norm(code(DType::kF32));
  for_each_chunk(exec, n, [&](size_t c, size_t lo, size_t hi) {
    float* a = acc + lo;
    const size_t len = hi - lo;
    if (src_dtype == DType::kF32) {
      const float* s = static_cast<const float*>(src) + lo;
      for (size_t i = 0; i < len; ++i) a[i] += s[i];
    } else {
      // Widen the chunk into a cache-resident scratch buffer first (the vectorized conversion).
      thread_local std::vector<float> tmp;
      tmp.resize(kChunkElems);
      to_f32(static_cast<const char*>(src) + lo * 2, tmp.data(), 0, len);
      for (size_t i = 0; i < len; ++i) a[i] += tmp[i];
    }
    partials[c] = norm(acc, lo, hi);
  });
  return Status::ok();
}

Status scale_in_place(void* data, DType dtype, size_t n, float scale, const Exec& exec) {
  if (n == 0) return Status::ok();
  if (data == nullptr) return invalid_argument("scale_in_place: null buffer for n=%zu", n);
  ZOE_ASSIGN_OR_RETURN(Dispatch d, dispatch(exec));
  kern::ScaleFn fn = d.table->scale(code(dtype), d.hw_bf16);
  for_each_chunk(exec, n, [&](size_t, size_t lo, size_t hi) { fn(data, scale, lo, hi); });
  return Status::ok();
}

StepScale compute_step_scale(const NormResult& norm, float loss_scale, float max_grad_norm) {
  StepScale s;
  if (!norm.finite || !std::isfinite(norm.sum_sq)) {
    s.overflow = true;
    s.grad_norm = std::numeric_limits<double>::infinity();
    s.grad_scale = 0.0f;
    return s;
  }
  ZOE_CHECK_MSG(loss_scale > 0.0f, "loss_scale must be > 0 (got %g)", loss_scale);
  s.grad_norm = std::sqrt(norm.sum_sq) / static_cast<double>(loss_scale);
  double clip = 1.0;
  if (max_grad_norm > 0.0f && s.grad_norm > max_grad_norm) {
    clip = static_cast<double>(max_grad_norm) / (s.grad_norm + 1e-6);
  }
  s.clip_coef = static_cast<float>(clip);
  s.grad_scale = static_cast<float>(clip / static_cast<double>(loss_scale));
  return s;
}

Result<AdamResult> adam_full_step(AdamGroup& group, const AdamBuffers& buf, float loss_scale,
                                  float max_grad_norm, const Exec& exec) {
  ZOE_RETURN_IF_ERROR(check_buffers(buf));
  if (!(loss_scale > 0.0f) || !finite(loss_scale)) {
    return invalid_argument("adam: loss_scale must be finite and > 0 (got %g)", loss_scale);
  }
  ZOE_ASSIGN_OR_RETURN(NormResult norm, grad_norm_sq(buf.grad, buf.grad_dtype, buf.n, exec));
  AdamResult r;
  r.scale = compute_step_scale(norm, loss_scale, max_grad_norm);
  if (r.scale.overflow) {
    r.skipped = true;
    return r;
  }
  AdamArgs a{buf, group.params, AdamStep{group.step + 1, r.scale.grad_scale}};
  ZOE_RETURN_IF_ERROR(adam_step(a, exec));
  ++group.step;
  return r;
}

Status roofline_pass(const AdamBuffers& b, const Exec& exec) {
  ZOE_RETURN_IF_ERROR(check_buffers(b));
  if (b.n == 0) return Status::ok();
  ZOE_ASSIGN_OR_RETURN(Dispatch d, dispatch(exec));
  kern::RooflineFn fn = d.table->roofline(static_cast<int>(dtype_size(b.grad_dtype)),
                                          static_cast<int>(dtype_size(b.state_dtype)),
                                          b.param_out ? (stream_out(b, exec) ? 3 : 2) : 0);
  for_each_chunk(exec, b.n, [&](size_t, size_t lo, size_t hi) {
    fn(b.param, b.grad, b.exp_avg, b.exp_avg_sq, b.param_out, lo, hi);
  });
  return Status::ok();
}

}  // namespace zoe::optim
