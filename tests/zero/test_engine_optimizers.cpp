// Lion and Adagrad (optimizer.type "Lion", "Adagrad") through the engine, at this process's world
// size (1 here, 2 under mpirun): every tier (device, host RAM, NVMe, a partial offload, several
// swapper chunks per module) gives the bits of a plain reference loop of the same optimizer
// (optim/lion_adagrad_reference.h) over the same gradients, so every tier gives the no-offload
// run's bits; fp32 and bf16 states; bf16 compute gives one set of bits in every tier; overlapped,
// speculative and serial updates agree; a step without gradients leaves a module as it was; the
// states take one buffer, not AdamW's two; a checkpoint resumes bit for bit, records its optimizer
// and is refused by an engine that runs another one.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "core/dtype.h"
#include "optim/lion_adagrad_reference.h"
#include "optim/lowbit.h"
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

struct Recipe {
  const char* type;         // optimizer.type
  const char* states;       // zoe.optimizer_states
  bool bf16 = false;        // compute dtype
  std::string extra_zoe{};  // more zoe.* keys
};

std::string describe(const Placement& pl, const Recipe& r) {
  return std::string(r.type) + ", " + r.states + " states, " + (r.bf16 ? "bf16" : "fp32") +
         " compute, stage " + std::to_string(pl.stage) + " offload_optimizer " + pl.opt + " x" + pl.ratio +
         " offload_param " + pl.param + r.extra_zoe;
}

// The MLP's hyperparameters as each optimizer's DeepSpeed params.
std::string params_json(std::string type, const MlpSpec& s) {
  for (char& c : type) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string lr = "\"lr\": " + std::to_string(s.lr), wd = "\"weight_decay\": " + std::to_string(s.wd);
  if (type == "lion")
    return "{" + lr + ", \"betas\": [" + std::to_string(s.beta1) + ", " + std::to_string(s.beta2) + "], " +
           wd + "}";
  if (type == "adagrad") return "{" + lr + ", \"eps\": 1e-8, " + wd + "}";
  return "{" + lr + ", \"betas\": [0.9, 0.999], \"eps\": 1e-8, " + wd + "}";
}

std::string make_config(const Placement& pl, const Recipe& r, const std::string& nvme, const MlpSpec& s) {
  auto off = [&](const char* dev) {
    std::string j = std::string("{\"device\": \"") + dev + "\"";
    if (std::string(dev) == "nvme") j += ", \"nvme_path\": \"" + nvme + "\"";
    return j + "}";
  };
  return std::string("{") + (r.bf16 ? "\"bf16\": {\"enabled\": true}," : "") +
         "\"train_micro_batch_size_per_gpu\": 4, \"optimizer\": {\"type\": \"" + r.type +
         "\", \"params\": " + params_json(r.type, s) +
         "}, \"zero_optimization\": {\"stage\": " + std::to_string(pl.stage) +
         ", \"stage3_param_persistence_threshold\": 0, \"sub_group_size\": 16384, \"offload_optimizer\": " +
         off(pl.opt) + ", \"offload_param\": " + (pl.stage == 3 ? off(pl.param) : "{\"device\": \"none\"}") +
         "}, \"zoe\": {\"device_budget\": \"64MiB\", \"optimizer_threads\": 1, \"offload_ratio\": " +
         pl.ratio + ", \"optimizer_states\": \"" + r.states + "\"" + r.extra_zoe + "}}";
}

Result<std::unique_ptr<Engine>> make_engine(const Placement& pl, const Recipe& r, const std::string& nvme,
                                            const MlpSpec& s) {
  Runtime& rt = test::shared_runtime();
  ZOE_ASSIGN_OR_RETURN(auto cfg, config::Config::parse(make_config(pl, r, nvme, s), rt.world_size()));
  ZOE_ASSIGN_OR_RETURN(auto e, zero::create_engine(rt, cfg));
  ZOE_RETURN_IF_ERROR(test::register_mlp(*e, s));
  return e;
}

Result<std::vector<Layer>> train(const Placement& pl, const Recipe& r, const MlpSpec& s, int steps) {
  Runtime& rt = test::shared_runtime();
  test::ScratchDir nvme("nvme");
  ZOE_ASSIGN_OR_RETURN(auto e, make_engine(pl, r, nvme.path(), s));
  std::vector<Layer> out;
  ZOE_RETURN_IF_ERROR(test::engine_train(*e, s, rt.rank(), rt.world_size(), steps, &out));
  return out;
}

// The plain loop: each rank's mean gradient over its samples (as engine_train computes it), summed
// over the ranks in rank order and scaled by 1/world inside the update (the engine's step scale),
// then optim::ref's Lion or Adagrad on each parameter, states in `states` ("fp32" or "bf16").
std::vector<Layer> reference_train(const MlpSpec& s, const std::string& type, const std::string& states,
                                   int world, int steps) {
  const bool lion = type == "Lion";
  const DType sdt = states == "bf16" ? DType::kBF16 : DType::kF32;
  std::vector<Layer> L = test::init_layers(s);
  // One state per parameter tensor, zero bytes (zero in both dtypes).
  std::vector<std::vector<float>> st;
  for (const Layer& l : L) {
    st.emplace_back(l.w.size(), 0.0f);
    st.emplace_back(l.b.size(), 0.0f);
  }
  for (int k = 0; k < steps; ++k) {
    const std::vector<Layer> g = test::rank_summed_grads(s, L, k, world);
    optim::AdamStep as;
    as.step = k + 1;
    as.grad_scale = static_cast<float>(1.0 / world);
    for (size_t l = 0; l < L.size(); ++l) {
      for (int which = 0; which < 2; ++which) {
        std::vector<float>& p = which ? L[l].b : L[l].w;
        optim::OneStateBuffers b;
        b.n = p.size();
        b.param = p.data();
        b.grad = which ? g[l].b.data() : g[l].w.data();
        b.state = st[2 * l + static_cast<size_t>(which)].data();
        b.state_dtype = sdt;
        Status ok;
        if (lion) {
          optim::LionParams lp;
          lp.lr = s.lr;
          lp.beta1 = s.beta1;
          lp.beta2 = s.beta2;
          lp.weight_decay = s.wd;
          ok = optim::ref::lion_step(optim::LionArgs{b, lp, as});
        } else {
          optim::AdagradParams gp;
          gp.lr = s.lr;
          gp.eps = 1e-8f;
          gp.weight_decay = s.wd;
          ok = optim::ref::adagrad_step(optim::AdagradArgs{b, gp, as});
        }
        EXPECT_OK(ok);
      }
    }
  }
  return L;
}

MlpSpec lion_spec() {
  MlpSpec s;
  s.d = 200;  // 40,200 elements a layer: several swapper chunks (sub_group_size 16384)
  s.lr = 1e-3f;
  s.beta2 = 0.99f;
  return s;
}

std::vector<Placement> all_placements() {
  std::vector<Placement> v;
  for (const auto& m : test::matrix_placements()) v.push_back({m.stage, m.opt, m.param});
  v.push_back({2, "nvme", "none", "0.5"});  // partial offload: the first half on NVMe
  v.push_back({3, "cpu", "nvme", "0.5"});
  return v;
}

TEST(OptimizerEngine, EveryTierGivesTheReferenceBits) {
  Runtime& rt = test::shared_runtime();
  const MlpSpec s = lion_spec();
  const int steps = 3;
  for (const char* type : {"Lion", "Adagrad"}) {
    for (const char* states : {"fp32", "bf16"}) {
      const auto ref = reference_train(s, type, states, rt.world_size(), steps);
      std::vector<Layer> none;
      for (const Placement& pl : all_placements()) {
        if (std::string(states) == "bf16" && pl.stage != 0 && std::string(pl.opt) == "none") continue;
        const Recipe r{type, states};
        SCOPED_TRACE(describe(pl, r));
        auto got = train(pl, r, s, steps);
        ASSERT_OK(got);
        EXPECT_TRUE(identical(got.value(), ref)) << "differs from the reference loop";
        if (pl.stage == 0) none = got.value();
        EXPECT_TRUE(identical(got.value(), none)) << "differs from the no-offload run";
      }
    }
  }
}

TEST(OptimizerEngine, Bf16ComputeGivesOneSetOfBitsInEveryTier) {
  MlpSpec s = lion_spec();
  s.d = 64;
  for (const char* type : {"Lion", "Adagrad"}) {
    std::map<int, std::vector<Layer>> base;
    for (const Placement& pl : all_placements()) {
      const Recipe r{type, "fp32", true};
      SCOPED_TRACE(describe(pl, r));
      auto got = train(pl, r, s, 3);
      ASSERT_OK(got);
      // Stage 0 computes with the whole module on every rank; stages 1-3 reduce the same way.
      const int key = pl.stage == 0 ? 0 : 1;
      if (!base.count(key)) base[key] = got.value();
      EXPECT_TRUE(identical(got.value(), base[key])) << "differs from the first run of its kind";
    }
  }
}

TEST(OptimizerEngine, OverlappedSpeculativeAndSerialUpdatesGiveTheSameBits) {
  MlpSpec s = lion_spec();
  s.d = 64;
  for (const char* type : {"Lion", "Adagrad"}) {
    for (const Placement& pl : {Placement{2, "cpu", "none"}, Placement{3, "nvme", "nvme"}}) {
      const Recipe serial{type, "fp32", true, ", \"overlap_step\": false"};
      auto a = train(pl, serial, s, 3);
      ASSERT_OK(a);
      for (const char* extra : {", \"overlap_step\": true", ", \"speculative_step\": true"}) {
        const Recipe r{type, "fp32", true, extra};
        SCOPED_TRACE(describe(pl, r));
        auto b = train(pl, r, s, 3);
        ASSERT_OK(b);
        EXPECT_TRUE(identical(a.value(), b.value()));
      }
    }
  }
}

TEST(OptimizerEngine, AStepWithoutGradientsLeavesTheModuleAsItWas) {
  // engine_train gives the first layer no gradients at step no_grads_at: its master and state stay
  // as they were (no decay, no momentum step), as lion-pytorch and torch.optim.Adagrad leave a
  // parameter whose .grad is None; the step after continues from them.
  MlpSpec s = lion_spec();
  s.d = 64;
  for (const auto& [type, states] : {std::pair{"Lion", "fp32"}, std::pair{"Adagrad", "fp32"},
                                     std::pair{"Lion", "int8"}, std::pair{"Adagrad", "int4"}}) {
    for (const Placement& pl :
         {Placement{1, "cpu", "none"}, Placement{3, "nvme", "nvme"}, Placement{2, "cpu", "none"}}) {
      const bool spec = pl.stage == 2;
      const Recipe r{type, states, false, spec ? ", \"speculative_step\": true" : ""};
      SCOPED_TRACE(describe(pl, r));
      auto one = train(pl, r, s, 1);
      ASSERT_OK(one);
      MlpSpec skip = s;
      skip.no_grads_at = 1;
      auto two = train(pl, r, skip, 2);
      ASSERT_OK(two);
      EXPECT_EQ(memcmp(one.value()[0].w.data(), two.value()[0].w.data(), one.value()[0].w.size() * 4), 0);
      EXPECT_FALSE(identical({one.value()[1]}, {two.value()[1]}));  // the other layers trained
    }
  }
}

// The plain loop with packed states (int8/int4): each layer's module as the engine lays it out
// ([w; b] flat, so the quantization blocks fall where the engine's do at any world size: partitions
// and chunks are multiples of the block), its state decoded, optim::ref's update over the whole
// module, encoded again; Lion's m with the signed map, Adagrad's sum with v's (>= 0, never zero where
// it is not: optim/lowbit.h).
std::vector<Layer> packed_reference(const MlpSpec& s, const std::string& type, optim::StateFormat f,
                                    int world, int steps) {
  const bool lion = type == "Lion";
  const auto kind = lion ? optim::StateKind::kExpAvg : optim::StateKind::kExpAvgSq;
  std::vector<Layer> L = test::init_layers(s);
  const size_t nw = L[0].w.size(), n = nw + L[0].b.size();
  std::vector<std::vector<char>> packed(L.size(), std::vector<char>(optim::state_bytes(f, n), 0));
  std::vector<float> p(n), g(n), st(n);
  for (int k = 0; k < steps; ++k) {
    const std::vector<Layer> gr = test::rank_summed_grads(s, L, k, world);
    optim::AdamStep as;
    as.step = k + 1;
    as.grad_scale = static_cast<float>(1.0 / world);
    for (size_t l = 0; l < L.size(); ++l) {
      std::copy(L[l].w.begin(), L[l].w.end(), p.begin());
      std::copy(L[l].b.begin(), L[l].b.end(), p.begin() + static_cast<long>(nw));
      std::copy(gr[l].w.begin(), gr[l].w.end(), g.begin());
      std::copy(gr[l].b.begin(), gr[l].b.end(), g.begin() + static_cast<long>(nw));
      EXPECT_OK(optim::dequantize_state(kind, f, packed[l].data(), st.data(), n));
      optim::OneStateBuffers b;
      b.n = n;
      b.param = p.data();
      b.grad = g.data();
      b.state = st.data();
      if (lion) {
        EXPECT_OK(optim::ref::lion_step(optim::LionArgs{b, {s.lr, s.beta1, s.beta2, s.wd}, as}));
      } else {
        EXPECT_OK(optim::ref::adagrad_step(optim::AdagradArgs{b, {s.lr, 1e-8f, s.wd}, as}));
      }
      EXPECT_OK(optim::quantize_state(kind, f, st.data(), packed[l].data(), n));
      std::copy(p.begin(), p.begin() + static_cast<long>(nw), L[l].w.begin());
      std::copy(p.begin() + static_cast<long>(nw), p.end(), L[l].b.begin());
    }
  }
  return L;
}

TEST(OptimizerEngine, PackedStatesGiveThePackedReferenceBits) {
  // Lion's m and Adagrad's sum as int8 and int4 blocks in every tier: the bits of the packed loop
  // above, and close to (not the same as) the fp32 states' run.
  Runtime& rt = test::shared_runtime();
  const MlpSpec s = lion_spec();
  const int steps = 3;
  for (const char* type : {"Lion", "Adagrad"}) {
    const auto fp32 = reference_train(s, type, "fp32", rt.world_size(), steps);
    for (const char* states : {"int8", "int4"}) {
      const optim::StateFormat f = optim::parse_state_format(states).value();
      const auto ref = packed_reference(s, type, f, rt.world_size(), steps);
      float far = 0.0f;
      for (size_t l = 0; l < ref.size(); ++l) {
        for (size_t i = 0; i < ref[l].w.size(); ++i)
          far = std::max(far, std::fabs(ref[l].w[i] - fp32[l].w[i]));
      }
      EXPECT_GT(far, 0.0f) << type << " " << states << ": the packed states changed nothing";
      EXPECT_LT(far, 50 * s.lr) << type << " " << states;
      for (const Placement& pl : all_placements()) {
        const Recipe r{type, states};
        SCOPED_TRACE(describe(pl, r));
        auto got = train(pl, r, s, steps);
        ASSERT_OK(got);
        EXPECT_TRUE(identical(got.value(), ref)) << "differs from the packed reference loop";
      }
    }
  }
}

TEST(AdamWEngine, EachParameterCountsItsOwnSteps) {
  // The first layer gets no gradients at step 1 (of 0-3): torch.optim.AdamW does not count that
  // step for it, so its bias correction afterwards uses one update fewer than the engine's steps.
  // Every tier follows the dense reference that counts so (mlp.h), within the fp32 matrix's
  // tolerance; counting the engine's steps instead puts that layer ~1e-3 off (lr 0.01).
  Runtime& rt = test::shared_runtime();
  MlpSpec s;
  s.no_grads_at = 1;
  const auto ref = test::reference_train(s, rt.world_size(), 4);
  for (const Placement& pl : {Placement{0, "none", "none"}, Placement{2, "none", "none"},
                              Placement{1, "cpu", "none"}, Placement{3, "nvme", "nvme"}}) {
    const Recipe r{"AdamW", "fp32"};
    SCOPED_TRACE(describe(pl, r));
    auto got = train(pl, r, s, 4);
    ASSERT_OK(got);
    double worst = 0;
    for (size_t l = 0; l < ref.size(); ++l) {
      for (size_t i = 0; i < ref[l].w.size(); ++i)
        worst = std::max(worst, static_cast<double>(std::fabs(got.value()[l].w[i] - ref[l].w[i])));
      for (size_t i = 0; i < ref[l].b.size(); ++i)
        worst = std::max(worst, static_cast<double>(std::fabs(got.value()[l].b[i] - ref[l].b[i])));
    }
    EXPECT_LE(worst, 2e-4);
  }
}

TEST(OptimizerEngine, OneStateTakesOneBuffer) {
  // Host RAM holds the states with offload_optimizer cpu: Lion and Adagrad keep the master and one
  // state (8 bytes per element in fp32, 6 with bf16 states), AdamW the master, m and v (12).
  MlpSpec s = lion_spec();
  s.d = 256;
  test::ScratchDir nvme("nvme");
  auto adamw = make_engine({1, "cpu", "none"}, {"AdamW", "fp32"}, nvme.path(), s);
  auto lion = make_engine({1, "cpu", "none"}, {"lion", "fp32"}, nvme.path(), s);
  auto ada = make_engine({1, "cpu", "none"}, {"ADAGRAD", "bf16"}, nvme.path(), s);
  ASSERT_OK(adamw);
  ASSERT_OK(lion);
  ASSERT_OK(ada);
  EXPECT_EQ(adamw.value()->optimizer(), "AdamW");
  EXPECT_EQ(lion.value()->optimizer(), "Lion");
  EXPECT_EQ(ada.value()->optimizer(), "Adagrad");
  EXPECT_EQ(adamw.value()->optimizer_state_bytes_per_param(), 12.0);
  EXPECT_EQ(lion.value()->optimizer_state_bytes_per_param(), 8.0);
  EXPECT_EQ(ada.value()->optimizer_state_bytes_per_param(), 6.0);
  const int64_t n = 3 * (256 * 256 + 256);  // elements, give or take the padding
  const int64_t w = test::shared_runtime().world_size();
  const int64_t fewer = static_cast<int64_t>(adamw.value()->model_state_bytes()) -
                        static_cast<int64_t>(lion.value()->model_state_bytes());
  EXPECT_GE(fewer, 4 * n / w);                   // one fp32 state fewer per owned element
  EXPECT_LE(fewer, 4 * (n + 3 * 2048 * w) / w);  // and no more than that
}

TEST(OptimizerCheckpoint, ResumeIsBitIdenticalAndLoadsOnlyIntoItsOptimizer) {
  Runtime& rt = test::shared_runtime();
  MlpSpec s = lion_spec();
  s.d = 64;
  // Packed states too (Lion int8, Adagrad int4): consolidate decodes each with its map.
  for (const auto& [type, states] : {std::pair{"Lion", "fp32"}, std::pair{"Adagrad", "fp32"},
                                     std::pair{"Lion", "int8"}, std::pair{"Adagrad", "int4"}}) {
    for (const Placement& pl :
         {Placement{0, "none", "none"}, Placement{2, "cpu", "none"}, Placement{3, "nvme", "nvme"}}) {
      const Recipe r{type, states};
      SCOPED_TRACE(describe(pl, r));
      test::ScratchDir nv("nvme"), ck("ckpt");
      const std::string dir = rank0_dir(ck.path());
      std::vector<Layer> whole, first, second;
      {
        auto e = make_engine(pl, r, nv.path(), s);
        ASSERT_OK(e);
        ASSERT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 3, &whole));
      }
      {
        auto e = make_engine(pl, r, nv.path(), s);
        ASSERT_OK(e);
        ASSERT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 2, &first));
        ASSERT_OK(e.value()->save(dir, "step-2", "{}"));
      }
      {
        auto e = make_engine(pl, r, nv.path(), s);
        ASSERT_OK(e);
        ASSERT_OK(e.value()->load(dir));
        ASSERT_OK(
            test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 3, &second, nullptr, -1, 1, 2));
        EXPECT_TRUE(identical(second, whole));
      }
      // The other optimizers refuse it, naming both.
      for (const char* other : {"AdamW", std::string(type) == "Lion" ? "Adagrad" : "Lion"}) {
        auto e = make_engine(pl, {other, "fp32"}, nv.path(), s);
        ASSERT_OK(e);
        auto loaded = e.value()->load(dir);
        ASSERT_FALSE(loaded.is_ok()) << other;
        EXPECT_NE(loaded.status().message().find(
                      std::string("holds the optimizer states of optimizer.type \"") + type +
                      "\", and this engine runs optimizer.type \"" + other + "\""),
                  std::string::npos)
            << loaded.status().message();
      }
      if (rt.rank() == 0) {
        auto rd = ckpt::Reader::open(dir);
        ASSERT_OK(rd);
        EXPECT_EQ(rd.value()->manifest().engine.value("optimizer", ""), type);
        const std::string state = std::string(type) == "Lion" ? "exp_avg" : "sum";
        EXPECT_TRUE(rd.value()->has_kind(state));
        EXPECT_TRUE(rd.value()->has_kind("master"));
        EXPECT_FALSE(rd.value()->has_kind("exp_avg_sq"));
        EXPECT_FALSE(std::string(type) == "Adagrad" && rd.value()->has_kind("exp_avg"));
        // Exported with its states (zoe ckpt export --with-moments): each parameter and its one state.
        test::ScratchDir exported("export");
        const std::string out = exported.path() + "/states.safetensors";
        ASSERT_OK(ckpt::consolidate(*rd.value(), out, "fp32", ckpt::kConsolidatePiece, true));
        std::ifstream f(out, std::ios::binary);
        uint64_t len = 0;
        f.read(reinterpret_cast<char*>(&len), 8);
        std::string header(len, '\0');
        f.read(header.data(), static_cast<std::streamsize>(len));
        EXPECT_NE(header.find("\"layer.1.w." + state + "\""), std::string::npos) << header;
        EXPECT_EQ(header.find("exp_avg_sq"), std::string::npos) << header;
      }
      ASSERT_OK(zero::runtime_comm(rt).barrier());
    }
  }
  // An AdamW checkpoint (and one from before engine.optimizer was written) into a Lion engine.
  test::ScratchDir nv("nvme"), ck("ckpt");
  const std::string dir = rank0_dir(ck.path());
  {
    auto e = make_engine({1, "cpu", "none"}, {"AdamW", "fp32"}, nv.path(), s);
    ASSERT_OK(e);
    std::vector<Layer> out;
    ASSERT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 1, &out));
    ASSERT_OK(e.value()->save(dir, "step-1", "{}"));
  }
  auto e = make_engine({1, "cpu", "none"}, {"Lion", "fp32"}, nv.path(), s);
  ASSERT_OK(e);
  auto loaded = e.value()->load(dir);
  ASSERT_FALSE(loaded.is_ok());
  EXPECT_NE(loaded.status().message().find(
                "optimizer.type \"AdamW\", and this engine runs optimizer.type \"Lion\""),
            std::string::npos)
      << loaded.status().message();
}

}  // namespace
}  // namespace zoe
