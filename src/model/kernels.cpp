// The GPT's row kernels; see kernels.h. Written as plain loops over 16 lanes that g++ vectorizes.
#include "model/kernels.h"

#include <bit>
#include <cmath>
#include <cstdint>

namespace zoe::model::kernels {
namespace {

constexpr int kLanes = 16;
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluK = 0.044715f;

// sum_i f(i) over [0, n) in a fixed order: 16 running lanes, a tail, then a fixed tree.
template <typename F>
inline float lane_sum(int n, F f) {
  float acc[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += f(i + j);
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += f(i);
  for (int w = kLanes / 2; w > 0; w /= 2) {
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  }
  return acc[0] + tail;
}

// fmax without the NaN rules, so it vectorizes to maxps.
inline float max2(float a, float b) { return a > b ? a : b; }

template <typename F>
inline float lane_max(int n, F f) {
  float acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = -INFINITY;
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] = max2(acc[j], f(i + j));
  }
  float m = -INFINITY;
  for (; i < n; ++i) m = max2(m, f(i));
  for (int j = 0; j < kLanes; ++j) m = max2(m, acc[j]);
  return m;
}

// exp(x) for x in [-88, 88] (Cephes' expf: 2^k times a degree-7 polynomial on [-ln2/2, ln2/2]),
// about 2 ulp, branch-free so a loop of it vectorizes (the libm call does not).
inline float exp_approx(float x) {
  const float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  const float r = x - k * 0.693359375f - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>((static_cast<int32_t>(k) + 127) << 23);
}

// GELU through the logistic form: 0.5 (1 + tanh(u)) = e / (1 + e) with e = exp(2u), which has no
// cancellation at either end. u is clamped to +-40 (e stays a normal float), where the terms that
// depend on it are exactly 0 or 1 in fp32 anyway.
inline float gelu_exp2u(float v) {
  float u = kGeluC * (v + kGeluK * v * v * v);
  u = max2(u, -40.0f);
  u = u < 40.0f ? u : 40.0f;
  return exp_approx(2.0f * u);
}

}  // namespace

void layernorm_forward(const float* x, const float* g, const float* b, int d, float* out, float* mean,
                       float* rstd) {
  const float inv_d = 1.0f / static_cast<float>(d);
  const float m = lane_sum(d, [x](int i) { return x[i]; }) * inv_d;
  const float var = lane_sum(d, [x, m](int i) { return (x[i] - m) * (x[i] - m); }) * inv_d;
  const float r = 1.0f / std::sqrt(var + kLayerNormEps);
  for (int i = 0; i < d; ++i) out[i] = (x[i] - m) * r * g[i] + b[i];
  *mean = m;
  *rstd = r;
}

void layernorm_backward_input(const float* dy, const float* x, const float* g, float mean, float rstd, int d,
                              float* dx) {
  const float inv_d = 1.0f / static_cast<float>(d);
  // dxhat = dy * g; dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
  const float m1 = lane_sum(d, [dy, g](int i) { return dy[i] * g[i]; }) * inv_d;
  const float m2 = lane_sum(d, [=](int i) { return dy[i] * g[i] * ((x[i] - mean) * rstd); }) * inv_d;
  for (int i = 0; i < d; ++i) {
    const float xhat = (x[i] - mean) * rstd;
    dx[i] += rstd * (dy[i] * g[i] - m1 - xhat * m2);
  }
}

void layernorm_backward_params(int rows, int d, int c0, int c1, const float* dy, const float* x,
                               const float* mean, const float* rstd, float* dg, float* db) {
  for (int r = 0; r < rows; ++r) {
    const float* dyr = dy + static_cast<size_t>(r) * d;
    const float* xr = x + static_cast<size_t>(r) * d;
    const float m = mean[r];
    const float s = rstd[r];
    for (int c = c0; c < c1; ++c) {
      dg[c] += dyr[c] * ((xr[c] - m) * s);
      db[c] += dyr[c];
    }
  }
}

void column_sum(int rows, int ld, int c0, int c1, const float* y, float* out) {
  for (int r = 0; r < rows; ++r) {
    const float* yr = y + static_cast<size_t>(r) * ld;
    for (int c = c0; c < c1; ++c) out[c] += yr[c];
  }
}

void fill_row(float* y, const float* b, int n) {
  for (int i = 0; i < n; ++i) y[i] = b[i];
}

void gelu_forward(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float e = gelu_exp2u(x[i]);
    y[i] = x[i] * (e / (1.0f + e));
  }
}

void gelu_backward(const float* x, float* dy, size_t n) {
  // gelu' = s + 2 v s (1 - s) u' with s = e / (1 + e); beyond |v| = 20 the second term is 0 in fp32,
  // and clamping v there keeps v^2 finite (so 0 * inf never happens).
  for (size_t i = 0; i < n; ++i) {
    float v = x[i];
    v = max2(v, -20.0f);
    v = v < 20.0f ? v : 20.0f;
    const float e = gelu_exp2u(v);
    const float q = 1.0f / (1.0f + e);
    const float s = e * q;
    const float du = kGeluC * (1.0f + 3.0f * kGeluK * v * v);
    dy[i] *= s + 2.0f * v * s * q * du;
  }
}

void causal_softmax_row(float* s, int t, int T) {
  const int n = t + 1;
  const float m = lane_max(n, [s](int i) { return s[i]; });
  for (int i = 0; i < n; ++i) s[i] = std::exp(s[i] - m);
  const float inv = 1.0f / lane_sum(n, [s](int i) { return s[i]; });
  for (int i = 0; i < n; ++i) s[i] *= inv;
  for (int i = n; i < T; ++i) s[i] = 0.0f;
}

void causal_softmax_backward_row(const float* p, float* dp, int t, int T, float scale) {
  const int n = t + 1;
  const float dot = lane_sum(n, [p, dp](int i) { return p[i] * dp[i]; });
  for (int i = 0; i < n; ++i) dp[i] = scale * p[i] * (dp[i] - dot);
  for (int i = n; i < T; ++i) dp[i] = 0.0f;
}

float logsumexp(const float* x, int n) {
  const float m = lane_max(n, [x](int i) { return x[i]; });
  return m + std::log(lane_sum(n, [x, m](int i) { return std::exp(x[i] - m); }));
}

void cross_entropy_backward_row(const float* logits, float lse, int target, float scale, int n,
                                float* dlogits) {
  for (int i = 0; i < n; ++i) dlogits[i] = scale * std::exp(logits[i] - lse);
  dlogits[target] -= scale;
}

}  // namespace zoe::model::kernels
