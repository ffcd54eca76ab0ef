// A small MLP trained through the engine, and the same MLP trained densely (one process, fp32
// AdamW over the global batch) as the reference the engine's results are compared with.
#pragma once

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "zoe/engine.h"

namespace zoe::test {

struct MlpSpec {
  int layers = 3;
  int d = 24;
  int batch = 4;  // samples per rank per step
  float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, wd = 0.01f;
  double clip = 0.0;
  int no_grads_at = -1;  // engine_train: at this step, the first layer produces no gradients
  // The first frozen_layers layers are never trained: engine_train gives them no gradients (it
  // calls no grads() for them), reference_train does not update them.
  int frozen_layers = 0;
};

// Deterministic data: sample s of the global batch at step k.
inline float input_value(int k, int s, int i) {
  return std::sin(0.37f * static_cast<float>(i + 1) + 0.11f * static_cast<float>(s) +
                  0.05f * static_cast<float>(k));
}
inline float target_value(int k, int s, int i) {
  return 0.5f * std::cos(0.23f * static_cast<float>(i) - 0.07f * static_cast<float>(s + k));
}
inline float init_value(size_t m, size_t p, size_t i) {
  return 0.2f * std::sin(static_cast<float>(i) * 0.731f + static_cast<float>(m) * 1.3f +
                         static_cast<float>(p) * 0.17f);
}

inline float load(const void* data, ComputeDType dt, size_t i) {
  if (dt == ComputeDType::kF32) return static_cast<const float*>(data)[i];
  uint16_t h = static_cast<const uint16_t*>(data)[i];
  return dt == ComputeDType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
}
inline void store(void* data, ComputeDType dt, size_t i, float v) {
  if (dt == ComputeDType::kF32) {
    static_cast<float*>(data)[i] = v;
    return;
  }
  static_cast<uint16_t*>(data)[i] = dt == ComputeDType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
}

// Forward and backward of one layer y = act(W x + b) for a batch; act = tanh except the last.
// Gradients of loss = sum over samples 0.5 |y - t|^2 / batch_global ... (per-rank mean).
struct Layer {
  std::vector<float> w, b;  // w[o * d + i]
};

// Gradients of the mean loss over `samples` for all layers given weights (fp32 math).
inline void mlp_grads(const MlpSpec& s, const std::vector<Layer>& L,
                      const std::vector<std::vector<float>>& xs, const std::vector<std::vector<float>>& ts,
                      std::vector<Layer>* g) {
  const int d = s.d, n = static_cast<int>(L.size());
  g->assign(L.size(), Layer{});
  for (auto& gl : *g) {
    gl.w.assign(static_cast<size_t>(d * d), 0.0f);
    gl.b.assign(static_cast<size_t>(d), 0.0f);
  }
  const float inv = 1.0f / static_cast<float>(xs.size());
  for (size_t smp = 0; smp < xs.size(); ++smp) {
    std::vector<std::vector<float>> act(static_cast<size_t>(n + 1));
    act[0] = xs[smp];
    for (int l = 0; l < n; ++l) {
      act[l + 1].assign(static_cast<size_t>(d), 0.0f);
      for (int o = 0; o < d; ++o) {
        float z = L[l].b[o];
        for (int i = 0; i < d; ++i) z += L[l].w[o * d + i] * act[l][i];
        act[l + 1][o] = l + 1 < n ? std::tanh(z) : z;
      }
    }
    std::vector<float> delta(static_cast<size_t>(d));
    for (int o = 0; o < d; ++o) delta[o] = (act[n][o] - ts[smp][o]) * inv;
    for (int l = n - 1; l >= 0; --l) {
      std::vector<float> prev(static_cast<size_t>(d), 0.0f);
      for (int o = 0; o < d; ++o) {
        (*g)[l].b[o] += delta[o];
        for (int i = 0; i < d; ++i) {
          (*g)[l].w[o * d + i] += delta[o] * act[l][i];
          prev[i] += L[l].w[o * d + i] * delta[o];
        }
      }
      if (l > 0) {
        for (int i = 0; i < d; ++i) prev[i] *= 1.0f - act[l][i] * act[l][i];
      }
      delta = prev;
    }
  }
}

inline std::vector<std::vector<float>> batch_inputs(const MlpSpec& s, int k, int first, int count) {
  std::vector<std::vector<float>> v;
  for (int smp = first; smp < first + count; ++smp) {
    std::vector<float> x(static_cast<size_t>(s.d));
    for (int i = 0; i < s.d; ++i) x[i] = input_value(k, smp, i);
    v.push_back(x);
  }
  return v;
}
inline std::vector<std::vector<float>> batch_targets(const MlpSpec& s, int k, int first, int count) {
  std::vector<std::vector<float>> v;
  for (int smp = first; smp < first + count; ++smp) {
    std::vector<float> t(static_cast<size_t>(s.d));
    for (int i = 0; i < s.d; ++i) t[i] = target_value(k, smp, i);
    v.push_back(t);
  }
  return v;
}

inline std::vector<Layer> init_layers(const MlpSpec& s) {
  std::vector<Layer> L(static_cast<size_t>(s.layers));
  for (int l = 0; l < s.layers; ++l) {
    L[l].w.resize(static_cast<size_t>(s.d * s.d));
    L[l].b.resize(static_cast<size_t>(s.d));
    for (size_t i = 0; i < L[l].w.size(); ++i) L[l].w[i] = init_value(static_cast<size_t>(l), 0, i);
    for (size_t i = 0; i < L[l].b.size(); ++i) L[l].b[i] = init_value(static_cast<size_t>(l), 1, i);
  }
  return L;
}

// Dense reference: `steps` AdamW steps on the global batch of world * batch samples.
inline std::vector<Layer> reference_train(const MlpSpec& s, int world, int steps, int micro = 1) {
  std::vector<Layer> L = init_layers(s), m = L, v = L;
  for (auto* st : {&m, &v}) {
    for (auto& l : *st) {
      std::fill(l.w.begin(), l.w.end(), 0.0f);
      std::fill(l.b.begin(), l.b.end(), 0.0f);
    }
  }
  for (int k = 0; k < steps; ++k) {
    std::vector<Layer> g;
    mlp_grads(s, L, batch_inputs(s, k, 0, micro * world * s.batch),
              batch_targets(s, k, 0, micro * world * s.batch), &g);
    for (int l = 0; l < s.frozen_layers; ++l) g[static_cast<size_t>(l)] = Layer{};  // no gradients
    double sq = 0;
    for (auto& gl : g) {
      for (float x : gl.w) sq += static_cast<double>(x) * x;
      for (float x : gl.b) sq += static_cast<double>(x) * x;
    }
    float coef = 1.0f;
    if (s.clip > 0 && std::sqrt(sq) > s.clip) coef = static_cast<float>(s.clip / (std::sqrt(sq) + 1e-6));
    // The first layer sits out step no_grads_at (no gradients): no update, and its own count of
    // updates (torch.optim.AdamW's per-parameter step) is one fewer afterwards.
    if (k == s.no_grads_at) g[0] = Layer{};
    double bc1 = 0, bc2 = 0;
    auto upd = [&](std::vector<float>& p, std::vector<float>& mm, std::vector<float>& vv,
                   const std::vector<float>& gg) {
      if (gg.empty()) return;
      for (size_t i = 0; i < p.size(); ++i) {
        float gi = gg[i] * coef;
        mm[i] = s.beta1 * mm[i] + (1 - s.beta1) * gi;
        vv[i] = s.beta2 * vv[i] + (1 - s.beta2) * gi * gi;
        p[i] *= 1.0f - s.lr * s.wd;
        p[i] -= static_cast<float>(s.lr / bc1) * mm[i] /
                (std::sqrt(vv[i]) / static_cast<float>(std::sqrt(bc2)) + s.eps);
      }
    };
    for (size_t l = static_cast<size_t>(s.frozen_layers); l < L.size(); ++l) {
      const int t = k + 1 - (l == 0 && s.no_grads_at >= 0 && k > s.no_grads_at ? 1 : 0);
      bc1 = 1.0 - std::pow(s.beta1, t);
      bc2 = 1.0 - std::pow(s.beta2, t);
      upd(L[l].w, m[l].w, v[l].w, g[l].w);
      upd(L[l].b, m[l].b, v[l].b, g[l].b);
    }
  }
  return L;
}

// Whether two trained models are the same bits.
inline bool identical(const std::vector<Layer>& a, const std::vector<Layer>& b) {
  if (a.size() != b.size()) return false;
  for (size_t l = 0; l < a.size(); ++l) {
    if (a[l].w.size() != b[l].w.size() || a[l].b.size() != b[l].b.size() ||
        memcmp(a[l].w.data(), b[l].w.data(), a[l].w.size() * 4) != 0 ||
        memcmp(a[l].b.data(), b[l].b.data(), a[l].b.size() * 4) != 0)
      return false;
  }
  return true;
}

// The gradients the engine sums at step k over `world` ranks: each rank's mean gradient over its
// samples (as engine_train computes it), added in rank order (the engine scales by 1/world inside
// the update).
inline std::vector<Layer> rank_summed_grads(const MlpSpec& s, const std::vector<Layer>& L, int k, int world) {
  std::vector<Layer> g;
  for (int r = 0; r < world; ++r) {
    std::vector<Layer> gr;
    mlp_grads(s, L, batch_inputs(s, k, r * s.batch, s.batch), batch_targets(s, k, r * s.batch, s.batch), &gr);
    if (r == 0) {
      g = gr;
      continue;
    }
    for (size_t l = 0; l < g.size(); ++l) {
      for (size_t i = 0; i < g[l].w.size(); ++i) g[l].w[i] += gr[l].w[i];
      for (size_t i = 0; i < g[l].b.size(); ++i) g[l].b[i] += gr[l].b[i];
    }
  }
  return g;
}

// How the harness reaches the engine's device memory: null (CpuDevice: host memory, read and
// written in place), or a copy function (a GPU: cudaMemcpy) set by the test.
using DeviceCopy = void (*)(void* dst, const void* src, size_t bytes, bool to_device);
inline DeviceCopy& device_copy() {
  static DeviceCopy f = nullptr;
  return f;
}
// Host view of a module's parameters or gradient buffers (copied in/out when device_copy() is set).
struct HostView {
  ModuleParams dev;
  std::vector<std::vector<char>> host;
  explicit HostView(const ModuleParams& p, bool read) : dev(p) {
    if (!device_copy()) return;
    const size_t es = p.dtype == ComputeDType::kF32 ? 4 : 2;
    host.resize(p.data.size());
    for (size_t i = 0; i < p.data.size(); ++i) {
      host[i].resize(p.numel[i] * es);
      if (read) device_copy()(host[i].data(), p.data[i], host[i].size(), false);
    }
  }
  void* data(size_t i) { return device_copy() ? host[i].data() : dev.data[i]; }
  void write_back() {
    if (!device_copy()) return;
    for (size_t i = 0; i < host.size(); ++i) device_copy()(dev.data[i], host[i].data(), host[i].size(), true);
  }
};

// Trains `steps` steps through the engine (this rank's share of the global batch) and returns
// the final fp32 master parameters. inject_inf_at: a step whose first gradient becomes inf.
inline Status engine_train(Engine& e, const MlpSpec& s, int rank, int world, int steps,
                           std::vector<Layer>* out, std::vector<StepStats>* stats = nullptr,
                           int inject_inf_at = -1, int micro = 1, int first_step = 0,
                           bool eval_passes = false, const std::function<Status(int step)>& before_step = {},
                           const std::function<Status(int step)>& after_step = {}) {
  const int d = s.d;
  for (int k = first_step; k < steps; ++k) {
    // eval_passes: from the second step on, a forward-only pass over the modules before the
    // training micro-batches (a fetch order the engine did not record in the first step).
    for (int l = 0; eval_passes && k > first_step && l < s.layers; ++l) {
      auto p = e.fetch(static_cast<size_t>(l));
      if (!p.is_ok()) return p.status();
      ZOE_RETURN_IF_ERROR(e.release(static_cast<size_t>(l)));
    }
    for (int j = 0; j < micro; ++j) {
      const int first = (j * world + rank) * s.batch;
      auto xs = batch_inputs(s, k, first, s.batch);
      auto ts = batch_targets(s, k, first, s.batch);
      // Forward: gather each module, keep an fp32 copy of its weights for backward.
      std::vector<Layer> L(static_cast<size_t>(s.layers));
      for (int l = 0; l < s.layers; ++l) {
        auto p = e.fetch(static_cast<size_t>(l));
        if (!p.is_ok()) return p.status();
        L[l].w.resize(static_cast<size_t>(d * d));
        L[l].b.resize(static_cast<size_t>(d));
        HostView hv(p.value(), /*read=*/true);
        for (int i = 0; i < d * d; ++i) L[l].w[i] = load(hv.data(0), p->dtype, static_cast<size_t>(i));
        for (int i = 0; i < d; ++i) L[l].b[i] = load(hv.data(1), p->dtype, static_cast<size_t>(i));
        ZOE_RETURN_IF_ERROR(e.release(static_cast<size_t>(l)));
      }
      std::vector<Layer> g;
      mlp_grads(s, L, xs, ts, &g);
      const float scale = static_cast<float>(e.loss_scale());
      for (int l = s.layers - 1; l >= 0; --l) {
        if (k == s.no_grads_at && l == 0) continue;  // a frozen module: the engine zeroes its gradients
        if (l < s.frozen_layers) continue;           // never trained
        auto p = e.fetch(static_cast<size_t>(l));
        if (!p.is_ok()) return p.status();
        auto gb = e.grads(static_cast<size_t>(l));
        if (!gb.is_ok()) return gb.status();
        HostView hg(gb.value(), /*read=*/false);
        for (int i = 0; i < d * d; ++i)
          store(hg.data(0), gb->dtype, static_cast<size_t>(i), g[l].w[i] * scale);
        for (int i = 0; i < d; ++i) store(hg.data(1), gb->dtype, static_cast<size_t>(i), g[l].b[i] * scale);
        if (k == inject_inf_at && l == 0) store(hg.data(0), gb->dtype, 0, INFINITY);
        hg.write_back();
        ZOE_RETURN_IF_ERROR(e.reduce_grads(static_cast<size_t>(l)));
        ZOE_RETURN_IF_ERROR(e.release(static_cast<size_t>(l)));
      }
    }
    if (before_step) ZOE_RETURN_IF_ERROR(before_step(k));  // the gradients are in, the step is not taken
    auto st = e.step();
    if (!st.is_ok()) return st.status();
    if (stats) stats->push_back(st.value());
    if (after_step) ZOE_RETURN_IF_ERROR(after_step(k));  // between steps
  }
  out->assign(static_cast<size_t>(s.layers), Layer{});
  for (int l = 0; l < s.layers; ++l) {
    (*out)[l].w.resize(static_cast<size_t>(d * d));
    (*out)[l].b.resize(static_cast<size_t>(d));
    ZOE_RETURN_IF_ERROR(e.read_master(static_cast<size_t>(l), 0, (*out)[l].w.data()));
    ZOE_RETURN_IF_ERROR(e.read_master(static_cast<size_t>(l), 1, (*out)[l].b.data()));
  }
  return Status::ok();
}

// engine_train in the layer-major order (zoe.schedule "layer-major", include/zoe/engine.h): each
// step's forward fetches each module once for all `micro` micro-batches, and its backward fetches
// each module once and reduces the micro-batches' gradients one after another in micro-batch order.
inline Status engine_train_layer_major(Engine& e, const MlpSpec& s, int rank, int world, int steps,
                                       std::vector<Layer>* out, std::vector<StepStats>* stats, int micro) {
  const int d = s.d;
  for (int k = 0; k < steps; ++k) {
    std::vector<Layer> L(static_cast<size_t>(s.layers));
    for (int l = 0; l < s.layers; ++l) {
      auto p = e.fetch(static_cast<size_t>(l));
      if (!p.is_ok()) return p.status();
      L[l].w.resize(static_cast<size_t>(d * d));
      L[l].b.resize(static_cast<size_t>(d));
      HostView hv(p.value(), /*read=*/true);
      for (int i = 0; i < d * d; ++i) L[l].w[i] = load(hv.data(0), p->dtype, static_cast<size_t>(i));
      for (int i = 0; i < d; ++i) L[l].b[i] = load(hv.data(1), p->dtype, static_cast<size_t>(i));
      ZOE_RETURN_IF_ERROR(e.release(static_cast<size_t>(l)));
    }
    std::vector<std::vector<Layer>> g(static_cast<size_t>(micro));
    for (int j = 0; j < micro; ++j) {
      const int first = (j * world + rank) * s.batch;
      mlp_grads(s, L, batch_inputs(s, k, first, s.batch), batch_targets(s, k, first, s.batch), &g[j]);
    }
    const float scale = static_cast<float>(e.loss_scale());
    for (int l = s.layers - 1; l >= 0; --l) {
      auto p = e.fetch(static_cast<size_t>(l));
      if (!p.is_ok()) return p.status();
      for (int j = 0; j < micro; ++j) {
        auto gb = e.grads(static_cast<size_t>(l));
        if (!gb.is_ok()) return gb.status();
        HostView hg(gb.value(), /*read=*/false);
        for (int i = 0; i < d * d; ++i)
          store(hg.data(0), gb->dtype, static_cast<size_t>(i), g[j][l].w[i] * scale);
        for (int i = 0; i < d; ++i)
          store(hg.data(1), gb->dtype, static_cast<size_t>(i), g[j][l].b[i] * scale);
        hg.write_back();
        ZOE_RETURN_IF_ERROR(e.reduce_grads(static_cast<size_t>(l)));
      }
      ZOE_RETURN_IF_ERROR(e.release(static_cast<size_t>(l)));
    }
    auto st = e.step();
    if (!st.is_ok()) return st.status();
    if (stats) stats->push_back(st.value());
  }
  out->assign(static_cast<size_t>(s.layers), Layer{});
  for (int l = 0; l < s.layers; ++l) {
    (*out)[l].w.resize(static_cast<size_t>(d * d));
    (*out)[l].b.resize(static_cast<size_t>(d));
    ZOE_RETURN_IF_ERROR(e.read_master(static_cast<size_t>(l), 0, (*out)[l].w.data()));
    ZOE_RETURN_IF_ERROR(e.read_master(static_cast<size_t>(l), 1, (*out)[l].b.data()));
  }
  return Status::ok();
}

// frozen_modules: the first s.frozen_layers layers are registered frozen (ModuleOptions::frozen);
// else as every other module (their parameters then simply get no gradients).
inline Status register_mlp(Engine& e, const MlpSpec& s, bool frozen_modules = false) {
  for (int l = 0; l < s.layers; ++l) {
    ModuleOptions opts;
    opts.frozen = frozen_modules && l < s.frozen_layers;
    ZOE_RETURN_IF_ERROR(e.add_module("layer." + std::to_string(l), {{"w", {s.d, s.d}}, {"b", {s.d}}}, opts));
  }
  return e.initialize([](size_t m, size_t p, float* data, size_t n) {
    for (size_t i = 0; i < n; ++i) data[i] = init_value(m, p, i);
  });
}

// The engine test matrix's placements: stage 0; stage 1/2 x optimizer offload none/cpu/nvme;
// stage 3 x parameter offload x optimizer offload (13 in all).
struct MatrixPlacement {
  int stage;
  const char* opt;    // offload_optimizer.device
  const char* param;  // offload_param.device
};
inline std::vector<MatrixPlacement> matrix_placements() {
  std::vector<MatrixPlacement> v = {{0, "none", "none"}};
  for (int st : {1, 2}) {
    for (const char* o : {"none", "cpu", "nvme"}) v.push_back({st, o, "none"});
  }
  for (const char* p : {"none", "cpu", "nvme"}) {
    for (const char* o : {"none", "cpu", "nvme"}) v.push_back({3, o, p});
  }
  return v;
}

}  // namespace zoe::test
