// Fused Lion and Adagrad: every SIMD path x grad dtype x state dtype x output dtype against the
// plain reference, with no tolerance: the kernels and the reference compute the same fp32
// operations in the same order without FMA, so every path (scalar, AVX2, AVX-512), every thread
// count and the reference store the same bits. Hand-computed values pin the formulas themselves.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "optim/lion_adagrad.h"
#include "optim/lion_adagrad_reference.h"
#include "optim_test_util.h"
#include "tests/util/status_test_util.h"

namespace zoe::optim::test {
namespace {

enum class Opt { kLion, kAdagrad };
const char* opt_name(Opt o) { return o == Opt::kLion ? "lion" : "adagrad"; }

struct Data {
  Buf p, g, s, out;
};

// Parameters in [-1, 1]; gradients N(0, 1) with every 7th x30 and a few exact zeros; the state
// N(0, 1e-2) for Lion's m, |N(0, 1)| for Adagrad's sum, zero at element 3 (untouched).
Data make_data(Opt o, size_t n, DType gd, DType sd, size_t offset, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> up(-1.0f, 1.0f);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Data d{Buf(DType::kF32, n, offset), Buf(gd, n, offset), Buf(sd, n, offset), Buf(DType::kBF16, n, offset)};
  for (size_t i = 0; i < n; ++i) {
    d.p.set(i, up(rng));
    float s = o == Opt::kLion ? nd(rng) * 1e-2f : std::fabs(nd(rng));
    d.s.set(i, i == 3 ? 0.0f : s);
  }
  return d;
}

void new_grads(Data& d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (size_t i = 0; i < d.g.size(); ++i) {
    float g = nd(rng) * (i % 7 == 0 ? 30.0f : 1.0f);
    d.g.set(i, i == 3 || i % 101 == 5 ? 0.0f : g);
  }
}

// out: 0 none, 1 fp16, 2 bf16. state: 0 fp32, 2 bf16 RNE, 3 bf16 stochastic.
OneStateBuffers buffers(Data& d, int out) {
  OneStateBuffers b;
  b.n = d.p.size();
  b.param = d.p.f32();
  b.grad = d.g.data();
  b.grad_dtype = d.g.dtype();
  b.state = d.s.data();
  b.state_dtype = d.s.dtype();
  b.param_out = out ? d.out.data() : nullptr;
  b.param_out_dtype = out == 1 ? DType::kF16 : DType::kBF16;
  b.index_base = 4096;
  return b;
}

LionParams lion_params(bool sr) {
  LionParams p;
  p.lr = 1e-3f;
  p.beta1 = 0.9f;
  p.beta2 = 0.99f;
  p.weight_decay = 0.1f;
  p.stochastic_rounding = sr;
  p.sr_seed = 77;
  return p;
}

AdagradParams adagrad_params(bool sr, float wd) {
  AdagradParams p;
  p.lr = 1e-2f;
  p.eps = 1e-10f;
  p.weight_decay = wd;
  p.stochastic_rounding = sr;
  p.sr_seed = 77;
  return p;
}

// One step of optimizer o: on `exec`, or through the reference when exec is null.
Status step(Opt o, Data& d, int out, bool sr, float wd, int64_t t, const Exec* exec) {
  const AdamStep st{t, 1.0f / 1024.0f};
  if (o == Opt::kLion) {
    LionArgs a{buffers(d, out), lion_params(sr), st};
    a.params.weight_decay = wd;
    return exec ? lion_step(a, *exec) : ref::lion_step(a);
  }
  AdagradArgs a{buffers(d, out), adagrad_params(sr, wd), st};
  return exec ? adagrad_step(a, *exec) : ref::adagrad_step(a);
}

bool same(const Data& a, const Data& b) {
  return a.p.same_bytes(b.p) && a.s.same_bytes(b.s) && a.out.same_bytes(b.out);
}

std::vector<const Path*> paths_here() {
  std::vector<const Path*> out;
  for (const Path& p : all_paths()) {
    if (path_unavailable(p).empty() && !p.hw_bf16) out.push_back(&p);
  }
  return out;
}

// Grad dtypes with fp16-representable values (fp16 gradients are rounded from the same draws).
const DType kGradDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};

}  // namespace

// Every path, on the calling thread and on 2 threads, with and without streaming stores of
// param_out, gives the reference's bits: both optimizers x grad dtype x state (fp32, bf16 RNE,
// bf16 stochastic) x param_out (none, fp16, bf16) x weight decay on/off, three steps, a ragged
// multi-chunk size at an aligned and a misaligned offset.
TEST(LionAdagrad, EveryPathGivesTheReferenceBits) {
  const size_t n = 2 * kChunkElems + 1000 + 37;
  auto pool = CpuPool::create({2, -1, CpuPool::Backend::kAuto}).value();
  int combos = 0;
  for (Opt o : {Opt::kLion, Opt::kAdagrad}) {
    for (DType gd : kGradDtypes) {
      for (int state : {0, 2, 3}) {
        for (int out : {0, 1, 2}) {
          for (float wd : {0.0f, 0.1f}) {
            const DType sd = state == 0 ? DType::kF32 : DType::kBF16;
            const bool sr = state == 3;
            const size_t off = combos % 2;
            SCOPED_TRACE(::testing::Message()
                         << opt_name(o) << " grad " << dtype_name(gd) << " state " << state << " out " << out
                         << " wd " << wd << " offset " << off);
            Data want = make_data(o, n, gd, sd, off, 1);
            for (int t = 1; t <= 3; ++t) {
              new_grads(want, 100 + t);
              ASSERT_OK(step(o, want, out, sr, wd, t, nullptr));
            }
            for (const Path* path : paths_here()) {
              for (CpuPool* pl : {static_cast<CpuPool*>(nullptr), pool.get()}) {
                Data got = make_data(o, n, gd, sd, off, 1);
                const Exec e = exec_for(*path, pl, pl != nullptr);  // streaming stores with the pool
                for (int t = 1; t <= 3; ++t) {
                  new_grads(got, 100 + t);
                  ASSERT_OK(step(o, got, out, sr, wd, t, &e));
                }
                EXPECT_TRUE(same(got, want)) << path->name << (pl ? " with 2 threads" : "");
              }
            }
            ++combos;
          }
        }
      }
    }
  }
  EXPECT_EQ(combos, 2 * 3 * 3 * 3 * 2);
}

// The same bits whatever the thread count (1, 2, 3) and pool backend, on the default path.
TEST(LionAdagrad, DeterministicAcrossThreads) {
  const size_t n = 1000003;
  std::vector<std::unique_ptr<CpuPool>> pools;
  pools.push_back(nullptr);
  for (auto be : {CpuPool::Backend::kAuto, CpuPool::Backend::kStdThread}) {
    for (int t : {1, 2, 3}) pools.push_back(CpuPool::create({t, -1, be}).value());
  }
  for (Opt o : {Opt::kLion, Opt::kAdagrad}) {
    std::vector<Data> results;
    for (auto& pool : pools) {
      Data d = make_data(o, n, DType::kBF16, DType::kBF16, 0, 11);
      new_grads(d, 12);
      const Exec e{pool.get(), std::nullopt, true, std::nullopt};
      ASSERT_OK(step(o, d, 2, true, 0.1f, 5, &e));
      results.push_back(std::move(d));
    }
    for (size_t i = 1; i < results.size(); ++i) {
      EXPECT_TRUE(same(results[i], results[0])) << opt_name(o) << " pool " << i;
    }
  }
}

// Lion by hand, with dyadic constants so every value is exact: lr 1/8, betas (1/2, 3/4),
// weight_decay 1/2 (decay 1 - 1/16 = 15/16), grad_scale 1/4.
//   e0: p 1,  m 0,  g 8 (2 scaled):  c = 1     -> p = 15/16 - 1/8 = 13/16, m = 1/4*2 = 1/2
//   e1: p 1,  m 0,  g 0:             c = 0     -> p = 15/16 (sign(0) = 0: no step), m = 0
//   e2: p -2, m 1,  g -16 (-4):      c = 1/2 - 2 = -3/2 -> p = -15/8 + 1/8 = -7/4,
//                                    m = 3/4 - 1 = -1/4
//   e3: p 4,  m -2, g 4 (1):         c = -1 + 1/2 = -1/2 -> p = 15/4 + 1/8 = 31/8,
//                                    m = -3/2 + 1/4 = -5/4
TEST(Lion, HandComputedValues) {
  for (const Path* path : paths_here()) {
    SCOPED_TRACE(path->name);
    std::vector<float> p = {1, 1, -2, 4}, m = {0, 0, 1, -2}, g = {8, 0, -16, 4};
    std::vector<uint16_t> out(4);
    LionArgs a;
    a.buf = {4, p.data(), g.data(), DType::kF32, m.data(), DType::kF32, out.data(), DType::kBF16, 0};
    a.params.lr = 0.125f;
    a.params.beta1 = 0.5f;
    a.params.beta2 = 0.75f;
    a.params.weight_decay = 0.5f;
    a.step = {1, 0.25f};
    ASSERT_OK(lion_step(a, exec_for(*path)));
    EXPECT_EQ(p, (std::vector<float>{13.0f / 16, 15.0f / 16, -7.0f / 4, 31.0f / 8}));
    EXPECT_EQ(m, (std::vector<float>{0.5f, 0.0f, -0.25f, -1.25f}));
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(out[i], f32_to_bf16(p[i])) << i;
  }
}

// Adagrad by hand: lr 1/2, eps 1, grad_scale 1.
//   e0: p 1, sum 16, g 3:   sum 25, p = 1 - (3/2) / (5 + 1) = 3/4
//   e1: p 0, sum 0,  g 0:   sum 0,  p = 0 - 0 / (0 + 1) = 0 (an untouched element stays put)
//   e2: p 2, sum 5,  g -2:  sum 9,  p = 2 - (-1) / (3 + 1) = 9/4
// and with weight_decay 1/2 (L2: g += p/2):
//   e0: p 2, sum 0, g 1:    g = 2, sum 4, p = 2 - 1 / (2 + 1) = 5/3 (in float: 2 - float(1/3))
TEST(Adagrad, HandComputedValues) {
  for (const Path* path : paths_here()) {
    SCOPED_TRACE(path->name);
    std::vector<float> p = {1, 0, 2}, s = {16, 0, 5}, g = {3, 0, -2};
    AdagradArgs a;
    a.buf = {3, p.data(), g.data(), DType::kF32, s.data(), DType::kF32, nullptr, DType::kBF16, 0};
    a.params.lr = 0.5f;
    a.params.eps = 1.0f;
    a.step = {1, 1.0f};
    ASSERT_OK(adagrad_step(a, exec_for(*path)));
    EXPECT_EQ(p, (std::vector<float>{0.75f, 0.0f, 2.25f}));
    EXPECT_EQ(s, (std::vector<float>{25.0f, 0.0f, 9.0f}));

    std::vector<float> p2 = {2}, s2 = {0}, g2 = {1};
    a.buf = {1, p2.data(), g2.data(), DType::kF32, s2.data(), DType::kF32, nullptr, DType::kBF16, 0};
    a.params.weight_decay = 0.5f;
    ASSERT_OK(adagrad_step(a, exec_for(*path)));
    EXPECT_EQ(s2[0], 4.0f);
    EXPECT_EQ(p2[0], 2.0f - 1.0f / 3.0f);
  }
}

// The references against the textbook formulas in double precision over 20 steps (DeepSpeed's
// default betas and eps, with weight decay): the float arithmetic stays within 1e-5 relative.
TEST(LionAdagradReference, MatchesDoublePrecisionTextbook) {
  const size_t n = 257;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> p(n), q(n), g(n), m(n, 0.0f), s(n, 0.0f);
  for (size_t i = 0; i < n; ++i) p[i] = q[i] = nd(rng);
  std::vector<double> pd(p.begin(), p.end()), qd(q.begin(), q.end()), md(n, 0.0), sd(n, 0.0);
  LionParams lp;
  lp.lr = 1e-2f;
  lp.weight_decay = 0.1f;
  AdagradParams ap;
  ap.weight_decay = 0.1f;
  for (int t = 1; t <= 20; ++t) {
    for (auto& x : g) x = nd(rng);
    ASSERT_OK(ref::lion_step({{n, p.data(), g.data(), DType::kF32, m.data(), DType::kF32}, lp, {t, 0.5f}}));
    ASSERT_OK(
        ref::adagrad_step({{n, q.data(), g.data(), DType::kF32, s.data(), DType::kF32}, ap, {t, 0.5f}}));
    for (size_t i = 0; i < n; ++i) {
      const double gi = 0.5 * g[i];
      const double c = double(lp.beta1) * md[i] + (1 - double(lp.beta1)) * gi;
      pd[i] = pd[i] * (1 - double(lp.lr) * lp.weight_decay) - lp.lr * (c > 0 ? 1 : c < 0 ? -1 : 0);
      md[i] = double(lp.beta2) * md[i] + (1 - double(lp.beta2)) * gi;
      const double ga = gi + double(ap.weight_decay) * qd[i];
      sd[i] += ga * ga;
      qd[i] -= ap.lr * ga / (std::sqrt(sd[i]) + ap.eps);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(p[i], pd[i], 1e-5 * (1 + std::fabs(pd[i]))) << "lion index " << i;
    ASSERT_NEAR(m[i], md[i], 1e-5 * (1 + std::fabs(md[i]))) << "lion m index " << i;
    ASSERT_NEAR(q[i], qd[i], 1e-5 * (1 + std::fabs(qd[i]))) << "adagrad index " << i;
    ASSERT_NEAR(s[i], sd[i], 1e-5 * (1 + std::fabs(sd[i]))) << "adagrad sum index " << i;
  }
}

// A NaN or inf gradient makes Lion's parameter NaN (the overflow shows) on every path.
TEST(Lion, NonFiniteMomentumMakesTheParameterNaN) {
  for (const Path* path : paths_here()) {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> p = {1, 1, 1}, m = {0, 0, 0}, g = {nan, inf, 1};
    LionArgs a;
    a.buf = {3, p.data(), g.data(), DType::kF32, m.data(), DType::kF32};
    ASSERT_OK(lion_step(a, exec_for(*path)));
    EXPECT_TRUE(std::isnan(p[0])) << path->name;
    EXPECT_TRUE(std::isnan(p[1])) << path->name;
    EXPECT_EQ(p[2], 1.0f - a.params.lr) << path->name;
  }
}

// Defaults are DeepSpeed's (DeepSpeedCPULion, DeepSpeedCPUAdagrad).
TEST(LionAdagrad, DefaultsAreDeepSpeeds) {
  LionParams l;
  EXPECT_EQ(l.lr, 1e-3f);
  EXPECT_EQ(l.beta1, 0.9f);
  EXPECT_EQ(l.beta2, 0.999f);
  EXPECT_EQ(l.weight_decay, 0.0f);
  AdagradParams a;
  EXPECT_EQ(a.lr, 1e-2f);
  EXPECT_EQ(a.eps, 1e-10f);
  EXPECT_EQ(a.weight_decay, 0.0f);
}

// Bad arguments are errors whose message names the hyperparameter or buffer.
TEST(LionAdagrad, RejectsBadArguments) {
  float p = 0, g = 0, s = 0;
  auto expect_invalid = [](const Status& st, const char* word) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find(word), std::string::npos) << st.message();
  };
  LionArgs l;
  l.buf = {1, &p, &g, DType::kF32, &s, DType::kF32};
  EXPECT_OK(lion_step(l));
  l.params.beta1 = 1.0f;
  expect_invalid(lion_step(l), "betas");
  l.params.beta1 = 0.9f;
  l.params.lr = -1.0f;
  expect_invalid(lion_step(l), "lr");
  l.params.lr = 1e-3f;
  l.params.weight_decay = NAN;
  expect_invalid(lion_step(l), "weight_decay");
  l.params.weight_decay = 0.0f;
  l.step.step = 0;
  expect_invalid(lion_step(l), "step");
  l.step.step = 1;
  l.buf.index_base = 8;
  expect_invalid(lion_step(l), "index_base");
  l.buf.index_base = 0;
  l.buf.state_dtype = DType::kF16;
  expect_invalid(lion_step(l), "state dtype");
  l.buf.state_dtype = DType::kF32;
  l.buf.param_out = &s;
  l.buf.param_out_dtype = DType::kF32;
  expect_invalid(lion_step(l), "param_out");

  AdagradArgs a;
  a.buf = {1, &p, &g, DType::kF32, &s, DType::kF32};
  EXPECT_OK(adagrad_step(a));
  a.params.eps = 0.0f;
  expect_invalid(adagrad_step(a), "eps");
  a.params.eps = 1e-10f;
  a.step.grad_scale = INFINITY;
  expect_invalid(adagrad_step(a), "grad_scale");
  a.step.grad_scale = 1.0f;
  a.buf.grad = nullptr;
  expect_invalid(adagrad_step(a), "grad");
}

// The yardstick streams the step's buffers without changing p, g or the state.
TEST(LionAdagrad, RooflineLeavesValuesAlone) {
  const size_t n = kChunkElems + 77;
  for (const Path* path : paths_here()) {
    Data d = make_data(Opt::kLion, n, DType::kBF16, DType::kF32, 0, 5),
         before = make_data(Opt::kLion, n, DType::kBF16, DType::kF32, 0, 5);
    new_grads(d, 6);
    new_grads(before, 6);
    ASSERT_OK(one_state_roofline_pass(buffers(d, 2), exec_for(*path)));
    EXPECT_TRUE(d.p.same_bytes(before.p) && d.g.same_bytes(before.g) && d.s.same_bytes(before.s))
        << path->name;
  }
}

}  // namespace zoe::optim::test
