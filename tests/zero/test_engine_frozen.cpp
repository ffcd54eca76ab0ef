// Frozen modules (ModuleOptions::frozen): a model whose first layers are frozen (the larger part)
// and whose last one trains, at stages 0-3 with offload none/cpu/nvme. A frozen module never
// changes, holds no optimizer states or gradient buffers in any tier (the bytes are asserted), is
// refused by grads()/reduce_grads() with its name, and checkpoints bit-identically. The trainable
// layers match, bit for bit, the run where the same layers are ordinary modules that get no
// gradients (which the engine leaves as they are), and the dense reference within tolerance.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "core/dtype.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"
#include "tests/zero/mlp.h"
#include "tests/zero/shared_runtime.h"
#include "zero/engine_internal.h"

namespace zoe {
namespace {

using test::Layer;
using test::MlpSpec;

struct Placement {
  int stage;
  const char* opt;    // offload_optimizer.device
  const char* param;  // offload_param.device (stage 3)
};

std::vector<Placement> placements() {
  return {{0, "none", "none"}, {1, "cpu", "none"}, {2, "nvme", "none"},
          {3, "none", "none"}, {3, "cpu", "cpu"},  {3, "nvme", "nvme"}};
}

std::string describe(const Placement& pl) {
  return "stage " + std::to_string(pl.stage) + " offload_optimizer " + pl.opt + " offload_param " + pl.param;
}

std::string make_config(const Placement& pl, const std::string& nvme, bool bf16 = false) {
  auto off = [&](const char* dev) {
    std::string s = std::string("{\"device\": \"") + dev + "\"";
    if (std::string(dev) == "nvme") s += ", \"nvme_path\": \"" + nvme + "\"";
    return s + "}";
  };
  return std::string("{") + (bf16 ? "\"bf16\": {\"enabled\": true}," : "") +
         "\"train_micro_batch_size_per_gpu\": 4,"
         " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"betas\": [0.9, 0.999],"
         " \"eps\": 1e-8, \"weight_decay\": 0.01}},"
         " \"zero_optimization\": {\"stage\": " +
         std::to_string(pl.stage) +
         ", \"stage3_param_persistence_threshold\": 0, \"offload_optimizer\": " + off(pl.opt) +
         ", \"offload_param\": " + (pl.stage == 3 ? off(pl.param) : "{\"device\": \"none\"}") +
         "}, \"zoe\": {\"device_budget\": \"64MiB\", \"optimizer_threads\": 1}}";
}

// The model: 4 layers of 24 x 24 (+ 24), the first 3 frozen.
MlpSpec spec() {
  MlpSpec s;
  s.layers = 4;
  s.frozen_layers = 3;
  return s;
}

// An engine for `pl`, its modules registered (frozen ones as such when `frozen`), initialized.
struct EngineRun {
  test::ScratchDir nvme{"nvme"};
  std::unique_ptr<Engine> e;
};
Status start(EngineRun* r, const Placement& pl, bool frozen, bool bf16 = false) {
  Runtime& rt = test::shared_runtime();
  ZOE_ASSIGN_OR_RETURN(auto cfg,
                       config::Config::parse(make_config(pl, r->nvme.path(), bf16), rt.world_size()));
  ZOE_ASSIGN_OR_RETURN(r->e, zero::create_engine(rt, cfg));
  return test::register_mlp(*r->e, spec(), frozen);
}

Status train(Engine& e, int steps, std::vector<Layer>* out, int first_step = 0) {
  Runtime& rt = test::shared_runtime();
  return test::engine_train(e, spec(), rt.rank(), rt.world_size(), steps, out, nullptr, -1, 1, first_step);
}

bool identical(const Layer& a, const Layer& b) {
  return a.w.size() == b.w.size() && a.b.size() == b.b.size() &&
         memcmp(a.w.data(), b.w.data(), a.w.size() * 4) == 0 &&
         memcmp(a.b.data(), b.b.data(), a.b.size() * 4) == 0;
}

double max_diff(const Layer& a, const Layer& b) {
  double d = 0;
  for (size_t i = 0; i < a.w.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(a.w[i]) - b.w[i]));
  for (size_t i = 0; i < a.b.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(a.b[i]) - b.b[i]));
  return d;
}

// Elements of one frozen layer: its flat group padded to whole partitions; this rank's share of it.
size_t padded_elems() {
  const size_t unit = 2048 * static_cast<size_t>(test::shared_runtime().world_size());
  const size_t n = 24 * 24 + 24;
  return (n + unit - 1) / unit * unit;
}
size_t owned_elems(int stage) {
  return stage == 0 ? padded_elems()
                    : padded_elems() / static_cast<size_t>(test::shared_runtime().world_size());
}

TEST(FrozenModules, NeverChangeAndTheRestTrainsAsWithoutGradients) {
  const MlpSpec s = spec();
  const std::vector<Layer> init = test::init_layers(s);
  const std::vector<Layer> ref = test::reference_train(s, test::shared_runtime().world_size(), 3);
  for (const Placement& pl : placements()) {
    SCOPED_TRACE(describe(pl));
    EngineRun frozen, plain;
    ASSERT_OK(start(&frozen, pl, true));
    ASSERT_OK(start(&plain, pl, false));
    std::vector<Layer> a, b;
    ASSERT_OK(train(*frozen.e, 3, &a));
    ASSERT_OK(train(*plain.e, 3, &b));
    for (int l = 0; l < s.layers; ++l) {
      SCOPED_TRACE("layer " + std::to_string(l));
      // Frozen layers: their initial values, bit for bit; every layer as in the run without them.
      if (l < s.frozen_layers) {
        EXPECT_TRUE(identical(a[l], init[l]));
      }
      EXPECT_TRUE(identical(a[l], b[l])) << "max difference " << max_diff(a[l], b[l]);
      EXPECT_LT(max_diff(a[l], ref[l]), 2e-4);
    }
    EXPECT_TRUE(frozen.e->module_frozen(0));
    EXPECT_FALSE(frozen.e->module_frozen(3));
  }
}

TEST(FrozenModules, HoldOnlyTheirParameterBytes) {
  const MlpSpec s = spec();
  Runtime& rt = test::shared_runtime();
  const uint64_t w = static_cast<uint64_t>(rt.world_size());
  for (const Placement& pl : placements()) {
    SCOPED_TRACE(describe(pl));
    EngineRun frozen, plain;
    ASSERT_OK(start(&frozen, pl, true));
    ASSERT_OK(start(&plain, pl, false));
    // model_state_bytes: a frozen layer's fp32 master, m, v (16 bytes per element over the owned
    // share) and its fp32 gradients (4 bytes, partitioned from stage 2) are gone; its compute
    // parameters stay.
    const uint64_t nf = static_cast<uint64_t>(s.frozen_layers) * (24 * 24 + 24);
    const uint64_t n = static_cast<uint64_t>(s.layers) * (24 * 24 + 24);
    auto share = [&](uint64_t x, bool partitioned) { return partitioned ? x / w : x; };
    const uint64_t states_drop = (share(n, pl.stage >= 1) - share(n - nf, pl.stage >= 1)) * 12 +
                                 (share(n, pl.stage >= 2) - share(n - nf, pl.stage >= 2)) * 4;
    EXPECT_EQ(plain.e->model_state_bytes() - frozen.e->model_state_bytes(), states_drop);
    if (w == 1) {
      EXPECT_EQ(states_drop, nf * 16);
    }
    // In use: the frozen layers' fp32 master, m, v and gradient accumulator (4 x 4 bytes per owned
    // element) are absent from the tier the optimizer states live in; nothing else differs.
    const uint64_t drop = static_cast<uint64_t>(s.frozen_layers) * owned_elems(pl.stage) * 16;
    const MemoryUse a = frozen.e->memory_in_use(), b = plain.e->memory_in_use();
    const std::string opt = pl.opt;
    EXPECT_EQ(b.device - a.device, opt == "none" ? drop : 0);
    // The swapper's read-ahead slots zoe sizes (offload_optimizer.buffer_count is not given)
    // follow the chunks of a step: the frozen run's may be fewer.
    auto swapper_bytes = [](const BufferSizes& x) {
      return static_cast<uint64_t>(x.swap_buffer_count + x.swap_async_buffers) * x.swap_buffer_bytes;
    };
    const uint64_t fewer = swapper_bytes(plain.e->buffer_sizes()) - swapper_bytes(frozen.e->buffer_sizes());
    EXPECT_EQ(b.host - a.host, (opt == "cpu" ? drop : 0) + fewer);
    EXPECT_EQ(b.nvme - a.nvme, opt == "nvme" ? drop : 0);
    // After training: the same on NVMe; host RAM holds at least as much less (with partitions on
    // NVMe the plain run also keeps the host copies of the partitions its update rewrote).
    std::vector<StepStats> sa, sb;
    std::vector<Layer> la, lb;
    ASSERT_OK(test::engine_train(*frozen.e, s, rt.rank(), rt.world_size(), 2, &la, &sa));
    ASSERT_OK(test::engine_train(*plain.e, s, rt.rank(), rt.world_size(), 2, &lb, &sb));
    const MemoryUse a2 = frozen.e->memory_in_use(), b2 = plain.e->memory_in_use();
    EXPECT_EQ(b2.nvme - a2.nvme, opt == "nvme" ? drop : 0);
    EXPECT_GE(b2.host, a2.host + (opt == "cpu" ? drop : 0));
    EXPECT_EQ(sb.back().high_water[2] - sa.back().high_water[2], opt == "nvme" ? drop : 0);
  }
}

TEST(FrozenModules, GradsAreRefusedByNameAndTheEngineStaysUsable) {
  for (const Placement& pl : {Placement{0, "none", "none"}, Placement{3, "nvme", "nvme"}}) {
    SCOPED_TRACE(describe(pl));
    EngineRun r;
    ASSERT_OK(start(&r, pl, true));
    auto g = r.e->grads(1);
    ASSERT_FALSE(g.is_ok());
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find("layer.1"), std::string::npos) << g.status().to_string();
    EXPECT_NE(g.status().message().find("frozen"), std::string::npos) << g.status().to_string();
    Status rg = r.e->reduce_grads(1);
    EXPECT_EQ(rg.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(rg.message().find("layer.1"), std::string::npos) << rg.to_string();
    Status rf = r.e->reduce_grads(1, {true, true});
    EXPECT_EQ(rf.code(), StatusCode::kInvalidArgument);
    // Still trains as a fresh engine does.
    EngineRun fresh;
    ASSERT_OK(start(&fresh, pl, true));
    std::vector<Layer> a, b;
    ASSERT_OK(train(*r.e, 2, &a));
    ASSERT_OK(train(*fresh.e, 2, &b));
    for (size_t l = 0; l < a.size(); ++l) EXPECT_TRUE(identical(a[l], b[l])) << "layer " << l;
  }
}

TEST(FrozenModules, CheckpointRoundTripIsBitIdentical) {
  Runtime& rt = test::shared_runtime();
  const MlpSpec s = spec();
  for (const Placement& pl : placements()) {
    SCOPED_TRACE(describe(pl));
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(bf16 ? "bf16" : "fp32");
      test::ScratchDir ck("ckpt");
      // One directory for every rank: rank 0's.
      std::string dir = ck.path();
      int64_t len = static_cast<int64_t>(dir.size());
      ASSERT_OK(zero::runtime_comm(rt).broadcast(&len, 1, comm::CommType::kI64, 0).wait());
      dir.resize(static_cast<size_t>(len));
      ASSERT_OK(zero::runtime_comm(rt).broadcast(dir.data(), dir.size(), comm::CommType::kU8, 0).wait());
      EngineRun whole, first, second;
      std::vector<Layer> w3, f2, s3;
      ASSERT_OK(start(&whole, pl, true, bf16));
      ASSERT_OK(train(*whole.e, 3, &w3));
      ASSERT_OK(start(&first, pl, true, bf16));
      ASSERT_OK(train(*first.e, 2, &f2));
      ASSERT_OK(first.e->save(dir, "step-2", "{}"));
      ASSERT_OK(start(&second, pl, true, bf16));
      ASSERT_OK(second.e->load(dir));
      ASSERT_OK(train(*second.e, 3, &s3, 2));
      for (int l = 0; l < s.layers; ++l) EXPECT_TRUE(identical(s3[l], w3[l])) << "layer " << l;
      // bf16 compute: a frozen layer holds its initial values rounded once to bf16.
      const std::vector<Layer> init = test::init_layers(s);
      for (int l = 0; l < s.frozen_layers; ++l) {
        Layer want = init[l];
        for (auto* v : {&want.w, &want.b}) {
          for (float& x : *v) x = bf16 ? bf16_to_f32(f32_to_bf16(x)) : x;
        }
        EXPECT_TRUE(identical(s3[l], want)) << "layer " << l;
      }
      // The checkpoint: a frozen layer has its parameters and fp32 values, no m and v.
      if (rt.rank() == 0) {
        auto rd = ckpt::Reader::open(dir);
        ASSERT_OK(rd);
        ASSERT_OK(rd.value()->check_complete());
        const ckpt::Manifest& man = rd.value()->manifest();
        for (const auto& t : man.tensors) {
          const bool frz = t.module < static_cast<uint32_t>(s.frozen_layers);
          if (frz) {
            EXPECT_TRUE(t.kind == "param" || t.kind == "master") << t.module << " " << t.kind;
          }
        }
        for (int l = 0; l < s.layers; ++l) EXPECT_EQ(man.modules[l].frozen, l < s.frozen_layers);
        std::vector<float> m0(24 * 24);
        ASSERT_OK(rd.value()->read_range(0, "master", 0, m0.size(), "f32", m0.data()));
        Layer want = init[0];
        for (float& x : want.w) x = bf16 ? bf16_to_f32(f32_to_bf16(x)) : x;
        EXPECT_EQ(memcmp(m0.data(), want.w.data(), m0.size() * 4), 0);
      }
      // The same checkpoint loads into the model with those layers trainable (m and v at zero).
      EngineRun thawed;
      ASSERT_OK(start(&thawed, pl, false, bf16));
      ASSERT_OK(thawed.e->load(dir));
      std::vector<float> w0(24 * 24);
      ASSERT_OK(thawed.e->read_master(0, 0, w0.data()));
      EXPECT_EQ(memcmp(w0.data(), s3[0].w.data(), w0.size() * 4), 0);
      ASSERT_OK(zero::runtime_comm(rt).barrier());
    }
  }
}

// Saved at one world size, loaded at another (the ctest pairs reshard_frozen_*): every value comes
// back exactly, and training goes on.
TEST(FrozenModules, Reshard) {
  const char* dir = getenv("ZOE_RESHARD_DIR");
  const char* role = getenv("ZOE_RESHARD_ROLE");
  if (!dir || !role) GTEST_SKIP() << "run by the reshard_frozen ctest pairs";
  Runtime& rt = test::shared_runtime();
  const MlpSpec s = spec();
  EngineRun r;
  ASSERT_OK(start(&r, {3, "cpu", "nvme"}, true, /*bf16=*/true));
  const std::string values = std::string(dir) + "/master-values.bin";
  const size_t per_layer = static_cast<size_t>(s.d * s.d + s.d);
  if (std::string(role) == "save") {
    std::filesystem::create_directories(dir);
    std::vector<Layer> out;
    ASSERT_OK(train(*r.e, 2, &out));
    ASSERT_OK(r.e->save(dir, "step-2", "{}"));
    if (rt.rank() == 0) {
      FILE* f = fopen(values.c_str(), "wb");
      ASSERT_NE(f, nullptr);
      for (const auto& l : out) {
        fwrite(l.w.data(), 4, l.w.size(), f);
        fwrite(l.b.data(), 4, l.b.size(), f);
      }
      fclose(f);
    }
    return;
  }
  ASSERT_OK(r.e->load(dir));
  std::vector<float> want(static_cast<size_t>(s.layers) * per_layer);
  FILE* f = fopen(values.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(fread(want.data(), 4, want.size(), f), want.size());
  fclose(f);
  for (int l = 0; l < s.layers; ++l) {
    std::vector<float> got(per_layer);
    ASSERT_OK(r.e->read_master(static_cast<size_t>(l), 0, got.data()));
    ASSERT_OK(r.e->read_master(static_cast<size_t>(l), 1, got.data() + s.d * s.d));
    EXPECT_EQ(memcmp(got.data(), want.data() + l * per_layer, per_layer * 4), 0) << "layer " << l;
  }
  std::vector<Layer> out;
  ASSERT_OK(train(*r.e, 3, &out, 2));
  for (int l = 0; l < s.frozen_layers; ++l)
    EXPECT_EQ(memcmp(out[l].w.data(), want.data() + l * per_layer, out[l].w.size() * 4), 0) << "layer " << l;
}

}  // namespace
}  // namespace zoe
