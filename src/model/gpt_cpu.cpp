// GptCpu: the GPT's forward and backward on the host, matrix products through OpenBLAS.
#include <cblas.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <thread>
#include <vector>

#include "core/cpu.h"
#include "core/log.h"
#include "model/gpt.h"
#include "model/kernels.h"
#include "zoe/features.h"

#if ZOE_HAVE_TBB
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#endif

namespace zoe::model {
namespace {

// Rows of C per cblas_sgemm call. Fixed, so the same calls with the same shapes run whatever the
// thread count, and OpenBLAS (single-threaded) gives the same bits.
constexpr int kGemmChunk = 64;
// Rows per task of the row kernels, and columns per task of the column sums.
constexpr int kRowGrain = 8;
constexpr int kColChunk = 64;

// CPUs this process may use (its affinity mask and cgroup quota), at least 1.
int usable_cpus() { return usable_cores(); }

// Runs independent work items on `threads` threads (a oneTBB arena), or in a plain loop.
class Parallel {
 public:
  explicit Parallel(int threads) : threads_(threads) {
#if ZOE_HAVE_TBB
    if (threads_ > 1) arena_ = std::make_unique<tbb::task_arena>(threads_);
#endif
  }
  int threads() const { return threads_; }

  // fn(i) for every i in [0, n); items are independent.
  template <typename F>
  void for_each(size_t n, const F& fn) {
#if ZOE_HAVE_TBB
    if (arena_ && n > 1) {
      arena_->execute([&] {
        tbb::parallel_for(
            tbb::blocked_range<size_t>(0, n, 1),
            [&](const tbb::blocked_range<size_t>& r) {
              for (size_t i = r.begin(); i != r.end(); ++i) fn(i);
            },
            tbb::simple_partitioner());
      });
      return;
    }
#endif
    for (size_t i = 0; i < n; ++i) fn(i);
  }
  // fn(r) for every row r in [0, rows), in tasks of `grain` rows.
  template <typename F>
  void for_rows(int rows, const F& fn) {
    const size_t tasks = (static_cast<size_t>(rows) + kRowGrain - 1) / kRowGrain;
    for_each(tasks, [&](size_t t) {
      const int r1 = std::min(rows, static_cast<int>(t + 1) * kRowGrain);
      for (int r = static_cast<int>(t) * kRowGrain; r < r1; ++r) fn(r);
    });
  }
  // fn(c0, c1) over [0, cols) in fixed chunks of kColChunk columns.
  template <typename F>
  void for_cols(int cols, const F& fn) {
    const size_t tasks = (static_cast<size_t>(cols) + kColChunk - 1) / kColChunk;
    for_each(tasks, [&](size_t t) {
      const int c0 = static_cast<int>(t) * kColChunk;
      fn(c0, std::min(cols, c0 + kColChunk));
    });
  }

 private:
  int threads_;
#if ZOE_HAVE_TBB
  std::unique_ptr<tbb::task_arena> arena_;
#endif
};

using Buf = std::vector<float>;

struct LayerActs {
  Buf ln1_out, ln1_mean, ln1_rstd;
  Buf qkv;      // [N, 3d]: q | k | v, head h at columns h * hd of each
  Buf att;      // [B, H, T, T] softmax probabilities, zero above the diagonal
  Buf att_out;  // [N, d] heads concatenated, before proj
  Buf x_mid;    // [N, d] residual after attention
  Buf ln2_out, ln2_mean, ln2_rstd;
  Buf fc1;   // [N, 4d] before GELU
  Buf gelu;  // [N, 4d]
};

class GptCpuImpl final : public GptCpu {
 public:
  GptCpuImpl(const GptConfig& c, int batch, int tokens, int threads, bool checkpointing)
      : c_(c),
        B_(batch),
        T_(tokens),
        N_(batch * tokens),
        d_(c.d_model),
        H_(c.heads),
        hd_(c.d_model / c.heads),
        V_(c.vocab),
        ckpt_(checkpointing),
        par_(threads) {
    const size_t nd = static_cast<size_t>(N_) * d_;
    const size_t n = static_cast<size_t>(N_);
    const size_t att = static_cast<size_t>(B_) * H_ * T_ * T_;
    // With checkpointing: two residual buffers (a block's input and its output, in turn) and one
    // block's workspace; without: every block's input and intermediates.
    residual_.resize(ckpt_ ? 2 : static_cast<size_t>(c.layers) + 1);
    for (Buf& r : residual_) alloc(r, nd);
    acts_.resize(ckpt_ ? 1 : static_cast<size_t>(c.layers));
    for (LayerActs& a : acts_) {
      alloc(a.ln1_out, nd), alloc(a.ln1_mean, n), alloc(a.ln1_rstd, n);
      alloc(a.qkv, 3 * nd), alloc(a.att, att), alloc(a.att_out, nd), alloc(a.x_mid, nd);
      alloc(a.ln2_out, nd), alloc(a.ln2_mean, n), alloc(a.ln2_rstd, n);
      alloc(a.fc1, 4 * nd), alloc(a.gelu, 4 * nd);
    }
    alloc(lnf_out_, nd), alloc(lnf_mean_, n), alloc(lnf_rstd_, n);
    alloc(logits_, n * V_), alloc(lse_, n);
    // Backward scratch, shared by every layer.
    alloc(dres_, nd), alloc(dln_, nd), alloc(datt_out_, nd), alloc(dqkv_, 3 * nd);
    alloc(dfc_, 4 * nd), alloc(datt_, att), alloc(dlogits_, n * V_);
    tokens_.resize(n);
    targets_.resize(n);
    bytes_ += 2 * n * sizeof(int32_t);
  }

  int threads() const override { return par_.threads(); }
  void set_block_hooks(BlockTensorHooks* hooks) override { hooks_ = hooks; }
  size_t activation_bytes() const override { return bytes_; }
  const float* logits() const override { return logits_.data(); }
  bool checkpointing() const override { return ckpt_; }
  size_t checkpoint_bytes() const override { return static_cast<size_t>(N_) * d_ * sizeof(float); }

  float* checkpoint_input(int layer) override {
    ZOE_CHECK_MSG(ckpt_, "checkpoint_input(%d): the model was created without checkpointing", layer);
    ZOE_CHECK_MSG(layer >= 0 && layer < c_.layers, "layer %d of %d", layer, c_.layers);
    const bool fwd = stage_ == Stage::kEmbedded, bwd = stage_ == Stage::kBackward;
    ZOE_CHECK_MSG((fwd || bwd) && layer == next_layer_,
                  "checkpoint_input(%d): expected layer %d, before its block_forward or block_backward",
                  layer, next_layer_);
    if (bwd) restored_ = layer;
    return res(layer);
  }

  void embed_forward(const int32_t* tokens, const float* const* p) override {
    for (int r = 0; r < N_; ++r) {
      ZOE_CHECK_MSG(tokens[r] >= 0 && tokens[r] < V_, "token %d at position %d: vocab is %d", tokens[r], r,
                    V_);
      tokens_[static_cast<size_t>(r)] = tokens[r];
    }
    const float* wte = p[0];
    const float* wpe = p[1];
    float* x = residual_[0].data();
    par_.for_rows(N_, [&](int r) {
      const float* e = wte + static_cast<size_t>(tokens_[static_cast<size_t>(r)]) * d_;
      const float* q = wpe + static_cast<size_t>(r % T_) * d_;
      float* o = x + static_cast<size_t>(r) * d_;
      for (int i = 0; i < d_; ++i) o[i] = e[i] + q[i];
    });
    stage_ = Stage::kEmbedded;
    next_layer_ = 0;
  }

  void block_forward(int layer, const float* const* p) override {
    ZOE_CHECK_MSG(layer >= 0 && layer < c_.layers, "layer %d of %d", layer, c_.layers);
    ZOE_CHECK_MSG(stage_ == Stage::kEmbedded && layer == next_layer_,
                  "block_forward(%d): expected layer %d, in order after embed_forward", layer, next_layer_);
    LayerActs& a = act(layer);
    block_intermediates(layer, p);
    float* y = res(layer + 1);
    linear_forward(a.gelu.data(), 4 * d_, param(p, kFc2W), param(p, kFc2B), d_, y);
    add_rows(y, a.x_mid.data());
    ++next_layer_;
  }

  float head_forward(const float* const* fp, const float* const* ep, const int32_t* targets) override {
    ZOE_CHECK_MSG(stage_ != Stage::kNone && next_layer_ == c_.layers, "head_forward after %d of %d blocks",
                  next_layer_, c_.layers);
    count_ = 0;
    for (int r = 0; r < N_; ++r) {
      ZOE_CHECK_MSG(targets[r] < V_, "target %d at position %d: vocab is %d", targets[r], r, V_);
      targets_[static_cast<size_t>(r)] = targets[r];
      if (targets[r] >= 0) ++count_;
    }
    const float* x = res(c_.layers);
    layernorm_rows(x, fp[0], fp[1], lnf_out_.data(), lnf_mean_.data(), lnf_rstd_.data());
    // logits = lnf_out . wte^T
    gemm(false, true, N_, V_, d_, lnf_out_.data(), d_, ep[0], d_, 0.0f, logits_.data(), V_);
    par_.for_rows(N_, [&](int r) {
      lse_[static_cast<size_t>(r)] = kernels::logsumexp(logits_.data() + static_cast<size_t>(r) * V_, V_);
    });
    double sum = 0.0;  // in row order: deterministic
    for (int r = 0; r < N_; ++r) {
      const int t = targets_[static_cast<size_t>(r)];
      if (t < 0) continue;
      sum += static_cast<double>(lse_[static_cast<size_t>(r)]) -
             static_cast<double>(logits_[static_cast<size_t>(r) * V_ + static_cast<size_t>(t)]);
    }
    stage_ = Stage::kHead;
    return count_ > 0 ? static_cast<float>(sum / count_) : 0.0f;
  }

  void head_backward(const float* const* fp, const float* const* ep, float* const* fg,
                     float* const* eg) override {
    ZOE_CHECK_MSG(stage_ == Stage::kHead, "head_backward without head_forward");
    const float scale = count_ > 0 ? 1.0f / static_cast<float>(count_) : 0.0f;
    par_.for_rows(N_, [&](int r) {
      float* dl = dlogits_.data() + static_cast<size_t>(r) * V_;
      const int t = targets_[static_cast<size_t>(r)];
      if (t < 0) {
        std::fill(dl, dl + V_, 0.0f);
      } else {
        kernels::cross_entropy_backward_row(logits_.data() + static_cast<size_t>(r) * V_,
                                            lse_[static_cast<size_t>(r)], t, scale, V_, dl);
      }
    });
    // dlnf = dlogits . wte; dwte += dlogits^T . lnf_out
    gemm(false, false, N_, d_, V_, dlogits_.data(), V_, ep[0], d_, 0.0f, dln_.data(), d_);
    gemm(true, false, V_, d_, N_, dlogits_.data(), V_, lnf_out_.data(), d_, 1.0f, eg[0], d_);
    std::fill(dres_.begin(), dres_.end(), 0.0f);
    layernorm_backward(dln_.data(), res(c_.layers), fp[0], lnf_mean_.data(), lnf_rstd_.data(), dres_.data(),
                       fg[0], fg[1]);
    stage_ = Stage::kBackward;
    next_layer_ = c_.layers - 1;
    restored_ = -1;
  }

  void block_backward(int layer, const float* const* p, float* const* g) override {
    ZOE_CHECK_MSG(layer >= 0 && layer < c_.layers, "layer %d of %d", layer, c_.layers);
    ZOE_CHECK_MSG(stage_ == Stage::kBackward && layer == next_layer_,
                  "block_backward(%d): expected layer %d, in reverse order after head_backward", layer,
                  next_layer_);
    if (ckpt_) {
      ZOE_CHECK_MSG(restored_ == layer, "block_backward(%d) with checkpointing: checkpoint_input(%d) first",
                    layer, layer);
      block_intermediates(layer, p);  // the recompute
    }
    LayerActs& a = act(layer);
    const int d = d_;
    // dres holds d(block output). MLP branch: y = x_mid + fc2(gelu(fc1(ln2(x_mid)))).
    linear_backward(dres_.data(), d, a.gelu.data(), 4 * d, param(p, kFc2W), dfc_.data(), g[kFc2W], g[kFc2B]);
    grads_done(kFc2W, kFc2B);
    const size_t row4 = static_cast<size_t>(4) * d;
    par_.for_rows(N_, [&](int r) {
      const size_t o = static_cast<size_t>(r) * row4;
      kernels::gelu_backward(a.fc1.data() + o, dfc_.data() + o, row4);
    });
    linear_backward(dfc_.data(), 4 * d, a.ln2_out.data(), d, param(p, kFc1W), dln_.data(), g[kFc1W],
                    g[kFc1B]);
    grads_done(kFc1W, kFc1B);
    layernorm_backward(dln_.data(), a.x_mid.data(), param(p, kLn2G), a.ln2_mean.data(), a.ln2_rstd.data(),
                       dres_.data(), g[kLn2G], g[kLn2B]);
    grads_done(kLn2G, kLn2B);
    // dres holds d(x_mid). Attention branch: x_mid = x + proj(attn(ln1(x))).
    linear_backward(dres_.data(), d, a.att_out.data(), d, param(p, kProjW), datt_out_.data(), g[kProjW],
                    g[kProjB]);
    grads_done(kProjW, kProjB);
    attention_backward(a);
    linear_backward(dqkv_.data(), 3 * d, a.ln1_out.data(), d, param(p, kQkvW), dln_.data(), g[kQkvW],
                    g[kQkvB]);
    grads_done(kQkvW, kQkvB);
    layernorm_backward(dln_.data(), res(layer), param(p, kLn1G), a.ln1_mean.data(), a.ln1_rstd.data(),
                       dres_.data(), g[kLn1G], g[kLn1B]);
    grads_done(kLn1G, kLn1B);
    --next_layer_;
  }

  void embed_backward(float* const* eg) override {
    ZOE_CHECK_MSG(stage_ == Stage::kBackward && next_layer_ == -1,
                  "embed_backward before the backward of block %d", next_layer_);
    float* dwte = eg[0];
    float* dwpe = eg[1];
    // Serial over rows: several rows may share a token, and the order of their sums must be fixed.
    for (int r = 0; r < N_; ++r) {
      const float* dx = dres_.data() + static_cast<size_t>(r) * d_;
      float* e = dwte + static_cast<size_t>(tokens_[static_cast<size_t>(r)]) * d_;
      float* q = dwpe + static_cast<size_t>(r % T_) * d_;
      for (int i = 0; i < d_; ++i) e[i] += dx[i];
      for (int i = 0; i < d_; ++i) q[i] += dx[i];
    }
  }

 private:
  enum class Stage { kNone, kEmbedded, kHead, kBackward };

  // The residual stream entering block l (l == layers: the final one), and block l's
  // intermediates: with checkpointing, two buffers in turn and one workspace.
  float* res(int l) { return residual_[static_cast<size_t>(ckpt_ ? l & 1 : l)].data(); }
  LayerActs& act(int l) { return acts_[static_cast<size_t>(ckpt_ ? 0 : l)]; }

  // Block `layer`'s forward from its input res(layer) up to the GELU (everything its backward
  // reads): the forward's first part, and the recompute of a checkpointed block.
  void block_intermediates(int layer, const float* const* p) {
    LayerActs& a = act(layer);
    const float* x = res(layer);
    const int d = d_;
    layernorm_rows(x, param(p, kLn1G), param(p, kLn1B), a.ln1_out.data(), a.ln1_mean.data(),
                   a.ln1_rstd.data());
    linear_forward(a.ln1_out.data(), d, param(p, kQkvW), param(p, kQkvB), 3 * d, a.qkv.data());
    attention_forward(a);
    linear_forward(a.att_out.data(), d, param(p, kProjW), param(p, kProjB), d, a.x_mid.data());
    add_rows(a.x_mid.data(), x);
    layernorm_rows(a.x_mid.data(), param(p, kLn2G), param(p, kLn2B), a.ln2_out.data(), a.ln2_mean.data(),
                   a.ln2_rstd.data());
    linear_forward(a.ln2_out.data(), d, param(p, kFc1W), param(p, kFc1B), 4 * d, a.fc1.data());
    const size_t row4 = static_cast<size_t>(4) * d;
    par_.for_rows(N_, [&](int r) {
      const size_t o = static_cast<size_t>(r) * row4;
      kernels::gelu_forward(a.fc1.data() + o, a.gelu.data() + o, row4);
    });
  }

  // Block parameter i, after telling the hooks it is needed.
  const float* param(const float* const* p, BlockParam i) {
    if (hooks_ != nullptr) hooks_->need(i);
    return p[i];
  }
  // Gradients w and b are complete.
  void grads_done(BlockParam w, BlockParam b) {
    if (hooks_ == nullptr) return;
    hooks_->grad_done(w);
    hooks_->grad_done(b);
  }

  void alloc(Buf& b, size_t n) {
    b.assign(n, 0.0f);
    bytes_ += n * sizeof(float);
  }

  // C[M, N] = op(A) op(B) + beta C (+ bias per row when given), split over M in fixed chunks.
  void gemm(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
            float beta, float* C, int ldc, const float* bias = nullptr) {
    const size_t chunks = (static_cast<size_t>(M) + kGemmChunk - 1) / kGemmChunk;
    par_.for_each(chunks, [&](size_t ci) {
      const int m0 = static_cast<int>(ci) * kGemmChunk;
      const int m = std::min(kGemmChunk, M - m0);
      const float* a = ta ? A + m0 : A + static_cast<size_t>(m0) * lda;
      float* c = C + static_cast<size_t>(m0) * ldc;
      float b = beta;
      if (bias != nullptr) {
        for (int r = 0; r < m; ++r) kernels::fill_row(c + static_cast<size_t>(r) * ldc, bias, N);
        b = 1.0f;
      }
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, N, K,
                  1.0f, a, lda, B, ldb, b, c, ldc);
    });
  }

  // y[N, out] = x[N, in] . W^T + b
  void linear_forward(const float* x, int in, const float* w, const float* b, int out, float* y) {
    gemm(false, true, N_, out, in, x, in, w, in, 0.0f, y, out, b);
  }
  // dx = dy . W (overwritten); dW += dy^T . x; db += column sums of dy.
  void linear_backward(const float* dy, int out, const float* x, int in, const float* w, float* dx, float* dw,
                       float* db) {
    gemm(false, false, N_, in, out, dy, out, w, in, 0.0f, dx, in);
    gemm(true, false, out, in, N_, dy, out, x, in, 1.0f, dw, in);
    par_.for_cols(out, [&](int c0, int c1) { kernels::column_sum(N_, out, c0, c1, dy, db); });
  }

  void layernorm_rows(const float* x, const float* g, const float* b, float* out, float* mean, float* rstd) {
    par_.for_rows(N_, [&](int r) {
      const size_t o = static_cast<size_t>(r) * d_;
      kernels::layernorm_forward(x + o, g, b, d_, out + o, mean + r, rstd + r);
    });
  }
  // dx += LayerNorm backward of dy; dg, db += parameter gradients.
  void layernorm_backward(const float* dy, const float* x, const float* g, const float* mean,
                          const float* rstd, float* dx, float* dg, float* db) {
    par_.for_rows(N_, [&](int r) {
      const size_t o = static_cast<size_t>(r) * d_;
      kernels::layernorm_backward_input(dy + o, x + o, g, mean[r], rstd[r], d_, dx + o);
    });
    par_.for_cols(d_, [&](int c0, int c1) {
      kernels::layernorm_backward_params(N_, d_, c0, c1, dy, x, mean, rstd, dg, db);
    });
  }
  void add_rows(float* y, const float* x) {
    par_.for_rows(N_, [&](int r) {
      const size_t o = static_cast<size_t>(r) * d_;
      for (int i = 0; i < d_; ++i) y[o + i] += x[o + i];
    });
  }

  // One (sequence, head) per task: S = scale Q K^T, causal softmax, out = P V.
  void attention_forward(LayerActs& a) {
    const int ld = 3 * d_;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
    const size_t tt = static_cast<size_t>(T_) * T_;
    par_.for_each(static_cast<size_t>(B_) * H_, [&](size_t i) {
      const int b = static_cast<int>(i) / H_;
      const int h = static_cast<int>(i) % H_;
      const float* q = a.qkv.data() + static_cast<size_t>(b) * T_ * ld + static_cast<size_t>(h) * hd_;
      const float* k = q + d_;
      const float* v = q + 2 * d_;
      float* p = a.att.data() + i * tt;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T_, T_, hd_, scale, q, ld, k, ld, 0.0f, p, T_);
      for (int t = 0; t < T_; ++t) kernels::causal_softmax_row(p + static_cast<size_t>(t) * T_, t, T_);
      float* o = a.att_out.data() + static_cast<size_t>(b) * T_ * d_ + static_cast<size_t>(h) * hd_;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T_, hd_, T_, 1.0f, p, T_, v, ld, 0.0f, o, d_);
    });
  }
  // From datt_out_ to dqkv_ (overwritten).
  void attention_backward(const LayerActs& a) {
    const int ld = 3 * d_;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
    const size_t tt = static_cast<size_t>(T_) * T_;
    par_.for_each(static_cast<size_t>(B_) * H_, [&](size_t i) {
      const int b = static_cast<int>(i) / H_;
      const int h = static_cast<int>(i) % H_;
      const size_t off = static_cast<size_t>(b) * T_ * ld + static_cast<size_t>(h) * hd_;
      const float* q = a.qkv.data() + off;
      const float* k = q + d_;
      const float* v = q + 2 * d_;
      float* dq = dqkv_.data() + off;
      float* dk = dq + d_;
      float* dv = dq + 2 * d_;
      const float* p = a.att.data() + i * tt;
      float* dp = datt_.data() + i * tt;
      const float* dout = datt_out_.data() + static_cast<size_t>(b) * T_ * d_ + static_cast<size_t>(h) * hd_;
      // dP = dout V^T; dV = P^T dout
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T_, T_, hd_, 1.0f, dout, d_, v, ld, 0.0f, dp, T_);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T_, hd_, T_, 1.0f, p, T_, dout, d_, 0.0f, dv, ld);
      for (int t = 0; t < T_; ++t) {
        const size_t o = static_cast<size_t>(t) * T_;
        kernels::causal_softmax_backward_row(p + o, dp + o, t, T_, scale);
      }
      // dQ = dS K; dK = dS^T Q
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T_, hd_, T_, 1.0f, dp, T_, k, ld, 0.0f, dq, ld);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T_, hd_, T_, 1.0f, dp, T_, q, ld, 0.0f, dk, ld);
    });
  }

  GptConfig c_;
  int B_, T_, N_, d_, H_, hd_, V_;
  bool ckpt_;  // activation checkpointing
  Parallel par_;
  Stage stage_ = Stage::kNone;
  int next_layer_ = 0;  // the block the next block_forward / block_backward must be
  int restored_ = -1;   // checkpointing: the block whose input the backward was given back
  size_t bytes_ = 0;
  int count_ = 0;
  BlockTensorHooks* hooks_ = nullptr;

  // layers + 1 of [N, d]: the input of each block, then the final one (checkpointing: 2, res()).
  std::vector<Buf> residual_;
  std::vector<LayerActs> acts_;  // one per block (checkpointing: one, act())
  Buf lnf_out_, lnf_mean_, lnf_rstd_, logits_, lse_;
  Buf dres_, dln_, datt_out_, dqkv_, dfc_, datt_, dlogits_;
  std::vector<int32_t> tokens_, targets_;
};

}  // namespace

Result<std::unique_ptr<GptCpu>> GptCpu::create(const GptConfig& c, int batch, int tokens_per_seq, int threads,
                                               bool checkpointing) {
  ZOE_RETURN_IF_ERROR(c.validate());
  if (batch < 1) return invalid_argument("GptCpu: batch %d: expected a positive number of sequences", batch);
  if (tokens_per_seq < 1 || tokens_per_seq > c.seq)
    return invalid_argument("GptCpu: tokens_per_seq %d: expected 1..%d (the model's seq)", tokens_per_seq,
                            c.seq);
  if (static_cast<int64_t>(batch) * tokens_per_seq > (int64_t{1} << 24))
    return invalid_argument("GptCpu: batch %d x tokens %d: more than 2^24 tokens per micro-batch", batch,
                            tokens_per_seq);
  if (threads < 0) return invalid_argument("GptCpu: threads %d: expected >= 0 (0: all cores)", threads);
  // More threads than cores only oversubscribes (and oneTBB would refuse the extra workers).
  const int cores = usable_cpus();
  threads = threads == 0 ? cores : std::min(threads, cores);
  // Our loops supply the parallelism; OpenBLAS runs each call on the calling thread.
  static std::once_flag blas_once;
  std::call_once(blas_once, [] { openblas_set_num_threads(1); });
  return std::unique_ptr<GptCpu>(new GptCpuImpl(c, batch, tokens_per_seq, threads, checkpointing));
}

CpuKernelSet cpu_kernel_set() {
  CpuKernelSet k;
  k.simd = simd_level_name(environment_simd_level());
  const char* core = openblas_get_corename();
  k.blas = std::string("openblas ") + (core != nullptr ? core : "unknown");
  return k;
}

}  // namespace zoe::model
