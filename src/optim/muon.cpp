// Muon's phases on the CPU: see muon.h. Compiled with -ffp-contract=off (no FMA in the
// per-element loops).
#include "optim/muon.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "optim/cpu_pool.h"

namespace zoe::optim {
namespace {

// Rows of C per cblas_sgemm call: fixed, so the same calls run whatever the thread count, and
// OpenBLAS (single-threaded here) gives the same bits.
constexpr size_t kGemmRows = 64;

float lerp(float x, float y, float w) { return w < 0.5f ? x + w * (y - x) : y - (y - x) * (1.0f - w); }

// C[M, N] = alpha * A[M, K] op(B) + beta * C, op(B) = B^T (tb) or B; row-major, split over M.
void gemm(bool tb, size_t M, size_t N, size_t K, float alpha, const float* A, const float* B, float beta,
          float* C, const Exec& exec) {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
  const size_t pieces = (M + kGemmRows - 1) / kGemmRows;
  auto piece = [&](size_t i) {
    const size_t m0 = i * kGemmRows, m = std::min(kGemmRows, M - m0);
    const int ldb = static_cast<int>(tb ? K : N);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
                static_cast<int>(N), static_cast<int>(K), alpha, A + m0 * K, static_cast<int>(K), B, ldb,
                beta, C + m0 * N, static_cast<int>(N));
  };
  if (exec.pool != nullptr && pieces > 1) {
    exec.pool->for_each(pieces, piece);
  } else {
    for (size_t i = 0; i < pieces; ++i) piece(i);
  }
}

}  // namespace

void muon_momentum(const float* g, float grad_scale, float* buf, float* u, size_t n, const MuonParams& p) {
  const float w = 1.0f - p.momentum;
  for (size_t i = 0; i < n; ++i) {
    const float gs = g[i] * grad_scale;
    const float b = lerp(buf[i], gs, w);
    buf[i] = b;
    u[i] = p.nesterov ? lerp(gs, b, p.momentum) : b;
  }
}

Status newton_schulz(const float* u, size_t rows, size_t cols, const MuonParams& p, float* out,
                     const Exec& exec) {
  if (rows == 0 || cols == 0) return invalid_argument("newton_schulz: an empty %zu x %zu matrix", rows, cols);
  if (p.ns_steps < 0) return invalid_argument("newton_schulz: ns_steps %d < 0", p.ns_steps);
  const bool tall = rows > cols;
  const size_t r = tall ? cols : rows, c = tall ? rows : cols;  // X is r x c, r <= c
  std::vector<float> x(r * c), xn(r * c), A(r * r), B(r * r);
  double sq = 0.0;
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) {
      const float v = u[i * cols + j];
      sq += static_cast<double>(v) * v;
      x[tall ? j * c + i : i * c + j] = v;
    }
  }
  const float inv = 1.0f / std::max(static_cast<float>(std::sqrt(sq)), p.ns_eps);
  for (float& v : x) v *= inv;
  for (int s = 0; s < p.ns_steps; ++s) {
    gemm(true, r, r, c, 1.0f, x.data(), x.data(), 0.0f, A.data(), exec);  // A = X X^T
    B = A;
    gemm(false, r, r, r, p.c, A.data(), A.data(), p.b, B.data(), exec);  // B = b*A + c*A A
    xn = x;
    gemm(false, r, c, r, 1.0f, B.data(), x.data(), p.a, xn.data(), exec);  // X = a*X + B X
    x.swap(xn);
  }
  const float scale = std::sqrt(std::max(1.0f, static_cast<float>(rows) / static_cast<float>(cols)));
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) out[i * cols + j] = x[tall ? j * c + i : i * c + j] * scale;
  }
  return Status::ok();
}

void muon_apply(float* param, const float* o, size_t n, const MuonParams& p) {
  const float decay = 1.0f - p.lr * p.weight_decay;
  for (size_t i = 0; i < n; ++i) param[i] = param[i] * decay - p.lr * o[i];
}

bool is_muon_matrix(const std::string& full_name, size_t dims) {
  return dims >= 2 && full_name.find("embed") == std::string::npos &&
         full_name.find("lm_head") == std::string::npos;
}

double newton_schulz_flops(size_t rows, size_t cols, int ns_steps) {
  const double r = static_cast<double>(std::min(rows, cols)), c = static_cast<double>(std::max(rows, cols));
  return ns_steps * (2.0 * r * r * c + 2.0 * r * r * r + 2.0 * r * r * c);
}

}  // namespace zoe::optim
