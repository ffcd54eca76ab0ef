// Benchmark harness for the CPU optimizer step (see adam_bench.h).
#include "optim/adam_bench.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>

#include "core/clock.h"
#include "core/units.h"

namespace zoe::optim::bench {
namespace {

constexpr size_t kAlign = size_t(2) << 20;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

template <typename Fn>
Result<double> timed(Fn&& fn) {
  uint64_t t0 = now_ns();
  Status s = fn();
  uint64_t t1 = now_ns();
  if (!s.is_ok()) return s;
  return double(t1 - t0) * 1e-9;
}

}  // namespace

const char* optimizer_name(Optimizer o) {
  switch (o) {
    case Optimizer::kAdam:
      return "adam";
    case Optimizer::kLion:
      return "lion";
    case Optimizer::kAdagrad:
      return "adagrad";
  }
  return "?";
}

Bytes bytes_per_param(const Config& c) {
  double gb = double(dtype_size(c.grad_dtype)), sb = double(dtype_size(c.state_dtype));
  double ob = c.out_dtype ? 2.0 : 0.0;
  const double k = state_count(c.optimizer);  // states read and written
  Bytes b;
  b.fused = 4 + gb + k * sb + 4 + k * sb + ob;
  b.norm = gb;
  b.full = b.norm + b.fused;
  b.separate = gb + 2 * gb + (8 + gb + 8 * k) + (c.out_dtype ? 4 + ob : 0);
  b.separate_fp32 = 4 + 2 * 4 + (8 + 4 + 8 * k) + (c.out_dtype ? 4 + ob : 0);
  return b;
}

Result<std::unique_ptr<Buffers>> Buffers::create(const Config& c, CpuPool* pool) {
  std::unique_ptr<Buffers> b(new Buffers());
  b->c_ = c;
  const size_t n = c.params;
  auto alloc = [&](size_t bytes) -> void* {
    size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (rounded == 0) rounded = kAlign;
    void* p = std::aligned_alloc(kAlign, rounded);
    if (p == nullptr) return nullptr;
    madvise(p, rounded, MADV_HUGEPAGE);  // a hint; fine when THP is off
    b->allocs_.push_back({p, rounded});
    return p;
  };
  const size_t gs = dtype_size(c.grad_dtype), ss = dtype_size(c.state_dtype);
  b->p_ = static_cast<float*>(alloc(n * 4));
  b->g_ = alloc(n * gs);
  const bool two = state_count(c.optimizer) == 2;
  b->m_ = alloc(n * ss);
  b->v_ = two ? alloc(n * ss) : b->m_;  // one-state optimizers: v is never read
  if (c.state_dtype == DType::kF32) {
    b->m32_ = b->m_;
    b->v32_ = b->v_;
  } else {
    b->m32_ = alloc(n * 4);
    b->v32_ = two ? alloc(n * 4) : b->m32_;
  }
  b->out_ = alloc(n * 2);
  b->g32_ = gs == 4 ? b->g_ : alloc(n * 4);
  if (!b->g32_ || !b->p_ || !b->g_ || !b->m_ || !b->v_ || !b->m32_ || !b->v32_ || !b->out_) {
    return make_status(StatusCode::kOutOfBudget, "adam bench: cannot allocate %s for %zu params",
                       format_bytes(uint64_t(n) * (4 + gs + 2 * ss + 2 + (ss == 2 ? 8 : 0))).c_str(), n);
  }
  // First touch by the threads that will stream the data (NUMA placement), chunk by chunk.
  auto fill = [&](size_t chunk) {
    size_t lo = chunk * kChunkElems, hi = std::min(n, lo + kChunkElems);
    std::mt19937 rng(static_cast<uint32_t>(chunk));
    std::uniform_real_distribution<float> up(-1.0f, 1.0f), uv(0.0f, 1e-4f);
    for (size_t i = lo; i < hi; ++i) {
      float g = up(rng) * 8.0f;
      b->p_[i] = up(rng);
      if (gs == 4)
        static_cast<float*>(b->g_)[i] = g;
      else
        static_cast<uint16_t*>(b->g_)[i] = c.grad_dtype == DType::kF16 ? f32_to_f16(g) : f32_to_bf16(g);
      if (gs != 4) static_cast<float*>(b->g32_)[i] = g;
      float m = up(rng) * 1e-2f, v = uv(rng);
      if (c.optimizer == Optimizer::kAdagrad) m = std::fabs(m);  // a sum of squares
      static_cast<float*>(b->m32_)[i] = m;
      static_cast<float*>(b->v32_)[i] = v;
      if (ss == 2) {
        static_cast<uint16_t*>(b->m_)[i] = f32_to_bf16(m);
        static_cast<uint16_t*>(b->v_)[i] = f32_to_bf16(v);
      }
      static_cast<uint16_t*>(b->out_)[i] = 0;
    }
  };
  size_t chunks = (n + kChunkElems - 1) / kChunkElems;
  if (pool)
    pool->for_each(chunks, fill);
  else
    for (size_t i = 0; i < chunks; ++i) fill(i);
  return b;
}

Buffers::~Buffers() {
  for (auto& a : allocs_) std::free(a.first);
}

AdamBuffers Buffers::fused() const {
  AdamBuffers a;
  a.n = c_.params;
  a.param = p_;
  a.grad = g_;
  a.grad_dtype = c_.grad_dtype;
  a.exp_avg = m_;
  a.exp_avg_sq = v_;
  a.state_dtype = c_.state_dtype;
  a.param_out = c_.out_dtype ? out_ : nullptr;
  a.param_out_dtype = c_.out_dtype.value_or(DType::kBF16);
  return a;
}

AdamBuffers Buffers::separate() const {
  AdamBuffers a = fused();
  a.exp_avg = m32_;
  a.exp_avg_sq = v32_;
  a.state_dtype = DType::kF32;
  a.param_out = nullptr;
  return a;
}

OneStateBuffers Buffers::one_state() const {
  OneStateBuffers a;
  a.n = c_.params;
  a.param = p_;
  a.grad = g_;
  a.grad_dtype = c_.grad_dtype;
  a.state = m_;
  a.state_dtype = c_.state_dtype;
  a.param_out = c_.out_dtype ? out_ : nullptr;
  a.param_out_dtype = c_.out_dtype.value_or(DType::kBF16);
  return a;
}

OneStateBuffers Buffers::one_state_separate() const {
  OneStateBuffers a = one_state();
  a.state = m32_;
  a.state_dtype = DType::kF32;
  a.param_out = nullptr;
  return a;
}

namespace {
AdamParams bench_params() {
  AdamParams p;
  p.lr = 1e-4f;
  p.weight_decay = 0.01f;
  return p;
}

// One step of c.optimizer over the fused (separate: the fp32-state, no-copy) buffers, with
// `grad` of dtype gd in place of the buffers' gradients when given.
Status run_step(const Buffers& b, const Config& c, const Exec& e, bool separate, AdamStep st,
                const void* grad = nullptr, DType gd = DType::kF32) {
  if (c.optimizer == Optimizer::kAdam) {
    AdamArgs a{separate ? b.separate() : b.fused(), bench_params(), st};
    a.params.stochastic_rounding = c.stochastic_rounding && !separate;
    if (grad) a.buf.grad = grad, a.buf.grad_dtype = gd;
    return adam_step(a, e);
  }
  OneStateBuffers buf = separate ? b.one_state_separate() : b.one_state();
  if (grad) buf.grad = grad, buf.grad_dtype = gd;
  const bool sr = c.stochastic_rounding && !separate;
  if (c.optimizer == Optimizer::kLion) {
    LionArgs a{buf, LionParams{1e-4f, 0.9f, 0.99f, 0.01f, sr, 0}, st};
    return lion_step(a, e);
  }
  AdagradArgs a{buf, AdagradParams{1e-2f, 1e-10f, 0.01f, sr, 0}, st};
  return adagrad_step(a, e);
}
}  // namespace

Result<double> time_roofline(const Buffers& b, const Config& c, const Exec& e) {
  if (c.optimizer != Optimizer::kAdam)
    return timed([&] { return one_state_roofline_pass(b.one_state(), e); });
  return timed([&] { return roofline_pass(b.fused(), e); });
}

Result<double> time_fused(const Buffers& b, const Config& c, const Exec& e) {
  return timed([&] { return run_step(b, c, e, false, AdamStep{10, 1.0f / 1024.0f}); });
}

Result<double> time_norm(const Buffers& b, const Config& c, const Exec& e) {
  return timed([&]() -> Status {
    auto r = grad_norm_sq(b.grad(), c.grad_dtype, c.params, e);
    return r.status();
  });
}

Result<double> time_full(const Buffers& b, const Config& c, const Exec& e) {
  if (c.optimizer != Optimizer::kAdam) {
    return timed([&]() -> Status {
      ZOE_ASSIGN_OR_RETURN(NormResult norm, grad_norm_sq(b.grad(), c.grad_dtype, c.params, e));
      StepScale sc = compute_step_scale(norm, 1024.0f, 1e9f);
      if (sc.overflow) return internal_error("optimizer bench: the full step overflowed");
      return run_step(b, c, e, false, AdamStep{10, sc.grad_scale});
    });
  }
  AdamGroup group;
  group.params = bench_params();
  group.params.stochastic_rounding = c.stochastic_rounding;
  group.step = 9;
  return timed([&]() -> Status {
    auto r = adam_full_step(group, b.fused(), 1024.0f, 1e9f, e);
    if (!r.is_ok()) return r.status();
    if (r->skipped) return internal_error("adam bench: the full step overflowed");
    return Status::ok();
  });
}

Result<double> time_separate(const Buffers& b, const Config& c, const Exec& e, float scale, bool fp32_grads) {
  void* g = fp32_grads ? b.grad32() : b.grad();
  const DType gd = fp32_grads ? DType::kF32 : c.grad_dtype;
  return timed([&]() -> Status {
    auto norm = grad_norm_sq(g, gd, c.params, e);
    if (!norm.is_ok()) return norm.status();
    ZOE_RETURN_IF_ERROR(scale_in_place(g, gd, c.params, scale, e));
    ZOE_RETURN_IF_ERROR(run_step(b, c, e, true, AdamStep{10, 1.0f}, g, gd));
    if (c.out_dtype) {
      auto r =
          convert_with_norm(b.fused().param, DType::kF32, b.param_out(), *c.out_dtype, c.params, false, e);
      if (!r.is_ok()) return r.status();
    }
    return Status::ok();
  });
}

Result<Report> run(const Config& c, const std::function<void(int, int)>& progress) {
  if (c.params == 0) return invalid_argument("adam bench: --params must be > 0");
  if (c.repeats < 1) return invalid_argument("adam bench: --repeats must be >= 1");
  if (c.state_dtype != DType::kF32 && c.state_dtype != DType::kBF16) {
    return invalid_argument("adam bench: --state-dtype must be fp32 or bf16");
  }
  if (c.out_dtype && *c.out_dtype == DType::kF32)
    return invalid_argument("adam bench: --out-dtype must be none, bf16 or fp16");
  ZOE_ASSIGN_OR_RETURN(auto pool, CpuPool::create({c.threads, c.numa_node, CpuPool::Backend::kAuto}));
  Exec e;
  e.pool = pool.get();
  e.simd = c.simd;
  if (c.simd && !simd_level_supported(*c.simd)) {
    return unsupported("adam bench: SIMD level %s not supported here", simd_level_name(*c.simd));
  }
  ZOE_ASSIGN_OR_RETURN(auto bufs, Buffers::create(c, pool.get()));
  Report r;
  r.config = c;
  r.simd_path = kernel_path_name(e);
  r.pool_backend = pool->backend_name();
  r.threads = pool->threads();
  r.bytes = bytes_per_param(c);
  std::vector<double> tr, tf, tn, tu, ts, ts32;
  const bool fp32_baseline = c.grad_dtype != DType::kF32;
  const int rounds = c.repeats + 1;  // the first round warms up and is dropped
  for (int i = 0; i < rounds; ++i) {
    ZOE_ASSIGN_OR_RETURN(double a, time_roofline(*bufs, c, e));
    ZOE_ASSIGN_OR_RETURN(double f, time_fused(*bufs, c, e));
    ZOE_ASSIGN_OR_RETURN(double nm, time_norm(*bufs, c, e));
    ZOE_ASSIGN_OR_RETURN(double u, time_full(*bufs, c, e));
    ZOE_ASSIGN_OR_RETURN(double s, time_separate(*bufs, c, e, i % 2 ? 0.5f : 2.0f));
    double s32 = s;
    if (fp32_baseline) {
      ZOE_ASSIGN_OR_RETURN(s32, time_separate(*bufs, c, e, i % 2 ? 0.5f : 2.0f, true));
    }
    if (i > 0) {
      tr.push_back(a), tf.push_back(f), tn.push_back(nm), tu.push_back(u), ts.push_back(s),
          ts32.push_back(s32);
    }
    if (progress) progress(i + 1, rounds);
  }
  auto stat = [](const std::vector<double>& v) {
    return Stat{median(v), *std::min_element(v.begin(), v.end())};
  };
  r.roofline = stat(tr);
  r.fused = stat(tf);
  r.norm = stat(tn);
  r.full = stat(tu);
  r.separate = stat(ts);
  r.separate_fp32 = stat(ts32);
  return r;
}

}  // namespace zoe::optim::bench
