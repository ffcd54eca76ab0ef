// The GPT's plain CUDA kernels (everything but the matrix products, which are cuBLAS'), and
// their launch helpers. Included by gpt_cuda.cu only, inside its anonymous namespace: the kernels
// keep internal linkage, as when they sat in that file.
#pragma once

// ---- kernels -----------------------------------------------------------------------------------

constexpr int kThreads = 256;                  // element-wise kernels and column kernels
constexpr int kRowThreads = 128;               // one block per row: LayerNorm, softmax, log-sum-exp
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluK = 0.044715f;

unsigned grid_for(size_t n, int threads) {
  const size_t b = (n + static_cast<size_t>(threads) - 1) / static_cast<size_t>(threads);
  return static_cast<unsigned>(b < (size_t(1) << 20) ? (b == 0 ? 1 : b) : (size_t(1) << 20));
}
unsigned grid_rows(size_t rows) {
  return static_cast<unsigned>(rows < (size_t(1) << 20) ? (rows == 0 ? 1 : rows) : (size_t(1) << 20));
}

// Grid-stride loop over [0, n).
#define ZOE_FOR_EACH(i, n)                                                             \
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
// One block per row, striding over the rows.
#define ZOE_FOR_EACH_ROW(r, rows) for (size_t r = blockIdx.x; r < (rows); r += gridDim.x)

struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Reduces v over the block (blockDim.x == kRowThreads) in a fixed tree; every thread gets the
// result. Every thread of the block must call it; sh is kRowThreads floats of shared memory.
template <typename Op>
__device__ float block_reduce(float v, float* sh, Op op) {
  const unsigned t = threadIdx.x;
  sh[t] = v;
  __syncthreads();
  for (unsigned w = kRowThreads / 2; w > 0; w >>= 1) {
    if (t < w) sh[t] = op(sh[t], sh[t + w]);
    __syncthreads();
  }
  const float r = sh[0];
  __syncthreads();  // sh may be reused right after
  return r;
}

__global__ void embed_kernel(const int32_t* __restrict__ tokens, const float* __restrict__ wte,
                             const float* __restrict__ wpe, float* __restrict__ x, size_t rows, int T,
                             int d) {
  ZOE_FOR_EACH(idx, rows * d) {
    const size_t r = idx / d, i = idx % d;
    x[idx] = wte[static_cast<size_t>(tokens[r]) * d + i] + wpe[(r % T) * d + i];
  }
}

__global__ void fill_rows_kernel(float* __restrict__ y, const float* __restrict__ b, size_t rows, int n) {
  ZOE_FOR_EACH(idx, rows * n) y[idx] = b[idx % n];
}

__global__ void add_kernel(float* __restrict__ y, const float* __restrict__ x, size_t n) {
  ZOE_FOR_EACH(i, n) y[i] += x[i];
}

__global__ void __launch_bounds__(kRowThreads)
    layernorm_forward_kernel(const float* __restrict__ x, const float* __restrict__ g,
                             const float* __restrict__ b, float* __restrict__ out, float* __restrict__ mean,
                             float* __restrict__ rstd, size_t rows, int d) {
  __shared__ float sh[kRowThreads];
  const float inv_d = 1.0f / static_cast<float>(d);
  ZOE_FOR_EACH_ROW(r, rows) {
    const float* xr = x + r * d;
    float s = 0.0f;
    for (int i = threadIdx.x; i < d; i += kRowThreads) s += xr[i];
    const float m = block_reduce(s, sh, SumOp()) * inv_d;
    float s2 = 0.0f;
    for (int i = threadIdx.x; i < d; i += kRowThreads) {
      const float c = xr[i] - m;
      s2 += c * c;
    }
    const float var = block_reduce(s2, sh, SumOp()) * inv_d;
    const float rs = 1.0f / sqrtf(var + kernels::kLayerNormEps);
    float* o = out + r * d;
    for (int i = threadIdx.x; i < d; i += kRowThreads) o[i] = (xr[i] - m) * rs * g[i] + b[i];
    if (threadIdx.x == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
  }
}

// dx += d(LayerNorm)/dx applied to dy, per row.
__global__ void __launch_bounds__(kRowThreads)
    layernorm_backward_input_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                    const float* __restrict__ g, const float* __restrict__ mean,
                                    const float* __restrict__ rstd, float* __restrict__ dx, size_t rows,
                                    int d) {
  __shared__ float sh[kRowThreads];
  const float inv_d = 1.0f / static_cast<float>(d);
  ZOE_FOR_EACH_ROW(r, rows) {
    const float* dyr = dy + r * d;
    const float* xr = x + r * d;
    const float m = mean[r], rs = rstd[r];
    float a = 0.0f, c = 0.0f;
    for (int i = threadIdx.x; i < d; i += kRowThreads) {
      const float dg = dyr[i] * g[i];
      a += dg;
      c += dg * ((xr[i] - m) * rs);
    }
    const float m1 = block_reduce(a, sh, SumOp()) * inv_d;
    const float m2 = block_reduce(c, sh, SumOp()) * inv_d;
    float* dxr = dx + r * d;
    for (int i = threadIdx.x; i < d; i += kRowThreads) {
      const float xhat = (xr[i] - m) * rs;
      dxr[i] += rs * (dyr[i] * g[i] - m1 - xhat * m2);
    }
  }
}

// dg[c] += sum_r dy[r, c] * xhat[r, c], db[c] += sum_r dy[r, c]: one thread per column, rows in order.
__global__ void layernorm_backward_params_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                                 const float* __restrict__ mean,
                                                 const float* __restrict__ rstd, float* __restrict__ dg,
                                                 float* __restrict__ db, size_t rows, int d) {
  ZOE_FOR_EACH(c, static_cast<size_t>(d)) {
    float sg = dg[c], sb = db[c];
    for (size_t r = 0; r < rows; ++r) {
      const float v = dy[r * d + c];
      sg += v * ((x[r * d + c] - mean[r]) * rstd[r]);
      sb += v;
    }
    dg[c] = sg;
    db[c] = sb;
  }
}

// out[c] += sum_r y[r * ld + c]: one thread per column, rows in order.
__global__ void column_sum_kernel(const float* __restrict__ y, float* __restrict__ out, size_t rows, int ld) {
  ZOE_FOR_EACH(c, static_cast<size_t>(ld)) {
    float s = out[c];
    for (size_t r = 0; r < rows; ++r) s += y[r * ld + c];
    out[c] = s;
  }
}

// e = exp(2u), u = sqrt(2/pi) (v + 0.044715 v^3) clamped to +-40 (as kernels.cpp does).
__device__ __forceinline__ float gelu_exp2u(float v) {
  float u = kGeluC * (v + kGeluK * v * v * v);
  u = fminf(fmaxf(u, -40.0f), 40.0f);
  return expf(2.0f * u);
}

__global__ void gelu_forward_kernel(const float* __restrict__ x, float* __restrict__ y, size_t n) {
  ZOE_FOR_EACH(i, n) {
    const float e = gelu_exp2u(x[i]);
    y[i] = x[i] * (e / (1.0f + e));
  }
}

// dy *= gelu'(x) = s + 2 v s (1 - s) u', s = e / (1 + e); v clamped to +-20 as in kernels.cpp.
__global__ void gelu_backward_kernel(const float* __restrict__ x, float* __restrict__ dy, size_t n) {
  ZOE_FOR_EACH(i, n) {
    const float v = fminf(fmaxf(x[i], -20.0f), 20.0f);
    const float e = gelu_exp2u(v);
    const float q = 1.0f / (1.0f + e);
    const float s = e * q;
    const float du = kGeluC * (1.0f + 3.0f * kGeluK * v * v);
    dy[i] *= s + 2.0f * v * s * q * du;
  }
}

// Rows of [B, H, T, T]: row r is query position r % T. Softmax over [0, t], zeros after.
__global__ void __launch_bounds__(kRowThreads)
    causal_softmax_kernel(float* __restrict__ att, size_t rows, int T) {
  __shared__ float sh[kRowThreads];
  ZOE_FOR_EACH_ROW(r, rows) {
    float* s = att + r * T;
    const int n = static_cast<int>(r % T) + 1;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < n; i += kRowThreads) mx = fmaxf(mx, s[i]);
    mx = block_reduce(mx, sh, MaxOp());
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += kRowThreads) {
      const float e = expf(s[i] - mx);
      s[i] = e;
      sum += e;
    }
    const float inv = 1.0f / block_reduce(sum, sh, SumOp());
    for (int i = threadIdx.x; i < n; i += kRowThreads) s[i] *= inv;
    for (int i = n + threadIdx.x; i < T; i += kRowThreads) s[i] = 0.0f;
  }
}

// dp = scale * p * (dp - sum(p * dp)) over [0, t], zeros after.
__global__ void __launch_bounds__(kRowThreads)
    causal_softmax_backward_kernel(const float* __restrict__ p, float* __restrict__ dp, size_t rows, int T,
                                   float scale) {
  __shared__ float sh[kRowThreads];
  ZOE_FOR_EACH_ROW(r, rows) {
    const float* pr = p + r * T;
    float* dr = dp + r * T;
    const int n = static_cast<int>(r % T) + 1;
    float dot = 0.0f;
    for (int i = threadIdx.x; i < n; i += kRowThreads) dot += pr[i] * dr[i];
    dot = block_reduce(dot, sh, SumOp());
    for (int i = threadIdx.x; i < n; i += kRowThreads) dr[i] = scale * pr[i] * (dr[i] - dot);
    for (int i = n + threadIdx.x; i < T; i += kRowThreads) dr[i] = 0.0f;
  }
}

__global__ void __launch_bounds__(kRowThreads)
    logsumexp_kernel(const float* __restrict__ logits, float* __restrict__ lse, size_t rows, int V) {
  __shared__ float sh[kRowThreads];
  ZOE_FOR_EACH_ROW(r, rows) {
    const float* x = logits + r * V;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += kRowThreads) mx = fmaxf(mx, x[i]);
    mx = block_reduce(mx, sh, MaxOp());
    float sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += kRowThreads) sum += expf(x[i] - mx);
    sum = block_reduce(sum, sh, SumOp());
    if (threadIdx.x == 0) lse[r] = mx + logf(sum);
  }
}

// *loss_sum = sum over rows with a target of (lse - logit[target]), in double: one block of
// kThreads, thread t taking rows t, t + kThreads, ..., then a fixed tree.
__global__ void __launch_bounds__(kThreads)
    loss_kernel(const float* __restrict__ logits, const float* __restrict__ lse,
                const int32_t* __restrict__ targets, size_t rows, int V, double* __restrict__ loss_sum) {
  __shared__ double sh[kThreads];
  double acc = 0.0;
  for (size_t r = threadIdx.x; r < rows; r += kThreads) {
    const int t = targets[r];
    if (t >= 0) acc += static_cast<double>(lse[r]) - static_cast<double>(logits[r * V + t]);
  }
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned w = kThreads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss_sum = sh[0];
}

// dlogits = scale * (softmax(logits) - onehot(target)); zero rows where the target is < 0.
__global__ void cross_entropy_backward_kernel(const float* __restrict__ logits, const float* __restrict__ lse,
                                              const int32_t* __restrict__ targets,
                                              float* __restrict__ dlogits, size_t rows, int V, float scale) {
  ZOE_FOR_EACH(idx, rows * V) {
    const size_t r = idx / V;
    const int c = static_cast<int>(idx % V);
    const int t = targets[r];
    float v = 0.0f;
    if (t >= 0) {
      v = scale * expf(logits[idx] - lse[r]);
      if (c == t) v -= scale;
    }
    dlogits[idx] = v;
  }
}

// dwpe[t, i] += dres[b, t, i] for b in order: one thread per (t, i).
__global__ void wpe_backward_kernel(const float* __restrict__ dres, float* __restrict__ dwpe, int B, int T,
                                    int d) {
  ZOE_FOR_EACH(idx, static_cast<size_t>(T) * d) {
    float s = dwpe[idx];
    for (int b = 0; b < B; ++b) s += dres[static_cast<size_t>(b) * T * d + idx];
    dwpe[idx] = s;
  }
}

// dwte[token[r], i] += dres[r, i] for rows in order: one thread per column i, so rows that share
// a token never race and every sum has the row order.
__global__ void wte_backward_kernel(const float* __restrict__ dres, const int32_t* __restrict__ tokens,
                                    float* __restrict__ dwte, size_t rows, int d) {
  ZOE_FOR_EACH(i, static_cast<size_t>(d)) {
    for (size_t r = 0; r < rows; ++r) dwte[static_cast<size_t>(tokens[r]) * d + i] += dres[r * d + i];
  }
}
