// C entry points to zoe's fused CPU optimizer steps, for comparison scripts that load them with
// ctypes and run them on the same buffers as another implementation (vs_deepspeed_optim.py).
//
// Every step returns 0, or -1 with the error in zoe_optim_last_error(). grad_dtype and
// out_dtype are DType codes (0 fp32, 1 fp16, 2 bf16); out may be null (no compute copy).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "optim/adam.h"
#include "optim/cpu_pool.h"
#include "optim/lion_adagrad.h"

namespace {

thread_local std::string g_error;

int report(const zoe::Status& s) {
  if (s.is_ok()) return 0;
  g_error = s.to_string();
  return -1;
}

zoe::optim::Exec exec_of(void* pool) {
  zoe::optim::Exec e;
  e.pool = static_cast<zoe::optim::CpuPool*>(pool);
  return e;
}

zoe::optim::OneStateBuffers one_state(float* p, const void* g, int grad_dtype, void* s, size_t n, void* out,
                                      int out_dtype) {
  zoe::optim::OneStateBuffers b;
  b.n = n;
  b.param = p;
  b.grad = g;
  b.grad_dtype = static_cast<zoe::DType>(grad_dtype);
  b.state = s;
  b.param_out = out;
  b.param_out_dtype = static_cast<zoe::DType>(out_dtype);
  return b;
}

}  // namespace

extern "C" {

const char* zoe_optim_last_error() { return g_error.c_str(); }

// A pool of `threads` threads (0: every PU); null on failure.
void* zoe_optim_pool_create(int threads) {
  auto pool = zoe::optim::CpuPool::create({threads, -1, zoe::optim::CpuPool::Backend::kAuto});
  if (!pool.is_ok()) {
    g_error = pool.status().to_string();
    return nullptr;
  }
  return pool.value().release();
}
void zoe_optim_pool_destroy(void* pool) { delete static_cast<zoe::optim::CpuPool*>(pool); }
int zoe_optim_pool_threads(void* pool) { return static_cast<zoe::optim::CpuPool*>(pool)->threads(); }
const char* zoe_optim_pool_backend(void* pool) {
  return static_cast<zoe::optim::CpuPool*>(pool)->backend_name();
}

// The SIMD path the steps take, e.g. "avx512".
const char* zoe_optim_kernel_path() { return zoe::optim::kernel_path_name(); }

int zoe_optim_lion_step(void* pool, float* p, const void* g, int grad_dtype, void* m, size_t n, float lr,
                        float beta1, float beta2, float weight_decay, int64_t step, float grad_scale,
                        void* out, int out_dtype) {
  zoe::optim::LionArgs a;
  a.buf = one_state(p, g, grad_dtype, m, n, out, out_dtype);
  a.params.lr = lr;
  a.params.beta1 = beta1;
  a.params.beta2 = beta2;
  a.params.weight_decay = weight_decay;
  a.step = {step, grad_scale};
  return report(zoe::optim::lion_step(a, exec_of(pool)));
}

int zoe_optim_adagrad_step(void* pool, float* p, const void* g, int grad_dtype, void* sum, size_t n, float lr,
                           float eps, float weight_decay, int64_t step, float grad_scale, void* out,
                           int out_dtype) {
  zoe::optim::AdagradArgs a;
  a.buf = one_state(p, g, grad_dtype, sum, n, out, out_dtype);
  a.params.lr = lr;
  a.params.eps = eps;
  a.params.weight_decay = weight_decay;
  a.step = {step, grad_scale};
  return report(zoe::optim::adagrad_step(a, exec_of(pool)));
}

// The memory yardstick with a one-state step's streams (reads p, g, s; writes p, s; out when
// set): values unchanged but out.
int zoe_optim_one_state_roofline(void* pool, float* p, const void* g, int grad_dtype, void* s, size_t n,
                                 void* out, int out_dtype) {
  return report(
      zoe::optim::one_state_roofline_pass(one_state(p, g, grad_dtype, s, n, out, out_dtype), exec_of(pool)));
}

// AdamW (adamw != 0) or Adam with L2, fp32 m and v.
int zoe_optim_adam_step(void* pool, float* p, const void* g, int grad_dtype, float* m, float* v, size_t n,
                        float lr, float beta1, float beta2, float eps, float weight_decay, int adamw,
                        int64_t step, float grad_scale, void* out, int out_dtype) {
  zoe::optim::AdamArgs a;
  a.buf.n = n;
  a.buf.param = p;
  a.buf.grad = g;
  a.buf.grad_dtype = static_cast<zoe::DType>(grad_dtype);
  a.buf.exp_avg = m;
  a.buf.exp_avg_sq = v;
  a.buf.param_out = out;
  a.buf.param_out_dtype = static_cast<zoe::DType>(out_dtype);
  a.params.lr = lr;
  a.params.beta1 = beta1;
  a.params.beta2 = beta2;
  a.params.eps = eps;
  a.params.weight_decay = weight_decay;
  a.params.adamw = adamw != 0;
  a.step = {step, grad_scale};
  return report(zoe::optim::adam_step(a, exec_of(pool)));
}

}  // extern "C"
