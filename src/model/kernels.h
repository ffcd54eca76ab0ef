// The GPT's element-wise and row kernels (LayerNorm, GELU, causal softmax, cross-entropy, bias).
//
// Each function handles one row or one range of rows/columns; GptCpu runs them in parallel. Every
// sum has a fixed order (16 lanes combined by a fixed tree), so a result depends only on the
// inputs, never on which thread computed it. Built with -O3 -fno-math-errno so g++ vectorizes
// the lane loops without reassociating anything.
#pragma once

#include <cstddef>

namespace zoe::model::kernels {

constexpr float kLayerNormEps = 1e-5f;

// out = (x - mean) * rstd * g + b over one row of d; writes the row's mean and 1/sqrt(var + eps).
void layernorm_forward(const float* x, const float* g, const float* b, int d, float* out, float* mean,
                       float* rstd);
// dx += d(LayerNorm)/dx applied to dy, for one row.
void layernorm_backward_input(const float* dy, const float* x, const float* g, float mean, float rstd, int d,
                              float* dx);
// dg[c] += sum_r dy[r, c] * xhat[r, c] and db[c] += sum_r dy[r, c] for c in [c0, c1), rows in order.
void layernorm_backward_params(int rows, int d, int c0, int c1, const float* dy, const float* x,
                               const float* mean, const float* rstd, float* dg, float* db);

// out[c] += sum_r y[r * ld + c] for c in [c0, c1), rows in order.
void column_sum(int rows, int ld, int c0, int c1, const float* y, float* out);
// y[i] = b[i] for one row of n.
void fill_row(float* y, const float* b, int n);

// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), computed as x e / (1 + e), e = exp(2u), with an
// inlined exp so the loop vectorizes (about 2 ulp; tested against the double formula).
void gelu_forward(const float* x, float* y, size_t n);
// dy *= gelu'(x).
void gelu_backward(const float* x, float* dy, size_t n);

// Row t of a causal attention matrix of width T: softmax over s[0..t], zeros after.
void causal_softmax_row(float* s, int t, int T);
// dp (row t, in place) becomes scale * p * (dp - sum(p * dp)) over [0..t], zeros after.
void causal_softmax_backward_row(const float* p, float* dp, int t, int T, float scale);

// log(sum(exp(x))) of one row, with the max subtracted first.
float logsumexp(const float* x, int n);
// dlogits = scale * (softmax(logits) - onehot(target)) for one row, from its logsumexp.
void cross_entropy_backward_row(const float* logits, float lse, int target, float scale, int n,
                                float* dlogits);

}  // namespace zoe::model::kernels
