// Low-bit optimizer states and the fused AdamW pass over them (optim/lowbit.h).
//
// The quantizer and the step are checked against a plain scalar reference written here from the
// formats' documented formulas: bytes identical, for random blocks and adversarial ones. Every
// SIMD path gives the same bits as the scalar one. Against AdamW with fp32 states over 10 steps
// the states stay within the bounds the formats allow (stated at CloseToFp32States).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "optim/adam_reference.h"
#include "optim/lowbit.h"
#include "optim_test_util.h"
#include "tests/util/status_test_util.h"

namespace zoe::optim::test {
namespace {

// ---- the plain reference ---------------------------------------------------------------------

struct Fmt {
  size_t block;
  int lm, lv;          // top levels of m and v
  float div_m, div_v;  // L^2 (int8 v: 255^4)
  bool v_fourth_root;  // int8 v
  int bits;
};
Fmt fmt(StateFormat f) {
  if (f == StateFormat::kInt8) return {256, 127, 255, 16129.0f, 4228250625.0f, true, 8};
  return {128, 7, 15, 49.0f, 225.0f, false, 4};
}

// lowbit.h's encoding: t = |m| * (L^2 / scale) (an m scale under 2^-64 scales |m| and the scale by
// 2^64 first), t = sqrt(v) * (L^2 / sqrt(scale)) (int8 v) or sqrt(v) * (L / sqrt(scale)) (int4 v);
// the code is round-half-even(sqrt(t)) (int4 v: of t), clamped to L. With a draw u in [0, 2^16) (the
// fused int4 step's), the code is lo = floor(r) (r = sqrt(t); int4 v: t), or lo + 1 where
// u * (2 lo + 1) < (T - lo^2) * 2^16, T = t for m and t * t for v (lowbit.h).
int encode_ref(float x, float scale, bool is_v, const Fmt& F, int u = -1) {
  const int levels = is_v ? F.lv : F.lm;
  const float L = static_cast<float>(levels);
  float t = 0.0f;
  if (scale > 0.0f && is_v) {
    t = std::sqrt(x) * ((F.v_fourth_root ? L * L : L) / std::sqrt(scale));
  } else if (scale >= 0x1p-64f) {
    t = std::fabs(x) * (L * L / scale);
  } else if (scale > 0.0f) {
    t = (std::fabs(x) * 0x1p64f) * (L * L / (scale * 0x1p64f));
  }
  const float root = is_v && !F.v_fourth_root ? t : std::sqrt(t);
  int c = static_cast<int>(std::nearbyint(root));  // half to even
  if (u >= 0) {
    const float lo = std::floor(root), big_t = is_v ? t * t : t;
    const bool up = static_cast<float>(u) * (lo + lo + 1.0f) < (big_t - lo * lo) * 65536.0f;
    c = static_cast<int>(lo) + (up ? 1 : 0);
  }
  c = std::min(c, levels);
  if (is_v) return x > 0.0f && c == 0 ? 1 : c;
  return x < 0.0f ? -c : c;
}

float decode_ref(int code, float scale, bool is_v, const Fmt& F) {
  const float d = scale / (is_v ? F.div_v : F.div_m);
  const float c = static_cast<float>(code);
  if (!is_v) return (c * std::fabs(c)) * d;
  float t = c * c;
  if (F.v_fourth_root) t = t * t;
  float v = t * d;
  const float tiny = std::numeric_limits<float>::denorm_min();
  return code > 0 && v < tiny ? tiny : v;
}

size_t bytes_ref(const Fmt& F, size_t n) {
  size_t full = n / F.block, r = n % F.block;
  return full * (4 + F.block * F.bits / 8) + (r ? 4 + (r * F.bits + 7) / 8 : 0);
}

int code_at(const std::vector<uint8_t>& s, const Fmt& F, size_t i, bool is_v) {
  const size_t b = i / F.block, e = i % F.block;
  const size_t off = b * (4 + F.block * F.bits / 8) + 4;
  if (F.bits == 8) return is_v ? s[off + e] : static_cast<int8_t>(s[off + e]);
  int nib = (s[off + e / 2] >> (4 * (e % 2))) & 0xf;
  return is_v ? nib : (nib >= 8 ? nib - 16 : nib);
}
float scale_at(const std::vector<uint8_t>& s, const Fmt& F, size_t i) {
  float x;
  std::memcpy(&x, &s[i / F.block * (4 + F.block * F.bits / 8)], 4);
  return x;
}

// draw(i): element i's draw in [0, 2^16), or -1 (round half to even).
std::vector<uint8_t> quantize_ref(const std::vector<float>& x, StateFormat f, bool is_v,
                                  const std::function<int(size_t)>& draw = nullptr) {
  const Fmt F = fmt(f);
  std::vector<uint8_t> out(bytes_ref(F, x.size()), 0);
  for (size_t b0 = 0; b0 < x.size(); b0 += F.block) {
    const size_t b1 = std::min(x.size(), b0 + F.block);
    float scale = 0.0f;
    for (size_t i = b0; i < b1; ++i) scale = std::max(scale, std::fabs(x[i]));
    uint8_t* blk = &out[b0 / F.block * (4 + F.block * F.bits / 8)];
    std::memcpy(blk, &scale, 4);
    for (size_t i = b0; i < b1; ++i) {
      const int c = encode_ref(x[i], scale, is_v, F, draw ? draw(i) : -1);
      const size_t e = i - b0;
      if (F.bits == 8)
        blk[4 + e] = static_cast<uint8_t>(c);
      else
        blk[4 + e / 2] |= static_cast<uint8_t>((c & 0xf) << (4 * (e % 2)));
    }
  }
  return out;
}

std::vector<float> dequantize_ref(const std::vector<uint8_t>& s, StateFormat f, bool is_v, size_t n) {
  const Fmt F = fmt(f);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = decode_ref(code_at(s, F, i, is_v), scale_at(s, F, i), is_v, F);
  return out;
}

// One AdamW step on packed states, element by element (the documented formulas).
struct RefState {
  std::vector<float> p32;     // fp32 master
  std::vector<uint16_t> p16;  // bf16 master
  std::vector<uint8_t> m, v;
};
void step_ref(RefState& s, const std::vector<float>& g, StateFormat f, bool bf16_master, const AdamParams& hp,
              int64_t step, float grad_scale, uint64_t index_base) {
  const size_t n = g.size();
  const AdamConstants c = make_adam_constants(hp, AdamStep{step, grad_scale}).value();
  std::vector<float> m = dequantize_ref(s.m, f, false, n), v = dequantize_ref(s.v, f, true, n);
  for (size_t i = 0; i < n; ++i) {
    float p = bf16_master ? bf16_to_f32(s.p16[i]) : s.p32[i];
    float gi = g[i] * c.grad_scale;
    gi = gi + c.l2 * p;
    m[i] = c.beta1 * m[i] + c.one_minus_beta1 * gi;
    v[i] = c.beta2 * v[i] + c.one_minus_beta2 * gi * gi;
    float denom = std::sqrt(v[i]) * c.inv_sqrt_bc2 + c.eps;
    p = p * c.decay;
    p = p - c.step_size * (m[i] / denom);
    if (bf16_master) {
      uint32_t h = ref::sr_hash(c.sr_seed ^ kMasterSeedSalt, index_base + i);
      s.p16[i] = f32_to_bf16_stochastic(p, static_cast<uint16_t>(h & 0xffff));
    } else {
      s.p32[i] = p;
    }
  }
  // The fused step rounds int4 codes stochastically: element i's hash of the step's seed, its low
  // 16 bits for m, its high 16 for v.
  const bool sr = f == StateFormat::kInt4;
  auto draw = [&](bool hi) -> std::function<int(size_t)> {
    if (!sr) return nullptr;
    return [&, hi](size_t i) {
      const uint32_t h = ref::sr_hash(c.sr_seed, index_base + i);
      return static_cast<int>(hi ? h >> 16 : h & 0xffff);
    };
  };
  s.m = quantize_ref(m, f, false, draw(false));
  s.v = quantize_ref(v, f, true, draw(true));
}

// ---- helpers -----------------------------------------------------------------------------------

std::vector<const Path*> paths_here() {
  std::vector<const Path*> out;
  for (const Path& p : all_paths()) {
    if (path_unavailable(p).empty() && !p.hw_bf16) out.push_back(&p);
  }
  return out;
}

std::vector<float> random_block_values(std::mt19937& rng, size_t n, bool is_v) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ex(-8.0f, 2.0f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    float mag = std::pow(10.0f, ex(rng));  // magnitudes over 10 decades
    x[i] = is_v ? mag * mag * 1e-3f : nd(rng) * mag;
  }
  return x;
}

// Adversarial inputs: each a whole number of blocks plus a ragged tail.
std::vector<std::pair<std::string, std::vector<float>>> adversarial(const Fmt& F, bool is_v) {
  const size_t n = 2 * F.block + 37;
  std::vector<std::pair<std::string, std::vector<float>>> cases;
  cases.push_back({"all zeros", std::vector<float>(n, 0.0f)});
  std::vector<float> outlier(n, is_v ? 1e-6f : -1e-3f);
  outlier[5] = 1e30f;
  outlier[F.block + 7] = is_v ? 3e38f : -3e38f;
  cases.push_back({"one huge outlier", outlier});
  std::vector<float> denorm(n);
  for (size_t i = 0; i < n; ++i) {
    float d = std::ldexp(static_cast<float>(i % 17 + 1), -149);  // subnormals
    denorm[i] = is_v || i % 2 ? d : -d;
  }
  cases.push_back({"denormals", denorm});
  std::vector<float> mixed = denorm;
  mixed[3] = std::numeric_limits<float>::min();
  mixed[F.block + 1] = 1e-20f;
  cases.push_back({"denormals beside normals", mixed});
  // Values on and next to the code boundaries: scale 1, x = ((c + 0.5) / L)^p +- 1 ulp.
  std::vector<float> edges(n, 0.0f);
  const int levels = is_v ? F.lv : F.lm;
  const int power = is_v && F.v_fourth_root ? 4 : 2;
  for (size_t i = 0; i < n; ++i) {
    float t =
        std::pow((static_cast<float>(i % (levels + 1)) + 0.5f) / static_cast<float>(levels), float(power));
    int w = static_cast<int>(i / (levels + 1)) % 3;
    t = w == 0 ? t : std::nextafter(t, w == 1 ? 0.0f : 2.0f);
    edges[i] = is_v || i % 2 == 0 ? t : -t;
  }
  for (size_t b = 0; b < n; b += F.block) edges[b] = 1.0f;  // every block's scale is 1
  cases.push_back({"code boundaries", edges});
  if (!is_v) {  // scale L^2 makes t = |m| exactly: t on (c + 1/2)^2 and one ulp to either side
    std::vector<float> mid(n, 0.0f);
    for (size_t i = 0; i < n; ++i) {
      const float c = static_cast<float>(i % levels) + 0.5f;
      const int w = static_cast<int>(i / levels) % 3;
      const float t = w == 0 ? c * c : std::nextafter(c * c, w == 1 ? 0.0f : 1e9f);
      mid[i] = i % 2 ? -t : t;
    }
    for (size_t b = 0; b < n; b += F.block) mid[b] = static_cast<float>(levels) * static_cast<float>(levels);
    cases.push_back({"exact midpoints", mid});
  }
  std::vector<float> top(n, 3.4e38f);
  if (!is_v) top[1] = -3.4e38f;
  cases.push_back({"near FLT_MAX", top});
  std::vector<float> tiny_v(n, 1e-30f);
  tiny_v[0] = 1.0f;
  tiny_v[F.block] = 1e30f;
  tiny_v[2 * F.block] = 1e-38f;
  tiny_v[2 * F.block + 1] = std::numeric_limits<float>::denorm_min();
  cases.push_back({"tiny beside huge", tiny_v});
  return cases;
}

}  // namespace

// ---- formats and byte counts -----------------------------------------------------------------

TEST(LowbitFormats, ParseNamesTheKey) {
  EXPECT_EQ(parse_state_format("int8").value(), StateFormat::kInt8);
  EXPECT_EQ(parse_state_format("int4").value(), StateFormat::kInt4);
  EXPECT_EQ(parse_state_format("bf16").value(), StateFormat::kBF16);
  EXPECT_EQ(parse_state_format("fp32").value(), StateFormat::kF32);
  auto bad = parse_state_format("int3");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("zoe.optimizer_states"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("int3"), std::string::npos);
  EXPECT_EQ(parse_master_format("bf16").value(), MasterFormat::kBF16);
  auto fp16 = parse_master_format("fp16");
  ASSERT_FALSE(fp16.is_ok());
  EXPECT_NE(fp16.status().message().find("zoe.master_weights"), std::string::npos) << fp16.status().message();
  EXPECT_FALSE(parse_master_format("int8").is_ok());
}

TEST(LowbitFormats, BytesAndTiling) {
  EXPECT_EQ(state_bytes(StateFormat::kInt8, 256), 260u);
  EXPECT_EQ(state_bytes(StateFormat::kInt8, 257), 260u + 5u);
  EXPECT_EQ(state_bytes(StateFormat::kInt4, 128), 68u);
  EXPECT_EQ(state_bytes(StateFormat::kInt4, 129), 68u + 5u);
  EXPECT_EQ(state_bytes(StateFormat::kInt4, 130), 68u + 5u);
  EXPECT_EQ(state_bytes(StateFormat::kBF16, 7), 14u);
  for (StateFormat f : {StateFormat::kInt8, StateFormat::kInt4}) {
    for (size_t n : {size_t(1), size_t(1000), size_t(12345)})
      EXPECT_EQ(state_bytes(f, n), bytes_ref(fmt(f), n));
    EXPECT_EQ(kChunkElems % state_block_elems(f), 0u);
  }
  EXPECT_DOUBLE_EQ(state_bytes_per_element(StateFormat::kInt8), 1.015625);
  EXPECT_DOUBLE_EQ(state_bytes_per_element(StateFormat::kInt4), 0.53125);
  EXPECT_DOUBLE_EQ(optimizer_state_bytes_per_param(MasterFormat::kF32, StateFormat::kF32), 12.0);
  EXPECT_LE(optimizer_state_bytes_per_param(MasterFormat::kBF16, StateFormat::kInt8), 4.1);
  EXPECT_LE(optimizer_state_bytes_per_param(MasterFormat::kBF16, StateFormat::kInt4), 3.1);
  EXPECT_OK(check_state_tiling(StateFormat::kInt8, kChunkElems, "the chunk"));
  Status s = check_state_tiling(StateFormat::kInt4, 1000, "the swapper's chunk");
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("zoe.optimizer_states"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("the swapper's chunk"), std::string::npos) << s.message();
}

// ---- the quantizer ---------------------------------------------------------------------------

TEST(LowbitQuantizer, MatchesReferenceOnRandomAndAdversarialBlocks) {
  std::mt19937 rng(3);
  for (StateFormat f : {StateFormat::kInt8, StateFormat::kInt4}) {
    const Fmt F = fmt(f);
    for (bool is_v : {false, true}) {
      auto cases = adversarial(F, is_v);
      cases.push_back({"random", random_block_values(rng, 5 * F.block + 3, is_v)});
      cases.push_back({"random, long", random_block_values(rng, 3 * kChunkElems + 1001, is_v)});
      for (const auto& [name, x] : cases) {
        const std::vector<uint8_t> want = quantize_ref(x, f, is_v);
        const std::vector<float> want_back = dequantize_ref(want, f, is_v, x.size());
        for (const Path* path : paths_here()) {
          SCOPED_TRACE(::testing::Message()
                       << state_format_name(f) << (is_v ? " v " : " m ") << name << " on " << path->name);
          const StateKind kind = is_v ? StateKind::kExpAvgSq : StateKind::kExpAvg;
          std::vector<uint8_t> got(state_bytes(f, x.size()), 0xAB);
          ASSERT_OK(quantize_state(kind, f, x.data(), got.data(), x.size(), exec_for(*path)));
          ASSERT_EQ(got.size(), want.size());
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_EQ(got[i], want[i]) << "byte " << i << " of " << got.size();
          }
          std::vector<float> back(x.size());
          ASSERT_OK(dequantize_state(kind, f, got.data(), back.data(), x.size(), exec_for(*path)));
          EXPECT_EQ(std::memcmp(back.data(), want_back.data(), x.size() * 4), 0);
          for (size_t i = 0; i < x.size(); ++i) {
            if (is_v && x[i] > 0.0f) {
              ASSERT_GT(back[i], 0.0f) << "v " << x[i] << " at " << i << " came back as 0";
            }
            if (x[i] == 0.0f) {
              ASSERT_EQ(back[i], 0.0f) << "a zero came back as " << back[i] << " at " << i;
            }
          }
        }
      }
    }
  }
}

// |x - dequant(quant(x))| <= scale * ((y + 1/2L)^p - (y - 1/2L)^p) with y = (|x|/scale)^(1/p), plus
// a v's rounding up to code 1 (scale / L^p) and fp32 rounding.
TEST(LowbitQuantizer, RoundTripErrorWithinTheMapsStep) {
  std::mt19937 rng(5);
  for (StateFormat f : {StateFormat::kInt8, StateFormat::kInt4}) {
    const Fmt F = fmt(f);
    for (bool is_v : {false, true}) {
      std::vector<float> x = random_block_values(rng, 20 * F.block, is_v);
      std::vector<uint8_t> q(state_bytes(f, x.size()));
      const StateKind kind = is_v ? StateKind::kExpAvgSq : StateKind::kExpAvg;
      ASSERT_OK(quantize_state(kind, f, x.data(), q.data(), x.size()));
      std::vector<float> back(x.size());
      ASSERT_OK(dequantize_state(kind, f, q.data(), back.data(), x.size()));
      const double levels = is_v ? F.lv : F.lm, p = is_v && F.v_fourth_root ? 4 : 2;
      double worst = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double s = scale_at(q, F, i);
        const double y = std::pow(std::fabs(x[i]) / s, 1.0 / p), h = 0.5 / levels;
        double bound = s * (std::pow(y + h, p) - std::pow(std::max(y - h, 0.0), p)) + s * 1e-6;
        if (is_v) bound = std::max(bound, s * std::pow(1.0 / levels, p) * (1 + 1e-6));
        const double err = std::fabs(double(back[i]) - x[i]);
        worst = std::max(worst, err / bound);
        ASSERT_LE(err, bound) << state_format_name(f) << (is_v ? " v" : " m") << " at " << i << ": " << x[i]
                              << " -> " << back[i];
      }
      printf("%s %s: worst round-trip error %.2f of its bound\n", state_format_name(f), is_v ? "v" : "m",
             worst);
    }
  }
}

TEST(LowbitQuantizer, RejectsNonFiniteAndNegativeV) {
  const size_t n = 1000;
  for (StateFormat f : {StateFormat::kF32, StateFormat::kBF16, StateFormat::kInt8, StateFormat::kInt4}) {
    std::vector<uint8_t> dst(state_bytes(f, n));
    for (float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -1.0f}) {
      std::vector<float> x(n, 0.5f);
      x[700] = bad;
      Status s = quantize_state(StateKind::kExpAvgSq, f, x.data(), dst.data(), n);
      EXPECT_FALSE(s.is_ok()) << state_format_name(f) << " v with " << bad;
      EXPECT_NE(s.message().find("v of elements"), std::string::npos) << s.message();
      if (bad < 0) {
        EXPECT_OK(quantize_state(StateKind::kExpAvg, f, x.data(), dst.data(), n));
      }
    }
  }
  // A corrupt (NaN) scale is an error, not a silent value.
  std::vector<float> x(1000, 1.0f), back(1000);
  std::vector<uint8_t> q(state_bytes(StateFormat::kInt8, 1000));
  ASSERT_OK(quantize_state(StateKind::kExpAvg, StateFormat::kInt8, x.data(), q.data(), 1000));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(&q[260 * 2], &nan, 4);
  Status s = dequantize_state(StateKind::kExpAvg, StateFormat::kInt8, q.data(), back.data(), 1000);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.to_string();
  EXPECT_NE(s.message().find("[512, 768)"), std::string::npos) << s.message();
}

// ---- the fused step ----------------------------------------------------------------------------

namespace {

struct StepData {
  std::vector<float> p32, g32;
  std::vector<uint16_t> p16, g16, out;
  std::vector<uint8_t> m, v;
};

const StateFormat kAllStates[] = {StateFormat::kF32, StateFormat::kBF16, StateFormat::kInt8,
                                  StateFormat::kInt4};

StepData make_step_data(size_t n, StateFormat f, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> up(-1.0f, 1.0f), uv(0.0f, 1e-4f);
  std::normal_distribution<float> nm(0.0f, 1e-2f);
  StepData d;
  d.p32.resize(n), d.p16.resize(n), d.out.assign(n, 0);
  std::vector<float> m(n), v(n);
  for (size_t i = 0; i < n; ++i) {
    d.p32[i] = up(rng);
    d.p16[i] = f32_to_bf16(d.p32[i]);
    m[i] = nm(rng);
    v[i] = uv(rng) * uv(rng) * 1e4f;
  }
  m[3] = 0.0f, v[3] = 0.0f;  // an untouched element
  d.m.resize(state_bytes(f, n)), d.v.resize(state_bytes(f, n));
  EXPECT_OK(quantize_state(StateKind::kExpAvg, f, m.data(), d.m.data(), n));
  EXPECT_OK(quantize_state(StateKind::kExpAvgSq, f, v.data(), d.v.data(), n));
  return d;
}

void new_grads(StepData& d, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> ng(0.0f, 1.0f);
  d.g32.resize(n), d.g16.resize(n);
  for (size_t i = 0; i < n; ++i) {
    d.g32[i] = i == 3 ? 0.0f : ng(rng) * 10.0f * (i % 7 == 0 ? 30.0f : 1.0f);
    d.g16[i] = f32_to_bf16(d.g32[i]);
  }
}

LowbitAdamArgs step_args(StepData& d, size_t n, StateFormat f, MasterFormat master, DType gd, int out,
                         bool sr, int64_t step) {
  LowbitAdamArgs a;
  a.buf.n = n;
  a.buf.param = master == MasterFormat::kF32 ? static_cast<void*>(d.p32.data()) : d.p16.data();
  a.buf.master = master;
  a.buf.grad = gd == DType::kF32 ? static_cast<const void*>(d.g32.data()) : d.g16.data();
  a.buf.grad_dtype = gd;
  a.buf.exp_avg = d.m.data();
  a.buf.exp_avg_sq = d.v.data();
  a.buf.states = f;
  a.buf.param_out = out ? d.out.data() : nullptr;
  a.buf.param_out_dtype = out == 1 ? DType::kF16 : DType::kBF16;
  a.buf.index_base = 4096;
  a.params.lr = 1e-3f;
  a.params.weight_decay = 0.01f;
  a.params.stochastic_rounding = sr;
  a.params.sr_seed = 77;
  a.step = {step, 1.0f / 1024.0f};
  return a;
}

bool same(const StepData& a, const StepData& b) {
  return a.p32 == b.p32 && a.p16 == b.p16 && a.m == b.m && a.v == b.v && a.out == b.out;
}

}  // namespace

// Every SIMD path, and a pool of 2 threads, gives the scalar path's bits: every state format x
// master x gradient dtype x param_out, three steps, a ragged multi-chunk size.
TEST(LowbitAdam, SameBitsOnEveryPath) {
  const size_t n = 2 * kChunkElems + 1000 + 37;
  auto pool = CpuPool::create({2, -1, CpuPool::Backend::kAuto}).value();
  int combos = 0;
  for (StateFormat f : kAllStates) {
    for (bool sr : {false, true}) {
      if (sr && f != StateFormat::kBF16) continue;
      for (MasterFormat master : {MasterFormat::kF32, MasterFormat::kBF16}) {
        for (DType gd : {DType::kF32, DType::kF16, DType::kBF16}) {
          for (int out : {0, 1, 2}) {
            SCOPED_TRACE(::testing::Message()
                         << "states " << state_format_name(f) << (sr ? " (sr)" : "") << " master "
                         << master_format_name(master) << " grad " << dtype_name(gd) << " out " << out);
            StepData want = make_step_data(n, f, 1);
            for (int s = 1; s <= 3; ++s) {
              new_grads(want, n, 100 + s);
              if (gd == DType::kF16) {
                for (size_t i = 0; i < n; ++i) want.g16[i] = f32_to_f16(want.g32[i]);
              }
              ASSERT_OK(
                  adam_step_lowbit(step_args(want, n, f, master, gd, out, sr, s), exec_for(all_paths()[0])));
            }
            for (const Path* path : paths_here()) {
              for (CpuPool* pl : {static_cast<CpuPool*>(nullptr), pool.get()}) {
                StepData got = make_step_data(n, f, 1);
                for (int s = 1; s <= 3; ++s) {
                  new_grads(got, n, 100 + s);
                  if (gd == DType::kF16) {
                    for (size_t i = 0; i < n; ++i) got.g16[i] = f32_to_f16(got.g32[i]);
                  }
                  ASSERT_OK(
                      adam_step_lowbit(step_args(got, n, f, master, gd, out, sr, s), exec_for(*path, pl)));
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
  EXPECT_EQ(combos, 5 * 2 * 3 * 3);
}

// The kernel computes the documented formulas: the plain reference's bytes, three steps.
TEST(LowbitAdam, MatchesPlainReference) {
  const size_t n = kChunkElems + 300 + 5;
  for (StateFormat f : {StateFormat::kInt8, StateFormat::kInt4}) {
    for (MasterFormat master : {MasterFormat::kF32, MasterFormat::kBF16}) {
      for (const Path* path : paths_here()) {
        SCOPED_TRACE(::testing::Message() << state_format_name(f) << " master " << master_format_name(master)
                                          << " on " << path->name);
        StepData d = make_step_data(n, f, 9);
        RefState r{d.p32, d.p16, d.m, d.v};
        for (int s = 1; s <= 3; ++s) {
          new_grads(d, n, 200 + s);
          LowbitAdamArgs a = step_args(d, n, f, master, DType::kF32, 2, false, s);
          ASSERT_OK(adam_step_lowbit(a, exec_for(*path)));
          step_ref(r, d.g32, f, master == MasterFormat::kBF16, a.params, s, a.step.grad_scale,
                   a.buf.index_base);
        }
        if (master == MasterFormat::kF32) {
          EXPECT_EQ(std::memcmp(d.p32.data(), r.p32.data(), n * 4), 0) << "fp32 master";
        } else {
          EXPECT_TRUE(d.p16 == r.p16) << "bf16 master";
          EXPECT_TRUE(d.out == r.p16) << "param_out (bf16) is the bf16 master";
        }
        EXPECT_TRUE(d.m == r.m) << "m";
        EXPECT_TRUE(d.v == r.v) << "v";
      }
    }
  }
}

// Ten steps against AdamW with fp32 states from the same start. Each step adds at most the
// map's round-trip error (RoundTripErrorWithinTheMapsStep: for m, scale * (y/L + 1/(4L^2)), at
// most 0.8% (int8) and 15% (int4) of the block's largest), which then decays by beta1 (m) or
// beta2 (v) and accumulates. Bounds, on errors relative to the block's largest fp32 value and
// on parameter differences relative to lr * steps: the measured values (printed, this data; the
// same bits on every path and CPU) with a margin: int8 m, v <= 0.05, parameters max <= 0.5, RMS
// <= 0.03; int4 m <= 1, v <= 0.5, parameters max <= 1.5, RMS <= 0.5 (measured: int8 0.026, 0.026,
// 0.23, 0.014; int4 0.79, 0.33, 1.02, 0.27: pure-noise gradients, where m is small beside sqrt(v);
// int4's codes are rounded stochastically, so one element may move a whole level in a step, while
// the mean stays unbiased: Int4StochasticRoundingIsUnbiased).
TEST(LowbitAdam, CloseToFp32States) {
  const size_t n = 4 * kChunkElems;
  const int steps = 10;
  struct Bound {
    StateFormat f;
    double m, v, p, p_rms;
  };
  for (const Bound& b :
       {Bound{StateFormat::kInt8, 0.05, 0.05, 0.5, 0.03}, Bound{StateFormat::kInt4, 1.0, 0.5, 1.5, 0.5}}) {
    StepData q = make_step_data(n, b.f, 1), ref32 = make_step_data(n, StateFormat::kF32, 1);
    std::fill(q.m.begin(), q.m.end(), 0), std::fill(q.v.begin(), q.v.end(), 0);
    std::fill(ref32.m.begin(), ref32.m.end(), 0), std::fill(ref32.v.begin(), ref32.v.end(), 0);
    const std::vector<float> p0 = ref32.p32;
    double worst_m = 0, worst_v = 0, worst_p = 0, rms_p = 0;
    for (int s = 1; s <= steps; ++s) {
      new_grads(q, n, 300 + s), new_grads(ref32, n, 300 + s);
      ASSERT_OK(adam_step_lowbit(step_args(q, n, b.f, MasterFormat::kF32, DType::kF32, 0, false, s)));
      ASSERT_OK(adam_step_lowbit(
          step_args(ref32, n, StateFormat::kF32, MasterFormat::kF32, DType::kF32, 0, false, s)));
      std::vector<float> m(n), v(n);
      ASSERT_OK(dequantize_state(StateKind::kExpAvg, b.f, q.m.data(), m.data(), n));
      ASSERT_OK(dequantize_state(StateKind::kExpAvgSq, b.f, q.v.data(), v.data(), n));
      const float* m32 = reinterpret_cast<const float*>(ref32.m.data());
      const float* v32 = reinterpret_cast<const float*>(ref32.v.data());
      const size_t B = state_block_elems(b.f);
      for (size_t b0 = 0; b0 < n; b0 += B) {  // error relative to the block's largest fp32 value
        double sm = 0, sv = 0;
        for (size_t i = b0; i < b0 + B; ++i)
          sm = std::max(sm, double(std::fabs(m32[i]))), sv = std::max(sv, double(v32[i]));
        for (size_t i = b0; i < b0 + B; ++i) {
          worst_m = std::max(worst_m, std::fabs(m[i] - m32[i]) / sm);
          worst_v = std::max(worst_v, std::fabs(v[i] - v32[i]) / sv);
        }
      }
      double sum_sq = 0;
      for (size_t i = 0; i < n; ++i) {  // parameter drift relative to how far fp32 moved it (lr * steps)
        const double d = std::fabs(double(q.p32[i]) - ref32.p32[i]) / (1e-3 * s);
        worst_p = std::max(worst_p, d);
        sum_sq += d * d;
      }
      rms_p = std::max(rms_p, std::sqrt(sum_sq / double(n)));
      for (size_t i = 0; i < n; ++i)
        ASSERT_TRUE(v32[i] == 0.0f || v[i] > 0.0f) << "v came back as 0 at " << i;
    }
    printf(
        "%s states vs fp32 states, %d steps: worst |m error| %.4f, |v error| %.4f of the block's largest; "
        "parameter difference max %.4f, RMS %.4f of lr*steps\n",
        state_format_name(b.f), steps, worst_m, worst_v, worst_p, rms_p);
    EXPECT_LE(worst_m, b.m);
    EXPECT_LE(worst_v, b.v);
    EXPECT_LE(worst_p, b.p);
    EXPECT_LE(rms_p, b.p_rms);
    EXPECT_NE(p0, q.p32);
  }
}

TEST(LowbitAdam, NonFiniteIsAnErrorAndLeavesTheBlock) {
  const size_t n = 3 * 256 + 10;
  for (StateFormat f : kAllStates) {
    SCOPED_TRACE(state_format_name(f));
    StepData d = make_step_data(n, f, 4);
    new_grads(d, n, 5);
    d.g32[300] = 1e30f;  // g^2 overflows: v becomes inf
    StepData before = d;
    Status s = adam_step_lowbit(step_args(d, n, f, MasterFormat::kF32, DType::kF32, 0, false, 1));
    ASSERT_FALSE(s.is_ok());
    const size_t end = f == StateFormat::kInt4 ? 384 : 512;  // the failing block
    EXPECT_NE(s.message().find("[256, " + std::to_string(end) + ")"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("v"), std::string::npos) << s.message();
    EXPECT_NE(before.p32, d.p32);  // the other blocks were updated
    for (size_t i = 256; i < end; ++i) ASSERT_EQ(d.p32[i], before.p32[i]) << i;
    const size_t sb = state_bytes(f, end) - state_bytes(f, 256), off = state_bytes(f, 256);
    EXPECT_EQ(std::memcmp(d.m.data() + off, before.m.data() + off, sb), 0);
    EXPECT_EQ(std::memcmp(d.v.data() + off, before.v.data() + off, sb), 0);
  }
  // A corrupt stored scale.
  StepData d = make_step_data(n, StateFormat::kInt4, 4);
  new_grads(d, n, 5);
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(&d.m[68 * 3], &inf, 4);
  Status s =
      adam_step_lowbit(step_args(d, n, StateFormat::kInt4, MasterFormat::kBF16, DType::kF32, 0, false, 1));
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.to_string();
  EXPECT_NE(s.message().find("[384, 512)"), std::string::npos) << s.message();
}

TEST(LowbitAdam, ZeroStatesAndGradientsStayZero) {
  const size_t n = 1000;
  for (StateFormat f : {StateFormat::kInt8, StateFormat::kInt4}) {
    std::vector<uint8_t> m(state_bytes(f, n), 0), v(state_bytes(f, n), 0);
    std::vector<float> p(n, 0.5f), g(n, 0.0f);
    LowbitAdamArgs a;
    a.buf.n = n, a.buf.param = p.data(), a.buf.grad = g.data(), a.buf.exp_avg = m.data(),
    a.buf.exp_avg_sq = v.data();
    a.buf.states = f;
    a.step = {1, 1.0f};
    ASSERT_OK(adam_step_lowbit(a));
    EXPECT_TRUE(std::all_of(m.begin(), m.end(), [](uint8_t b) { return b == 0; }));
    EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](uint8_t b) { return b == 0; }));
    EXPECT_TRUE(std::all_of(p.begin(), p.end(), [](float x) { return x == 0.5f; }));
  }
}

// The fused step rounds int4 codes stochastically, unbiased in the stored value: one step from zero
// states with the gradient g = 0.7 on every element but each block's first (10, the scale) gives
// m = (1 - beta1) g and v = (1 - beta2) g^2 everywhere else, which fall between two codes (m: r =
// 1.85 of 7 levels, v: r = 1.05 of 15). The decoded means are the true values (bounds: 4 standard
// errors of the mean over 520K elements); rounding to nearest (quantize_state: what shows that the
// test can fail) is 17% (m) and 9% (v) off.
TEST(LowbitAdam, Int4StochasticRoundingIsUnbiased) {
  const size_t n = size_t(128) << 12;
  std::vector<float> g(n), p(n, 0.0f);
  for (size_t i = 0; i < n; ++i) g[i] = i % 128 == 0 ? 10.0f : 0.7f;
  std::vector<uint8_t> m(state_bytes(StateFormat::kInt4, n), 0), v(m.size(), 0);
  LowbitAdamArgs a;
  a.buf.n = n, a.buf.param = p.data(), a.buf.grad = g.data(), a.buf.exp_avg = m.data(),
  a.buf.exp_avg_sq = v.data();
  a.buf.states = StateFormat::kInt4;
  a.params.weight_decay = 0.0f;
  a.step = {1, 1.0f};
  ASSERT_OK(adam_step_lowbit(a));
  const float m_true = (1.0f - a.params.beta1) * 0.7f, v_true = (1.0f - a.params.beta2) * 0.7f * 0.7f;
  auto mean_of_others = [&](StateKind kind, const std::vector<uint8_t>& packed) {
    std::vector<float> x(n);
    EXPECT_OK(dequantize_state(kind, StateFormat::kInt4, packed.data(), x.data(), n));
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += i % 128 ? x[i] : 0.0;
    return sum / double(n - n / 128);
  };
  EXPECT_NEAR(mean_of_others(StateKind::kExpAvg, m) / m_true, 1.0, 2e-3);
  EXPECT_NEAR(mean_of_others(StateKind::kExpAvgSq, v) / v_true, 1.0, 3e-3);
  // The same values rounded to nearest.
  std::vector<float> mv(n), vv(n);
  for (size_t i = 0; i < n; ++i) {
    const float gi = i % 128 == 0 ? 10.0f : 0.7f;
    mv[i] = (1.0f - a.params.beta1) * gi, vv[i] = (1.0f - a.params.beta2) * gi * gi;
  }
  std::vector<uint8_t> mn(m.size()), vn(v.size());
  ASSERT_OK(quantize_state(StateKind::kExpAvg, StateFormat::kInt4, mv.data(), mn.data(), n));
  ASSERT_OK(quantize_state(StateKind::kExpAvgSq, StateFormat::kInt4, vv.data(), vn.data(), n));
  EXPECT_GT(std::fabs(mean_of_others(StateKind::kExpAvg, mn) / m_true - 1.0), 0.05);
  EXPECT_GT(std::fabs(mean_of_others(StateKind::kExpAvgSq, vn) / v_true - 1.0), 0.05);
}

// A bf16 master is rounded stochastically: the mean of many rounded values is the fp32 value
// (unbiased), a rerun gives the same bits, another step other bits.
TEST(Bf16Master, StochasticRoundingIsUnbiasedAndReproducible) {
  const size_t n = size_t(1) << 18;
  const float start = 1.0f + 5.0f / 128.0f;  // a bf16 value
  auto run = [&](int64_t step, std::vector<uint16_t>& p) {
    p.assign(n, f32_to_bf16(start));
    std::vector<float> g(n, 0.0f);
    std::vector<uint8_t> m(state_bytes(StateFormat::kInt8, n), 0), v = m;
    LowbitAdamArgs a;
    a.buf.n = n, a.buf.param = p.data(), a.buf.master = MasterFormat::kBF16, a.buf.grad = g.data();
    a.buf.exp_avg = m.data(), a.buf.exp_avg_sq = v.data();
    a.params.lr = 1e-2f, a.params.weight_decay = 0.3f, a.params.sr_seed = 5;  // decay 0.997
    a.step = {step, 1.0f};
    EXPECT_OK(adam_step_lowbit(a));
    const AdamConstants c = make_adam_constants(a.params, a.step).value();
    return double(start * c.decay);  // the fp32 result (g == 0: no Adam term)
  };
  std::vector<uint16_t> p1, p2, p3;
  const double exact = run(1, p1);
  run(1, p2);
  run(2, p3);
  EXPECT_TRUE(p1 == p2) << "the same (seed, step) must give the same bits";
  EXPECT_FALSE(p1 == p3) << "another step must draw other bits";
  for (const auto* p : {&p1, &p3}) {
    double sum = 0, lo = 1e9, hi = -1e9;
    for (uint16_t h : *p)
      sum += bf16_to_f32(h), lo = std::min(lo, double(bf16_to_f32(h))),
                             hi = std::max(hi, double(bf16_to_f32(h)));
    const double mean = sum / double(n), ulp = hi - lo;
    // The two neighbours of `exact`; the mean of n Bernoulli draws is within 5 sigma of exact.
    const double frac = (exact - lo) / ulp, sigma = ulp * std::sqrt(frac * (1 - frac) / double(n));
    printf("bf16 master: fp32 %.8f, neighbours %.8f / %.8f, mean of %zu draws %.8f (%.2f sigma)\n", exact, lo,
           hi, n, mean, (mean - exact) / sigma);
    EXPECT_LE(lo, exact);
    EXPECT_GE(hi, exact);
    EXPECT_NEAR(mean, exact, 5 * sigma);
  }
}

}  // namespace zoe::optim::test
