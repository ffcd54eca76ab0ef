// Argument checks, constants, SIMD dispatch and chunked execution of the Lion and Adagrad kernels.
#include "optim/lion_adagrad.h"

#include <cmath>
#include <cstdint>

#include "core/log.h"

namespace zoe::optim {
namespace {

const kern::OneStateTable* one_state_table_for(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      return kern::avx512_one_state_table();
    case SimdLevel::kAvx2:
      return kern::avx2_one_state_table();
    case SimdLevel::kScalar:
      return &kern::scalar_one_state_table();
  }
  return nullptr;
}

Result<const kern::OneStateTable*> one_state_dispatch(const Exec& exec) {
  SimdLevel level = exec.simd ? *exec.simd : active_simd_level();
  const kern::OneStateTable* t = simd_level_supported(level) ? one_state_table_for(level) : nullptr;
  if (t == nullptr) {
    return unsupported("SIMD level %s: not supported by this CPU or build", simd_level_name(level));
  }
  return t;
}

// Runs fn(begin, end) over the fixed kChunkElems chunks of [0, n), on the pool when there is one.
template <typename Fn>
void for_each_chunk(const Exec& exec, size_t n, Fn&& fn) {
  const size_t chunks = (n + kChunkElems - 1) / kChunkElems;
  auto one = [&](size_t c) {
    const size_t b = c * kChunkElems;
    fn(b, b + kChunkElems < n ? b + kChunkElems : n);
  };
  if (exec.pool == nullptr || exec.pool->threads() <= 1 || chunks <= 1) {
    for (size_t c = 0; c < chunks; ++c) one(c);
  } else {
    exec.pool->for_each(chunks, one);
  }
}

bool finite(float x) { return std::isfinite(x); }

Status check_buffers(const OneStateBuffers& b, const char* who) {
  if (b.index_base % 16 != 0) {
    return invalid_argument("%s: index_base %llu must be a multiple of 16", who,
                            static_cast<unsigned long long>(b.index_base));
  }
  if (b.n == 0) return Status::ok();
  if (b.param == nullptr || b.grad == nullptr || b.state == nullptr) {
    return invalid_argument("%s: param, grad and state must be set for n=%zu", who, b.n);
  }
  if (b.state_dtype != DType::kF32 && b.state_dtype != DType::kBF16) {
    return invalid_argument("%s: state dtype %s not supported (fp32 or bf16)", who,
                            dtype_name(b.state_dtype));
  }
  if (b.param_out != nullptr && b.param_out_dtype == DType::kF32) {
    return invalid_argument("%s: param_out must be bf16 or fp16 (the master params are the fp32 copy)", who);
  }
  return Status::ok();
}

Status check_common(const char* who, float lr, float wd, const AdamStep& s) {
  if (s.step < 1)
    return invalid_argument("%s: step must be >= 1 (got %lld)", who, static_cast<long long>(s.step));
  if (!(lr >= 0.0f) || !finite(lr)) return invalid_argument("%s: lr must be >= 0 (got %g)", who, lr);
  if (!(wd >= 0.0f) || !finite(wd))
    return invalid_argument("%s: weight_decay must be >= 0 (got %g)", who, wd);
  if (!finite(s.grad_scale))
    return invalid_argument("%s: grad_scale must be finite (got %g)", who, s.grad_scale);
  return Status::ok();
}

// The stochastic-rounding seed of a step: the same mix of (sr_seed, step) as Adam's.
uint32_t step_seed(uint64_t sr_seed, int64_t step) {
  uint64_t h = sr_seed ^ (static_cast<uint64_t>(step) * 0x9e3779b97f4a7c15ull);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return static_cast<uint32_t>(h);
}

int code(DType d) { return static_cast<int>(d); }

bool stream_out(const OneStateBuffers& b, const Exec& exec) {
  if (b.param_out == nullptr || reinterpret_cast<uintptr_t>(b.param_out) % 32 != 0) return false;
  return exec.stream_param_out.value_or(b.n >= kStreamOutMinElems);
}

// Runs the kernel `pick` chooses for buf's dtypes over every chunk.
template <typename Pick>
Status run_one_state(const OneStateBuffers& b, const OneStateConstants& c, bool stochastic, const Exec& exec,
                     Pick&& pick) {
  if (b.n == 0) return Status::ok();
  ZOE_ASSIGN_OR_RETURN(const kern::OneStateTable* t, one_state_dispatch(exec));
  const int state = b.state_dtype == DType::kF32 ? 0 : (stochastic ? 3 : 2);
  const int out = b.param_out == nullptr ? 0 : code(b.param_out_dtype) + (stream_out(b, exec) ? 3 : 0);
  kern::OneStateFn fn = pick(*t, code(b.grad_dtype), state, out);
  ZOE_CHECK(fn != nullptr);
  for_each_chunk(exec, b.n,
                 [&](size_t lo, size_t hi) { fn(c, b.param, b.grad, b.state, b.param_out, lo, hi); });
  return Status::ok();
}

}  // namespace

Result<OneStateConstants> make_lion_constants(const LionParams& p, const AdamStep& s, uint64_t index_base) {
  ZOE_RETURN_IF_ERROR(check_common("lion", p.lr, p.weight_decay, s));
  if (!(p.beta1 >= 0.0f && p.beta1 < 1.0f) || !(p.beta2 >= 0.0f && p.beta2 < 1.0f)) {
    return invalid_argument("lion: betas must lie in [0, 1) (got %g, %g)", p.beta1, p.beta2);
  }
  OneStateConstants c{};
  c.grad_scale = s.grad_scale;
  c.lr = p.lr;
  c.beta1 = p.beta1;
  c.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(p.beta1));
  c.beta2 = p.beta2;
  c.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(p.beta2));
  c.decay = static_cast<float>(1.0 - static_cast<double>(p.lr) * static_cast<double>(p.weight_decay));
  c.eps = 0.0f;
  c.l2 = 0.0f;
  c.sr_seed = step_seed(p.sr_seed, s.step);
  c.index_base = index_base;
  return c;
}

Result<OneStateConstants> make_adagrad_constants(const AdagradParams& p, const AdamStep& s,
                                                 uint64_t index_base) {
  ZOE_RETURN_IF_ERROR(check_common("adagrad", p.lr, p.weight_decay, s));
  if (!(p.eps > 0.0f) || !finite(p.eps)) return invalid_argument("adagrad: eps must be > 0 (got %g)", p.eps);
  OneStateConstants c{};
  c.grad_scale = s.grad_scale;
  c.lr = p.lr;
  c.beta1 = c.beta2 = 0.0f;
  c.one_minus_beta1 = c.one_minus_beta2 = 1.0f;
  c.decay = 1.0f;
  c.eps = p.eps;
  c.l2 = p.weight_decay;
  c.sr_seed = step_seed(p.sr_seed, s.step);
  c.index_base = index_base;
  return c;
}

Status lion_step(const LionArgs& args, const Exec& exec) {
  ZOE_RETURN_IF_ERROR(check_buffers(args.buf, "lion"));
  ZOE_ASSIGN_OR_RETURN(OneStateConstants c, make_lion_constants(args.params, args.step, args.buf.index_base));
  return run_one_state(args.buf, c, args.params.stochastic_rounding, exec,
                       [](const kern::OneStateTable& t, int g, int s, int o) { return t.lion(g, s, o); });
}

Status adagrad_step(const AdagradArgs& args, const Exec& exec) {
  ZOE_RETURN_IF_ERROR(check_buffers(args.buf, "adagrad"));
  ZOE_ASSIGN_OR_RETURN(OneStateConstants c,
                       make_adagrad_constants(args.params, args.step, args.buf.index_base));
  const bool wd = args.params.weight_decay > 0.0f;
  return run_one_state(
      args.buf, c, args.params.stochastic_rounding, exec,
      [wd](const kern::OneStateTable& t, int g, int s, int o) { return t.adagrad(g, s, o, wd); });
}

Status one_state_roofline_pass(const OneStateBuffers& b, const Exec& exec) {
  ZOE_RETURN_IF_ERROR(check_buffers(b, "roofline"));
  if (b.n == 0) return Status::ok();
  ZOE_ASSIGN_OR_RETURN(const kern::OneStateTable* t, one_state_dispatch(exec));
  kern::OneStateRooflineFn fn =
      t->roofline(static_cast<int>(dtype_size(b.grad_dtype)), static_cast<int>(dtype_size(b.state_dtype)),
                  b.param_out ? (stream_out(b, exec) ? 3 : 2) : 0);
  for_each_chunk(exec, b.n, [&](size_t lo, size_t hi) { fn(b.param, b.grad, b.state, b.param_out, lo, hi); });
  return Status::ok();
}

}  // namespace zoe::optim
