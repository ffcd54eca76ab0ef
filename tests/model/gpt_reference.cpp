// The double-precision reference forward of the GPT; written for clarity, not speed.
#include "gpt_reference.h"

#include <cmath>

namespace zoe::model::testing {
namespace {

using Vec = std::vector<double>;

// y[n, out] = x[n, in] W^T + b
Vec linear(const Vec& x, int n, int in, const Vec& w, const Vec& b, int out) {
  Vec y(static_cast<size_t>(n) * out);
  for (int r = 0; r < n; ++r)
    for (int o = 0; o < out; ++o) {
      double s = b[o];
      for (int i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
      y[r * out + o] = s;
    }
  return y;
}

Vec layernorm(const Vec& x, int n, int d, const Vec& g, const Vec& b) {
  Vec y(x.size());
  for (int r = 0; r < n; ++r) {
    double m = 0.0, v = 0.0;
    for (int i = 0; i < d; ++i) m += x[r * d + i];
    m /= d;
    for (int i = 0; i < d; ++i) v += (x[r * d + i] - m) * (x[r * d + i] - m);
    v /= d;
    const double rs = 1.0 / std::sqrt(v + 1e-5);
    for (int i = 0; i < d; ++i) y[r * d + i] = (x[r * d + i] - m) * rs * g[i] + b[i];
  }
  return y;
}

double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

}  // namespace

RefOutput gpt_reference_forward(const GptConfig& c, int batch, int T, const RefParams& params,
                                const int32_t* tokens, const int32_t* targets) {
  const int d = c.d_model, n = batch * T, H = c.heads, hd = d / H, V = c.vocab;
  const Vec& wte = params[0][0];
  const Vec& wpe = params[0][1];
  Vec x(static_cast<size_t>(n) * d);
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < d; ++i) x[r * d + i] = wte[tokens[r] * d + i] + wpe[(r % T) * d + i];

  for (int l = 0; l < c.layers; ++l) {
    const auto& p = params[1 + l];
    const Vec h1 = layernorm(x, n, d, p[0], p[1]);
    const Vec qkv = linear(h1, n, d, p[2], p[3], 3 * d);
    Vec att(static_cast<size_t>(n) * d, 0.0);
    for (int b = 0; b < batch; ++b)
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < T; ++t) {
          const double* q = &qkv[(b * T + t) * 3 * d + h * hd];
          std::vector<double> w(t + 1);
          double mx = -1e300;
          for (int s = 0; s <= t; ++s) {
            const double* k = &qkv[(b * T + s) * 3 * d + d + h * hd];
            double dot = 0.0;
            for (int i = 0; i < hd; ++i) dot += q[i] * k[i];
            w[s] = dot / std::sqrt(static_cast<double>(hd));
            mx = std::max(mx, w[s]);
          }
          double sum = 0.0;
          for (int s = 0; s <= t; ++s) sum += (w[s] = std::exp(w[s] - mx));
          for (int s = 0; s <= t; ++s) {
            const double* v = &qkv[(b * T + s) * 3 * d + 2 * d + h * hd];
            for (int i = 0; i < hd; ++i) att[(b * T + t) * d + h * hd + i] += w[s] / sum * v[i];
          }
        }
    const Vec pr = linear(att, n, d, p[4], p[5], d);
    for (size_t i = 0; i < x.size(); ++i) x[i] += pr[i];
    const Vec h2 = layernorm(x, n, d, p[6], p[7]);
    Vec f = linear(h2, n, d, p[8], p[9], 4 * d);
    for (double& v : f) v = gelu(v);
    const Vec f2 = linear(f, n, 4 * d, p[10], p[11], d);
    for (size_t i = 0; i < x.size(); ++i) x[i] += f2[i];
  }
  const auto& pf = params[1 + c.layers];
  const Vec xf = layernorm(x, n, d, pf[0], pf[1]);
  RefOutput out;
  out.logits.assign(static_cast<size_t>(n) * V, 0.0);
  double loss = 0.0;
  int count = 0;
  for (int r = 0; r < n; ++r) {
    double mx = -1e300;
    for (int v = 0; v < V; ++v) {
      double s = 0.0;
      for (int i = 0; i < d; ++i) s += xf[r * d + i] * wte[v * d + i];
      out.logits[r * V + v] = s;
      mx = std::max(mx, s);
    }
    if (targets[r] < 0) continue;
    double sum = 0.0;
    for (int v = 0; v < V; ++v) sum += std::exp(out.logits[r * V + v] - mx);
    loss += mx + std::log(sum) - out.logits[r * V + targets[r]];
    ++count;
  }
  out.loss = count > 0 ? loss / count : 0.0;
  return out;
}

}  // namespace zoe::model::testing
