// GptCuda: the GPT's forward and backward on a GPU; cuBLAS for matrix products, plain kernels
// for the rest (see gpt_cuda.h). Layouts are GptCpu's: row-major activations [rows, features].
#include "model/gpt_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/cuda_util.h"
#include "core/log.h"
#include "model/kernels.h"

namespace zoe::model {
namespace {

// ---- errors ------------------------------------------------------------------------------------

Status cublas_error(const char* call, cublasStatus_t st) {
  StatusCode code = st == CUBLAS_STATUS_ALLOC_FAILED ? StatusCode::kOutOfBudget : StatusCode::kIoError;
  return Status(code,
                std::string(call) + ": " + cublasGetStatusName(st) + " (" + cublasGetStatusString(st) + ")");
}

#include "model/gpt_cuda_kernels.cuh"  // inside the anonymous namespace

// ---- the model -----------------------------------------------------------------------------------

// Makes `ordinal` the calling thread's current device for a scope, restoring the previous one.
class DeviceScope {
 public:
  explicit DeviceScope(int ordinal) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      (void)cudaGetLastError();
      prev_ = -1;
    }
    if (prev_ != ordinal) {
      err_ = cudaSetDevice(ordinal);
      changed_ = err_ == cudaSuccess;
    }
  }
  ~DeviceScope() {
    if (changed_ && prev_ >= 0) (void)cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  cudaError_t error() const { return err_; }

 private:
  int prev_ = -1;
  bool changed_ = false;
  cudaError_t err_ = cudaSuccess;
};

struct LayerActs {
  float *ln1_out, *ln1_mean, *ln1_rstd;
  float* qkv;      // [N, 3d]: q | k | v, head h at columns h * hd of each
  float* att;      // [B, H, T, T] softmax probabilities, zero above the diagonal
  float* att_out;  // [N, d]
  float* x_mid;    // [N, d] residual after attention
  float *ln2_out, *ln2_mean, *ln2_rstd;
  float* fc1;   // [N, 4d] before GELU
  float* gelu;  // [N, 4d]
};

class GptCudaImpl final : public GptCuda {
 public:
  GptCudaImpl(const GptConfig& c, int batch, int tokens, int ordinal, void* stream, bool checkpointing)
      : c_(c),
        B_(batch),
        T_(tokens),
        N_(batch * tokens),
        d_(c.d_model),
        H_(c.heads),
        hd_(c.d_model / c.heads),
        V_(c.vocab),
        ordinal_(ordinal),
        ckpt_(checkpointing),
        stream_(static_cast<cudaStream_t>(stream)),
        own_stream_(stream == nullptr) {}

  ~GptCudaImpl() override {
    DeviceScope dev(ordinal_);
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
    if (cublas_ != nullptr) (void)cublasDestroy(cublas_);
    if (arena_ != nullptr) (void)cudaFree(arena_);
    if (stream_ != nullptr && own_stream_) (void)cudaStreamDestroy(stream_);
  }

  // Stream, cuBLAS handle and the one device allocation that holds every activation.
  Status init() {
    DeviceScope dev(ordinal_);
    if (dev.error() != cudaSuccess) return cuda_error("cudaSetDevice", dev.error());
    // A blocking stream: it waits for work on the legacy default stream (e.g. a cudaMemcpy of the
    // parameters, whose DMA may still run when the call returns) and that stream waits for it.
    if (own_stream_) ZOE_CUDA_TRY(cudaStreamCreate(&stream_));
    cublasStatus_t st = cublasCreate(&cublas_);
    if (st != CUBLAS_STATUS_SUCCESS) {
      cublas_ = nullptr;
      return cublas_error("cublasCreate", st);
    }
    st = cublasSetStream(cublas_, stream_);
    if (st != CUBLAS_STATUS_SUCCESS) return cublas_error("cublasSetStream", st);
    st = cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH);  // fp32 products, no TF32
    if (st != CUBLAS_STATUS_SUCCESS) return cublas_error("cublasSetMathMode", st);

    const size_t n = static_cast<size_t>(N_);
    const size_t nd = n * d_;
    const size_t att = static_cast<size_t>(B_) * H_ * T_ * T_;
    // Each buffer's place in the one allocation: (where its pointer goes, bytes).
    struct Slot {
      float** f;
      int32_t** i;
      double** d;
      size_t bytes;
    };
    std::vector<Slot> plan;
    auto f = [&](float** p, size_t count) { plan.push_back({p, nullptr, nullptr, count * sizeof(float)}); };
    // With checkpointing: two residual buffers (a block's input and its output, in turn) and one
    // block's workspace (GptKernels::checkpointing()).
    residual_.resize(ckpt_ ? 2 : static_cast<size_t>(c_.layers) + 1);
    for (float*& r : residual_) f(&r, nd);
    acts_.resize(ckpt_ ? 1 : static_cast<size_t>(c_.layers));
    for (LayerActs& a : acts_) {
      f(&a.ln1_out, nd), f(&a.ln1_mean, n), f(&a.ln1_rstd, n);
      f(&a.qkv, 3 * nd), f(&a.att, att), f(&a.att_out, nd), f(&a.x_mid, nd);
      f(&a.ln2_out, nd), f(&a.ln2_mean, n), f(&a.ln2_rstd, n);
      f(&a.fc1, 4 * nd), f(&a.gelu, 4 * nd);
    }
    f(&lnf_out_, nd), f(&lnf_mean_, n), f(&lnf_rstd_, n);
    f(&logits_, n * V_), f(&lse_, n);
    f(&dres_, nd), f(&dln_, nd), f(&datt_out_, nd), f(&dqkv_, 3 * nd);
    f(&dfc_, 4 * nd), f(&datt_, att), f(&dlogits_, n * V_);
    plan.push_back({nullptr, &tokens_dev_, nullptr, n * sizeof(int32_t)});
    plan.push_back({nullptr, &targets_dev_, nullptr, n * sizeof(int32_t)});
    plan.push_back({nullptr, nullptr, &loss_dev_, sizeof(double)});
    constexpr size_t kAlign = 256;
    size_t total = 0;
    for (const Slot& p : plan) total += (p.bytes + kAlign - 1) / kAlign * kAlign;
    void* base = nullptr;
    ZOE_CUDA_TRY(cudaMalloc(&base, total));
    arena_ = base;
    bytes_ = total;
    size_t off = 0;
    for (const Slot& p : plan) {
      unsigned char* at = static_cast<unsigned char*>(base) + off;
      if (p.f != nullptr) *p.f = reinterpret_cast<float*>(at);
      if (p.i != nullptr) *p.i = reinterpret_cast<int32_t*>(at);
      if (p.d != nullptr) *p.d = reinterpret_cast<double*>(at);
      off += (p.bytes + kAlign - 1) / kAlign * kAlign;
    }
    ZOE_CUDA_TRY(cudaMemsetAsync(arena_, 0, total, stream_));
    ZOE_CUDA_TRY(cudaStreamSynchronize(stream_));
    tokens_.assign(n, 0);
    targets_.assign(n, -1);
    logits_host_.assign(n * V_, 0.0f);
    return Status::ok();
  }

  size_t activation_bytes() const override { return bytes_; }
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

  int device_ordinal() const override { return ordinal_; }
  void* stream() const override { return stream_; }
  Status status() const override { return err_; }

  Status synchronize() override {
    if (!err_.is_ok()) return err_;
    DeviceScope dev(ordinal_);
    if (dev.error() != cudaSuccess)
      fail(cuda_error("cudaSetDevice", dev.error()));
    else
      check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return err_;
  }

  const float* logits() const override {
    if (err_.is_ok()) {
      DeviceScope dev(ordinal_);
      if (dev.error() != cudaSuccess) {
        fail(cuda_error("cudaSetDevice", dev.error()));
      } else {
        check(cudaMemcpyAsync(logits_host_.data(), logits_, logits_host_.size() * sizeof(float),
                              cudaMemcpyDeviceToHost, stream_),
              "cudaMemcpyAsync (logits to host)");
        check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
      }
    }
    if (!err_.is_ok())
      std::fill(logits_host_.begin(), logits_host_.end(), std::numeric_limits<float>::quiet_NaN());
    return logits_host_.data();
  }

  void embed_forward(const int32_t* tokens, const float* const* p) override {
    for (int r = 0; r < N_; ++r) {
      ZOE_CHECK_MSG(tokens[r] >= 0 && tokens[r] < V_, "token %d at position %d: vocab is %d", tokens[r], r,
                    V_);
      tokens_[static_cast<size_t>(r)] = tokens[r];
    }
    stage_ = Stage::kEmbedded;
    next_layer_ = 0;
    DeviceScope dev(ordinal_);
    if (!begin(dev)) return;
    // Pageable source: the call returns once the bytes are staged, so tokens_ may change after.
    check(cudaMemcpyAsync(tokens_dev_, tokens_.data(), tokens_.size() * sizeof(int32_t),
                          cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync (tokens to device)");
    const size_t n = static_cast<size_t>(N_) * d_;
    embed_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_>>>(tokens_dev_, p[0], p[1], res(0), N_, T_,
                                                                  d_);
    launched("embed_kernel");
  }

  void block_forward(int layer, const float* const* p) override {
    ZOE_CHECK_MSG(layer >= 0 && layer < c_.layers, "layer %d of %d", layer, c_.layers);
    ZOE_CHECK_MSG(stage_ == Stage::kEmbedded && layer == next_layer_,
                  "block_forward(%d): expected layer %d, in order after embed_forward", layer, next_layer_);
    ++next_layer_;
    DeviceScope dev(ordinal_);
    if (!begin(dev)) return;
    LayerActs& a = act(layer);
    block_intermediates(layer, p);
    float* y = res(layer + 1);
    linear_forward(a.gelu, 4 * d_, p[kFc2W], p[kFc2B], d_, y);
    add(y, a.x_mid, static_cast<size_t>(N_) * d_);
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
    stage_ = Stage::kHead;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    DeviceScope dev(ordinal_);
    if (!begin(dev)) return nan;
    check(cudaMemcpyAsync(targets_dev_, targets_.data(), targets_.size() * sizeof(int32_t),
                          cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync (targets to device)");
    layernorm_rows(res(c_.layers), fp[0], fp[1], lnf_out_, lnf_mean_, lnf_rstd_);
    // logits = lnf_out . wte^T
    gemm(false, true, N_, V_, d_, 1.0f, lnf_out_, d_, ep[0], d_, 0.0f, logits_, V_);
    logsumexp_kernel<<<grid_rows(N_), kRowThreads, 0, stream_>>>(logits_, lse_, N_, V_);
    launched("logsumexp_kernel");
    loss_kernel<<<1, kThreads, 0, stream_>>>(logits_, lse_, targets_dev_, N_, V_, loss_dev_);
    launched("loss_kernel");
    double sum = 0.0;
    check(cudaMemcpyAsync(&sum, loss_dev_, sizeof(double), cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync (loss to host)");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    if (!err_.is_ok()) return nan;
    return count_ > 0 ? static_cast<float>(sum / count_) : 0.0f;
  }

  void head_backward(const float* const* fp, const float* const* ep, float* const* fg,
                     float* const* eg) override {
    ZOE_CHECK_MSG(stage_ == Stage::kHead, "head_backward without head_forward");
    stage_ = Stage::kBackward;
    next_layer_ = c_.layers - 1;
    restored_ = -1;
    DeviceScope dev(ordinal_);
    if (!begin(dev)) return;
    const float scale = count_ > 0 ? 1.0f / static_cast<float>(count_) : 0.0f;
    const size_t nv = static_cast<size_t>(N_) * V_;
    cross_entropy_backward_kernel<<<grid_for(nv, kThreads), kThreads, 0, stream_>>>(
        logits_, lse_, targets_dev_, dlogits_, N_, V_, scale);
    launched("cross_entropy_backward_kernel");
    // dlnf = dlogits . wte; dwte += dlogits^T . lnf_out
    gemm(false, false, N_, d_, V_, 1.0f, dlogits_, V_, ep[0], d_, 0.0f, dln_, d_);
    gemm(true, false, V_, d_, N_, 1.0f, dlogits_, V_, lnf_out_, d_, 1.0f, eg[0], d_);
    check(cudaMemsetAsync(dres_, 0, static_cast<size_t>(N_) * d_ * sizeof(float), stream_),
          "cudaMemsetAsync");
    layernorm_backward(dln_, res(c_.layers), fp[0], lnf_mean_, lnf_rstd_, dres_, fg[0], fg[1]);
  }

  void block_backward(int layer, const float* const* p, float* const* g) override {
    ZOE_CHECK_MSG(layer >= 0 && layer < c_.layers, "layer %d of %d", layer, c_.layers);
    ZOE_CHECK_MSG(stage_ == Stage::kBackward && layer == next_layer_,
                  "block_backward(%d): expected layer %d, in reverse order after head_backward", layer,
                  next_layer_);
    ZOE_CHECK_MSG(!ckpt_ || restored_ == layer,
                  "block_backward(%d) with checkpointing: checkpoint_input(%d) first", layer, layer);
    --next_layer_;
    DeviceScope dev(ordinal_);
    if (!begin(dev)) return;
    if (ckpt_) block_intermediates(layer, p);  // the recompute, from the input given back
    LayerActs& a = act(layer);
    const int d = d_;
    const size_t n4 = static_cast<size_t>(N_) * 4 * d;
    // dres holds d(block output). MLP branch: y = x_mid + fc2(gelu(fc1(ln2(x_mid)))).
    linear_backward(dres_, d, a.gelu, 4 * d, p[kFc2W], dfc_, g[kFc2W], g[kFc2B]);
    gelu_backward_kernel<<<grid_for(n4, kThreads), kThreads, 0, stream_>>>(a.fc1, dfc_, n4);
    launched("gelu_backward_kernel");
    linear_backward(dfc_, 4 * d, a.ln2_out, d, p[kFc1W], dln_, g[kFc1W], g[kFc1B]);
    layernorm_backward(dln_, a.x_mid, p[kLn2G], a.ln2_mean, a.ln2_rstd, dres_, g[kLn2G], g[kLn2B]);
    // dres holds d(x_mid). Attention branch: x_mid = x + proj(attn(ln1(x))).
    linear_backward(dres_, d, a.att_out, d, p[kProjW], datt_out_, g[kProjW], g[kProjB]);
    attention_backward(a);
    linear_backward(dqkv_, 3 * d, a.ln1_out, d, p[kQkvW], dln_, g[kQkvW], g[kQkvB]);
    layernorm_backward(dln_, res(layer), p[kLn1G], a.ln1_mean, a.ln1_rstd, dres_, g[kLn1G], g[kLn1B]);
  }

  void embed_backward(float* const* eg) override {
    ZOE_CHECK_MSG(stage_ == Stage::kBackward && next_layer_ == -1,
                  "embed_backward before the backward of block %d", next_layer_);
    DeviceScope dev(ordinal_);
    if (!begin(dev)) return;
    wte_backward_kernel<<<grid_for(d_, kThreads), kThreads, 0, stream_>>>(dres_, tokens_dev_, eg[0], N_, d_);
    launched("wte_backward_kernel");
    wpe_backward_kernel<<<grid_for(static_cast<size_t>(T_) * d_, kThreads), kThreads, 0, stream_>>>(
        dres_, eg[1], B_, T_, d_);
    launched("wpe_backward_kernel");
  }

 private:
  enum class Stage { kNone, kEmbedded, kHead, kBackward };

  // The residual stream entering block l (l == layers: the final one), and block l's
  // intermediates: with checkpointing, two buffers in turn and one workspace.
  float* res(int l) const { return residual_[static_cast<size_t>(ckpt_ ? l & 1 : l)]; }
  LayerActs& act(int l) { return acts_[static_cast<size_t>(ckpt_ ? 0 : l)]; }

  // Block `layer`'s forward from its input res(layer) up to the GELU (everything its backward
  // reads): the forward's first part, and the recompute of a checkpointed block. Enqueued.
  void block_intermediates(int layer, const float* const* p) {
    LayerActs& a = act(layer);
    const float* x = res(layer);
    const int d = d_;
    const size_t nd = static_cast<size_t>(N_) * d;
    layernorm_rows(x, p[kLn1G], p[kLn1B], a.ln1_out, a.ln1_mean, a.ln1_rstd);
    linear_forward(a.ln1_out, d, p[kQkvW], p[kQkvB], 3 * d, a.qkv);
    attention_forward(a);
    linear_forward(a.att_out, d, p[kProjW], p[kProjB], d, a.x_mid);
    add(a.x_mid, x, nd);
    layernorm_rows(a.x_mid, p[kLn2G], p[kLn2B], a.ln2_out, a.ln2_mean, a.ln2_rstd);
    linear_forward(a.ln2_out, d, p[kFc1W], p[kFc1B], 4 * d, a.fc1);
    gelu_forward_kernel<<<grid_for(4 * nd, kThreads), kThreads, 0, stream_>>>(a.fc1, a.gelu, 4 * nd);
    launched("gelu_forward_kernel");
  }

  // ---- error bookkeeping: the first failure sticks, later work is skipped ----
  void fail(Status s) const {
    // (void): nvcc's front end counts Status& from operator= as a [[nodiscard]] Status.
    if (err_.is_ok()) (void)(err_ = std::move(s));
  }
  void check(cudaError_t e, const char* what) const {
    if (e != cudaSuccess) fail(cuda_error(what, e));
  }
  void launched(const char* kernel) const {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) fail(cuda_error((std::string("launch of ") + kernel).c_str(), e));
  }
  void check_cublas(cublasStatus_t st, const char* what) const {
    if (st != CUBLAS_STATUS_SUCCESS) fail(cublas_error(what, st));
  }
  // Whether the call should enqueue work: no earlier error and the device is current.
  bool begin(const DeviceScope& dev) const {
    if (!err_.is_ok()) return false;
    if (dev.error() != cudaSuccess) {
      fail(cuda_error("cudaSetDevice", dev.error()));
      return false;
    }
    return true;
  }

  // ---- matrix products: row-major C[M, N] = alpha op(A) op(B) + beta C ----
  // cuBLAS is column-major, where a row-major X reads as X^T: so compute C^T = op(B)^T op(A)^T,
  // i.e. swap the operands and M/N and keep each operand's transpose flag.
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
            int ldb, float beta, float* C, int ldc) {
    if (!err_.is_ok()) return;
    check_cublas(cublasSgemm(cublas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K,
                             &alpha, B, ldb, A, lda, &beta, C, ldc),
                 "cublasSgemm");
  }
  // The same over `batch` products whose operands sit stride_a/stride_b/stride_c floats apart.
  void gemm_batched(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                    long long stride_a, const float* B, int ldb, long long stride_b, float beta, float* C,
                    int ldc, long long stride_c, int batch) {
    if (!err_.is_ok()) return;
    check_cublas(cublasSgemmStridedBatched(cublas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                           ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb, stride_b,
                                           A, lda, stride_a, &beta, C, ldc, stride_c, batch),
                 "cublasSgemmStridedBatched");
  }

  // y[N, out] = x[N, in] . W^T + b
  void linear_forward(const float* x, int in, const float* w, const float* b, int out, float* y) {
    const size_t n = static_cast<size_t>(N_) * out;
    fill_rows_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_>>>(y, b, N_, out);
    launched("fill_rows_kernel");
    gemm(false, true, N_, out, in, 1.0f, x, in, w, in, 1.0f, y, out);
  }
  // dx = dy . W (overwritten); dW += dy^T . x; db += column sums of dy.
  void linear_backward(const float* dy, int out, const float* x, int in, const float* w, float* dx, float* dw,
                       float* db) {
    gemm(false, false, N_, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
    gemm(true, false, out, in, N_, 1.0f, dy, out, x, in, 1.0f, dw, in);
    column_sum_kernel<<<grid_for(out, kThreads), kThreads, 0, stream_>>>(dy, db, N_, out);
    launched("column_sum_kernel");
  }

  void layernorm_rows(const float* x, const float* g, const float* b, float* out, float* mean, float* rstd) {
    layernorm_forward_kernel<<<grid_rows(N_), kRowThreads, 0, stream_>>>(x, g, b, out, mean, rstd, N_, d_);
    launched("layernorm_forward_kernel");
  }
  // dx += LayerNorm backward of dy; dg, db += parameter gradients.
  void layernorm_backward(const float* dy, const float* x, const float* g, const float* mean,
                          const float* rstd, float* dx, float* dg, float* db) {
    layernorm_backward_input_kernel<<<grid_rows(N_), kRowThreads, 0, stream_>>>(dy, x, g, mean, rstd, dx, N_,
                                                                                d_);
    launched("layernorm_backward_input_kernel");
    layernorm_backward_params_kernel<<<grid_for(d_, kThreads), kThreads, 0, stream_>>>(dy, x, mean, rstd, dg,
                                                                                       db, N_, d_);
    launched("layernorm_backward_params_kernel");
  }
  void add(float* y, const float* x, size_t n) {
    add_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_>>>(y, x, n);
    launched("add_kernel");
  }

  // Per sequence b, the H heads as one strided batch (head h's q/k/v start h * hd columns in):
  // S = scale Q K^T, causal softmax (all rows at once), out = P V.
  void attention_forward(LayerActs& a) {
    const int ld = 3 * d_;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
    const long long tt = static_cast<long long>(T_) * T_;
    for (int b = 0; b < B_; ++b) {
      const float* q = a.qkv + static_cast<size_t>(b) * T_ * ld;
      float* p = a.att + static_cast<size_t>(b) * H_ * tt;
      gemm_batched(false, true, T_, T_, hd_, scale, q, ld, hd_, q + d_, ld, hd_, 0.0f, p, T_, tt, H_);
    }
    const size_t rows = static_cast<size_t>(B_) * H_ * T_;
    causal_softmax_kernel<<<grid_rows(rows), kRowThreads, 0, stream_>>>(a.att, rows, T_);
    launched("causal_softmax_kernel");
    for (int b = 0; b < B_; ++b) {
      const float* v = a.qkv + static_cast<size_t>(b) * T_ * ld + 2 * d_;
      const float* p = a.att + static_cast<size_t>(b) * H_ * tt;
      float* o = a.att_out + static_cast<size_t>(b) * T_ * d_;
      gemm_batched(false, false, T_, hd_, T_, 1.0f, p, T_, tt, v, ld, hd_, 0.0f, o, d_, hd_, H_);
    }
  }
  // From datt_out_ to dqkv_ (overwritten): dP = dout V^T, dV = P^T dout, softmax backward,
  // dQ = dS K, dK = dS^T Q.
  void attention_backward(const LayerActs& a) {
    const int ld = 3 * d_;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
    const long long tt = static_cast<long long>(T_) * T_;
    for (int b = 0; b < B_; ++b) {
      const float* q = a.qkv + static_cast<size_t>(b) * T_ * ld;
      const float* v = q + 2 * d_;
      const float* p = a.att + static_cast<size_t>(b) * H_ * tt;
      float* dp = datt_ + static_cast<size_t>(b) * H_ * tt;
      float* dv = dqkv_ + static_cast<size_t>(b) * T_ * ld + 2 * d_;
      const float* dout = datt_out_ + static_cast<size_t>(b) * T_ * d_;
      gemm_batched(false, true, T_, T_, hd_, 1.0f, dout, d_, hd_, v, ld, hd_, 0.0f, dp, T_, tt, H_);
      gemm_batched(true, false, T_, hd_, T_, 1.0f, p, T_, tt, dout, d_, hd_, 0.0f, dv, ld, hd_, H_);
    }
    const size_t rows = static_cast<size_t>(B_) * H_ * T_;
    causal_softmax_backward_kernel<<<grid_rows(rows), kRowThreads, 0, stream_>>>(a.att, datt_, rows, T_,
                                                                                 scale);
    launched("causal_softmax_backward_kernel");
    for (int b = 0; b < B_; ++b) {
      const float* q = a.qkv + static_cast<size_t>(b) * T_ * ld;
      const float* k = q + d_;
      const float* dp = datt_ + static_cast<size_t>(b) * H_ * tt;
      float* dq = dqkv_ + static_cast<size_t>(b) * T_ * ld;
      float* dk = dq + d_;
      gemm_batched(false, false, T_, hd_, T_, 1.0f, dp, T_, tt, k, ld, hd_, 0.0f, dq, ld, hd_, H_);
      gemm_batched(true, false, T_, hd_, T_, 1.0f, dp, T_, tt, q, ld, hd_, 0.0f, dk, ld, hd_, H_);
    }
  }

  GptConfig c_;
  int B_, T_, N_, d_, H_, hd_, V_;
  int ordinal_;
  bool ckpt_;  // activation checkpointing
  Stage stage_ = Stage::kNone;
  int next_layer_ = 0;
  int restored_ = -1;  // checkpointing: the block whose input the backward was given back
  int count_ = 0;
  size_t bytes_ = 0;
  mutable Status err_;

  cudaStream_t stream_ = nullptr;
  bool own_stream_ = true;  // created (and destroyed) here, else the caller's
  cublasHandle_t cublas_ = nullptr;
  void* arena_ = nullptr;
  std::vector<float*> residual_;  // layers + 1 of [N, d] (checkpointing: 2, res())
  std::vector<LayerActs> acts_;   // one per block (checkpointing: one, act())
  float *lnf_out_ = nullptr, *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr, *logits_ = nullptr, *lse_ = nullptr;
  float *dres_ = nullptr, *dln_ = nullptr, *datt_out_ = nullptr, *dqkv_ = nullptr, *dfc_ = nullptr,
        *datt_ = nullptr, *dlogits_ = nullptr;
  int32_t* tokens_dev_ = nullptr;
  int32_t* targets_dev_ = nullptr;
  double* loss_dev_ = nullptr;
  std::vector<int32_t> tokens_, targets_;
  mutable std::vector<float> logits_host_;
};

}  // namespace

Result<std::unique_ptr<GptCuda>> GptCuda::create(const GptConfig& c, int batch, int tokens_per_seq,
                                                 int device_ordinal, void* stream, bool checkpointing) {
  ZOE_RETURN_IF_ERROR(c.validate());
  if (batch < 1) return invalid_argument("GptCuda: batch %d: expected a positive number of sequences", batch);
  if (tokens_per_seq < 1 || tokens_per_seq > c.seq)
    return invalid_argument("GptCuda: tokens_per_seq %d: expected 1..%d (the model's seq)", tokens_per_seq,
                            c.seq);
  if (static_cast<int64_t>(batch) * tokens_per_seq > (int64_t{1} << 24))
    return invalid_argument("GptCuda: batch %d x tokens %d: more than 2^24 tokens per micro-batch", batch,
                            tokens_per_seq);
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return unsupported("GptCuda: no CUDA device: cudaGetDeviceCount: %s (%s)", cudaGetErrorName(err),
                       cudaGetErrorString(err));
  }
  if (count == 0) return unsupported("GptCuda: no CUDA device: the CUDA runtime reports none");
  if (device_ordinal < 0 || device_ordinal >= count)
    return invalid_argument("GptCuda: CUDA device %d does not exist (%d present)", device_ordinal, count);
  auto m = std::make_unique<GptCudaImpl>(c, batch, tokens_per_seq, device_ordinal, stream, checkpointing);
  ZOE_RETURN_IF_ERROR_CTX(m->init(), "creating GptCuda");
  return std::unique_ptr<GptCuda>(std::move(m));
}

}  // namespace zoe::model
