// train_mlp: a user's own model trained through an installed zoe. A residual MLP with LayerNorm
// (x = x + W2 relu(W1 LN(x) + b1) + b2, kBlocks times) learns a fixed random teacher t = tanh(T x),
// forward and backward written here in plain loops. ZeRO stage 3 with parameters and optimizer
// states on NVMe and a device budget ~4.5x smaller than the model states.
// Usage: train_mlp [steps (30)] [nvme dir ($ZOE_SCRATCH or /var/tmp)]; exits 1 unless the loss fell.
#include <zoe/zoe.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

constexpr int kDim = 64, kHidden = 256, kBlocks = 8, kBatch = 32;
enum { kLnG, kLnB, kW1, kB1, kW2, kB2, kParams };  // parameter order inside a block
using Vec = std::vector<float>;

template <typename T>
T check(zoe::Result<T> r, const char* what) {
  if (!r.is_ok()) {
    fprintf(stderr, "train_mlp: %s: %s\n", what, r.status().to_string().c_str());
    exit(2);
  }
  return std::move(r).value();
}
void check(const zoe::Status& s, const char* what) {
  if (!s.is_ok()) {
    fprintf(stderr, "train_mlp: %s: %s\n", what, s.to_string().c_str());
    exit(2);
  }
}

// A block's parameters as fp32 host copies (the engine hands out bf16, maybe in device memory).
std::vector<Vec> to_host(zoe::Engine& eng, const zoe::ModuleParams& p) {
  std::vector<Vec> out(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    out[i].resize(p[i].numel);
    check(eng.read_f32(p[i], out[i].data()), "reading parameters");
  }
  return out;
}

struct Acts {
  Vec x, xhat, rstd, h, u;
};  // what a block's backward needs, per block

void block_forward(const std::vector<Vec>& w, const Vec& x, Acts* a, Vec* y) {
  a->x = x;
  a->xhat.assign(kBatch * kDim, 0);
  a->rstd.assign(kBatch, 0);
  a->h.assign(kBatch * kDim, 0);
  a->u.assign(kBatch * kHidden, 0);
  *y = x;
  for (int b = 0; b < kBatch; ++b) {
    const float* xb = &a->x[b * kDim];
    float mean = 0, var = 0;
    for (int d = 0; d < kDim; ++d) mean += xb[d] / kDim;
    for (int d = 0; d < kDim; ++d) var += (xb[d] - mean) * (xb[d] - mean) / kDim;
    a->rstd[b] = 1.0f / std::sqrt(var + 1e-5f);
    for (int d = 0; d < kDim; ++d) {
      a->xhat[b * kDim + d] = (xb[d] - mean) * a->rstd[b];
      a->h[b * kDim + d] = a->xhat[b * kDim + d] * w[kLnG][d] + w[kLnB][d];
    }
    for (int j = 0; j < kHidden; ++j) {
      float s = w[kB1][j];
      for (int d = 0; d < kDim; ++d) s += w[kW1][j * kDim + d] * a->h[b * kDim + d];
      a->u[b * kHidden + j] = s;
    }
    for (int d = 0; d < kDim; ++d) {
      float s = w[kB2][d];
      for (int j = 0; j < kHidden; ++j) s += w[kW2][d * kHidden + j] * std::max(a->u[b * kHidden + j], 0.0f);
      (*y)[b * kDim + d] += s;
    }
  }
}

// dy -> dx (in place), parameter gradients into g (zeroed by the caller).
void block_backward(const std::vector<Vec>& w, const Acts& a, Vec* dy, std::vector<Vec>* g) {
  Vec dx = *dy, dh(kDim), du(kHidden);
  for (int b = 0; b < kBatch; ++b) {
    const float* d_out = &(*dy)[b * kDim];
    for (int d = 0; d < kDim; ++d) (*g)[kB2][d] += d_out[d];
    for (int j = 0; j < kHidden; ++j) {
      const float r = std::max(a.u[b * kHidden + j], 0.0f);
      float s = 0;
      for (int d = 0; d < kDim; ++d) {
        (*g)[kW2][d * kHidden + j] += d_out[d] * r;
        s += d_out[d] * w[kW2][d * kHidden + j];
      }
      du[j] = a.u[b * kHidden + j] > 0 ? s : 0;
      (*g)[kB1][j] += du[j];
    }
    for (int d = 0; d < kDim; ++d) {
      float s = 0;
      for (int j = 0; j < kHidden; ++j) {
        (*g)[kW1][j * kDim + d] += du[j] * a.h[b * kDim + d];
        s += du[j] * w[kW1][j * kDim + d];
      }
      dh[d] = s;
    }
    float m1 = 0, m2 = 0;  // LayerNorm backward: dxhat, then its projection
    for (int d = 0; d < kDim; ++d) {
      (*g)[kLnG][d] += dh[d] * a.xhat[b * kDim + d];
      (*g)[kLnB][d] += dh[d];
      const float dxh = dh[d] * w[kLnG][d];
      m1 += dxh / kDim;
      m2 += dxh * a.xhat[b * kDim + d] / kDim;
    }
    for (int d = 0; d < kDim; ++d) {
      const float dxh = dh[d] * w[kLnG][d];
      dx[b * kDim + d] += a.rstd[b] * (dxh - m1 - a.xhat[b * kDim + d] * m2);
    }
  }
  *dy = dx;
}

int main(int argc, char** argv) {
  const int steps = argc > 1 ? atoi(argv[1]) : 30;
  const char* env = getenv("ZOE_SCRATCH");
  const std::string nvme = argc > 2 ? argv[2] : env && *env ? env : "/var/tmp";

  auto rt = check(zoe::Runtime::init(), "starting the runtime");
  const uint64_t budget = 1 << 20;  // 1 MiB of device memory for ~4.8 MB of model states
  auto cfg = check(zoe::Config::Builder()
                       .stage(3)
                       .micro_batch(kBatch)
                       .precision(zoe::ComputeDType::kBF16)
                       .lr(1e-3)
                       .param_persistence_threshold(0)
                       .offload_param(zoe::Offload::kNvme, {nvme})
                       .offload_optimizer(zoe::Offload::kNvme, {nvme})
                       .device_budget(budget)
                       .build(rt->world_size()),
                   "building the config");
  auto eng = check(zoe::Engine::create(*rt, cfg), "creating the engine");
  const std::vector<zoe::ParamSpec> block = {{"ln_g", {kDim}},        {"ln_b", {kDim}},
                                             {"w1", {kHidden, kDim}}, {"b1", {kHidden}},
                                             {"w2", {kDim, kHidden}}, {"b2", {kDim}}};
  for (int l = 0; l < kBlocks; ++l)
    check(eng->add_module("block." + std::to_string(l), block), "adding a block");
  // The same values on every rank: a generator seeded by the parameter.
  auto init = [](size_t m, size_t p, float* x, size_t n) {
    std::mt19937 gen(static_cast<unsigned>(1000 * m + p));
    std::normal_distribution<float> nd(0.0f, p == kW1 ? 1.0f / 8 : p == kW2 ? 0.02f : 0.0f);
    for (size_t i = 0; i < n; ++i) x[i] = p == kLnG ? 1.0f : nd(gen);
  };
  check(eng->initialize(init), "initialising");
  printf("train_mlp: %llu parameters, model states %llu bytes, device budget %llu bytes (%.1fx smaller)\n",
         static_cast<unsigned long long>(eng->num_params()),
         static_cast<unsigned long long>(eng->model_state_bytes()), static_cast<unsigned long long>(budget),
         static_cast<double>(eng->model_state_bytes()) / static_cast<double>(eng->device_budget_bytes()));

  Vec teacher(kDim * kDim);
  std::mt19937 tgen(7);
  std::normal_distribution<float> tn(0.0f, 1.0f / 8);
  for (float& v : teacher) v = tn(tgen);
  std::mt19937 data(1234 + static_cast<unsigned>(rt->rank()));
  std::normal_distribution<float> xn(0.0f, 1.0f);
  double first = 0, last = 0;
  for (int step = 0; step < steps; ++step) {
    Vec x(kBatch * kDim), t(kBatch * kDim);
    for (float& v : x) v = xn(data);
    for (int b = 0; b < kBatch; ++b) {
      for (int i = 0; i < kDim; ++i) {
        float s = 0;
        for (int d = 0; d < kDim; ++d) s += teacher[i * kDim + d] * x[b * kDim + d];
        t[b * kDim + i] = std::tanh(s);
      }
    }
    std::vector<Acts> acts(kBlocks);
    for (int m = 0; m < kBlocks; ++m) {  // forward: gather, compute, release at scope exit
      auto p = check(eng->gather(m), "gathering a block");
      block_forward(to_host(*eng, p.params()), x, &acts[m], &x);
    }
    double loss = 0;  // 0.5 x mean over the batch of |x - t|^2
    Vec dy(kBatch * kDim);
    for (int i = 0; i < kBatch * kDim; ++i) {
      loss += 0.5 * (x[i] - t[i]) * (x[i] - t[i]) / kBatch;
      dy[i] = (x[i] - t[i]) / kBatch;
    }
    for (int m = kBlocks - 1; m >= 0; --m) {  // backward: gather, gradients, reduce
      auto p = check(eng->gather(m), "gathering a block");
      std::vector<Vec> g(kParams);
      for (int i = 0; i < kParams; ++i) g[i].assign(p[i].numel, 0.0f);
      block_backward(to_host(*eng, p.params()), acts[m], &dy, &g);
      auto gb = check(eng->grads(m), "gradient buffers");
      for (int i = 0; i < kParams; ++i) {
        check(eng->write_f32(gb[i], g[i].data(), static_cast<float>(eng->loss_scale())), "writing grads");
      }
      check(eng->reduce_grads(m), "reducing gradients");
    }
    auto st = check(eng->step(), "optimizer step");
    loss = check(rt->average(loss), "averaging the loss");
    if (step == 0) first = loss;
    last = loss;
    if (rt->rank() == 0) {
      printf("step %3d  loss %.5f  grad norm %.4f  device high water %llu bytes\n", step + 1, loss,
             st.grad_norm, static_cast<unsigned long long>(st.high_water[0]));
    }
  }
  if (rt->rank() == 0) printf("loss %.5f -> %.5f over %d steps\n", first, last, steps);
  return last < first ? 0 : 1;
}
