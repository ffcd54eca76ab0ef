// GptCuda against GptCpu (ggml test-backend-ops style): the same parameters, tokens and targets
// through both, comparing the loss (relative 1e-4), the logits and every gradient tensor (largest
// absolute difference over the largest absolute value, 1e-3), naming the tensor on a mismatch.
// The gradient buffers start from the same nonzero values, so the "backward adds" contract is
// checked too. GPU tests skip (GTEST_SKIP) when cudaGetDeviceCount fails or finds no device.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "device/device.h"
#include "model/gpt.h"
#include "model/gpt_cuda.h"
#include "tests/util/gpu_test_util.h"
#include "tests/util/status_test_util.h"

namespace zoe::model {
namespace {

// Host parameters and gradients of one model, laid out as gpt_modules() says, with device copies.
struct Model {
  GptConfig c;
  std::vector<ModuleSpec> specs;
  std::vector<std::vector<std::vector<float>>> p, g;  // host
  std::vector<std::vector<float*>> dp, dg;            // device
  bool device_ok = true;

  explicit Model(const GptConfig& cfg) : c(cfg), specs(gpt_modules(cfg)) {
    p.resize(specs.size());
    g.resize(specs.size());
    dp.resize(specs.size());
    dg.resize(specs.size());
    for (size_t m = 0; m < specs.size(); ++m)
      for (const TensorSpec& t : specs[m].params) {
        p[m].emplace_back(t.numel(), 0.0f);
        g[m].emplace_back(t.numel(), 0.0f);
      }
  }
  ~Model() {
    for (auto& mod : dp)
      for (float* x : mod) (void)cudaFree(x);
    for (auto& mod : dg)
      for (float* x : mod) (void)cudaFree(x);
  }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // gpt_init parameters; gradients start at small random values (backward must add to them).
  void init(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-0.01f, 0.01f);
    for (size_t m = 0; m < p.size(); ++m)
      for (size_t i = 0; i < p[m].size(); ++i) {
        gpt_init(c, seed, m, i, p[m][i].data(), p[m][i].size());
        for (float& x : g[m][i]) x = u(rng);
      }
  }
  // Device copies of p and g.
  ::testing::AssertionResult upload() {
    for (size_t m = 0; m < p.size(); ++m)
      for (size_t i = 0; i < p[m].size(); ++i) {
        const size_t bytes = p[m][i].size() * sizeof(float);
        void* va = nullptr;
        void* vb = nullptr;
        const bool ok = cudaMalloc(&va, bytes) == cudaSuccess && cudaMalloc(&vb, bytes) == cudaSuccess;
        float* a = static_cast<float*>(va);
        float* b = static_cast<float*>(vb);
        dp[m].push_back(a);
        dg[m].push_back(b);
        if (!ok) return ::testing::AssertionFailure() << "cudaMalloc " << bytes << " bytes failed";
        if (cudaMemcpy(a, p[m][i].data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaMemcpy(b, g[m][i].data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess)
          return ::testing::AssertionFailure() << "cudaMemcpy to the device failed";
      }
    return synced();
  }
  // A copy from pageable memory may still be in flight when cudaMemcpy returns.
  static ::testing::AssertionResult synced() {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess)
      return ::testing::AssertionFailure() << "cudaDeviceSynchronize: " << cudaGetErrorString(e);
    return ::testing::AssertionSuccess();
  }
  // Device gradients into host buffers shaped like g.
  ::testing::AssertionResult download_grads(std::vector<std::vector<std::vector<float>>>* out) const {
    *out = g;
    for (size_t m = 0; m < g.size(); ++m)
      for (size_t i = 0; i < g[m].size(); ++i)
        if (cudaMemcpy((*out)[m][i].data(), dg[m][i], g[m][i].size() * sizeof(float),
                       cudaMemcpyDeviceToHost) != cudaSuccess)
          return ::testing::AssertionFailure() << "cudaMemcpy of " << name(m, i) << " to the host failed";
    return ::testing::AssertionSuccess();
  }
  ::testing::AssertionResult reset_device_grads() const {
    for (size_t m = 0; m < g.size(); ++m)
      for (size_t i = 0; i < g[m].size(); ++i)
        if (cudaMemcpy(dg[m][i], g[m][i].data(), g[m][i].size() * sizeof(float), cudaMemcpyHostToDevice) !=
            cudaSuccess)
          return ::testing::AssertionFailure() << "cudaMemcpy to the device failed";
    return synced();
  }
  std::string name(size_t m, size_t i) const { return specs[m].name + "." + specs[m].params[i].name; }

  // Pointer tables for the model calls.
  static std::vector<const float*> cptrs(const std::vector<std::vector<float>>& mod) {
    std::vector<const float*> v;
    for (const auto& t : mod) v.push_back(t.data());
    return v;
  }
  static std::vector<float*> ptrs(std::vector<std::vector<float>>& mod) {
    std::vector<float*> v;
    for (auto& t : mod) v.push_back(t.data());
    return v;
  }
  static std::vector<const float*> cdev(const std::vector<float*>& mod) { return {mod.begin(), mod.end()}; }
};

// Forward and backward through any model type with GptCpu's call sequence.
template <typename Gpt, typename P, typename G>
float step(Gpt& gpt, int layers, P& params, G& grads, const int32_t* tokens, const int32_t* targets) {
  gpt.embed_forward(tokens, params[0].data());
  for (int l = 0; l < layers; ++l) gpt.block_forward(l, params[1 + l].data());
  const float loss = gpt.head_forward(params.back().data(), params[0].data(), targets);
  gpt.head_backward(params.back().data(), params[0].data(), grads.back().data(), grads[0].data());
  for (int l = layers - 1; l >= 0; --l) gpt.block_backward(l, params[1 + l].data(), grads[1 + l].data());
  gpt.embed_backward(grads[0].data());
  return loss;
}

// max |got - want| / max |want| <= tol, naming the tensor and the worst index.
::testing::AssertionResult close(const std::string& what, const float* got, const float* want, size_t n,
                                 double tol) {
  double max_abs = 0.0, max_diff = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < n; ++i) {
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(want[i])));
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= max_diff)) {  // NaN counts as the worst
      max_diff = d;
      worst = i;
    }
  }
  const double rel = max_abs > 0.0 ? max_diff / max_abs : max_diff;
  if (rel <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": max |gpu - cpu| / max |cpu| = " << rel << " > " << tol << "; worst at index " << worst
         << " of " << n << ": gpu " << got[worst] << " cpu " << want[worst] << " (max |cpu| " << max_abs
         << ")";
}

struct Shape {
  const char* name;
  GptConfig c;
  int batch, T;
};

class GptCudaVsCpu : public ::testing::TestWithParam<Shape> {};

TEST_P(GptCudaVsCpu, LossLogitsAndEveryGradientMatch) {
  ZOE_SKIP_WITHOUT_GPU();
  const Shape& s = GetParam();
  const GptConfig& c = s.c;
  const size_t n = static_cast<size_t>(s.batch) * s.T;
  Model model(c);
  model.init(42);
  ASSERT_TRUE(model.upload());

  std::mt19937_64 rng(7);
  std::vector<int32_t> tokens(n), targets(n);
  for (size_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<int32_t>(rng() % static_cast<uint64_t>(c.vocab));
    targets[i] =
        i % 7 == 3 ? -1 : static_cast<int32_t>(rng() % static_cast<uint64_t>(c.vocab));  // some ignored
  }

  // CPU: the reference side.
  auto cpu_r = GptCpu::create(c, s.batch, s.T, 1);
  ASSERT_OK(cpu_r);
  GptCpu& cpu = *cpu_r.value();
  std::vector<std::vector<const float*>> cp;
  std::vector<std::vector<float*>> cg;
  auto cpu_grads = model.g;
  for (size_t m = 0; m < model.p.size(); ++m) {
    cp.push_back(Model::cptrs(model.p[m]));
    cg.push_back(Model::ptrs(cpu_grads[m]));
  }
  const float cpu_loss = step(cpu, c.layers, cp, cg, tokens.data(), targets.data());
  std::vector<float> cpu_logits(cpu.logits(), cpu.logits() + n * static_cast<size_t>(c.vocab));

  // GPU.
  auto gpu_r = GptCuda::create(c, s.batch, s.T, 0);
  ASSERT_OK(gpu_r);
  GptCuda& gpu = *gpu_r.value();
  std::vector<std::vector<const float*>> gp;
  std::vector<std::vector<float*>> gg;
  for (size_t m = 0; m < model.p.size(); ++m) {
    gp.push_back(Model::cdev(model.dp[m]));
    gg.push_back(model.dg[m]);
  }
  const float gpu_loss = step(gpu, c.layers, gp, gg, tokens.data(), targets.data());
  Status st = gpu.synchronize();
  ASSERT_OK(st);
  std::vector<float> gpu_logits(gpu.logits(), gpu.logits() + n * static_cast<size_t>(c.vocab));
  ASSERT_OK(gpu.status());

  std::printf("  %s: loss cpu %.7f gpu %.7f; %zu device bytes of activations\n", s.name, cpu_loss, gpu_loss,
              gpu.activation_bytes());
  EXPECT_TRUE(std::isfinite(cpu_loss));
  EXPECT_NEAR(gpu_loss, cpu_loss, 1e-4 * std::fabs(cpu_loss)) << "loss";
  EXPECT_TRUE(close("logits", gpu_logits.data(), cpu_logits.data(), cpu_logits.size(), 1e-3));
  std::vector<std::vector<std::vector<float>>> gpu_grads;
  ASSERT_TRUE(model.download_grads(&gpu_grads));
  for (size_t m = 0; m < cpu_grads.size(); ++m)
    for (size_t i = 0; i < cpu_grads[m].size(); ++i)
      EXPECT_TRUE(close("gradient " + model.name(m, i), gpu_grads[m][i].data(), cpu_grads[m][i].data(),
                        cpu_grads[m][i].size(), 1e-3));

  // The same step again from the same gradients: the same bits (a fixed order everywhere).
  ASSERT_TRUE(model.reset_device_grads());
  const float again = step(gpu, c.layers, gp, gg, tokens.data(), targets.data());
  st = gpu.synchronize();
  ASSERT_OK(st);
  EXPECT_EQ(std::memcmp(&again, &gpu_loss, sizeof(float)), 0) << again << " vs " << gpu_loss;
  std::vector<std::vector<std::vector<float>>> again_grads;
  ASSERT_TRUE(model.download_grads(&again_grads));
  for (size_t m = 0; m < again_grads.size(); ++m)
    for (size_t i = 0; i < again_grads[m].size(); ++i)
      EXPECT_TRUE(again_grads[m][i] == gpu_grads[m][i])
          << model.name(m, i) << " differs between two identical steps";
}

GptConfig config(int vocab, int seq, int d, int heads, int layers) {
  GptConfig c;
  c.vocab = vocab;
  c.seq = seq;
  c.d_model = d;
  c.heads = heads;
  c.layers = layers;
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GptCudaVsCpu,
    ::testing::Values(Shape{"tiny", config(256, 16, 32, 4, 2), 2, 16},
                      // d > the row kernels' 128 threads, T < seq, odd vocab, 5 heads of 32
                      Shape{"wider", config(301, 48, 160, 5, 1), 3, 40}),
    [](const ::testing::TestParamInfo<Shape>& i) { return std::string(i.param.name); });

// One forward pass over every module of `c`; the loss.
float forward_loss(GptCuda& gpu, const GptConfig& c, const std::vector<std::vector<const float*>>& gp,
                   const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets) {
  gpu.embed_forward(tokens.data(), gp[0].data());
  for (int l = 0; l < c.layers; ++l) gpu.block_forward(l, gp[1 + l].data());
  return gpu.head_forward(gp.back().data(), gp[0].data(), targets.data());
}

// An evaluation pass (forward only, then a new forward) leaves the model usable.
TEST(GptCuda, ForwardOnlyThenAgain) {
  ZOE_SKIP_WITHOUT_GPU();
  const GptConfig c = config(256, 16, 32, 4, 2);
  Model model(c);
  model.init(3);
  ASSERT_TRUE(model.upload());
  auto gpu_r = GptCuda::create(c, 1, 16, 0);
  ASSERT_OK(gpu_r);
  GptCuda& gpu = *gpu_r.value();
  std::vector<int32_t> tokens(16, 5), targets(16, -1);
  std::vector<std::vector<const float*>> gp;
  for (auto& mod : model.dp) gp.push_back(Model::cdev(mod));
  float losses[2];
  for (float& loss : losses) loss = forward_loss(gpu, c, gp, tokens, targets);
  EXPECT_EQ(losses[0], 0.0f);  // every target ignored
  EXPECT_EQ(losses[1], 0.0f);
  EXPECT_OK(gpu.status());
  const float* lg = gpu.logits();
  EXPECT_TRUE(std::isfinite(lg[0]) && std::isfinite(lg[16 * 256 - 1]));
}

// On a stream of the engine's device (device::Device owns every stream): the model enqueues there,
// leaves the stream alive, and computes the bits of a model on its own stream.
TEST(GptCuda, RunsOnTheDevicesStream) {
  ZOE_SKIP_WITHOUT_GPU();
  const GptConfig c = config(256, 16, 32, 4, 2);
  Model model(c);
  model.init(4);
  ASSERT_TRUE(model.upload());
  auto dev = device::create_cuda_device(0, size_t{256} << 20);
  ASSERT_OK(dev);
  auto stream = dev.value()->create_stream();
  ASSERT_OK(stream);
  void* handle = stream.value()->native_handle();
  ASSERT_NE(handle, nullptr);
  std::vector<int32_t> tokens(16), targets(16);
  for (int i = 0; i < 16; ++i) {
    tokens[static_cast<size_t>(i)] = (i * 7) % 256;
    targets[static_cast<size_t>(i)] = (i * 7 + 1) % 256;
  }
  std::vector<std::vector<const float*>> gp;
  for (auto& mod : model.dp) gp.push_back(Model::cdev(mod));
  float loss[2];
  for (int k = 0; k < 2; ++k) {
    // The same upload before each model: the device's stream is non-blocking, so order it.
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto gpu_r = GptCuda::create(c, 1, 16, 0, k == 0 ? nullptr : handle);
    ASSERT_OK(gpu_r);
    GptCuda& gpu = *gpu_r.value();
    if (k == 1) {
      EXPECT_EQ(gpu.stream(), handle);
    }
    loss[k] = forward_loss(gpu, c, gp, tokens, targets);
    ASSERT_OK(gpu.synchronize());
  }
  EXPECT_TRUE(std::isfinite(loss[0]));
  EXPECT_EQ(loss[0], loss[1]) << "own stream against the device's";
  // The model is gone; the device's stream still works.
  EXPECT_OK(stream.value()->synchronize());
}

// Activation checkpointing on the GPU: each block's input copied to a device buffer of the test's
// before its forward and back before its backward (as the trainer does through the engine's
// activation store); the loss, logits and every gradient are the bits of the model that keeps
// every activation, with one block's workspace instead of every block's.
TEST(GptCuda, CheckpointingGivesTheSameBits) {
  ZOE_SKIP_WITHOUT_GPU();
  const GptConfig c = config(301, 48, 160, 5, 3);
  const int B = 2, T = 40;
  const size_t n = static_cast<size_t>(B) * T;
  Model model(c);
  model.init(9);
  ASSERT_TRUE(model.upload());
  std::vector<int32_t> tokens(n), targets(n);
  for (size_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<int32_t>((i * 37) % 301);
    targets[i] = static_cast<int32_t>((i * 11 + 5) % 301);
  }
  std::vector<std::vector<const float*>> gp;
  for (auto& mod : model.dp) gp.push_back(Model::cdev(mod));
  struct Run {
    float loss = 0;
    std::vector<float> logits;
    std::vector<std::vector<std::vector<float>>> grads;
    size_t bytes = 0;
  };
  auto run = [&](bool ckpt, Run* r) {
    ASSERT_TRUE(model.reset_device_grads());
    auto gpu_r = GptCuda::create(c, B, T, 0, nullptr, ckpt);
    ASSERT_OK(gpu_r);
    GptCuda& gpu = *gpu_r.value();
    ASSERT_EQ(gpu.checkpointing(), ckpt);
    const size_t bytes = gpu.checkpoint_bytes();
    std::vector<void*> kept(static_cast<size_t>(c.layers), nullptr);
    for (void*& k : kept) ASSERT_EQ(cudaMalloc(&k, bytes), cudaSuccess);
    auto copy = [&](void* dst, const void* src) {
      ASSERT_EQ(
          cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(gpu.stream())),
          cudaSuccess);
    };
    gpu.embed_forward(tokens.data(), gp[0].data());
    for (int l = 0; l < c.layers; ++l) {
      if (ckpt) copy(kept[static_cast<size_t>(l)], gpu.checkpoint_input(l));
      gpu.block_forward(l, gp[1 + static_cast<size_t>(l)].data());
    }
    r->loss = gpu.head_forward(gp.back().data(), gp[0].data(), targets.data());
    r->logits.assign(gpu.logits(), gpu.logits() + n * static_cast<size_t>(c.vocab));
    gpu.head_backward(gp.back().data(), gp[0].data(), model.dg.back().data(), model.dg[0].data());
    for (int l = c.layers - 1; l >= 0; --l) {
      if (ckpt) copy(gpu.checkpoint_input(l), kept[static_cast<size_t>(l)]);
      gpu.block_backward(l, gp[1 + static_cast<size_t>(l)].data(),
                         model.dg[1 + static_cast<size_t>(l)].data());
    }
    gpu.embed_backward(model.dg[0].data());
    ASSERT_OK(gpu.synchronize());
    for (void* k : kept) (void)cudaFree(k);
    ASSERT_TRUE(model.download_grads(&r->grads));
    r->bytes = gpu.activation_bytes();
  };
  Run plain, ckpt;
  run(false, &plain);
  run(true, &ckpt);
  EXPECT_EQ(std::memcmp(&plain.loss, &ckpt.loss, sizeof(float)), 0) << plain.loss << " vs " << ckpt.loss;
  EXPECT_TRUE(plain.logits == ckpt.logits);
  for (size_t m = 0; m < plain.grads.size(); ++m)
    for (size_t i = 0; i < plain.grads[m].size(); ++i)
      EXPECT_TRUE(plain.grads[m][i] == ckpt.grads[m][i]) << model.name(m, i) << " differs with checkpointing";
  EXPECT_LT(ckpt.bytes, plain.bytes);
}

TEST(GptCuda, BadArgumentsAreRejected) {
  GptConfig c = config(256, 16, 32, 4, 2);
  auto r = GptCuda::create(c, 2, 17, 0);  // checked before looking for a GPU
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("tokens_per_seq 17"), std::string::npos) << r.status().message();
  c.d_model = 30;
  r = GptCuda::create(c, 2, 16, 0);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("not a multiple of heads"), std::string::npos) << r.status().message();
  if (::zoe::test::gpu_unavailable().empty()) {
    r = GptCuda::create(config(256, 16, 32, 4, 2), 2, 16, 1000);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("device 1000 does not exist"), std::string::npos)
        << r.status().message();
  }
}

// Runs here too: without a GPU, create() says so and why.
TEST(GptCuda, WithoutAGpuCreationSaysWhy) {
  if (::zoe::test::gpu_unavailable().empty()) GTEST_SKIP() << "a GPU is present";
  auto r = GptCuda::create(config(256, 16, 32, 4, 2), 2, 16, 0);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported) << r.status().to_string();
  EXPECT_NE(r.status().message().find("no CUDA device"), std::string::npos) << r.status().message();
  std::printf("  without a GPU: %s\n", r.status().to_string().c_str());
}

}  // namespace
}  // namespace zoe::model
