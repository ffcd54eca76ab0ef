// Low-bit optimizer states (zoe.optimizer_states "int8"/"int4", optim/lowbit.h) and a bf16 master
// (zoe.master_weights "bf16") through the engine, at this process's world size (1 here, 2 and 4 under
// mpirun): every tier (device, host RAM, NVMe, a partial offload streaming several chunks per
// module) gives the bits of the no-offload run of the same stage; the result stays near the
// dense fp32 reference and differs from the fp32-state run (the format is in use); a step without
// gradients leaves a module as it was; the stored bytes shrink by the format's ratio; the keys
// parse, alias and refuse as documented.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"
#include "tests/zero/mlp.h"
#include "tests/zero/rank0_dir.h"
#include "tests/zero/shared_runtime.h"
#include "zero/engine_internal.h"

namespace zoe {
namespace {

using test::identical;
using test::Layer;
using test::MlpSpec;
using test::rank0_dir;

struct Placement {
  int stage;
  const char* opt;    // offload_optimizer.device
  const char* param;  // offload_param.device (stage 3)
  const char* ratio = "1";
};

struct Format {
  const char* states;
  const char* master;
};

std::string describe(const Placement& pl, const Format& f) {
  return std::string(f.states) + " states, " + f.master + " master, stage " + std::to_string(pl.stage) +
         " offload_optimizer " + pl.opt + " x" + pl.ratio + " offload_param " + pl.param;
}

std::string make_config(const Placement& pl, const Format& f, const std::string& nvme, bool bf16,
                        const std::string& extra_zoe = "") {
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
         ", \"stage3_param_persistence_threshold\": 0, \"sub_group_size\": 16384, \"offload_optimizer\": " +
         off(pl.opt) + ", \"offload_param\": " + (pl.stage == 3 ? off(pl.param) : "{\"device\": \"none\"}") +
         "}, \"zoe\": {\"device_budget\": \"64MiB\", \"optimizer_threads\": 1, \"offload_ratio\": " +
         pl.ratio + ", \"optimizer_states\": \"" + f.states + "\", \"master_weights\": \"" + f.master + "\"" +
         extra_zoe + "}}";
}

Result<std::unique_ptr<Engine>> make_engine(const Placement& pl, const Format& f, const std::string& nvme,
                                            const MlpSpec& s, bool bf16, const std::string& extra_zoe = "") {
  Runtime& rt = test::shared_runtime();
  ZOE_ASSIGN_OR_RETURN(auto cfg,
                       config::Config::parse(make_config(pl, f, nvme, bf16, extra_zoe), rt.world_size()));
  ZOE_ASSIGN_OR_RETURN(auto e, zero::create_engine(rt, cfg));
  ZOE_RETURN_IF_ERROR(test::register_mlp(*e, s));
  return e;
}

Result<std::vector<Layer>> run(const Placement& pl, const Format& f, const MlpSpec& s, int steps, bool bf16,
                               const std::string& extra_zoe = "") {
  Runtime& rt = test::shared_runtime();
  test::ScratchDir nvme("nvme");
  ZOE_ASSIGN_OR_RETURN(auto e, make_engine(pl, f, nvme.path(), s, bf16, extra_zoe));
  std::vector<Layer> out;
  ZOE_RETURN_IF_ERROR(test::engine_train(*e, s, rt.rank(), rt.world_size(), steps, &out));
  return out;
}

// The largest and the mean absolute difference.
std::pair<double, double> diff(const std::vector<Layer>& a, const std::vector<Layer>& b) {
  double d = 0, sum = 0;
  size_t n = 0;
  for (size_t l = 0; l < a.size(); ++l) {
    for (int which = 0; which < 2; ++which) {
      const auto& x = which ? a[l].b : a[l].w;
      const auto& y = which ? b[l].b : b[l].w;
      for (size_t i = 0; i < x.size(); ++i, ++n) {
        const double e = std::fabs(static_cast<double>(x[i]) - y[i]);
        d = std::max(d, e);
        sum += e;
      }
    }
  }
  return {d, sum / static_cast<double>(std::max<size_t>(n, 1))};
}

const Format kFormats[] = {{"int8", "fp32"}, {"int8", "bf16"}, {"int4", "bf16"}, {"fp32", "bf16"}};

std::vector<Placement> placements() {
  return {{0, "none", "none"},        {1, "none", "none"}, {1, "cpu", "none"}, {2, "nvme", "none"},
          {2, "nvme", "none", "0.5"}, {3, "none", "none"}, {3, "cpu", "cpu"},  {3, "nvme", "nvme"}};
}

TEST(LowbitEngine, EveryTierGivesTheNoOffloadBitsNearTheReference) {
  Runtime& rt = test::shared_runtime();
  MlpSpec s;
  s.d = 200;  // 40,200 elements a layer: several swapper chunks (sub_group_size 16384) and blocks
  const int steps = 3;
  const auto ref = test::reference_train(s, rt.world_size(), steps);
  for (bool bf16 : {false, true}) {
    std::map<int, std::vector<Layer>> fp32_states;
    for (int st : {0, 1, 2, 3}) {
      auto r = run({st, "none", "none"}, {"fp32", "fp32"}, s, steps, bf16);
      ASSERT_OK(r);
      fp32_states[st] = r.value();
    }
    for (const Format& f : kFormats) {
      std::map<int, std::vector<Layer>> base;
      for (const Placement& pl : placements()) {
        SCOPED_TRACE(describe(pl, f) + (bf16 ? ", bf16 compute" : ", fp32 compute"));
        auto r = run(pl, f, s, steps, bf16);
        ASSERT_OK(r);
        if (!base.count(pl.stage)) {
          base[pl.stage] = r.value();
          // The format is in use: not the fp32-state bits, but near the dense fp32 reference. Adam
          // moves an element by about lr a step; 16-bit compute can flip the sign of a tiny
          // gradient's step (2 lr), and a v quantized at the bottom of its block's range can double
          // a step (2309.01507 sec. 4): a bound of 4 lr a step on the largest difference, and the
          // mean difference stays small.
          EXPECT_FALSE(identical(r.value(), fp32_states[pl.stage]));
          const auto [dmax, dmean] = diff(r.value(), ref);
          EXPECT_LE(dmax, 4 * 0.01 * steps + 1e-3);
          EXPECT_LE(dmean, 4e-3);
        } else {
          EXPECT_TRUE(identical(r.value(), base[pl.stage])) << "differs from the no-offload run";
        }
      }
    }
  }
}

TEST(LowbitEngine, OverlappedAndSerialUpdatesGiveTheSameBits) {
  MlpSpec s;
  s.d = 64;
  for (const Format& f : {Format{"int8", "bf16"}, Format{"int4", "bf16"}}) {
    for (const Placement& pl : {Placement{2, "cpu", "none"}, Placement{3, "nvme", "nvme"}}) {
      SCOPED_TRACE(describe(pl, f));
      auto a = run(pl, f, s, 3, true, ", \"overlap_step\": true");
      auto b = run(pl, f, s, 3, true, ", \"overlap_step\": false");
      ASSERT_OK(a);
      ASSERT_OK(b);
      EXPECT_TRUE(identical(a.value(), b.value()));
    }
  }
}

TEST(LowbitEngine, AStepWithoutGradientsLeavesTheModuleAsItWas) {
  // engine_train gives the first layer no gradients at step no_grads_at: the engine leaves it as
  // it is (no moment update, no decay), as torch.optim.AdamW leaves a parameter whose .grad is None.
  Runtime& rt = test::shared_runtime();
  MlpSpec s;
  for (const Format& f : {Format{"int8", "bf16"}, Format{"int4", "fp32"}}) {
    for (const Placement& pl : {Placement{1, "cpu", "none"}, Placement{3, "nvme", "nvme"}}) {
      SCOPED_TRACE(describe(pl, f));
      auto one = run(pl, f, s, 1, false);
      ASSERT_OK(one);
      MlpSpec skip = s;
      skip.no_grads_at = 1;
      auto two = run(pl, f, skip, 2, false);
      ASSERT_OK(two);
      EXPECT_EQ(memcmp(one.value()[0].w.data(), two.value()[0].w.data(), one.value()[0].w.size() * 4), 0);
      EXPECT_FALSE(identical({one.value()[1]}, {two.value()[1]}));  // the other layers trained
    }
  }
  (void)rt;
}

TEST(LowbitEngine, AModuleThatSatOutAStepCountsItsOwnSteps) {
  // The first layer gets no gradients at step 1 of 0-3; afterwards its AdamW bias correction counts
  // its own updates (one fewer than the engine's), as with fp32 states: the low-bit run stays as
  // close to the fp32-state run on that layer as on the others. Measured (mean |int8 - fp32|): the
  // layer 3.8e-5, the others up to 2.1e-4; counting the engine's steps there gives 1.2e-3 (lr 0.01).
  MlpSpec s;
  s.no_grads_at = 1;
  for (const Placement& pl : {Placement{1, "cpu", "none"}, Placement{3, "nvme", "nvme"}}) {
    SCOPED_TRACE(describe(pl, {"int8", "fp32"}));
    auto low = run(pl, {"int8", "fp32"}, s, 4, false);
    auto full = run(pl, {"fp32", "fp32"}, s, 4, false);
    ASSERT_OK(low);
    ASSERT_OK(full);
    std::vector<double> mean(low.value().size());
    for (size_t l = 0; l < mean.size(); ++l) mean[l] = diff({low.value()[l]}, {full.value()[l]}).second;
    const double others = *std::max_element(mean.begin() + 1, mean.end());
    EXPECT_LE(mean[0], 4e-4) << "layer 0 " << mean[0] << ", the others up to " << others;
  }
}

TEST(LowbitEngine, StoredBytesShrinkByTheFormat) {
  // Host RAM holds the optimizer states with offload_optimizer cpu: master + m + v + fp32
  // gradient sums per element, 16 bytes in fp32, 2 + 1.015625 x 2 + 4 in int8 with a bf16 master.
  MlpSpec s;
  s.d = 256;
  test::ScratchDir nvme("nvme");
  auto fp32 = make_engine({1, "cpu", "none"}, {"fp32", "fp32"}, nvme.path(), s, true);
  auto int8 = make_engine({1, "cpu", "none"}, {"int8", "bf16"}, nvme.path(), s, true);
  ASSERT_OK(fp32);
  ASSERT_OK(int8);
  EXPECT_EQ(fp32.value()->optimizer_state_bytes_per_param(), 12.0);
  EXPECT_EQ(int8.value()->optimizer_state_bytes_per_param(), 2.0 + 2 * 260.0 / 256);
  EXPECT_EQ(int8.value()->optimizer_states(), "int8");
  EXPECT_EQ(int8.value()->master_weights(), "bf16");
  EXPECT_LT(int8.value()->model_state_bytes(), fp32.value()->model_state_bytes());
}

TEST(LowbitEngine, ABf16MasterWithBf16ComputeIsStoredOnce) {
  // On a host-memory device the bf16 master is the compute copy's owned range: NVMe holds no master
  // beside it, 4 bytes per owned element fewer than with an fp32 master.
  Runtime& rt = test::shared_runtime();
  MlpSpec s;
  s.d = 64;
  uint64_t state_bytes[2] = {0, 0};  // model_state_bytes(): fp32 master, bf16 master
  auto nvme_high_water = [&](const Format& f, const std::string& extra) -> uint64_t {
    test::ScratchDir nv("nvme");
    auto e = make_engine({3, "nvme", "nvme"}, f, nv.path(), s, true, extra);
    EXPECT_OK(e);
    if (!e.is_ok()) return 0;
    state_bytes[std::string(f.master) == "bf16"] = e.value()->model_state_bytes();
    std::vector<Layer> out;
    std::vector<StepStats> stats;
    EXPECT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 2, &out, &stats));
    return stats.empty() ? 0 : stats.back().high_water[2];
  };
  const uint64_t fp32_master = nvme_high_water({"int8", "fp32"}, "");
  const uint64_t once = nvme_high_water({"int8", "bf16"}, "");
  const size_t unit = 2048 * static_cast<size_t>(rt.world_size()), n = 64 * 64 + 64;
  const size_t owned = 3 * ((n + unit - 1) / unit * unit) / static_cast<size_t>(rt.world_size());
  EXPECT_GE(fp32_master - once, 4 * owned * 9 / 10) << fp32_master << " vs " << once;
  // model_state_bytes() counts the master once too: 4 bytes per trained element fewer (stage 3:
  // this rank's share), not 2 (a bf16 master beside the compute copy).
  const uint64_t trained = 3 * n / static_cast<uint64_t>(rt.world_size());
  EXPECT_EQ(state_bytes[0] - state_bytes[1], 4 * trained) << state_bytes[0] << " vs " << state_bytes[1];
}

TEST(LowbitCheckpoint, ResumeIsBitIdenticalAndStoresThePackedStates) {
  Runtime& rt = test::shared_runtime();
  MlpSpec s;
  s.d = 64;
  for (const Format& f : {Format{"int8", "bf16"}, Format{"int4", "fp32"}}) {
    for (const Placement& pl :
         {Placement{0, "none", "none"}, Placement{2, "cpu", "none"}, Placement{3, "nvme", "nvme"}}) {
      SCOPED_TRACE(describe(pl, f));
      test::ScratchDir nv("nvme"), ck("ckpt");
      const std::string dir = rank0_dir(ck.path());
      std::vector<Layer> whole, first, second;
      {
        auto e = make_engine(pl, f, nv.path(), s, true);
        ASSERT_OK(e);
        ASSERT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 3, &whole));
      }
      {
        auto e = make_engine(pl, f, nv.path(), s, true);
        ASSERT_OK(e);
        ASSERT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 2, &first));
        ASSERT_OK(e.value()->save(dir, "step-2", "{}"));
      }
      auto e = make_engine(pl, f, nv.path(), s, true);
      ASSERT_OK(e);
      ASSERT_OK(e.value()->load(dir));
      ASSERT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 3, &second, nullptr, -1, 1, 2));
      EXPECT_TRUE(identical(second, whole));
      if (rt.rank() == 0) {
        auto rd = ckpt::Reader::open(dir);
        ASSERT_OK(rd);
        const std::string packed = std::string(f.states) == "int8" ? "int8b256" : "int4b128";
        size_t moments = 0;
        for (const auto& t : rd.value()->manifest().tensors) {
          if (t.kind == "exp_avg" || t.kind == "exp_avg_sq") {
            EXPECT_EQ(t.dtype, packed);
            moments++;
          }
          if (t.kind == "master") EXPECT_EQ(t.dtype, std::string(f.master) == "bf16" ? "bf16" : "f32");
        }
        EXPECT_GT(moments, 0u);
      }
      ASSERT_OK(zero::runtime_comm(rt).barrier());
    }
  }
}

TEST(LowbitCheckpoint, LoadsIntoAnotherFormat) {
  // An fp32-state checkpoint resumes with int8 states (quantized as they load) and back; the
  // master comes back exactly where both masters are fp32.
  Runtime& rt = test::shared_runtime();
  MlpSpec s;
  const Placement pl{1, "cpu", "none"};
  for (const auto& [from, to] : {std::pair<Format, Format>{{"fp32", "fp32"}, {"int8", "fp32"}},
                                 std::pair<Format, Format>{{"int4", "fp32"}, {"fp32", "fp32"}}}) {
    SCOPED_TRACE(std::string(from.states) + " -> " + to.states);
    test::ScratchDir nv("nvme"), ck("ckpt");
    const std::string dir = rank0_dir(ck.path());
    std::vector<Layer> out;
    auto a = make_engine(pl, from, nv.path(), s, false);
    ASSERT_OK(a);
    ASSERT_OK(test::engine_train(*a.value(), s, rt.rank(), rt.world_size(), 2, &out));
    ASSERT_OK(a.value()->save(dir, "step-2", "{}"));
    auto b = make_engine(pl, to, nv.path(), s, false);
    ASSERT_OK(b);
    ASSERT_OK(b.value()->load(dir));
    std::vector<float> w(static_cast<size_t>(s.d * s.d));
    ASSERT_OK(b.value()->read_master(0, 0, w.data()));
    EXPECT_EQ(memcmp(w.data(), out[0].w.data(), w.size() * 4), 0);
    std::vector<Layer> more;
    ASSERT_OK(test::engine_train(*b.value(), s, rt.rank(), rt.world_size(), 3, &more, nullptr, -1, 1, 2));
    ASSERT_OK(zero::runtime_comm(rt).barrier());
  }
}

// Saved at one world size, loaded at another (the ctest pairs reshard_lowbit_*): the master and the
// packed m and v come back bit for bit (saved again after the load, they are the same bytes).
TEST(LowbitCheckpoint, Reshard) {
  const char* dir = getenv("ZOE_RESHARD_DIR");
  const char* role = getenv("ZOE_RESHARD_ROLE");
  if (!dir || !role) GTEST_SKIP() << "run by the reshard_lowbit ctest pairs";
  Runtime& rt = test::shared_runtime();
  MlpSpec s;
  s.d = 64;
  test::ScratchDir nv("nvme");
  auto e = make_engine({3, "cpu", "nvme"}, {"int8", "bf16"}, nv.path(), s, true);
  ASSERT_OK(e);
  const std::string first = std::string(dir) + "/first", again = std::string(dir) + "/again";
  std::filesystem::create_directories(first);
  std::filesystem::create_directories(again);
  ASSERT_OK(zero::runtime_comm(rt).barrier());
  if (std::string(role) == "save") {
    std::vector<Layer> out;
    ASSERT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 2, &out));
    ASSERT_OK(e.value()->save(first, "step-2", "{}"));
    return;
  }
  ASSERT_OK(e.value()->load(first));
  ASSERT_OK(e.value()->save(again, "step-2", "{}"));
  if (rt.rank() != 0) return;
  auto a = ckpt::Reader::open(first);
  auto b = ckpt::Reader::open(again);
  ASSERT_OK(a);
  ASSERT_OK(b);
  for (uint32_t m = 0; m < static_cast<uint32_t>(s.layers); ++m) {
    // Both checkpoints' padded range (whole blocks; the padding holds zeros).
    const uint64_t n =
        std::min(a.value()->manifest().modules[m].padded, b.value()->manifest().modules[m].padded);
    for (const auto& [kind, dtype] : {std::pair<const char*, const char*>{"master", "bf16"},
                                      {"exp_avg", "int8b256"},
                                      {"exp_avg_sq", "int8b256"}}) {
      const size_t bytes = ckpt::tensor_bytes(dtype, n);
      std::vector<uint8_t> x(bytes), y(bytes);
      ASSERT_OK(a.value()->read_range(m, kind, 0, n, dtype, x.data()));
      ASSERT_OK(b.value()->read_range(m, kind, 0, n, dtype, y.data()));
      EXPECT_EQ(x, y) << "module " << m << " " << kind;
    }
  }
}

TEST(LowbitConfig, KeysAliasAndRefusals) {
  auto parse = [](const std::string& zoe_keys) {
    return config::Config::parse("{\"train_batch_size\": 1, \"zoe\": {" + zoe_keys + "}}", 1);
  };
  auto c = parse("");
  ASSERT_OK(c);
  EXPECT_EQ(c.value().zoe.optimizer_states, "fp32");
  EXPECT_EQ(c.value().zoe.master_weights, "fp32");
  c = parse("\"bf16_optimizer_states\": true");
  ASSERT_OK(c);
  EXPECT_EQ(c.value().zoe.optimizer_states, "bf16");  // the older spelling
  // Written back once, as zoe.optimizer_states, and read back the same.
  const std::string text = c.value().to_json();
  EXPECT_EQ(text.find("bf16_optimizer_states"), std::string::npos) << text;
  auto again = config::Config::parse(text, 1);
  ASSERT_OK(again);
  EXPECT_EQ(again.value().zoe.optimizer_states, "bf16");
  c = parse("\"optimizer_states\": \"int4\", \"master_weights\": \"bf16\"");
  ASSERT_OK(c);
  EXPECT_EQ(c.value().zoe.optimizer_states, "int4");
  EXPECT_EQ(c.value().zoe.master_weights, "bf16");
  struct Bad {
    const char* keys;
    const char* says;
  };
  for (const Bad& b : {Bad{"\"bf16_optimizer_states\": true, \"optimizer_states\": \"int8\"", "disagree"},
                       Bad{"\"master_weights\": \"fp16\"", "zoe.master_weights: \"fp16\" is refused"},
                       Bad{"\"optimizer_states\": \"int2\"", "zoe.optimizer_states"},
                       Bad{"\"optimizer_states\": \"fp16\"", "zoe.optimizer_states: \"fp16\" is refused"}}) {
    auto r = parse(b.keys);
    ASSERT_FALSE(r.is_ok()) << b.keys;
    EXPECT_NE(r.status().message().find(b.says), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace zoe
