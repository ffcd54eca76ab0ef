// The GPT's row kernels; see kernels.h. Written as plain loops over 16 lanes that g++ vectorizes.
#include "model/kernels.h"

#include <cmath>

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

template <typename F>
inline float lane_max(int n, F f) {
  float acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = -INFINITY;
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] = std::fmax(acc[j], f(i + j));
  }
  float m = -INFINITY;
  for (; i < n; ++i) m = std::fmax(m, f(i));
  for (int j = 0; j < kLanes; ++j) m = std::fmax(m, acc[j]);
  return m;
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
  const float m2 =
      lane_sum(d, [=](int i) { return dy[i] * g[i] * ((x[i] - mean) * rstd); }) * inv_d;
  for (int i = 0; i < d; ++i) {
    const float xhat = (x[i] - mean) * rstd;
    dx[i] += rstd * (dy[i] * g[i] - m1 - xhat * m2);
  }
}

void layernorm_backward_params(int rows, int d, int c0, int c1, const float* dy, const float* x, const float* mean,
                               const float* rstd, float* dg, float* db) {
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
    const float v = x[i];
    const float u = kGeluC * (v + kGeluK * v * v * v);
    y[i] = 0.5f * v * (1.0f + std::tanh(u));
  }
}

void gelu_backward(const float* x, float* dy, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float t = std::tanh(kGeluC * (v + kGeluK * v * v * v));
    const float du = kGeluC * (1.0f + 3.0f * kGeluK * v * v);
    dy[i] *= 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
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
