// The GPU optimizer kernels (optim/adam_cuda.h) against the CPU reference (optim/adam_reference.h).
//
// Tolerances (GPU vs reference, same inputs, one step):
//   fp32 p, m, v: within 4 ulp of the reference's value (the GPU does the reference's operations
//     in the same order, each correctly rounded, so the bits are expected to be identical; the
//     tests print how many are not).
//   bf16 m/v (RNE or stochastic) and bf16/fp16 param_out: within 1 ulp of the reference's, and
//     param_out exactly the RNE conversion of the GPU's own fp32 p.
//   conversions: identical bytes for every bit pattern (NaN, inf, subnormals included).
//   norms: within 1e-12 relative of the CPU's sums (different summation order, both in double);
//     bit-identical between two GPU runs.
// Every test that needs a GPU skips (GTEST_SKIP) when cudaGetDeviceCount fails or finds none.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "optim/adam.h"
#include "optim/adam_cuda.h"
#include "optim/adam_reference.h"
#include "optim_test_util.h"
#include "tests/util/gpu_test_util.h"
#include "tests/util/status_test_util.h"

namespace zoe::optim::test {
namespace {

#define ZOE_ASSERT_CUDA(call)                                                                             \
  do {                                                                                                    \
    cudaError_t e_ = (call);                                                                              \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorName(e_) << " (" << cudaGetErrorString(e_) \
                               << ")";                                                                    \
  } while (0)

// n elements of `dtype` in device memory, `offset` elements past a cudaMalloc'd (256-byte aligned)
// base, with copies to and from a host Buf of the same shape.
class DevBuf {
 public:
  DevBuf(DType dtype, size_t n, size_t offset = 0) : dtype_(dtype), n_(n), off_(offset) {
    const size_t bytes = (n + offset) * dtype_size(dtype) + 64;
    cudaError_t e = cudaMalloc(&base_, bytes);
    EXPECT_EQ(e, cudaSuccess) << "cudaMalloc " << bytes << " bytes: " << cudaGetErrorString(e);
    if (e != cudaSuccess) base_ = nullptr;
  }
  ~DevBuf() {
    if (base_ != nullptr) (void)cudaFree(base_);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;

  void* data() const { return static_cast<unsigned char*>(base_) + off_ * dtype_size(dtype_); }
  float* f32() const { return static_cast<float*>(data()); }
  size_t bytes() const { return n_ * dtype_size(dtype_); }
  bool ok() const { return base_ != nullptr; }
  // Waits for the device too: a copy from pageable memory may still be in flight when cudaMemcpy returns.
  cudaError_t upload(const Buf& h) const {
    cudaError_t e = cudaMemcpy(data(), h.data(), bytes(), cudaMemcpyHostToDevice);
    return e != cudaSuccess ? e : cudaDeviceSynchronize();
  }
  cudaError_t download(Buf& h) const { return cudaMemcpy(h.data(), data(), bytes(), cudaMemcpyDeviceToHost); }

 private:
  DType dtype_;
  size_t n_, off_;
  void* base_ = nullptr;
};

// A stream for the test, destroyed at the end.
class StreamHolder {
 public:
  StreamHolder() {
    if (cudaStreamCreate(&s_) != cudaSuccess) s_ = nullptr;
  }
  ~StreamHolder() {
    if (s_ != nullptr) (void)cudaStreamDestroy(s_);
  }
  void* get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// fp32 values within `ulps` units in the last place of `want` (NaN matches NaN).
auto ulp_bound(const float* want, double ulps) {
  return [want, ulps](size_t i) {
    const float w = want[i];
    const float up = std::nextafter(std::fabs(w), std::numeric_limits<float>::infinity());
    return ulps * (static_cast<double>(up) - std::fabs(static_cast<double>(w)));
  };
}

size_t count_not_identical(const Buf& a, const Buf& b) {
  const size_t es = dtype_size(a.dtype());
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(static_cast<const unsigned char*>(a.data()) + i * es,
                    static_cast<const unsigned char*>(b.data()) + i * es, es) != 0)
      ++bad;
  return bad;
}

::testing::AssertionResult near_rel(const char* what, double got, double want, double rel) {
  if (got == want || std::fabs(got - want) <= rel * std::fabs(want)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": got " << got << " want " << want << " (relative difference "
         << std::fabs(got - want) / std::fabs(want) << ", bound " << rel << ")";
}

// ---- Adam ------------------------------------------------------------------------------------

struct Data {
  Buf p, g, m, v, out;
};

Data make_data(size_t n, DType gd, DType sd, DType od, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> up(-1.0f, 1.0f), uv(0.0f, 1e-4f);
  std::normal_distribution<float> ng(0.0f, 1.0f), nm(0.0f, 1e-2f);
  Data d{Buf(DType::kF32, n), Buf(gd, n), Buf(sd, n), Buf(sd, n), Buf(od, n)};
  for (size_t i = 0; i < n; ++i) {
    d.p.set(i, up(rng));
    d.g.set(i, i % 97 == 5 ? 0.0f : ng(rng) * 10.0f);  // loss-scaled (scale 1/1024 below); some zeros
    d.m.set(i, nm(rng));
    d.v.set(i, uv(rng));
  }
  return d;
}

AdamParams params_for(bool adamw, bool sr) {
  AdamParams p;
  p.lr = 1e-3f;
  p.beta1 = 0.9f;
  p.beta2 = 0.999f;
  p.eps = 1e-8f;
  p.weight_decay = 0.01f;
  p.adamw = adamw;
  p.stochastic_rounding = sr;
  p.sr_seed = 1234;
  return p;
}

using Combo = std::tuple<DType, int, int>;  // grad dtype, state (0 fp32, 2 bf16, 3 bf16 stochastic), out (0
                                            // none, 1 fp16, 2 bf16)

class AdamCuda : public ::testing::TestWithParam<Combo> {};

TEST_P(AdamCuda, MatchesReference) {
  ZOE_SKIP_WITHOUT_GPU();
  auto [gd, st, out] = GetParam();
  const DType sd = st == 0 ? DType::kF32 : DType::kBF16;
  const DType od = out == 1 ? DType::kF16 : DType::kBF16;
  struct Case {
    size_t n, offset;
    int64_t step;
    bool adamw;
  };
  const Case cases[] = {{0, 0, 1, true},   {1, 1, 1000000, false}, {17, 1, 1, true},
                        {17, 0, 3, false}, {1000003, 0, 1, true},  {1000003, 1, 1000000, false}};
  StreamHolder stream;
  ASSERT_NE(stream.get(), nullptr);
  uint32_t seed = 100;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "n=" << c.n << " offset=" << c.offset << " step=" << c.step
                                      << (c.adamw ? " adamw" : " adam-l2"));
    Data ref = make_data(c.n, gd, sd, od, seed);
    Data gpu = make_data(c.n, gd, sd, od, seed);
    ++seed;
    DevBuf dp(DType::kF32, c.n, c.offset), dg(gd, c.n, c.offset), dm(sd, c.n, c.offset),
        dv(sd, c.n, c.offset), dout(od, c.n, c.offset);
    ASSERT_TRUE(dp.ok() && dg.ok() && dm.ok() && dv.ok() && dout.ok());
    ZOE_ASSERT_CUDA(dp.upload(gpu.p));
    ZOE_ASSERT_CUDA(dg.upload(gpu.g));
    ZOE_ASSERT_CUDA(dm.upload(gpu.m));
    ZOE_ASSERT_CUDA(dv.upload(gpu.v));

    AdamArgs a;
    a.params = params_for(c.adamw, st == 3);
    a.step.step = c.step;
    a.step.grad_scale = 1.0f / 1024.0f;
    a.buf.n = c.n;
    a.buf.grad_dtype = gd;
    a.buf.state_dtype = sd;
    a.buf.param_out_dtype = od;
    AdamArgs ad = a, ar = a;
    ad.buf.param = dp.f32(), ad.buf.grad = dg.data(), ad.buf.exp_avg = dm.data(),
    ad.buf.exp_avg_sq = dv.data();
    ad.buf.param_out = out ? dout.data() : nullptr;
    ar.buf.param = ref.p.f32(), ar.buf.grad = ref.g.data(), ar.buf.exp_avg = ref.m.data(),
    ar.buf.exp_avg_sq = ref.v.data();
    ar.buf.param_out = out ? ref.out.data() : nullptr;

    Status s = cuda::adam_step(ad, stream.get());
    ASSERT_OK(s);
    ZOE_ASSERT_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.get())));
    ASSERT_OK(ref::adam_step(ar));
    ZOE_ASSERT_CUDA(dp.download(gpu.p));
    ZOE_ASSERT_CUDA(dm.download(gpu.m));
    ZOE_ASSERT_CUDA(dv.download(gpu.v));
    if (out) ZOE_ASSERT_CUDA(dout.download(gpu.out));

    EXPECT_TRUE(near_f32("param", gpu.p.f32(), ref.p.f32(), c.n, ulp_bound(ref.p.f32(), 4)));
    if (sd == DType::kF32) {
      EXPECT_TRUE(near_f32("exp_avg", gpu.m.f32(), ref.m.f32(), c.n, ulp_bound(ref.m.f32(), 4)));
      EXPECT_TRUE(near_f32("exp_avg_sq", gpu.v.f32(), ref.v.f32(), c.n, ulp_bound(ref.v.f32(), 4)));
    } else {
      EXPECT_TRUE(near_half("exp_avg", gpu.m.u16(), ref.m.u16(), c.n, sd, 1));
      EXPECT_TRUE(near_half("exp_avg_sq", gpu.v.u16(), ref.v.u16(), c.n, sd, 1));
    }
    if (out) {
      EXPECT_TRUE(near_half("param_out", gpu.out.u16(), ref.out.u16(), c.n, od, 1));
      std::vector<uint16_t> own(c.n);
      for (size_t i = 0; i < c.n; ++i)
        own[i] = od == DType::kF16 ? f32_to_f16(gpu.p.f32()[i]) : f32_to_bf16(gpu.p.f32()[i]);
      EXPECT_TRUE(near_half("param_out vs own p", gpu.out.u16(), own.data(), c.n, od, 0));
    }
    const size_t np = count_not_identical(gpu.p, ref.p), nm = count_not_identical(gpu.m, ref.m),
                 nv = count_not_identical(gpu.v, ref.v);
    if (np + nm + nv != 0)
      std::printf("  note: n=%zu: %zu p, %zu m, %zu v elements not bit-identical to the reference\n", c.n, np,
                  nm, nv);
  }
}

std::string combo_name(const ::testing::TestParamInfo<Combo>& info) {
  auto [gd, st, out] = info.param;
  static const char* outs[] = {"none", "fp16", "bf16"};
  static const char* states[] = {"fp32", "", "bf16", "bf16sr"};
  return std::string("g") + dtype_name(gd) + "_m" + states[st] + "_out" + outs[out];
}

INSTANTIATE_TEST_SUITE_P(All, AdamCuda,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                                            ::testing::Values(0, 2, 3), ::testing::Values(0, 1, 2)),
                         combo_name);

// The legacy default stream (stream = nullptr) works too, and a second step continues from the first.
TEST(AdamCudaStream, DefaultStreamTwoSteps) {
  ZOE_SKIP_WITHOUT_GPU();
  const size_t n = 4099;
  Data ref = make_data(n, DType::kBF16, DType::kF32, DType::kBF16, 7);
  Data gpu = make_data(n, DType::kBF16, DType::kF32, DType::kBF16, 7);
  DevBuf dp(DType::kF32, n), dg(DType::kBF16, n), dm(DType::kF32, n), dv(DType::kF32, n),
      dout(DType::kBF16, n);
  ZOE_ASSERT_CUDA(dp.upload(gpu.p));
  ZOE_ASSERT_CUDA(dg.upload(gpu.g));
  ZOE_ASSERT_CUDA(dm.upload(gpu.m));
  ZOE_ASSERT_CUDA(dv.upload(gpu.v));
  for (int64_t step = 1; step <= 2; ++step) {
    AdamArgs a;
    a.params = params_for(true, false);
    a.step.step = step;
    a.buf = AdamBuffers{n,         dp.f32(),    dg.data(),   DType::kBF16, dm.data(),
                        dv.data(), DType::kF32, dout.data(), DType::kBF16};
    Status s = cuda::adam_step(a, nullptr);
    ASSERT_OK(s);
    a.buf = AdamBuffers{n,           ref.p.f32(),    ref.g.data(), DType::kBF16, ref.m.data(), ref.v.data(),
                        DType::kF32, ref.out.data(), DType::kBF16};
    ASSERT_OK(ref::adam_step(a));
  }
  ZOE_ASSERT_CUDA(cudaDeviceSynchronize());
  ZOE_ASSERT_CUDA(dp.download(gpu.p));
  ZOE_ASSERT_CUDA(dout.download(gpu.out));
  EXPECT_TRUE(near_f32("param", gpu.p.f32(), ref.p.f32(), n, ulp_bound(ref.p.f32(), 8)));
  EXPECT_TRUE(near_half("param_out", gpu.out.u16(), ref.out.u16(), n, DType::kBF16, 1));
}

TEST(AdamCudaErrors, BadArgumentsAreRejectedWithTheReason) {
  ZOE_SKIP_WITHOUT_GPU();
  const size_t n = 64;
  DevBuf dp(DType::kF32, n), dg(DType::kF32, n), dm(DType::kF32, n), dv(DType::kF32, n);
  AdamArgs good;
  good.buf = AdamBuffers{n,         dp.f32(),    dg.data(), DType::kF32, dm.data(),
                         dv.data(), DType::kF32, nullptr,   DType::kBF16};
  ASSERT_OK(cuda::adam_step(good, nullptr));
  ZOE_ASSERT_CUDA(cudaDeviceSynchronize());

  struct Bad {
    AdamArgs a;
    const char* needle;
  };
  std::vector<Bad> bad;
  std::vector<float> host(n);
  Bad b{good, "grad is null"};
  b.a.buf.grad = nullptr;
  bad.push_back(b);
  b = {good, "not memory the GPU can address"};
  b.a.buf.grad = host.data();
  bad.push_back(b);
  b = {good, "not aligned"};
  b.a.buf.param = reinterpret_cast<float*>(static_cast<unsigned char*>(dp.data()) + 2);
  bad.push_back(b);
  b = {good, "m/v dtype fp16 not supported"};
  b.a.buf.state_dtype = DType::kF16;
  bad.push_back(b);
  b = {good, "param_out must be bf16 or fp16"};
  b.a.buf.param_out = dm.data();
  b.a.buf.param_out_dtype = DType::kF32;
  bad.push_back(b);
  b = {good, "eps must be > 0"};
  b.a.params.eps = 0.0f;
  bad.push_back(b);
  for (const Bad& x : bad) {
    Status s = cuda::adam_step(x.a, nullptr);
    ASSERT_FALSE(s.is_ok()) << x.needle;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find(x.needle), std::string::npos) << s.message();
  }
  auto r = cuda::grad_norm_sq(host.data(), DType::kF32, n, nullptr);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("not memory the GPU can address"), std::string::npos)
      << r.status().message();
  auto c = cuda::convert_with_norm(dp.data(), DType::kF32, dp.data(), DType::kF32, n, true, nullptr);
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("must differ"), std::string::npos) << c.status().message();
}

// Runs here too: without a GPU, calls that need one fail with the runtime's reason; calls that do
// not (n = 0, bad hyperparameters) behave as with one.
TEST(AdamCudaErrors, WithoutAGpuCallsSayWhy) {
  if (::zoe::test::gpu_unavailable().empty()) GTEST_SKIP() << "a GPU is present";
  float fake[4] = {};
  auto r = cuda::grad_norm_sq(fake, DType::kF32, 4, nullptr);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("cudaPointerGetAttributes"), std::string::npos)
      << r.status().to_string();
  std::printf("  without a GPU: %s\n", r.status().to_string().c_str());
  auto z = cuda::grad_norm_sq(nullptr, DType::kF32, 0, nullptr);
  ASSERT_OK(z);
  EXPECT_EQ(z->sum_sq, 0.0);
  AdamArgs a;
  EXPECT_OK(cuda::adam_step(a, nullptr));  // n = 0
  a.params.beta1 = 1.0f;
  Status s = cuda::adam_step(a, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
}

// ---- norms, conversion, accumulation ------------------------------------------------------------

// Random values of `dtype` spread over many binades (finite).
Buf random_values(DType dtype, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-12, 12);
  Buf b(dtype, n);
  for (size_t i = 0; i < n; ++i) b.set(i, std::ldexp(nd(rng), ex(rng)));
  return b;
}

// Every bit pattern is possible: NaNs, infinities, subnormals.
Buf random_bits(DType dtype, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  Buf b(dtype, n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t r = rng();
    if (dtype == DType::kF32)
      std::memcpy(b.f32() + i, &r, 4);
    else
      b.u16()[i] = static_cast<uint16_t>(r);
  }
  return b;
}

const size_t kNormSizes[] = {1, 17, 4096, 1000003, 5000011};  // the last one uses the capped grid

class NormCuda : public ::testing::TestWithParam<DType> {};

TEST_P(NormCuda, MatchesCpuAndIsDeterministic) {
  ZOE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  StreamHolder stream;
  auto z = cuda::grad_norm_sq(nullptr, dt, 0, stream.get());
  ASSERT_OK(z);
  EXPECT_EQ(z->sum_sq, 0.0);
  EXPECT_TRUE(z->finite);
  for (size_t n : kNormSizes) {
    SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " n=" << n);
    Buf h = random_values(dt, n, static_cast<uint32_t>(n));
    DevBuf d(dt, n);
    ZOE_ASSERT_CUDA(d.upload(h));
    auto a = cuda::grad_norm_sq(d.data(), dt, n, stream.get());
    auto b = cuda::grad_norm_sq(d.data(), dt, n, stream.get());
    ASSERT_OK(a);
    ASSERT_OK(b);
    EXPECT_EQ(std::memcmp(&a->sum_sq, &b->sum_sq, sizeof(double)), 0) << a->sum_sq << " vs " << b->sum_sq;
    EXPECT_TRUE(a->finite);
    const NormResult want = ref::grad_norm_sq(h.data(), dt, n);
    EXPECT_TRUE(near_rel("norm vs ref::grad_norm_sq", a->sum_sq, want.sum_sq, 1e-12));
    auto cpu = optim::grad_norm_sq(h.data(), dt, n);
    ASSERT_OK(cpu);
    EXPECT_TRUE(near_rel("norm vs grad_norm_sq", a->sum_sq, cpu->sum_sq, 1e-12));
  }
}

TEST_P(NormCuda, InfAndNanAreDetected) {
  ZOE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const size_t n = 1000003;
  const float big = dt == DType::kF16 ? 65504.0f : 3.0e38f;  // the largest finite values square fine
  for (size_t where : {size_t(0), size_t(n / 2), n - 1}) {
    for (int kind = 0; kind < 3; ++kind) {  // 0 large finite, 1 inf, 2 NaN
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " at " << where << " kind " << kind);
      Buf h = random_values(dt, n, 3);
      h.set(where, kind == 0 ? -big : kind == 1 ? -INFINITY : NAN);
      DevBuf d(dt, n);
      ZOE_ASSERT_CUDA(d.upload(h));
      auto r = cuda::grad_norm_sq(d.data(), dt, n, nullptr);
      ASSERT_OK(r);
      EXPECT_EQ(r->finite, kind == 0) << r->sum_sq;
      if (kind == 1) {
        EXPECT_TRUE(std::isinf(r->sum_sq)) << r->sum_sq;
      } else if (kind == 2) {
        EXPECT_TRUE(std::isnan(r->sum_sq)) << r->sum_sq;
      }
      // The fused passes see it too.
      DevBuf acc(DType::kF32, n);
      auto s = cuda::accumulate_with_norm(acc.f32(), d.data(), dt, n, true, nullptr);
      ASSERT_OK(s);
      EXPECT_EQ(s->finite, kind == 0) << s->sum_sq;
      auto c = cuda::convert_with_norm(d.data(), dt, acc.f32(), DType::kF32, n, true, nullptr);
      ASSERT_OK(c);
      EXPECT_EQ(c->finite, kind == 0) << c->sum_sq;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, NormCuda, ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

using ConvertCombo = std::tuple<DType, DType>;
class ConvertCuda : public ::testing::TestWithParam<ConvertCombo> {};

TEST_P(ConvertCuda, SameBytesAsReferenceForEveryBitPattern) {
  ZOE_SKIP_WITHOUT_GPU();
  auto [sd, dd] = GetParam();
  StreamHolder stream;
  for (size_t n : {size_t(1), size_t(17), size_t(1000003)}) {
    for (int pattern = 0; pattern < 2; ++pattern) {  // 0 finite values (norm compared), 1 any bits
      SCOPED_TRACE(::testing::Message() << dtype_name(sd) << "->" << dtype_name(dd) << " n=" << n
                                        << (pattern ? " random bits" : " finite values"));
      Buf src = pattern ? random_bits(sd, n, 5) : random_values(sd, n, 6);
      Buf want(dd, n), got(dd, n);
      const NormResult wn = ref::convert_with_norm(src.data(), sd, want.data(), dd, n);
      DevBuf ds(sd, n, 1), ddst(dd, n, 1);  // one element past an aligned base
      ZOE_ASSERT_CUDA(ds.upload(src));
      auto r = cuda::convert_with_norm(ds.data(), sd, ddst.data(), dd, n, true, stream.get());
      ASSERT_OK(r);
      ZOE_ASSERT_CUDA(ddst.download(got));
      const size_t es = dtype_size(dd);
      size_t bad = 0, first = n;
      for (size_t i = 0; i < n; ++i) {
        if (std::memcmp(static_cast<const unsigned char*>(got.data()) + i * es,
                        static_cast<const unsigned char*>(want.data()) + i * es, es) != 0) {
          if (first == n) first = i;
          ++bad;
        }
      }
      EXPECT_EQ(bad, 0u) << "first at index " << first << ": src " << src.get(first) << " got "
                         << got.get(first) << " want " << want.get(first);
      EXPECT_EQ(r->finite, wn.finite);
      if (wn.finite) {
        EXPECT_TRUE(near_rel("convert norm", r->sum_sq, wn.sum_sq, 1e-12));
      }
      // compute_norm = false: the same bytes, no sum.
      ZOE_ASSERT_CUDA(cudaMemset(ddst.data(), 0, ddst.bytes()));
      auto q = cuda::convert_with_norm(ds.data(), sd, ddst.data(), dd, n, false, stream.get());
      ASSERT_OK(q);
      EXPECT_EQ(q->sum_sq, 0.0);
      Buf got2(dd, n);
      ZOE_ASSERT_CUDA(ddst.download(got2));
      EXPECT_TRUE(got2.same_bytes(got));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, ConvertCuda,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                                            ::testing::Values(DType::kF32, DType::kF16, DType::kBF16)),
                         [](const ::testing::TestParamInfo<ConvertCombo>& i) {
                           return std::string(dtype_name(std::get<0>(i.param))) + "_to_" +
                                  dtype_name(std::get<1>(i.param));
                         });

class AccumulateCuda : public ::testing::TestWithParam<DType> {};

TEST_P(AccumulateCuda, FirstOverwritesThenAdds) {
  ZOE_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  StreamHolder stream;
  for (size_t n : {size_t(1), size_t(17), size_t(1000003)}) {
    SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " n=" << n);
    Buf g1 = random_values(dt, n, 11), g2 = random_values(dt, n, 12);
    DevBuf dacc(DType::kF32, n), dg(dt, n);
    // Garbage (NaN bytes) in acc: `first` must not read it.
    ZOE_ASSERT_CUDA(cudaMemset(dacc.data(), 0xff, dacc.bytes()));
    std::vector<float> want(n);
    Buf got(DType::kF32, n);
    for (int round = 0; round < 2; ++round) {
      const Buf& g = round == 0 ? g1 : g2;
      ZOE_ASSERT_CUDA(dg.upload(g));
      auto r = cuda::accumulate_with_norm(dacc.f32(), dg.data(), dt, n, round == 0, stream.get());
      ASSERT_OK(r);
      double sum = 0.0;
      for (size_t i = 0; i < n; ++i) {
        want[i] = round == 0 ? g.get(i) : want[i] + g.get(i);
        sum += static_cast<double>(want[i]) * want[i];
      }
      ZOE_ASSERT_CUDA(dacc.download(got));
      EXPECT_TRUE(near_f32("acc", got.f32(), want.data(), n, [](size_t) { return 0.0; }))
          << "round " << round;
      EXPECT_TRUE(r->finite);
      EXPECT_TRUE(near_rel("accumulate norm", r->sum_sq, sum, 1e-12)) << "round " << round;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, AccumulateCuda, ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

}  // namespace
}  // namespace zoe::optim::test
