// Muon (optimizer.type "Muon") through the engine, at this process's world size (1 here, 2 and 4
// under mpirun): every tier (device, host RAM, NVMe, a partial offload, several swapper chunks per
// matrix, a matrix split across the ranks' partitions) gives the bits of a plain single-process loop
// that runs Newton-Schulz on each whole matrix (optim/muon.h) and the auxiliary AdamW on the
// biases, over the same gradients; overlapped and serial updates agree; a step without gradients
// leaves a module as it was; Newton-Schulz on a flat shard (the test hook ZOE_TEST_MUON_FLAT_SHARD,
// what an engine that runs Muon on its flattened ZeRO partitions computes) leaves the reference; a
// checkpoint resumes bit for bit and an AdamW engine refuses it (the same two states, another update);
// int8/int4 states give one set of bits in every tier.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "config/config.h"
#include "optim/adam.h"
#include "optim/muon.h"
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

constexpr float kMuonLr = 0.02f, kMomentum = 0.9f;

struct Placement {
  int stage;
  const char* opt;    // offload_optimizer.device
  const char* param;  // offload_param.device (stage 3)
  const char* ratio = "1";
};

std::string describe(const Placement& pl, const std::string& extra) {
  return "stage " + std::to_string(pl.stage) + " offload_optimizer " + pl.opt + " x" + pl.ratio +
         " offload_param " + pl.param + extra;
}

std::string make_config(const Placement& pl, const std::string& nvme, const MlpSpec& s,
                        const std::string& extra) {
  auto off = [&](const char* dev) {
    std::string j = std::string("{\"device\": \"") + dev + "\"";
    if (std::string(dev) == "nvme") j += ", \"nvme_path\": \"" + nvme + "\"";
    return j + "}";
  };
  return "{\"train_micro_batch_size_per_gpu\": 4, \"optimizer\": {\"type\": \"muon\", \"params\": "
         "{\"muon_lr\": " +
         std::to_string(kMuonLr) + ", \"adam_lr\": " + std::to_string(s.lr) +
         ", \"momentum\": " + std::to_string(kMomentum) + ", \"betas\": [0.9, 0.999], \"eps\": 1e-8, " +
         "\"weight_decay\": " + std::to_string(s.wd) +
         "}}, \"zero_optimization\": {\"stage\": " + std::to_string(pl.stage) +
         ", \"stage3_param_persistence_threshold\": 0, \"sub_group_size\": 16384, \"offload_optimizer\": " +
         off(pl.opt) + ", \"offload_param\": " + (pl.stage == 3 ? off(pl.param) : "{\"device\": \"none\"}") +
         "}, \"zoe\": {\"device_budget\": \"64MiB\", \"optimizer_threads\": 1, \"offload_ratio\": " +
         pl.ratio + extra + "}}";
}

Result<std::unique_ptr<Engine>> make_engine(const Placement& pl, const MlpSpec& s, const std::string& nvme,
                                            const std::string& extra = "") {
  Runtime& rt = test::shared_runtime();
  ZOE_ASSIGN_OR_RETURN(auto cfg, config::Config::parse(make_config(pl, nvme, s, extra), rt.world_size()));
  ZOE_ASSIGN_OR_RETURN(auto e, zero::create_engine(rt, cfg));
  ZOE_RETURN_IF_ERROR(test::register_mlp(*e, s));
  return e;
}

Result<std::vector<Layer>> train(const Placement& pl, const MlpSpec& s, int steps,
                                 const std::string& extra = "") {
  Runtime& rt = test::shared_runtime();
  test::ScratchDir nvme("nvme");
  ZOE_ASSIGN_OR_RETURN(auto e, make_engine(pl, s, nvme.path(), extra));
  EXPECT_EQ(e->optimizer(), "Muon");
  std::vector<Layer> out;
  ZOE_RETURN_IF_ERROR(test::engine_train(*e, s, rt.rank(), rt.world_size(), steps, &out));
  return out;
}

float max_diff(const std::vector<Layer>& a, const std::vector<Layer>& b) {
  float d = 0.0f;
  for (size_t l = 0; l < a.size() && l < b.size(); ++l) {
    for (size_t i = 0; i < a[l].w.size(); ++i) d = std::max(d, std::fabs(a[l].w[i] - b[l].w[i]));
    for (size_t i = 0; i < a[l].b.size(); ++i) d = std::max(d, std::fabs(a[l].b[i] - b[l].b[i]));
  }
  return d;
}

// The plain loop: each rank's mean gradient over its samples, summed (test::rank_summed_grads)
// over the ranks in rank order and scaled by 1/world inside the update; then Muon on each whole
// weight matrix (d x d) and AdamW on each bias.
std::vector<Layer> muon_reference(const MlpSpec& s, int world, int steps) {
  std::vector<Layer> L = test::init_layers(s);
  std::vector<std::vector<float>> buf, m, v;
  for (const Layer& l : L) {
    buf.emplace_back(l.w.size(), 0.0f);
    m.emplace_back(l.b.size(), 0.0f);
    v.emplace_back(l.b.size(), 0.0f);
  }
  optim::MuonParams mp;
  mp.lr = kMuonLr;
  mp.momentum = kMomentum;
  mp.weight_decay = s.wd;
  optim::AdamParams ap;
  ap.lr = s.lr;
  ap.beta1 = 0.9f;
  ap.beta2 = 0.999f;
  ap.eps = 1e-8f;
  ap.weight_decay = s.wd;
  ap.adamw = true;
  for (int k = 0; k < steps; ++k) {
    const std::vector<Layer> g = test::rank_summed_grads(s, L, k, world);
    const float scale = static_cast<float>(1.0 / world);
    for (size_t l = 0; l < L.size(); ++l) {
      if (static_cast<int>(l) < s.frozen_layers || (k == s.no_grads_at && l == 0)) continue;
      std::vector<float> u(L[l].w.size()), o(L[l].w.size());
      optim::muon_momentum(g[l].w.data(), scale, buf[l].data(), u.data(), u.size(), mp);
      EXPECT_OK(optim::newton_schulz(u.data(), s.d, s.d, mp, o.data()));
      optim::muon_apply(L[l].w.data(), o.data(), o.size(), mp);
      optim::AdamArgs a;
      a.buf.n = L[l].b.size();
      a.buf.param = L[l].b.data();
      a.buf.grad = g[l].b.data();
      a.buf.exp_avg = m[l].data();
      a.buf.exp_avg_sq = v[l].data();
      a.params = ap;
      // The bias's own updates: one fewer after the step it sat out (torch.optim.AdamW's count).
      a.step.step = k + 1 - (s.no_grads_at >= 0 && k > s.no_grads_at && l == 0 ? 1 : 0);
      a.step.grad_scale = scale;
      EXPECT_OK(optim::adam_step(a));
    }
  }
  return L;
}

MlpSpec muon_spec() {
  MlpSpec s;
  s.d = 200;  // 40,200 elements a layer: several swapper chunks (sub_group_size 16384)
  s.lr = 1e-3f;
  s.wd = 0.1f;
  return s;
}

std::vector<Placement> all_placements() {
  std::vector<Placement> v;
  for (const auto& m : test::matrix_placements()) v.push_back({m.stage, m.opt, m.param});
  v.push_back({2, "nvme", "none", "0.5"});  // partial offload: the first half on NVMe
  v.push_back({3, "cpu", "nvme", "0.5"});
  return v;
}

TEST(MuonEngine, EveryTierGivesTheWholeMatrixReferenceBits) {
  Runtime& rt = test::shared_runtime();
  const MlpSpec s = muon_spec();
  const int steps = 3;
  const auto ref = muon_reference(s, rt.world_size(), steps);
  EXPECT_GT(max_diff(ref, test::init_layers(s)), 100 * kMuonLr * 1e-3f);  // the loop moved the weights
  for (const Placement& pl : all_placements()) {
    SCOPED_TRACE(describe(pl, ""));
    auto got = train(pl, s, steps);
    ASSERT_OK(got);
    EXPECT_TRUE(identical(got.value(), ref))
        << "differs from the reference loop by " << max_diff(got.value(), ref);
  }
}

TEST(MuonEngine, PackedStatesGiveOneSetOfBitsInEveryTier) {
  // The momentum (and the auxiliary AdamW's m and v) as int8 or int4 blocks (zoe.optimizer_states):
  // every tier gives the no-offload run's bits, not the fp32 whole-matrix reference's, and trains.
  Runtime& rt = test::shared_runtime();
  MlpSpec s = muon_spec();
  s.no_grads_at = 1;
  const auto ref = muon_reference(s, rt.world_size(), 3);
  const auto init = test::init_layers(s);
  for (const char* states : {"int8", "int4"}) {
    const std::string extra = std::string(", \"optimizer_states\": \"") + states + "\"";
    std::vector<Layer> none;
    for (const Placement& pl : all_placements()) {
      SCOPED_TRACE(describe(pl, extra));
      auto got = train(pl, s, 3, extra);
      ASSERT_OK(got);
      if (pl.stage == 0) none = got.value();
      EXPECT_TRUE(identical(got.value(), none))
          << "differs from the no-offload run by " << max_diff(got.value(), none);
      EXPECT_GT(max_diff(got.value(), ref), 0.0f);
      // No closeness bound here: this MLP's gradients have rank <= 4 a step, and Newton-Schulz lifts
      // the quantization noise in the momentum's null directions towards unit size (the orthogonal
      // update treats every direction alike); tests/python/test_torch_muon.py bounds the losses on a
      // transformer instead.
      EXPECT_GT(max_diff(got.value(), init), 1e-3f) << states;
    }
  }
}

TEST(MuonEngine, OverlappedAndSerialUpdatesGiveTheSameBits) {
  MlpSpec s = muon_spec();
  s.d = 64;
  for (const Placement& pl : {Placement{2, "cpu", "none"}, Placement{3, "nvme", "nvme"}}) {
    auto a = train(pl, s, 3, ", \"overlap_step\": false");
    ASSERT_OK(a);
    for (const char* extra : {", \"overlap_step\": true", ", \"speculative_step\": true"}) {
      SCOPED_TRACE(describe(pl, extra));
      auto b = train(pl, s, 3, extra);
      ASSERT_OK(b);
      EXPECT_TRUE(identical(a.value(), b.value()));
    }
  }
}

TEST(MuonEngine, AStepWithoutGradientsLeavesTheModuleAsItWas) {
  // engine_train gives the first layer no gradients at step no_grads_at: its weights, momentum and
  // the bias's moments stay as they were (torch.optim.Muon and AdamW skip a parameter whose .grad
  // is None); the reference skips them too, and the bias's AdamW counts its own updates after it.
  MlpSpec s = muon_spec();
  s.d = 64;
  s.no_grads_at = 1;
  const auto ref = muon_reference(s, test::shared_runtime().world_size(), 3);
  for (const Placement& pl : {Placement{1, "cpu", "none"}, Placement{3, "nvme", "nvme"}}) {
    SCOPED_TRACE(describe(pl, ""));
    auto got = train(pl, s, 3);
    ASSERT_OK(got);
    EXPECT_TRUE(identical(got.value(), ref)) << max_diff(got.value(), ref);
  }
}

TEST(MuonEngine, NewtonSchulzOnAFlatShardLeavesTheReference) {
  // What DeepSpeed's offloaded Muon computes (each rank orthogonalizes its flattened piece, RFC
  // #8463): the test hook makes zoe do the same, and the weights leave the reference by far more
  // than the reference's own rounding.
  const MlpSpec s = muon_spec();
  const auto ref = muon_reference(s, test::shared_runtime().world_size(), 3);
  setenv("ZOE_TEST_MUON_FLAT_SHARD", "1", 1);
  auto got = train({3, "nvme", "nvme"}, s, 3);
  unsetenv("ZOE_TEST_MUON_FLAT_SHARD");
  ASSERT_OK(got);
  EXPECT_GT(max_diff(got.value(), ref), 1e-3f);
}

TEST(MuonEngine, MatricesAreTheParametersDeepSpeedGivesMuon) {
  // 2 or more dimensions and a name ("<module>.<param>") with neither "embed" nor "lm_head": the
  // others get the auxiliary AdamW, whose rate is adam_lr. A model whose every parameter is an
  // embedding or a head trains as AdamW with adam_lr does.
  Runtime& rt = test::shared_runtime();
  MlpSpec s = muon_spec();
  s.d = 32;
  test::ScratchDir nvme("nvme");
  auto cfg = config::Config::parse(make_config({1, "cpu", "none"}, nvme.path(), s, ""), rt.world_size());
  ASSERT_OK(cfg);
  auto adam_cfg = config::Config::parse(
      "{\"train_micro_batch_size_per_gpu\": 4, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": " +
          std::to_string(s.lr) +
          ", \"betas\": [0.9, 0.999], \"eps\": 1e-8, \"weight_decay\": " + std::to_string(s.wd) +
          "}}, \"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": {\"device\": \"cpu\"}}, \"zoe\": "
          "{\"device_budget\": \"64MiB\", \"optimizer_threads\": 1}}",
      rt.world_size());
  ASSERT_OK(adam_cfg);
  std::vector<std::vector<Layer>> out(2);
  for (int i = 0; i < 2; ++i) {
    auto made = zero::create_engine(rt, i == 0 ? cfg.value() : adam_cfg.value());
    ASSERT_OK(made);
    Engine* e = made.value().get();
    for (int l = 0; l < s.layers; ++l) {
      const std::string name = l == 0 ? "model.embed_tokens" : l == 1 ? "lm_head" : "blocks.embedder";
      ASSERT_OK(e->add_module(name + std::to_string(l), {{"w", {s.d, s.d}}, {"b", {s.d}}}, {}));
    }
    ASSERT_OK(e->initialize([](size_t m, size_t p, float* data, size_t n) {
      for (size_t j = 0; j < n; ++j) data[j] = test::init_value(m, p, j);
    }));
    ASSERT_OK(test::engine_train(*e, s, rt.rank(), rt.world_size(), 2, &out[i]));
  }
  EXPECT_TRUE(identical(out[0], out[1])) << max_diff(out[0], out[1]);
}

TEST(MuonCheckpoint, ResumeIsBitIdenticalAndAnAdamWEngineRefusesIt) {
  Runtime& rt = test::shared_runtime();
  MlpSpec s = muon_spec();
  s.d = 64;
  for (const Placement& pl :
       {Placement{0, "none", "none"}, Placement{2, "cpu", "none"}, Placement{3, "nvme", "nvme"}}) {
    SCOPED_TRACE(describe(pl, ""));
    test::ScratchDir nv("nvme"), ck("ckpt");
    const std::string dir = rank0_dir(ck.path());
    std::vector<Layer> whole, first, second;
    {
      auto e = make_engine(pl, s, nv.path());
      ASSERT_OK(e);
      ASSERT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 3, &whole));
    }
    {
      auto e = make_engine(pl, s, nv.path());
      ASSERT_OK(e);
      ASSERT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 2, &first));
      ASSERT_OK(e.value()->save(dir, "step-2", "{}"));
    }
    {
      auto e = make_engine(pl, s, nv.path());
      ASSERT_OK(e);
      ASSERT_OK(e.value()->load(dir));
      ASSERT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 3, &second, nullptr, -1, 1, 2));
      EXPECT_TRUE(identical(second, whole)) << max_diff(second, whole);
    }
    auto cfg =
        config::Config::parse("{\"train_micro_batch_size_per_gpu\": 4, \"zero_optimization\": {\"stage\": " +
                                  std::to_string(pl.stage) + "}, \"zoe\": {\"device_budget\": \"64MiB\"}}",
                              rt.world_size());
    ASSERT_OK(cfg);
    auto adamw = zero::create_engine(rt, cfg.value());
    ASSERT_OK(adamw);
    ASSERT_OK(test::register_mlp(*adamw.value(), s));
    auto loaded = adamw.value()->load(dir);
    ASSERT_FALSE(loaded.is_ok());
    EXPECT_NE(loaded.status().message().find(
                  "optimizer.type \"Muon\", and this engine runs optimizer.type \"AdamW\""),
              std::string::npos)
        << loaded.status().message();
    ASSERT_OK(zero::runtime_comm(rt).barrier());
  }
}

}  // namespace
}  // namespace zoe
