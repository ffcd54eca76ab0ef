// The GPT: config checks, layout, init, and the fp32 CPU forward/backward against a double reference
// (loss, logits, every gradient by central finite differences), determinism across thread counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpt_reference.h"
#include "model/gpt.h"
#include "model/kernels.h"
#include "tests/util/status_test_util.h"

namespace zoe::model {
namespace {

using testing::RefParams;

// Parameters and gradients of one model, laid out as gpt_modules() says.
struct Model {
  GptConfig c;
  std::vector<ModuleSpec> specs;
  std::vector<std::vector<std::vector<float>>> p, g;
  std::vector<std::vector<const float*>> pp;
  std::vector<std::vector<float*>> gp;

  explicit Model(const GptConfig& cfg) : c(cfg), specs(gpt_modules(cfg)) {
    p.resize(specs.size());
    g.resize(specs.size());
    pp.resize(specs.size());
    gp.resize(specs.size());
    for (size_t m = 0; m < specs.size(); ++m) {
      for (const TensorSpec& t : specs[m].params) {
        p[m].emplace_back(t.numel(), 0.0f);
        g[m].emplace_back(t.numel(), 0.0f);
      }
      for (size_t i = 0; i < p[m].size(); ++i) {
        pp[m].push_back(p[m][i].data());
        gp[m].push_back(g[m][i].data());
      }
    }
  }
  void init(uint64_t seed) {
    for (size_t m = 0; m < p.size(); ++m)
      for (size_t i = 0; i < p[m].size(); ++i) gpt_init(c, seed, m, i, p[m][i].data(), p[m][i].size());
  }
  // Large random values everywhere (gains around 1), so that every path of the gradient matters.
  void randomize(uint64_t seed, float scale) {
    std::mt19937_64 rng(seed);
    auto uni = [&] { return static_cast<float>(static_cast<double>(rng() >> 11) * 0x1p-53 * 2.0 - 1.0); };
    for (size_t m = 0; m < p.size(); ++m)
      for (size_t i = 0; i < p[m].size(); ++i) {
        const bool gain = specs[m].params[i].name.ends_with("_g");
        const bool vec = specs[m].params[i].shape.size() == 1;
        for (float& v : p[m][i]) v = gain ? 1.0f + 0.3f * uni() : (vec ? 0.1f : scale) * uni();
      }
  }
  void zero_grads() {
    for (auto& mod : g)
      for (auto& t : mod) std::fill(t.begin(), t.end(), 0.0f);
  }
  float forward(GptCpu& gpt, const int32_t* tokens, const int32_t* targets) {
    gpt.embed_forward(tokens, pp[0].data());
    for (int l = 0; l < c.layers; ++l) gpt.block_forward(l, pp[1 + l].data());
    return gpt.head_forward(pp.back().data(), pp[0].data(), targets);
  }
  void backward(GptCpu& gpt) {
    gpt.head_backward(pp.back().data(), pp[0].data(), gp.back().data(), gp[0].data());
    for (int l = c.layers - 1; l >= 0; --l) gpt.block_backward(l, pp[1 + l].data(), gp[1 + l].data());
    gpt.embed_backward(gp[0].data());
  }
  RefParams to_double() const {
    RefParams r(p.size());
    for (size_t m = 0; m < p.size(); ++m)
      for (const auto& t : p[m]) r[m].emplace_back(t.begin(), t.end());
    return r;
  }
};

std::unique_ptr<GptCpu> make_gpt(const GptConfig& c, int batch, int T, int threads) {
  auto r = GptCpu::create(c, batch, T, threads);
  EXPECT_OK(r);
  return r.is_ok() ? std::move(r).value() : nullptr;
}

std::vector<int32_t> random_ids(size_t n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return v;
}

// ---------------------------------------------------------------------------------------------
TEST(GptConfig, Validate) {
  GptConfig ok;
  EXPECT_OK(ok.validate());
  struct Bad {
    GptConfig c;
    const char* needle;
  };
  std::vector<Bad> bad;
  GptConfig c = ok;
  c.d_model = 130;  // heads 4
  bad.push_back({c, "not a multiple of heads"});
  c = ok, c.vocab = 0, bad.push_back({c, "vocab 0"});
  c = ok, c.vocab = 65537, bad.push_back({c, "vocab 65537"});
  c = ok, c.seq = -1, bad.push_back({c, "seq -1"});
  c = ok, c.heads = 0, bad.push_back({c, "heads 0"});
  c = ok, c.layers = 0, bad.push_back({c, "layers 0"});
  c = ok, c.d_model = 0, bad.push_back({c, "d_model 0"});
  for (const Bad& b : bad) {
    Status s = b.c.validate();
    ASSERT_FALSE(s.is_ok()) << b.needle;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(b.needle), std::string::npos) << s.message();
  }
  GptConfig v = ok;
  v.vocab = 65536;
  EXPECT_OK(v.validate());
}

TEST(GptConfig, ModulesMatchNumParams) {
  GptConfig c{.vocab = 300, .seq = 32, .d_model = 48, .heads = 3, .layers = 3};
  auto mods = gpt_modules(c);
  ASSERT_EQ(mods.size(), 5u);
  EXPECT_EQ(mods[0].name, "embed");
  EXPECT_EQ(mods[1].name, "block.0");
  EXPECT_EQ(mods[3].name, "block.2");
  EXPECT_EQ(mods[4].name, "final");
  ASSERT_EQ(mods[1].params.size(), 12u);
  EXPECT_EQ(mods[1].params[2].name, "qkv_w");
  EXPECT_EQ(mods[1].params[2].shape, (std::vector<int64_t>{144, 48}));
  EXPECT_EQ(mods[1].params[10].shape, (std::vector<int64_t>{48, 192}));
  uint64_t n = 0;
  for (const auto& m : mods)
    for (const auto& t : m.params) n += t.numel();
  EXPECT_EQ(n, c.num_params());
}

TEST(GptCpu, CreateRefusesBadShapes) {
  GptConfig c{.vocab = 16, .seq = 8, .d_model = 8, .heads = 2, .layers = 1};
  EXPECT_FALSE(GptCpu::create(c, 1, 9).is_ok());
  EXPECT_FALSE(GptCpu::create(c, 0, 8).is_ok());
  EXPECT_FALSE(GptCpu::create(c, 1, 0).is_ok());
  EXPECT_FALSE(GptCpu::create(c, 1, 8, -1).is_ok());
  GptConfig bad = c;
  bad.heads = 3;
  auto r = GptCpu::create(bad, 1, 8);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("heads"), std::string::npos);
  auto ok = GptCpu::create(c, 2, 8, 0);
  ASSERT_OK(ok);
  EXPECT_GE((*ok)->threads(), 1);
  EXPECT_GT((*ok)->activation_bytes(), 0u);
}

// Calls out of order abort with a message that names the expected call.
TEST(GptCpuDeathTest, CallsOutOfOrderAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  GptConfig c{.vocab = 16, .seq = 4, .d_model = 8, .heads = 2, .layers = 2};
  Model m(c);
  m.init(1);
  std::vector<int32_t> ids(4, 1);
  auto gpt = make_gpt(c, 1, 4, 1);
  ASSERT_TRUE(gpt);
  EXPECT_DEATH(gpt->block_forward(0, m.pp[1].data()), "expected layer 0, in order after embed_forward");
  gpt->embed_forward(ids.data(), m.pp[0].data());
  EXPECT_DEATH(gpt->block_forward(1, m.pp[2].data()), "block_forward\\(1\\): expected layer 0");
  EXPECT_DEATH(gpt->head_forward(m.pp[3].data(), m.pp[0].data(), ids.data()),
               "head_forward after 0 of 2 blocks");
  m.forward(*gpt, ids.data(), ids.data());
  EXPECT_DEATH(gpt->block_backward(1, m.pp[2].data(), m.gp[2].data()), "after head_backward");
  gpt->head_backward(m.pp[3].data(), m.pp[0].data(), m.gp[3].data(), m.gp[0].data());
  EXPECT_DEATH(gpt->block_backward(0, m.pp[1].data(), m.gp[1].data()), "expected layer 1, in reverse order");
  EXPECT_DEATH(gpt->embed_backward(m.gp[0].data()), "before the backward of block 1");
}

// ---------------------------------------------------------------------------------------------
TEST(GptInit, DeterministicShardableGpt2Style) {
  GptConfig c{.vocab = 512, .seq = 64, .d_model = 64, .heads = 4, .layers = 8};
  Model a(c), b(c);
  a.init(7);
  b.init(7);
  EXPECT_EQ(a.p, b.p);
  b.init(8);
  EXPECT_NE(a.p[0][0], b.p[0][0]);
  // Element i depends on (seed, module, param, i) only: a shard equals the slice.
  std::vector<float> part(100);
  gpt_init_range(c, 7, 2, 8, 1000, part.data(), part.size());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), a.p[2][8].begin() + 1000));
  // A tensor large enough to be filled on several threads: the same values as one pass.
  GptConfig wide{.vocab = 512, .seq = 64, .d_model = 768, .heads = 4, .layers = 1};
  const size_t fc1 = size_t{4} * 768 * 768;  // fc1_w: 2.25M elements
  std::vector<float> threaded(fc1), serial(fc1);
  gpt_init(wide, 7, 1, 8, threaded.data(), fc1);
  gpt_init_range(wide, 7, 1, 8, 0, serial.data(), fc1);
  EXPECT_EQ(threaded, serial);
  // Different tensors get different streams.
  EXPECT_NE(std::vector<float>(a.p[1][2].begin(), a.p[1][2].begin() + 64),
            std::vector<float>(a.p[2][2].begin(), a.p[2][2].begin() + 64));

  auto stats = [](const std::vector<float>& v) {
    double s = 0, s2 = 0;
    for (float x : v) s += x, s2 += static_cast<double>(x) * x;
    const double m = s / v.size();
    return std::make_pair(m, std::sqrt(s2 / v.size() - m * m));
  };
  auto [m_wte, sd_wte] = stats(a.p[0][0]);
  EXPECT_NEAR(m_wte, 0.0, 1e-3);
  EXPECT_NEAR(sd_wte, 0.02, 0.0005);
  auto [m_fc1, sd_fc1] = stats(a.p[1][8]);
  EXPECT_NEAR(m_fc1, 0.0, 1e-3);
  EXPECT_NEAR(sd_fc1, 0.02, 0.0005);
  auto [m_fc2, sd_fc2] = stats(a.p[1][10]);  // residual projection: 0.02 / sqrt(2 * 8) = 0.005
  EXPECT_NEAR(sd_fc2, 0.005, 0.0002);
  auto [m_proj, sd_proj] = stats(a.p[1][4]);
  EXPECT_NEAR(sd_proj, 0.005, 0.0003);
  for (size_t m = 1; m < a.p.size(); ++m)
    for (size_t i = 0; i < a.p[m].size(); ++i) {
      const std::string& name = a.specs[m].params[i].name;
      const auto& v = a.p[m][i];
      if (name.ends_with("_g")) {
        EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 1.0f; })) << name;
      }
      if (name.ends_with("_b")) {
        EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; })) << name;
      }
    }
}

// ---------------------------------------------------------------------------------------------
// The vectorized GELU (its own exp/tanh) against the double formula, value and derivative.
// Tolerance, for both: 4e-7 * max(1, |x|) absolute (the rounding of 1 + tanh in fp32, times x).
TEST(GptKernels, GeluMatchesDouble) {
  std::vector<float> x;
  for (int i = -30000; i <= 30000; ++i) x.push_back(static_cast<float>(i) * 1e-3f);
  for (float v : {1e-30f, -1e-30f, 0.0f, 50.0f, -50.0f, 1e4f, -1e4f, 3e38f, -3e38f}) x.push_back(v);
  std::vector<float> y(x.size()), dy(x.size(), 1.0f);
  kernels::gelu_forward(x.data(), y.data(), x.size());
  kernels::gelu_backward(x.data(), dy.data(), x.size());
  const double c = std::sqrt(2.0 / M_PI);
  int wrong = 0;
  double worst = 0, worst_d = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    const double t = std::tanh(c * (v + 0.044715 * v * v * v));
    const double ref = 0.5 * v * (1.0 + t);
    const double dref = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * v * v);
    const double tol = 4e-7 * std::max(1.0, std::fabs(v));
    worst = std::max(worst, std::fabs(y[i] - ref) / tol);
    worst_d = std::max(worst_d, std::fabs(dy[i] - dref) / tol);
    if (!(std::fabs(y[i] - ref) <= tol) || !(std::fabs(dy[i] - dref) <= tol)) {
      if (wrong++ == 0)
        ADD_FAILURE() << "first wrong at x = " << v << ": gelu " << y[i] << " vs " << ref << ", gelu' "
                      << dy[i] << " vs " << dref;
    }
  }
  EXPECT_EQ(wrong, 0);
  std::printf("gelu: worst error / tolerance %.2f (value), %.2f (derivative)\n", worst, worst_d);
}

// ---------------------------------------------------------------------------------------------
// The fp32 forward against the double reference: loss and every logit, with ignored targets and
// T < seq.
TEST(GptCpu, ForwardMatchesDoubleReference) {
  GptConfig c{.vocab = 50, .seq = 8, .d_model = 32, .heads = 4, .layers = 2};
  const int B = 3, T = 7;
  Model m(c);
  m.randomize(11, 0.3f);
  auto tokens = random_ids(B * T, c.vocab, 1);
  auto targets = random_ids(B * T, c.vocab, 2);
  targets[0] = -1, targets[5] = -100, targets[B * T - 1] = -1;
  auto gpt = make_gpt(c, B, T, 2);
  ASSERT_TRUE(gpt);
  const float loss = m.forward(*gpt, tokens.data(), targets.data());
  const auto ref = testing::gpt_reference_forward(c, B, T, m.to_double(), tokens.data(), targets.data());
  EXPECT_NEAR(loss, ref.loss, 1e-5 * std::max(1.0, ref.loss));
  double scale = 0;
  for (double v : ref.logits) scale = std::max(scale, std::fabs(v));
  const double tol = 2e-5 * std::max(1.0, scale);
  int wrong = 0, first = -1;
  for (size_t i = 0; i < ref.logits.size(); ++i) {
    if (std::fabs(gpt->logits()[i] - ref.logits[i]) > tol) {
      if (first < 0) first = static_cast<int>(i);
      ++wrong;
    }
  }
  EXPECT_EQ(wrong, 0) << "first wrong logit " << first << ": " << (first >= 0 ? gpt->logits()[first] : 0.f)
                      << " vs " << (first >= 0 ? ref.logits[static_cast<size_t>(first)] : 0.0) << " (tol "
                      << tol << ")";
}

// Every element of every parameter tensor: analytic fp32 gradient vs central differences of the
// double reference loss. Tolerance per tensor: |g - fd| <= 1e-3 * max|fd| + 1e-6.
TEST(GptCpu, GradientsMatchFiniteDifferences) {
  GptConfig c{.vocab = 11, .seq = 5, .d_model = 8, .heads = 2, .layers = 2};
  const int B = 2, T = 5;
  Model m(c);
  m.randomize(3, 0.5f);
  auto tokens = random_ids(B * T, c.vocab, 5);
  tokens[1] = tokens[7];  // a repeated token: the embedding scatter must sum
  auto targets = random_ids(B * T, c.vocab, 6);
  targets[3] = -1;  // ignored
  auto gpt = make_gpt(c, B, T, 2);
  ASSERT_TRUE(gpt);
  m.zero_grads();
  m.forward(*gpt, tokens.data(), targets.data());
  m.backward(*gpt);

  RefParams rp = m.to_double();
  const double h = 1e-4;
  double worst = 0.0;
  std::string worst_at;
  for (size_t mod = 0; mod < rp.size(); ++mod) {
    for (size_t t = 0; t < rp[mod].size(); ++t) {
      std::vector<double>& w = rp[mod][t];
      std::vector<double> fd(w.size());
      for (size_t i = 0; i < w.size(); ++i) {
        const double w0 = w[i];
        w[i] = w0 + h;
        const double lp = testing::gpt_reference_forward(c, B, T, rp, tokens.data(), targets.data()).loss;
        w[i] = w0 - h;
        const double lm = testing::gpt_reference_forward(c, B, T, rp, tokens.data(), targets.data()).loss;
        w[i] = w0;
        fd[i] = (lp - lm) / (2 * h);
      }
      double scale = 0;
      for (double v : fd) scale = std::max(scale, std::fabs(v));
      const double tol = 1e-3 * scale + 1e-6;
      const std::string name = m.specs[mod].name + "." + m.specs[mod].params[t].name;
      EXPECT_GT(scale, 1e-4) << name << ": a gradient this small checks nothing";
      for (size_t i = 0; i < w.size(); ++i) {
        const double err = std::fabs(m.g[mod][t][i] - fd[i]);
        if (err / (scale + 1e-12) > worst)
          worst = err / (scale + 1e-12), worst_at = name + "[" + std::to_string(i) + "]";
        if (err > tol) {
          ADD_FAILURE() << name << "[" << i << "]: analytic " << m.g[mod][t][i] << " vs finite difference "
                        << fd[i] << " (tol " << tol << ", tensor scale " << scale << ")";
          break;  // the first bad index of each tensor
        }
      }
    }
  }
  std::printf("gradient check: worst |g - fd| / max|fd| = %.2e at %s\n", worst, worst_at.c_str());
}

// Positions with target < 0 contribute nothing: all ignored gives loss 0 and zero gradients, and
// ignoring a position equals the reference that skips it (checked above); logits do not depend on
// targets.
TEST(GptCpu, IgnoredTargets) {
  GptConfig c{.vocab = 20, .seq = 6, .d_model = 16, .heads = 2, .layers = 1};
  const int B = 2, T = 6;
  Model m(c);
  m.randomize(9, 0.3f);
  auto tokens = random_ids(B * T, c.vocab, 1);
  std::vector<int32_t> none(B * T, -1);
  auto gpt = make_gpt(c, B, T, 1);
  ASSERT_TRUE(gpt);
  m.zero_grads();
  EXPECT_EQ(m.forward(*gpt, tokens.data(), none.data()), 0.0f);
  std::vector<float> logits_none(gpt->logits(), gpt->logits() + B * T * c.vocab);
  m.backward(*gpt);
  for (auto& mod : m.g)
    for (auto& t : mod)
      for (float v : t) ASSERT_EQ(v, 0.0f);

  // One live target: the gradient only flows from that position.
  std::vector<int32_t> one = none;
  one[4] = 3;
  const float loss = m.forward(*gpt, tokens.data(), one.data());
  EXPECT_EQ(std::memcmp(logits_none.data(), gpt->logits(), logits_none.size() * sizeof(float)), 0);
  const auto ref = testing::gpt_reference_forward(c, B, T, m.to_double(), tokens.data(), one.data());
  EXPECT_NEAR(loss, ref.loss, 1e-5);
  m.backward(*gpt);
  // Causal: position 4 of sequence 0 sees nothing of sequence 1, nor of positions 5 of sequence 0.
  const auto& dwpe = m.g[0][1];
  for (int t = 5; t < T; ++t)
    for (int i = 0; i < c.d_model; ++i) ASSERT_EQ(dwpe[static_cast<size_t>(t * c.d_model + i)], 0.0f) << t;
}

// Same bits for the same inputs: twice, and with 1, 2 and 3 threads. Backward adds: a second
// backward without zeroing doubles every gradient exactly.
TEST(GptCpu, DeterministicAcrossThreadCounts) {
  GptConfig c{.vocab = 97, .seq = 48, .d_model = 64, .heads = 4, .layers = 2};
  const int B = 4, T = 48;  // 192 rows: several GEMM chunks
  Model base(c);
  base.randomize(21, 0.2f);
  auto tokens = random_ids(B * T, c.vocab, 1);
  auto targets = random_ids(B * T, c.vocab, 2);
  targets[10] = -1;

  struct Run {
    float loss;
    std::vector<float> logits;
    std::vector<std::vector<std::vector<float>>> grads;
  };
  auto run = [&](int threads) {
    Model m = base;
    for (size_t i = 0; i < m.p.size(); ++i)
      for (size_t j = 0; j < m.p[i].size(); ++j) m.pp[i][j] = m.p[i][j].data(), m.gp[i][j] = m.g[i][j].data();
    auto gpt = make_gpt(c, B, T, threads);
    m.zero_grads();
    Run r;
    r.loss = m.forward(*gpt, tokens.data(), targets.data());
    r.logits.assign(gpt->logits(), gpt->logits() + static_cast<size_t>(B) * T * c.vocab);
    m.backward(*gpt);
    r.grads = m.g;
    // Accumulation: forward + backward again without zeroing gives twice the gradient (to
    // rounding: a tensor fed by several sums, like wte, adds them one after the other).
    EXPECT_EQ(m.forward(*gpt, tokens.data(), targets.data()), r.loss);
    m.backward(*gpt);
    for (size_t i = 0; i < m.g.size(); ++i)
      for (size_t j = 0; j < m.g[i].size(); ++j) {
        float scale = 0.0f;
        for (float v : r.grads[i][j]) scale = std::max(scale, std::fabs(v));
        for (size_t k = 0; k < m.g[i][j].size(); ++k)
          if (std::fabs(m.g[i][j][k] - 2.0f * r.grads[i][j][k]) > 1e-4f * scale) {
            ADD_FAILURE() << "accumulated gradient " << i << "." << j << "[" << k << "]: " << m.g[i][j][k]
                          << " vs 2 * " << r.grads[i][j][k];
            break;
          }
      }
    return r;
  };
  const Run ref = run(1);
  for (int threads : {1, 2, 3}) {
    const Run r = run(threads);
    EXPECT_EQ(std::memcmp(&r.loss, &ref.loss, sizeof(float)), 0) << threads;
    EXPECT_EQ(std::memcmp(r.logits.data(), ref.logits.data(), r.logits.size() * sizeof(float)), 0) << threads;
    for (size_t i = 0; i < r.grads.size(); ++i)
      for (size_t j = 0; j < r.grads[i].size(); ++j)
        EXPECT_EQ(
            std::memcmp(r.grads[i][j].data(), ref.grads[i][j].data(), r.grads[i][j].size() * sizeof(float)),
            0)
            << "threads " << threads << ": gradient " << i << "." << j << " differs";
  }
}

// Activation checkpointing: the caller keeps each block's input (here in plain vectors, as the
// trainer does in the engine's activation store); the backward recomputes each block from it. The
// loss, logits and every gradient are bit-identical to the model that keeps every activation, over
// two micro-batches (the workspace reused) and whatever the thread count; the model holds one
// block's workspace instead of every block's.
TEST(GptCpu, CheckpointingGivesTheSameBits) {
  GptConfig c{.vocab = 97, .seq = 48, .d_model = 64, .heads = 4, .layers = 3};
  const int B = 3, T = 40;
  Model base(c);
  base.randomize(5, 0.2f);
  struct Run {
    std::vector<float> losses, logits;
    std::vector<std::vector<std::vector<float>>> grads;
  };
  auto run = [&](bool ckpt, int threads) {
    Model m = base;
    for (size_t i = 0; i < m.p.size(); ++i)
      for (size_t j = 0; j < m.p[i].size(); ++j) m.pp[i][j] = m.p[i][j].data(), m.gp[i][j] = m.g[i][j].data();
    auto made = GptCpu::create(c, B, T, threads, ckpt);
    EXPECT_OK(made);
    GptCpu& gpt = *made.value();
    EXPECT_EQ(gpt.checkpointing(), ckpt);
    EXPECT_EQ(gpt.checkpoint_bytes(), static_cast<size_t>(B) * T * c.d_model * sizeof(float));
    Run r;
    std::vector<std::vector<float>> kept(static_cast<size_t>(c.layers));
    const size_t nd = static_cast<size_t>(B) * T * c.d_model;
    for (uint64_t mb = 0; mb < 2; ++mb) {
      auto tokens = random_ids(B * T, c.vocab, 10 + mb), targets = random_ids(B * T, c.vocab, 20 + mb);
      gpt.embed_forward(tokens.data(), m.pp[0].data());
      for (int l = 0; l < c.layers; ++l) {
        if (ckpt) kept[static_cast<size_t>(l)].assign(gpt.checkpoint_input(l), gpt.checkpoint_input(l) + nd);
        gpt.block_forward(l, m.pp[1 + static_cast<size_t>(l)].data());
      }
      r.losses.push_back(gpt.head_forward(m.pp.back().data(), m.pp[0].data(), targets.data()));
      r.logits.insert(r.logits.end(), gpt.logits(), gpt.logits() + static_cast<size_t>(B) * T * c.vocab);
      gpt.head_backward(m.pp.back().data(), m.pp[0].data(), m.gp.back().data(), m.gp[0].data());
      for (int l = c.layers - 1; l >= 0; --l) {
        if (ckpt)
          std::copy(kept[static_cast<size_t>(l)].begin(), kept[static_cast<size_t>(l)].end(),
                    gpt.checkpoint_input(l));
        gpt.block_backward(l, m.pp[1 + static_cast<size_t>(l)].data(),
                           m.gp[1 + static_cast<size_t>(l)].data());
      }
      gpt.embed_backward(m.gp[0].data());
    }
    r.grads = m.g;
    return std::make_pair(r, gpt.activation_bytes());
  };
  const auto [ref, ref_bytes] = run(false, 1);
  for (int threads : {1, 2}) {
    const auto [r, bytes] = run(true, threads);
    ASSERT_EQ(r.losses.size(), ref.losses.size());
    EXPECT_EQ(std::memcmp(r.losses.data(), ref.losses.data(), r.losses.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(r.logits.data(), ref.logits.data(), r.logits.size() * sizeof(float)), 0);
    for (size_t i = 0; i < r.grads.size(); ++i)
      for (size_t j = 0; j < r.grads[i].size(); ++j)
        EXPECT_EQ(
            std::memcmp(r.grads[i][j].data(), ref.grads[i][j].data(), r.grads[i][j].size() * sizeof(float)),
            0)
            << "threads " << threads << ": gradient " << i << "." << j << " differs with checkpointing";
    // One block workspace and two residual buffers, not three and four.
    EXPECT_LT(bytes, ref_bytes);
  }
}

// Hooks that give a block's four weights one buffer, filled on need() (the rest of it NaN, so a
// weight read without being needed shows), and their gradients another, added to the block's own
// gradients on grad_done() and zeroed: what GptTrainer does with a block's fp32 copies.
struct SharedWeights final : BlockTensorHooks {
  const std::vector<std::vector<float>>* params = nullptr;
  std::vector<std::vector<float>>* grads = nullptr;
  std::vector<float> w, gw;
  std::vector<int> done = std::vector<int>(kBlockParams, 0);  // grad_done() calls per parameter
  static bool weight(size_t i) { return i == kQkvW || i == kProjW || i == kFc1W || i == kFc2W; }
  void need(size_t i) override {
    if (!weight(i)) return;
    std::fill(w.begin(), w.end(), std::nanf(""));
    std::copy((*params)[i].begin(), (*params)[i].end(), w.begin());
  }
  void grad_done(size_t i) override {
    ++done[i];
    if (!weight(i)) return;
    for (size_t k = 0; k < (*grads)[i].size(); ++k) (*grads)[i][k] += gw[k];
    std::fill(gw.begin(), gw.end(), 0.0f);
  }
};

// With hooks whose weights share one buffer (and their gradients another), the loss and every
// gradient are the bits of the model without hooks, with and without checkpointing; each gradient
// is finished once per block_backward.
TEST(GptCpu, BlockHooksLetWeightsShareOneBuffer) {
  GptConfig c{.vocab = 97, .seq = 48, .d_model = 64, .heads = 4, .layers = 3};
  const int B = 2, T = 40;
  Model base(c);
  base.randomize(7, 0.2f);
  const auto tokens = random_ids(B * T, c.vocab, 3), targets = random_ids(B * T, c.vocab, 4);
  const size_t nd = static_cast<size_t>(B) * T * c.d_model;
  auto run = [&](bool hooked, bool ckpt, std::vector<int>* done) {
    Model m = base;
    for (size_t i = 0; i < m.p.size(); ++i)
      for (size_t j = 0; j < m.p[i].size(); ++j) m.pp[i][j] = m.p[i][j].data(), m.gp[i][j] = m.g[i][j].data();
    SharedWeights h;
    h.w.assign(static_cast<size_t>(4) * c.d_model * c.d_model, 0.0f);
    h.gw = h.w;
    auto made = GptCpu::create(c, B, T, 2, ckpt);
    EXPECT_OK(made);
    GptCpu& gpt = *made.value();
    auto block = [&](int l) {
      const size_t mi = 1 + static_cast<size_t>(l);
      std::vector<const float*> pp = m.pp[mi];
      std::vector<float*> gp = m.gp[mi];
      if (hooked) {
        h.params = &m.p[mi];
        h.grads = &m.g[mi];
        for (size_t i = 0; i < pp.size(); ++i)
          if (SharedWeights::weight(i)) pp[i] = h.w.data(), gp[i] = h.gw.data();
      }
      return std::make_pair(pp, gp);
    };
    gpt.set_block_hooks(hooked ? &h : nullptr);
    std::vector<std::vector<float>> kept(static_cast<size_t>(c.layers));
    gpt.embed_forward(tokens.data(), m.pp[0].data());
    for (int l = 0; l < c.layers; ++l) {
      if (ckpt) kept[static_cast<size_t>(l)].assign(gpt.checkpoint_input(l), gpt.checkpoint_input(l) + nd);
      gpt.block_forward(l, block(l).first.data());
    }
    const float loss = gpt.head_forward(m.pp.back().data(), m.pp[0].data(), targets.data());
    gpt.head_backward(m.pp.back().data(), m.pp[0].data(), m.gp.back().data(), m.gp[0].data());
    for (int l = c.layers - 1; l >= 0; --l) {
      if (ckpt)
        std::copy(kept[static_cast<size_t>(l)].begin(), kept[static_cast<size_t>(l)].end(),
                  gpt.checkpoint_input(l));
      auto [pp, gp] = block(l);
      gpt.block_backward(l, pp.data(), gp.data());
    }
    gpt.embed_backward(m.gp[0].data());
    if (done) *done = h.done;
    return std::make_pair(loss, m.g);
  };
  const auto [ref_loss, ref_grads] = run(false, false, nullptr);
  for (bool ckpt : {false, true}) {
    std::vector<int> done;
    const auto [loss, grads] = run(true, ckpt, &done);
    EXPECT_EQ(std::memcmp(&loss, &ref_loss, sizeof(float)), 0) << "checkpointing " << ckpt;
    for (size_t i = 0; i < grads.size(); ++i)
      for (size_t j = 0; j < grads[i].size(); ++j)
        EXPECT_EQ(std::memcmp(grads[i][j].data(), ref_grads[i][j].data(), grads[i][j].size() * sizeof(float)),
                  0)
            << "checkpointing " << ckpt << ": gradient " << i << "." << j << " differs with shared weights";
    EXPECT_EQ(done, std::vector<int>(kBlockParams, c.layers)) << "checkpointing " << ckpt;
  }
}

// With checkpointing, the block inputs are asked for in order, and a backward without its input
// given back aborts (it would recompute from whatever the buffer holds).
TEST(GptCpuDeathTest, CheckpointingOrder) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  GptConfig c{.vocab = 16, .seq = 4, .d_model = 8, .heads = 2, .layers = 2};
  Model m(c);
  m.init(1);
  std::vector<int32_t> ids(4, 1);
  auto plain = make_gpt(c, 1, 4, 1);
  ASSERT_TRUE(plain);
  EXPECT_DEATH(plain->checkpoint_input(0), "created without checkpointing");
  auto made = GptCpu::create(c, 1, 4, 1, true);
  ASSERT_OK(made);
  GptCpu& gpt = *made.value();
  EXPECT_DEATH(gpt.checkpoint_input(0), "before its block_forward or block_backward");
  m.forward(gpt, ids.data(), ids.data());
  gpt.head_backward(m.pp[3].data(), m.pp[0].data(), m.gp[3].data(), m.gp[0].data());
  EXPECT_DEATH(gpt.checkpoint_input(0), "checkpoint_input\\(0\\): expected layer 1");
  EXPECT_DEATH(gpt.block_backward(1, m.pp[2].data(), m.gp[2].data()), "checkpoint_input\\(1\\) first");
}

// At init the logits are nearly uniform: the loss is close to ln(vocab).
TEST(GptCpu, InitialLossIsLogVocab) {
  GptConfig c{.vocab = 256, .seq = 32, .d_model = 64, .heads = 4, .layers = 2};
  const int B = 4, T = 32;
  Model m(c);
  m.init(1);
  auto tokens = random_ids(B * T, c.vocab, 3);
  auto targets = random_ids(B * T, c.vocab, 4);
  auto gpt = make_gpt(c, B, T, 2);
  ASSERT_TRUE(gpt);
  const float loss = m.forward(*gpt, tokens.data(), targets.data());
  EXPECT_NEAR(loss, std::log(256.0), 0.05) << loss;
}

// The size of a small real run: d 256, 6 layers, 8 x 64 tokens, on every thread. Prints the time
// of one forward + backward (the target is < 1 s; not asserted: sanitizer builds and shared
// machines). Asserted: the timed passes are repeatable, each one's loss and every gradient bit
// for bit the first one's (the threads split the work the same way every time).
TEST(GptCpu, TimingD256L6) {
  GptConfig c{.vocab = 256, .seq = 64, .d_model = 256, .heads = 4, .layers = 6};
  const int B = 8, T = 64;
  Model m(c);
  m.init(1);
  auto tokens = random_ids(B * T, c.vocab, 3);
  auto targets = random_ids(B * T, c.vocab, 4);
  auto gpt = make_gpt(c, B, T, 0);
  ASSERT_TRUE(gpt);
  double best = 1e9;
  float first_loss = 0;
  std::vector<std::vector<std::vector<float>>> first_grads;
  for (int rep = 0; rep < 3; ++rep) {
    m.zero_grads();
    const auto t0 = std::chrono::steady_clock::now();
    const float loss = m.forward(*gpt, tokens.data(), targets.data());
    m.backward(*gpt);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    ASSERT_TRUE(std::isfinite(loss));
    if (rep == 0) {
      first_loss = loss;
      first_grads = m.g;
      continue;
    }
    EXPECT_EQ(std::memcmp(&loss, &first_loss, sizeof loss), 0)
        << "pass " << rep << ": " << loss << " vs " << first_loss;
    for (size_t k = 0; k < m.g.size(); ++k) {
      for (size_t i = 0; i < m.g[k].size(); ++i) {
        const auto& got = m.g[k][i];
        const auto& want = first_grads[k][i];
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
            << "pass " << rep << ": gradient of module " << k << " tensor " << i << " differs";
      }
    }
  }
  const double flops = 6.0 * static_cast<double>(c.num_params()) * B * T;  // ignoring attention
  std::printf(
      "d=256 L=6 B=8 T=64, %d threads: forward+backward %.1f ms (%.1f GFLOP/s of 6*N*tokens), "
      "activations %.1f MiB\n",
      gpt->threads(), best * 1e3, flops / best * 1e-9, gpt->activation_bytes() / 1048576.0);
}

}  // namespace
}  // namespace zoe::model
