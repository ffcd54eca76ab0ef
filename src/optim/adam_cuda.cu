// CUDA kernels of the GPU Adam/AdamW step and the gradient norms (see adam_cuda.h).
//
// Plain grid-stride loops, one element per thread per iteration, no vector loads: the kernels are
// memory bound and the simple form is the one that is easy to check against the reference.
#include "optim/adam_cuda.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "core/cuda_util.h"

namespace zoe::optim::cuda {
namespace {

// ---- errors ------------------------------------------------------------------------------------

// After a <<<...>>> launch: a bad configuration or a missing kernel image shows up here.
#define ZOE_CUDA_LAUNCHED(what)                                                            \
  do {                                                                                     \
    cudaError_t zoe_cuda_err_ = cudaGetLastError();                                        \
    if (zoe_cuda_err_ != cudaSuccess) return cuda_error("launch of " what, zoe_cuda_err_); \
  } while (0)

// p must be addressable by the current device and aligned to `align` bytes.
Status check_ptr(const char* fn, const char* what, const void* p, size_t align) {
  if (p == nullptr) return invalid_argument("%s: %s is null", fn, what);
  if (reinterpret_cast<uintptr_t>(p) % align != 0)
    return invalid_argument("%s: %s (%p) is not aligned to its %zu-byte elements", fn, what, p, align);
  cudaPointerAttributes a{};
  cudaError_t err = cudaPointerGetAttributes(&a, p);
  if (err != cudaSuccess)
    return cuda_error("cudaPointerGetAttributes", err).with_context(std::string(fn) + ": checking " + what);
  if (a.type == cudaMemoryTypeUnregistered)
    return invalid_argument(
        "%s: %s (%p) is not memory the GPU can address (pageable host memory?): pass "
        "device, managed or pinned host memory",
        fn, what, p);
  if (a.type == cudaMemoryTypeDevice) {
    int cur = -1;
    ZOE_CUDA_TRY(cudaGetDevice(&cur));
    if (a.device != cur)
      return invalid_argument("%s: %s (%p) lives on GPU %d but the current device is GPU %d", fn, what, p,
                              a.device, cur);
  }
  return Status::ok();
}

Status check_dtype(const char* fn, const char* what, DType d) {
  if (d != DType::kF32 && d != DType::kF16 && d != DType::kBF16)
    return invalid_argument("%s: %s has unknown dtype %d", fn, what, static_cast<int>(d));
  return Status::ok();
}

// Grid of an element-wise pass: one thread per element up to 64 Ki blocks, then grid-stride.
unsigned elementwise_blocks(size_t n) {
  size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < (size_t(1) << 16) ? b : (size_t(1) << 16));
}

// ---- element conversions (the integer algorithms of core/dtype.h) --------------------------------

__device__ __forceinline__ float bf16_to_f32_dev(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

__device__ __forceinline__ uint16_t f32_to_bf16_dev(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__device__ __forceinline__ uint16_t f32_to_bf16_sr_dev(float f, uint32_t random16) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += random16;
  return static_cast<uint16_t>(u >> 16);
}

__device__ __forceinline__ float f16_to_f32_dev(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0x1f) return __uint_as_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    float r = __fmul_rn(static_cast<float>(m), 0x1p-24f);  // exact: m < 2^10
    return sign ? -r : r;
  }
  return __uint_as_float(sign | ((e + 112) << 23) | (m << 13));
}

__device__ __forceinline__ uint16_t f32_to_f16_dev(float f) {
  uint32_t u = __float_as_uint(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (a >= 0x38800000u) {                                              // fp16 normal range
    uint32_t r = a - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  // Subnormal fp16: one RNE add puts |f| on the 2^-24 grid (needs no flush-to-zero: built
  // without --use_fast_math / -ftz=true).
  float t = __fadd_rn(__uint_as_float(a), 0.5f);
  return static_cast<uint16_t>(sign | (__float_as_uint(t) - 0x3f000000u));
}

// D: DType's value (0 fp32, 1 fp16, 2 bf16).
template <int D>
__device__ __forceinline__ float load_f32(const void* base, size_t i) {
  if constexpr (D == 0)
    return static_cast<const float*>(base)[i];
  else if constexpr (D == 1)
    return f16_to_f32_dev(static_cast<const uint16_t*>(base)[i]);
  else
    return bf16_to_f32_dev(static_cast<const uint16_t*>(base)[i]);
}

template <int D>
__device__ __forceinline__ void store_f32(void* base, size_t i, float x) {
  if constexpr (D == 0)
    static_cast<float*>(base)[i] = x;
  else if constexpr (D == 1)
    static_cast<uint16_t*>(base)[i] = f32_to_f16_dev(x);
  else
    static_cast<uint16_t*>(base)[i] = f32_to_bf16_dev(x);
}

// ref::sr_hash: lowbias32 of (seed mixed with the index's high word) + the index's low word.
__device__ __forceinline__ uint32_t sr_hash_dev(uint32_t seed, uint64_t index) {
  uint32_t s = seed ^ static_cast<uint32_t>(index >> 32) * 0x27d4eb2fu;
  uint32_t x = static_cast<uint32_t>(index) + s;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  return x ^ (x >> 16);
}

// ---- Adam ----------------------------------------------------------------------------------------

// G: grad dtype; S: state dtype (0 fp32, 2 bf16). sr: bf16 states rounded stochastically.
// out: 0 none, 1 fp16, 2 bf16 (uniform over the grid, so the branches cost nothing).
template <int G, int S>
__global__ void __launch_bounds__(kThreads)
    adam_kernel(AdamConstants c, bool adamw, bool sr, int out, float* __restrict__ p,
                const void* __restrict__ g, void* __restrict__ m, void* __restrict__ v, void* __restrict__ po,
                size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float pi = p[i];
    float gi = __fmul_rn(load_f32<G>(g, i), c.grad_scale);
    if (!adamw) gi = __fadd_rn(gi, __fmul_rn(c.l2, pi));
    float mi = load_f32<S>(m, i);
    float vi = load_f32<S>(v, i);
    mi = __fadd_rn(__fmul_rn(c.beta1, mi), __fmul_rn(c.one_minus_beta1, gi));
    vi = __fadd_rn(__fmul_rn(c.beta2, vi), __fmul_rn(__fmul_rn(c.one_minus_beta2, gi), gi));
    const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), c.inv_sqrt_bc2), c.eps);
    if (adamw) pi = __fmul_rn(pi, c.decay);
    pi = __fsub_rn(pi, __fmul_rn(c.step_size, __fdiv_rn(mi, denom)));
    p[i] = pi;
    if (S == 2 && sr) {
      const uint32_t h = sr_hash_dev(c.sr_seed, i);
      static_cast<uint16_t*>(m)[i] = f32_to_bf16_sr_dev(mi, h & 0xffffu);
      static_cast<uint16_t*>(v)[i] = f32_to_bf16_sr_dev(vi, h >> 16);
    } else {
      store_f32<S>(m, i, mi);
      store_f32<S>(v, i, vi);
    }
    if (out == 1)
      store_f32<1>(po, i, pi);
    else if (out == 2)
      store_f32<2>(po, i, pi);
  }
}

using AdamKernel = void (*)(AdamConstants, bool, bool, int, float*, const void*, void*, void*, void*, size_t);

template <int G>
AdamKernel pick_adam_s(DType s) {
  return s == DType::kF32 ? &adam_kernel<G, 0> : &adam_kernel<G, 2>;
}
AdamKernel pick_adam(DType g, DType s) {
  switch (g) {
    case DType::kF32:
      return pick_adam_s<0>(s);
    case DType::kF16:
      return pick_adam_s<1>(s);
    case DType::kBF16:
      return pick_adam_s<2>(s);
  }
  return nullptr;
}

// ---- norms ---------------------------------------------------------------------------------------

// Sum over the block in a fixed tree (blockDim.x == kNormThreads, a power of two). Every thread
// of the block must call it; the result is valid in thread 0.
__device__ double block_sum(double x) {
  __shared__ double sh[kNormThreads];
  const unsigned t = threadIdx.x;
  sh[t] = x;
  __syncthreads();
  for (unsigned w = kNormThreads / 2; w > 0; w >>= 1) {
    if (t < w) sh[t] = __dadd_rn(sh[t], sh[t + w]);
    __syncthreads();
  }
  return sh[0];
}

__device__ __forceinline__ double add_sq(double acc, float x) {
  const double d = x;
  return __dadd_rn(acc, __dmul_rn(d, d));  // the product is exact: a float has 24 bits
}

template <int S>
__global__ void __launch_bounds__(kNormThreads)
    norm_kernel(const void* __restrict__ src, size_t n, double* __restrict__ partial) {
  const size_t stride = static_cast<size_t>(gridDim.x) * kNormThreads;
  double acc = 0.0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * kNormThreads + threadIdx.x; i < n; i += stride)
    acc = add_sq(acc, load_f32<S>(src, i));
  const double s = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

template <int S, int D>
__global__ void __launch_bounds__(kNormThreads)
    convert_kernel(const void* __restrict__ src, void* __restrict__ dst, size_t n,
                   double* __restrict__ partial) {
  const size_t stride = static_cast<size_t>(gridDim.x) * kNormThreads;
  double acc = 0.0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * kNormThreads + threadIdx.x; i < n; i += stride) {
    const float x = load_f32<S>(src, i);
    store_f32<D>(dst, i, x);
    acc = add_sq(acc, x);
  }
  if (partial != nullptr) {  // uniform: every thread of the block takes the same branch
    const double s = block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
  }
}

template <int S>
__global__ void __launch_bounds__(kNormThreads)
    accumulate_kernel(float* __restrict__ acc_buf, const void* __restrict__ g, size_t n, bool first,
                      double* __restrict__ partial) {
  const size_t stride = static_cast<size_t>(gridDim.x) * kNormThreads;
  double acc = 0.0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * kNormThreads + threadIdx.x; i < n; i += stride) {
    const float x = load_f32<S>(g, i);
    const float a = first ? x : __fadd_rn(acc_buf[i], x);
    acc_buf[i] = a;
    acc = add_sq(acc, a);
  }
  const double s = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// Second level: one block sums the `count` block partials (thread t takes t, t + 256, ... in
// order, then the tree) into *out.
__global__ void __launch_bounds__(kNormThreads)
    finish_norm_kernel(const double* __restrict__ partial, int count, double* __restrict__ out) {
  double acc = 0.0;
  for (int i = static_cast<int>(threadIdx.x); i < count; i += kNormThreads) acc = __dadd_rn(acc, partial[i]);
  const double s = block_sum(acc);
  if (threadIdx.x == 0) *out = s;
}

// The stream-ordered scratch of one norm: the block partials, then the result.
class NormScratch {
 public:
  explicit NormScratch(cudaStream_t s) : stream_(s) {}
  ~NormScratch() {
    if (mem_ != nullptr) (void)cudaFreeAsync(mem_, stream_);
  }
  NormScratch(const NormScratch&) = delete;
  NormScratch& operator=(const NormScratch&) = delete;

  Status allocate(int blocks) {
    ZOE_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&mem_),
                                 (static_cast<size_t>(blocks) + 1) * sizeof(double), stream_));
    blocks_ = blocks;
    return Status::ok();
  }
  double* partial() const { return mem_; }
  // Sums the partials on the device, copies the result to the host and waits for the stream.
  Result<NormResult> finish() {
    finish_norm_kernel<<<1, kNormThreads, 0, stream_>>>(mem_, blocks_, mem_ + blocks_);
    ZOE_CUDA_LAUNCHED("finish_norm_kernel");
    double sum = 0.0;
    ZOE_CUDA_TRY(cudaMemcpyAsync(&sum, mem_ + blocks_, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    ZOE_CUDA_TRY(cudaFreeAsync(mem_, stream_));
    mem_ = nullptr;
    ZOE_CUDA_TRY(cudaStreamSynchronize(stream_));
    return NormResult{sum, std::isfinite(sum)};
  }

 private:
  cudaStream_t stream_;
  double* mem_ = nullptr;
  int blocks_ = 0;
};

template <int S>
void launch_norm(int blocks, cudaStream_t s, const void* src, size_t n, double* partial) {
  norm_kernel<S><<<blocks, kNormThreads, 0, s>>>(src, n, partial);
}

template <int S, int D>
void launch_convert(int blocks, cudaStream_t s, const void* src, void* dst, size_t n, double* partial) {
  convert_kernel<S, D><<<blocks, kNormThreads, 0, s>>>(src, dst, n, partial);
}
template <int S>
void launch_convert_d(DType d, int blocks, cudaStream_t s, const void* src, void* dst, size_t n,
                      double* partial) {
  switch (d) {
    case DType::kF32:
      launch_convert<S, 0>(blocks, s, src, dst, n, partial);
      break;
    case DType::kF16:
      launch_convert<S, 1>(blocks, s, src, dst, n, partial);
      break;
    case DType::kBF16:
      launch_convert<S, 2>(blocks, s, src, dst, n, partial);
      break;
  }
}

template <int S>
void launch_accumulate(int blocks, cudaStream_t s, float* acc, const void* g, size_t n, bool first,
                       double* partial) {
  accumulate_kernel<S><<<blocks, kNormThreads, 0, s>>>(acc, g, n, first, partial);
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

Status adam_step(const AdamArgs& args, void* stream) {
  const AdamBuffers& b = args.buf;
  constexpr const char* fn = "adam_step(cuda)";
  ZOE_ASSIGN_OR_RETURN(AdamConstants c, make_adam_constants(args.params, args.step));
  if (b.n == 0) return Status::ok();
  ZOE_RETURN_IF_ERROR(check_dtype(fn, "grad", b.grad_dtype));
  if (b.state_dtype != DType::kF32 && b.state_dtype != DType::kBF16)
    return invalid_argument("%s: m/v dtype %s not supported (fp32 or bf16)", fn, dtype_name(b.state_dtype));
  if (b.param_out != nullptr && b.param_out_dtype != DType::kF16 && b.param_out_dtype != DType::kBF16)
    return invalid_argument("%s: param_out must be bf16 or fp16 (the master params are the fp32 copy)", fn);
  ZOE_RETURN_IF_ERROR(check_ptr(fn, "param", b.param, 4));
  ZOE_RETURN_IF_ERROR(check_ptr(fn, "grad", b.grad, dtype_size(b.grad_dtype)));
  ZOE_RETURN_IF_ERROR(check_ptr(fn, "exp_avg", b.exp_avg, dtype_size(b.state_dtype)));
  ZOE_RETURN_IF_ERROR(check_ptr(fn, "exp_avg_sq", b.exp_avg_sq, dtype_size(b.state_dtype)));
  int out = 0;
  if (b.param_out != nullptr) {
    ZOE_RETURN_IF_ERROR(check_ptr(fn, "param_out", b.param_out, 2));
    out = b.param_out_dtype == DType::kF16 ? 1 : 2;
  }
  const bool sr = args.params.stochastic_rounding && b.state_dtype == DType::kBF16;
  AdamKernel k = pick_adam(b.grad_dtype, b.state_dtype);
  k<<<elementwise_blocks(b.n), kThreads, 0, as_stream(stream)>>>(
      c, args.params.adamw, sr, out, b.param, b.grad, b.exp_avg, b.exp_avg_sq, b.param_out, b.n);
  ZOE_CUDA_LAUNCHED("adam_kernel");
  return Status::ok();
}

Result<NormResult> grad_norm_sq(const void* grad, DType dtype, size_t n, void* stream) {
  constexpr const char* fn = "grad_norm_sq(cuda)";
  if (n == 0) return NormResult{};
  ZOE_RETURN_IF_ERROR(check_dtype(fn, "grad", dtype));
  ZOE_RETURN_IF_ERROR(check_ptr(fn, "grad", grad, dtype_size(dtype)));
  const cudaStream_t s = as_stream(stream);
  const int blocks = norm_blocks(n);
  NormScratch scratch(s);
  ZOE_RETURN_IF_ERROR(scratch.allocate(blocks));
  switch (dtype) {
    case DType::kF32:
      launch_norm<0>(blocks, s, grad, n, scratch.partial());
      break;
    case DType::kF16:
      launch_norm<1>(blocks, s, grad, n, scratch.partial());
      break;
    case DType::kBF16:
      launch_norm<2>(blocks, s, grad, n, scratch.partial());
      break;
  }
  ZOE_CUDA_LAUNCHED("norm_kernel");
  return scratch.finish();
}

Result<NormResult> convert_with_norm(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n,
                                     bool compute_norm, void* stream) {
  constexpr const char* fn = "convert_with_norm(cuda)";
  if (n == 0) return NormResult{};
  ZOE_RETURN_IF_ERROR(check_dtype(fn, "src", src_dtype));
  ZOE_RETURN_IF_ERROR(check_dtype(fn, "dst", dst_dtype));
  if (src == dst) return invalid_argument("%s: src and dst must differ", fn);
  ZOE_RETURN_IF_ERROR(check_ptr(fn, "src", src, dtype_size(src_dtype)));
  ZOE_RETURN_IF_ERROR(check_ptr(fn, "dst", dst, dtype_size(dst_dtype)));
  const cudaStream_t s = as_stream(stream);
  const int blocks = norm_blocks(n);
  NormScratch scratch(s);
  if (compute_norm) ZOE_RETURN_IF_ERROR(scratch.allocate(blocks));
  double* partial = compute_norm ? scratch.partial() : nullptr;
  switch (src_dtype) {
    case DType::kF32:
      launch_convert_d<0>(dst_dtype, blocks, s, src, dst, n, partial);
      break;
    case DType::kF16:
      launch_convert_d<1>(dst_dtype, blocks, s, src, dst, n, partial);
      break;
    case DType::kBF16:
      launch_convert_d<2>(dst_dtype, blocks, s, src, dst, n, partial);
      break;
  }
  ZOE_CUDA_LAUNCHED("convert_kernel");
  if (compute_norm) return scratch.finish();
  ZOE_CUDA_TRY(cudaStreamSynchronize(s));
  return NormResult{};
}

Result<NormResult> accumulate_with_norm(float* acc, const void* g, DType g_dtype, size_t n, bool first,
                                        void* stream) {
  constexpr const char* fn = "accumulate_with_norm(cuda)";
  if (n == 0) return NormResult{};
  ZOE_RETURN_IF_ERROR(check_dtype(fn, "g", g_dtype));
  if (static_cast<const void*>(acc) == g) return invalid_argument("%s: acc and g must differ", fn);
  ZOE_RETURN_IF_ERROR(check_ptr(fn, "acc", acc, 4));
  ZOE_RETURN_IF_ERROR(check_ptr(fn, "g", g, dtype_size(g_dtype)));
  const cudaStream_t s = as_stream(stream);
  const int blocks = norm_blocks(n);
  NormScratch scratch(s);
  ZOE_RETURN_IF_ERROR(scratch.allocate(blocks));
  switch (g_dtype) {
    case DType::kF32:
      launch_accumulate<0>(blocks, s, acc, g, n, first, scratch.partial());
      break;
    case DType::kF16:
      launch_accumulate<1>(blocks, s, acc, g, n, first, scratch.partial());
      break;
    case DType::kBF16:
      launch_accumulate<2>(blocks, s, acc, g, n, first, scratch.partial());
      break;
  }
  ZOE_CUDA_LAUNCHED("accumulate_kernel");
  return scratch.finish();
}

}  // namespace zoe::optim::cuda
