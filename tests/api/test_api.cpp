// The public API through the installed headers only: the scoped fetch releases on every path,
// typed views at every stage and precision, the dtype helpers bit for bit against the engine's own
// conversions, Config's errors, setters and keys by JSON path, the Runtime's collectives, and a
// saved checkpoint read back through CheckpointReader.
#include <gtest/gtest.h>
#include <zoe/zoe.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "../util/status_test_util.h"

namespace {

zoe::Runtime& runtime() {
  static std::unique_ptr<zoe::Runtime> rt = [] {
    auto r = zoe::Runtime::init();
    if (!r.is_ok()) abort();
    return std::move(r).value();
  }();
  return *rt;
}

std::string scratch_dir() {
  const char* t = getenv("ZOE_TEST_TMPDIR");
  return t && *t ? t : "/tmp";
}

uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// The initial value of element i of parameter p of module m.
float init_value(size_t m, size_t p, size_t i) {
  return 0.01f * static_cast<float>(i % 97) - 0.3f + 0.125f * static_cast<float>(m) +
         0.5f * static_cast<float>(p);
}

const std::vector<zoe::ParamSpec> kSpecs = {{"w", {3, 5}}, {"b", {5}}, {"t", {2, 3, 4}}};

std::unique_ptr<zoe::Engine> make_engine(const zoe::Config& cfg, size_t modules) {
  auto e = zoe::Engine::create(runtime(), cfg);
  EXPECT_OK(e);
  if (!e.is_ok()) return nullptr;
  auto eng = std::move(e).value();
  for (size_t m = 0; m < modules; ++m) {
    EXPECT_OK(eng->add_module("mod." + std::to_string(m), kSpecs));
  }
  zoe::Status s = eng->initialize([](size_t m, size_t p, float* x, size_t n) {
    for (size_t i = 0; i < n; ++i) x[i] = init_value(m, p, i);
  });
  EXPECT_OK(s);
  return s.is_ok() ? std::move(eng) : nullptr;
}

zoe::Config stage3_nvme(uint64_t budget) {
  const std::string dir = scratch_dir();
  auto c = zoe::Config::Builder()
               .stage(3)
               .precision(zoe::ComputeDType::kBF16)
               .param_persistence_threshold(0)
               .offload_param(zoe::Offload::kNvme, {dir})
               .offload_optimizer(zoe::Offload::kNvme, {dir})
               .device_budget(budget)
               .build();
  EXPECT_OK(c);
  return c.value();
}

// ---------------------------------------------------------------------------------------------
// Scoped fetch

class ScopedFetch : public ::testing::Test {
 protected:
  void SetUp() override {
    eng_ = make_engine(stage3_nvme(1 << 20), 3);
    ASSERT_TRUE(eng_);
    idle_ = eng_->memory_in_use();
    ASSERT_EQ(idle_.partition_pins, 0u);
  }
  // Released: device memory back to what it was between calls, nothing pinned, and module m can
  // be fetched again (a module still fetched would refuse release() twice).
  void expect_released(size_t m) {
    const zoe::MemoryUse u = eng_->memory_in_use();
    EXPECT_EQ(u.device - u.device_partitions, idle_.device - idle_.device_partitions);
    EXPECT_EQ(u.partition_pins, 0u);
    zoe::Status s = eng_->release(m);
    EXPECT_EQ(s.code(), zoe::StatusCode::kInvalidArgument) << "module " << m << " was still fetched";
  }
  size_t gathered_device_bytes() {
    const zoe::MemoryUse u = eng_->memory_in_use();
    return u.device - u.device_partitions;
  }
  std::unique_ptr<zoe::Engine> eng_;
  zoe::MemoryUse idle_;
};

TEST_F(ScopedFetch, ReleasesAtScopeExit) {
  {
    auto p = eng_->gather(1);
    ASSERT_OK(p);
    EXPECT_EQ(p->module(), 1u);
    // One rank: the partition itself, pinned on the device until release (no gathered copy);
    // several: a gathered copy beside the partitions.
    const zoe::MemoryUse u = eng_->memory_in_use();
    EXPECT_TRUE(u.partition_pins > 0 || gathered_device_bytes() > idle_.device - idle_.device_partitions);
  }
  expect_released(1);
}

TEST_F(ScopedFetch, ReleasesOnEarlyReturn) {
  auto use = [&](bool leave_early) -> int {
    auto p = eng_->gather(0);
    if (!p.is_ok()) return -1;
    if (leave_early) return 1;
    return 2;
  };
  EXPECT_EQ(use(true), 1);
  expect_released(0);
  EXPECT_EQ(use(false), 2);
  expect_released(0);
}

TEST_F(ScopedFetch, ReleasesOnException) {
  try {
    auto p = eng_->gather(2);
    ASSERT_OK(p);
    throw std::runtime_error("the caller's forward failed");
  } catch (const std::runtime_error&) {
  }
  expect_released(2);
}

TEST_F(ScopedFetch, ExplicitReleaseOnceAndMoves) {
  auto p = eng_->gather(0);
  ASSERT_OK(p);
  zoe::Gathered g = std::move(p).value();
  EXPECT_EQ(g.size(), kSpecs.size());
  EXPECT_OK(g.release());
  EXPECT_EQ(g.size(), 0u);  // the views are gone
  EXPECT_OK(g.release());   // a second release does nothing
  expect_released(0);
  // Moving a Gathered over another releases the one it replaces; the moved-from one owns nothing.
  auto a = eng_->gather(0);
  auto b = eng_->gather(1);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  zoe::Gathered ga = std::move(a).value(), gb = std::move(b).value();
  ga = std::move(gb);
  EXPECT_EQ(ga.module(), 1u);
  EXPECT_EQ(eng_->release(0).code(), zoe::StatusCode::kInvalidArgument);  // 0 went with the move
  EXPECT_OK(ga.release());
  expect_released(1);
}

TEST_F(ScopedFetch, HighWaterReturnsToIdleOverAStep) {
  for (int step = 0; step < 2; ++step) {
    for (size_t m = 0; m < 3; ++m) {
      auto p = eng_->gather(m);
      ASSERT_OK(p);
    }
    for (size_t m = 3; m-- > 0;) {
      auto p = eng_->gather(m);
      ASSERT_OK(p);
      auto g = eng_->grads(m);
      ASSERT_OK(g);
      for (const zoe::TensorView& v : g->tensors) {
        std::vector<float> ones(v.numel, 1.0f);
        ASSERT_OK(eng_->write_f32(v, ones.data()));
      }
      ASSERT_OK(eng_->reduce_grads(m));
    }
    auto st = eng_->step();
    ASSERT_OK(st);
    EXPECT_LE(st->high_water[0], eng_->device_budget_bytes());
    const zoe::MemoryUse u = eng_->memory_in_use();
    EXPECT_EQ(u.partition_pins, 0u);
    EXPECT_EQ(u.device - u.device_partitions, idle_.device - idle_.device_partitions) << "step " << step;
  }
}

// StepStats is declared once (zoe/step_stats.h): every field the struct has is visited, documented
// and in the JSON, with its value; a step's stats reach it too.
TEST_F(ScopedFetch, EveryStepStatsFieldReachesTheJson) {
  for (size_t m = 0; m < 3; ++m) ASSERT_OK(eng_->gather(m));
  for (size_t m = 3; m-- > 0;) {
    ASSERT_OK(eng_->gather(m));
    ASSERT_OK(eng_->grads(m));
    ASSERT_OK(eng_->reduce_grads(m));
  }
  auto st = eng_->step();
  ASSERT_OK(st);
  zoe::StepStats s = *st;
  s.speculative_undone = 123456789;
  s.high_water[2] = 987654321;
  s.t_activation_stall = 0.5;
  s.grad_norm = 0.25;
  const std::string j = zoe::step_stats_json(s);
  size_t fields = 0, bytes = 0;
  zoe::for_each_field(s, [&](const char* name, const auto& value) {
    ++fields;
    bytes += sizeof(value);
    EXPECT_NE(j.find("\"" + std::string(name) + "\": "), std::string::npos) << name << " missing in " << j;
    EXPECT_STRNE(zoe::step_stats_doc(name), "") << name;
  });
  // Every member is visited: the visited sizes add up to the struct's, padding aside.
  EXPECT_GE(sizeof(zoe::StepStats), bytes);
  EXPECT_LT(sizeof(zoe::StepStats) - bytes, 16u);
  EXPECT_EQ(fields, 36u);
  EXPECT_NE(j.find("\"step\": 1,"), std::string::npos) << j;
  EXPECT_NE(j.find("\"speculative_undone\": 123456789,"), std::string::npos) << j;
  EXPECT_NE(j.find("\"t_activation_stall\": 0.5}"), std::string::npos) << j;
  EXPECT_NE(j.find("\"nvme\": 987654321}"), std::string::npos) << j;
  EXPECT_NE(j.find("\"grad_norm\": 0.25,"), std::string::npos) << j;
  EXPECT_STREQ(zoe::step_stats_doc("no_such_field"), "");
}

// ---------------------------------------------------------------------------------------------
// Typed views: every stage, every precision

class TypedViews : public ::testing::TestWithParam<std::tuple<int, zoe::ComputeDType>> {};

TEST_P(TypedViews, ShapesDtypesAndValues) {
  const auto [stage, dt] = GetParam();
  zoe::Config::Builder b;
  b.stage(stage).precision(dt).param_persistence_threshold(0);
  auto cfg = b.build();
  ASSERT_OK(cfg);
  auto eng = make_engine(cfg.value(), 2);
  ASSERT_TRUE(eng);
  EXPECT_EQ(eng->compute_dtype(), dt);
  for (size_t m = 0; m < 2; ++m) {
    auto p = eng->gather(m);
    ASSERT_OK(p);
    ASSERT_EQ(p->size(), kSpecs.size());
    EXPECT_EQ(p->params().dtype, dt);
    for (size_t i = 0; i < kSpecs.size(); ++i) {
      const zoe::TensorView& v = (*p)[i];
      size_t n = 1;
      for (int64_t d : kSpecs[i].shape) n *= static_cast<size_t>(d);
      EXPECT_EQ(v.name, kSpecs[i].name);
      ASSERT_NE(v.shape, nullptr);
      EXPECT_EQ(*v.shape, kSpecs[i].shape);
      EXPECT_EQ(v.dtype, dt);
      EXPECT_EQ(v.numel, n);
      EXPECT_EQ(v.bytes, n * zoe::dtype_size(dt));
      EXPECT_TRUE(v.host_addressable);  // the CPU device
      EXPECT_EQ(p->params().data[i], v.data);
      EXPECT_EQ(p->params().numel[i], v.numel);
      // The values: the initial fp32 ones in the compute dtype.
      std::vector<float> got(n);
      ASSERT_OK(eng->read_f32(v, got.data()));
      for (size_t k = 0; k < n; ++k) {
        const float x = init_value(m, i, k);
        const float want = dt == zoe::ComputeDType::kF32 ? x : zoe::to_f32(zoe::from_f32(x, dt), dt);
        ASSERT_EQ(bits(got[k]), bits(want)) << "module " << m << " " << v.name << "[" << k << "]";
      }
    }
    auto g = eng->grads(m);
    ASSERT_OK(g);
    ASSERT_EQ(g->size(), kSpecs.size());
    for (size_t i = 0; i < kSpecs.size(); ++i) {
      const zoe::TensorView& v = (*g)[i];
      EXPECT_EQ(v.name, kSpecs[i].name);
      EXPECT_EQ(*v.shape, kSpecs[i].shape);
      EXPECT_EQ(v.dtype, dt);
      EXPECT_EQ(v.bytes, v.numel * zoe::dtype_size(dt));
      std::vector<float> z(v.numel, 1.0f);
      ASSERT_OK(eng->read_f32(v, z.data()));
      for (float f : z) ASSERT_EQ(f, 0.0f);  // zeroed
    }
    ASSERT_OK(eng->reduce_grads(m));
  }
}

INSTANTIATE_TEST_SUITE_P(AllStagesAndPrecisions, TypedViews,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(zoe::ComputeDType::kF32,
                                                              zoe::ComputeDType::kBF16,
                                                              zoe::ComputeDType::kF16)));

// ---------------------------------------------------------------------------------------------
// dtype helpers

TEST(DType, KnownBitPatterns) {
  using zoe::ComputeDType;
  EXPECT_EQ(zoe::from_f32(1.0f, ComputeDType::kBF16), 0x3f80);
  EXPECT_EQ(zoe::from_f32(from_bits(0x3f808000u), ComputeDType::kBF16), 0x3f80);  // tie: to even
  EXPECT_EQ(zoe::from_f32(from_bits(0x3f818000u), ComputeDType::kBF16), 0x3f82);  // tie: to even (up)
  EXPECT_EQ(zoe::from_f32(from_bits(0x3f808001u), ComputeDType::kBF16), 0x3f81);  // above the tie
  EXPECT_EQ(zoe::from_f32(INFINITY, ComputeDType::kBF16), 0x7f80);
  EXPECT_EQ(zoe::from_f32(-0.0f, ComputeDType::kBF16), 0x8000);
  EXPECT_EQ(zoe::from_f32(NAN, ComputeDType::kBF16) & 0x7fc0, 0x7fc0);  // a quiet NaN
  EXPECT_EQ(zoe::from_f32(1.0f, ComputeDType::kF16), 0x3c00);
  EXPECT_EQ(zoe::from_f32(65504.0f, ComputeDType::kF16), 0x7bff);
  EXPECT_EQ(zoe::from_f32(65520.0f, ComputeDType::kF16), 0x7c00);  // rounds to inf
  EXPECT_EQ(zoe::from_f32(0x1p-24f, ComputeDType::kF16), 0x0001);  // smallest subnormal
  EXPECT_EQ(zoe::from_f32(0x1p-25f, ComputeDType::kF16), 0x0000);  // tie to even: zero
  EXPECT_EQ(zoe::from_f32(0x3p-25f, ComputeDType::kF16), 0x0002);  // tie to even: up
  EXPECT_EQ(zoe::from_f32(-2.0f, ComputeDType::kF16), 0xc000);
  EXPECT_EQ(zoe::to_f32(0x3f80, ComputeDType::kBF16), 1.0f);
  EXPECT_EQ(zoe::to_f32(0x0001, ComputeDType::kF16), 0x1p-24f);
  EXPECT_EQ(zoe::to_f32(0x7bff, ComputeDType::kF16), 65504.0f);
  EXPECT_TRUE(std::isinf(zoe::to_f32(0xfc00, ComputeDType::kF16)));
  EXPECT_STREQ(zoe::dtype_name(ComputeDType::kBF16), "bf16");
}

TEST(DType, ArraysMatchScalarsAndScale) {
  std::mt19937 gen(5);
  std::vector<float> x(4096);
  for (float& v : x) v = from_bits(gen() & 0xbfffffffu);  // finite and infinite, every exponent below 2^1
  for (auto dt : {zoe::ComputeDType::kBF16, zoe::ComputeDType::kF16}) {
    std::vector<uint16_t> h(x.size()), hs(x.size());
    zoe::from_f32(x.data(), dt, h.data(), x.size());
    zoe::from_f32(x.data(), dt, hs.data(), x.size(), 4.0f);
    std::vector<float> back(x.size());
    zoe::to_f32(h.data(), dt, back.data(), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(h[i], zoe::from_f32(x[i], dt)) << i;
      ASSERT_EQ(hs[i], zoe::from_f32(x[i] * 4.0f, dt)) << i;
      ASSERT_EQ(bits(back[i]), bits(zoe::to_f32(h[i], dt))) << i;
    }
  }
}

// The engine stores initial values in the compute dtype with its internal conversion: the public
// helper must give the same bits, on every device this host has (CPU; CUDA where a GPU is).
class DTypeVsEngine : public ::testing::TestWithParam<std::string> {};

TEST_P(DTypeVsEngine, BitEqualToTheEnginesConversion) {
  std::mt19937 gen(11);
  std::vector<float> vals(8192);
  for (float& v : vals) {
    uint32_t u = gen();
    if ((u & 0x7f800000u) == 0x7f800000u) u &= 0xbfffffffu;  // no inf/NaN as initial values
    v = from_bits(u);
  }
  vals[0] = 65520.0f, vals[1] = 0x1p-25f, vals[2] = 0x3p-25f, vals[3] = from_bits(0x3f808000u);
  for (auto dt : {zoe::ComputeDType::kBF16, zoe::ComputeDType::kF16}) {
    auto cfg = zoe::Config::Builder().precision(dt).device(GetParam()).build();
    ASSERT_OK(cfg);
    auto e = zoe::Engine::create(runtime(), cfg.value());
    if (!e.is_ok() && e.status().code() == zoe::StatusCode::kUnsupported)
      GTEST_SKIP() << e.status().to_string();
    ASSERT_OK(e);
    auto eng = std::move(e).value();
    ASSERT_OK(eng->add_module("m", {{"x", {static_cast<int64_t>(vals.size())}}}));
    ASSERT_OK(eng->initialize([&](size_t, size_t, float* x, size_t n) { memcpy(x, vals.data(), n * 4); }));
    auto p = eng->gather(0);
    ASSERT_OK(p);
    const zoe::TensorView& v = (*p)[0];
    std::vector<uint16_t> engine_bits(vals.size());
    if (v.host_addressable) {
      memcpy(engine_bits.data(), v.data, v.bytes);
    } else {  // device memory: read back as fp32 (exact), then to the dtype (exact for these)
      std::vector<float> f(vals.size());
      ASSERT_OK(eng->read_f32(v, f.data()));
      zoe::from_f32(f.data(), dt, engine_bits.data(), f.size());
    }
    for (size_t i = 0; i < vals.size(); ++i) {
      ASSERT_EQ(engine_bits[i], zoe::from_f32(vals[i], dt)) << zoe::dtype_name(dt) << " value " << vals[i];
    }
    // write_f32 then read_f32 through the device: the public conversion, scale included.
    std::vector<float> src(vals.size()), back(vals.size());
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i % 251) * 0.37f - 40.0f;
    auto g = eng->grads(0);
    ASSERT_OK(g);
    ASSERT_OK(eng->write_f32((*g)[0], src.data(), 8.0f));
    ASSERT_OK(eng->read_f32((*g)[0], back.data()));
    for (size_t i = 0; i < src.size(); ++i) {
      ASSERT_EQ(bits(back[i]), bits(zoe::to_f32(zoe::from_f32(src[i] * 8.0f, dt), dt))) << i;
    }
    ASSERT_OK(eng->reduce_grads(0));
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, DTypeVsEngine, ::testing::Values("cpu", "cuda"));

// ---------------------------------------------------------------------------------------------
// Config and Runtime

TEST(Config, ErrorsNameTheJsonPath) {
  auto bad =
      zoe::Config::parse(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "disk"}}})");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), zoe::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().to_string().find("zero_optimization.offload_param.device"), std::string::npos)
      << bad.status().to_string();
  auto missing = zoe::Config::load("/nonexistent/ds_config.json");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().to_string().find("/nonexistent/ds_config.json"), std::string::npos);
}

TEST(Config, SettersValidateAndLeaveTheConfigAloneOnError) {
  auto c =
      zoe::Config::parse(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3})", 1);
  ASSERT_OK(c);
  zoe::Config cfg = c.value();
  ASSERT_OK(cfg.set_micro_batch(4));
  EXPECT_EQ(cfg.micro_batch(), 4);
  EXPECT_EQ(cfg.train_batch_size(), 12);
  ASSERT_OK(cfg.set_precision(zoe::ComputeDType::kF16));
  EXPECT_EQ(cfg.precision(), zoe::ComputeDType::kF16);
  ASSERT_OK(cfg.set_lr(2e-3));
  EXPECT_EQ(cfg.lr(), 2e-3);
  const std::string before = cfg.to_json();
  zoe::Status s = cfg.set_stage(7);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("zero_optimization.stage"), std::string::npos) << s.to_string();
  EXPECT_EQ(cfg.to_json(), before);
  // Parameter offload needs stage 3: refused at stage 0, accepted after set_stage(3).
  EXPECT_FALSE(cfg.set_offload_param(zoe::Offload::kCpu).is_ok());
  EXPECT_EQ(cfg.offload_param(), zoe::Offload::kNone);
  ASSERT_OK(cfg.set_stage(3));
  ASSERT_OK(cfg.set_offload_param(zoe::Offload::kCpu));
  EXPECT_EQ(cfg.offload_param(), zoe::Offload::kCpu);
  ASSERT_OK(cfg.set_device_budget(64u << 20));
  EXPECT_EQ(cfg.device_budget(), 64u << 20);
  auto again = zoe::Config::parse(cfg.to_json());
  ASSERT_OK(again);
  EXPECT_EQ(again->to_json(), cfg.to_json());
}

TEST(Config, KeysByJsonPath) {
  auto c = zoe::Config::parse(R"({"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.5})", 1);
  ASSERT_OK(c);
  zoe::Config cfg = c.value();
  EXPECT_EQ(cfg.get("train_micro_batch_size_per_gpu").value(), "2");
  EXPECT_EQ(cfg.get_int("train_batch_size").value(), 2);
  EXPECT_EQ(cfg.get_double("gradient_clipping").value(), 1.5);
  EXPECT_EQ(cfg.get_bool("bf16.enabled").value(), false);
  EXPECT_EQ(cfg.get_string("zero_optimization.offload_param.device").value(), "none");

  zoe::Status s = cfg.set("zero_optimization.stage", "3");
  ASSERT_OK(s);
  EXPECT_EQ(cfg.stage(), 3);
  EXPECT_EQ(cfg.get_int("zero_optimization.stage").value(), 3);
  s = cfg.set("zero_optimization.offload_param", R"({"device": "cpu"})");
  ASSERT_OK(s);
  EXPECT_EQ(cfg.offload_param(), zoe::Offload::kCpu);
  EXPECT_EQ(cfg.get_string("zero_optimization.offload_param.device").value(), "cpu");
  s = cfg.set("bf16.enabled", "true");
  ASSERT_OK(s);
  EXPECT_EQ(cfg.precision(), zoe::ComputeDType::kBF16);

  // Refused, naming the key; the config is left as it was.
  const std::string before = cfg.to_json();
  s = cfg.set("zero_optimization.stage", "7");
  EXPECT_EQ(s.code(), zoe::StatusCode::kInvalidArgument);
  EXPECT_NE(s.to_string().find("zero_optimization.stage"), std::string::npos) << s.to_string();
  s = cfg.set("zero_optimization.offload_param.device", "nvme");  // not JSON: no quotes
  EXPECT_EQ(s.code(), zoe::StatusCode::kInvalidArgument);
  EXPECT_NE(s.to_string().find("not JSON"), std::string::npos) << s.to_string();
  s = cfg.set("zero_optimization.stgae", "2");
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("stgae"), std::string::npos) << s.to_string();
  s = cfg.set("train_batch_size.x", "2");
  EXPECT_EQ(s.code(), zoe::StatusCode::kInvalidArgument);
  EXPECT_EQ(cfg.to_json(), before);

  auto missing = cfg.get("zero_optimization.stgae");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), zoe::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("'stgae'"), std::string::npos) << missing.status().to_string();
  EXPECT_NE(missing.status().message().find("stage"), std::string::npos) << missing.status().to_string();
  EXPECT_EQ(cfg.get("").status().code(), zoe::StatusCode::kInvalidArgument);
  EXPECT_EQ(cfg.get_bool("zero_optimization.stage").status().code(), zoe::StatusCode::kInvalidArgument);
}

TEST(Config, BuilderErrors) {
  auto c = zoe::Config::Builder().stage(2).offload_optimizer(zoe::Offload::kNvme, {}).build();
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().to_string().find("offload_optimizer"), std::string::npos) << c.status().to_string();
  auto d = zoe::Config::Builder().micro_batch(0).build();
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.status().to_string().find("train_micro_batch_size_per_gpu"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// CheckpointReader

// A fresh directory under the scratch directory.
std::string make_temp_dir(const std::string& what) {
  std::string tmpl = scratch_dir() + "/zoe-api-" + what + "-XXXXXX";
  if (!mkdtemp(tmpl.data())) return "";
  return tmpl;
}

// Saved parameters read back whole and equal to what was written: fp32 without masters (the
// compute copy) and bf16 stage 3 on NVMe (the fp32 masters, partitioned over the ranks).
TEST(CheckpointReader, ReadsBackWhatWasSaved) {
  auto fp32 = zoe::Config::Builder().build(runtime().world_size());
  ASSERT_OK(fp32);
  const std::vector<std::pair<std::string, zoe::Config>> configs = {{"fp32", fp32.value()},
                                                                    {"stage3-bf16", stage3_nvme(1 << 20)}};
  for (const auto& [what, cfg] : configs) {
    SCOPED_TRACE(what);
    auto eng = make_engine(cfg, 2);
    ASSERT_TRUE(eng);
    std::string dir = runtime().rank() == 0 ? make_temp_dir(what) : std::string();
    ASSERT_TRUE(runtime().rank() != 0 || !dir.empty());
    std::vector<char> buf(4096, 0);
    dir.copy(buf.data(), buf.size() - 1);
    ASSERT_OK(runtime().broadcast(buf.data(), buf.size(), 0));
    dir = buf.data();
    zoe::Status s = eng->save(dir, "t1", R"({"epoch": 3})");
    ASSERT_OK(s);

    auto r = zoe::CheckpointReader::open(dir);  // the save directory: its latest
    ASSERT_OK(r);
    const zoe::CheckpointReader& reader = *r.value();
    EXPECT_EQ(reader.path(), dir + "/t1");
    EXPECT_EQ(reader.step(), 0);
    EXPECT_EQ(reader.world_size(), runtime().world_size());
    EXPECT_EQ(reader.stage(), cfg.stage());
    EXPECT_NE(reader.trainer_state_json().find("\"epoch\":3"), std::string::npos)
        << reader.trainer_state_json();
    ASSERT_EQ(reader.params().size(), 2 * kSpecs.size());
    for (size_t i = 0; i < reader.params().size(); ++i) {
      const size_t m = i / kSpecs.size(), p = i % kSpecs.size();
      const zoe::CheckpointParam& cp = reader.params()[i];
      EXPECT_EQ(cp.full_name(), "mod." + std::to_string(m) + "." + kSpecs[p].name);
      EXPECT_EQ(cp.shape, kSpecs[p].shape);
      std::vector<float> got(cp.numel, -1.0f);
      s = reader.read_f32(i, got.data());
      ASSERT_OK(s);
      size_t wrong = 0;
      for (size_t k = 0; k < got.size(); ++k) wrong += bits(got[k]) != bits(init_value(m, p, k));
      EXPECT_EQ(wrong, 0u) << cp.full_name();
    }
    EXPECT_EQ(reader.read_f32(reader.params().size(), nullptr).code(), zoe::StatusCode::kInvalidArgument);
    EXPECT_OK(reader.verify());
    eng.reset();
    std::error_code ec;
    if (runtime().rank() == 0) std::filesystem::remove_all(dir, ec);
  }
  auto missing = zoe::CheckpointReader::open("/nonexistent/ckpt");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().to_string().find("/nonexistent/ckpt"), std::string::npos);
}

TEST(Runtime, Collectives) {
  zoe::Runtime& rt = runtime();
  ASSERT_GE(rt.world_size(), 1);
  auto avg = rt.average(static_cast<double>(rt.rank()));
  ASSERT_OK(avg);
  EXPECT_DOUBLE_EQ(avg.value(), (rt.world_size() - 1) / 2.0);
  int64_t v = rt.rank() == 0 ? 42 : -1;
  ASSERT_OK(rt.broadcast(&v, sizeof v, 0));
  EXPECT_EQ(v, 42);
  EXPECT_EQ(rt.broadcast(&v, sizeof v, rt.world_size()).code(), zoe::StatusCode::kInvalidArgument);
  EXPECT_OK(rt.barrier());
  EXPECT_EQ(zoe::parse_bytes("4KiB").value(), 4096u);
}

}  // namespace
