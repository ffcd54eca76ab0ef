// Adam-mini (optimizer.type "AdamMini") through the engine, at this process's world size (1 here, 2
// and 4 under mpirun): every tier (device, host RAM, NVMe, a partial offload, several swapper chunks
// per module, blocks split across the ranks' partitions) gives the bits of a plain single-process
// loop over the same gradients whose blocks are written out here (a row of the embedding, an element
// of a bias, a head of q_proj, a whole norm, a whole matrix the rules do not know); overlapped and
// serial updates agree; a step without gradients leaves a module's weights, m and block moments as
// they were; m packed as int8/int4 blocks gives one set of bits in every tier; a checkpoint resumes
// bit for bit and an AdamW engine refuses it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "config/config.h"
#include "optim/adam_mini.h"
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

constexpr int kHeads = 4;

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
  return "{\"train_micro_batch_size_per_gpu\": 4, \"optimizer\": {\"type\": \"AdamMini\", \"params\": "
         "{\"lr\": " +
         std::to_string(s.lr) +
         ", \"betas\": [0.9, 0.999], \"eps\": 1e-8, \"weight_decay\": " + std::to_string(s.wd) +
         ", \"dim\": " + std::to_string(s.d) + ", \"n_heads\": " + std::to_string(kHeads) +
         "}}, \"zero_optimization\": {\"stage\": " + std::to_string(pl.stage) +
         ", \"stage3_param_persistence_threshold\": 0, \"sub_group_size\": 16384, \"offload_optimizer\": " +
         off(pl.opt) + ", \"offload_param\": " + (pl.stage == 3 ? off(pl.param) : "{\"device\": \"none\"}") +
         "}, \"zoe\": {\"device_budget\": \"64MiB\", \"optimizer_threads\": 1, \"offload_ratio\": " +
         pl.ratio + extra + "}}";
}

// The MLP's three layers under names that pick three of Adam-mini's rules each (optim/adam_mini.h).
const char* const kModules[3] = {"model.embed", "attn", "final"};
const char* const kParams[3][2] = {{"weight", "bias"}, {"q_proj", "norm"}, {"w", "ln_b"}};

Status register_named(Engine& e, const MlpSpec& s) {
  for (int l = 0; l < s.layers; ++l) {
    ZOE_RETURN_IF_ERROR(e.add_module(kModules[l], {{kParams[l][0], {s.d, s.d}}, {kParams[l][1], {s.d}}}, {}));
  }
  return e.initialize([](size_t m, size_t p, float* data, size_t n) {
    for (size_t i = 0; i < n; ++i) data[i] = test::init_value(m, p, i);
  });
}

Result<std::unique_ptr<Engine>> make_engine(const Placement& pl, const MlpSpec& s, const std::string& nvme,
                                            const std::string& extra = "") {
  Runtime& rt = test::shared_runtime();
  ZOE_ASSIGN_OR_RETURN(auto cfg, config::Config::parse(make_config(pl, nvme, s, extra), rt.world_size()));
  ZOE_ASSIGN_OR_RETURN(auto e, zero::create_engine(rt, cfg));
  ZOE_RETURN_IF_ERROR(register_named(*e, s));
  return e;
}

Result<std::vector<Layer>> train(const Placement& pl, const MlpSpec& s, int steps,
                                 const std::string& extra = "") {
  Runtime& rt = test::shared_runtime();
  test::ScratchDir nvme("nvme");
  ZOE_ASSIGN_OR_RETURN(auto e, make_engine(pl, s, nvme.path(), extra));
  EXPECT_EQ(e->optimizer(), "AdamMini");
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

// One tensor of the reference: its values, m, its blocks (equal ones of `block` elements) and their
// mean moments, and whether it decays.
struct RefTensor {
  std::vector<float>* p;
  std::vector<float> m, v;
  size_t block;
  bool decay;
};

// The plain loop: each rank's mean gradient, summed over the ranks in rank order
// (test::rank_summed_grads) and scaled by 1/world; each block's sum of g^2 in double in element
// order, its mean moment, then m and the weights element by element. Layer 0 ("model.embed"): the
// weight a row a block, the bias an element (no decay); layer 1 ("attn"): q_proj a head (d*d/4
// elements), the norm whole (no decay); layer 2 ("final"): w whole, ln_b an element (no decay).
// per_element: every block one element instead (Adam's moments, with Adam-mini's decay rules).
std::vector<Layer> reference(const MlpSpec& s, int world, int steps, bool per_element = false) {
  std::vector<Layer> L = test::init_layers(s);
  const size_t d = static_cast<size_t>(s.d);
  std::vector<std::vector<RefTensor>> T(L.size());
  size_t wblock[3] = {d, d * d / kHeads, d * d}, bblock[3] = {1, d, 1};
  if (per_element) {
    for (int l = 0; l < 3; ++l) wblock[l] = bblock[l] = 1;
  }
  for (size_t l = 0; l < L.size(); ++l) {
    T[l].push_back(
        {&L[l].w, std::vector<float>(d * d), std::vector<float>(d * d / wblock[l]), wblock[l], true});
    T[l].push_back({&L[l].b, std::vector<float>(d), std::vector<float>(d / bblock[l]), bblock[l], false});
  }
  optim::AdamMiniParams ap{s.lr, 0.9f, 0.999f, 1e-8f, s.wd};
  std::vector<int64_t> own(L.size(), 0);  // each layer's own update count
  for (int k = 0; k < steps; ++k) {
    const std::vector<Layer> g = test::rank_summed_grads(s, L, k, world);
    const float scale = static_cast<float>(1.0 / world);
    const double s2 = static_cast<double>(scale) * static_cast<double>(scale);
    for (size_t l = 0; l < L.size(); ++l) {
      if (static_cast<int>(l) < s.frozen_layers || (k == s.no_grads_at && l == 0)) continue;
      own[l]++;
      for (size_t t = 0; t < 2; ++t) {
        RefTensor& x = T[l][t];
        const std::vector<float>& gt = t == 0 ? g[l].w : g[l].b;
        for (size_t j = 0; j < x.v.size(); ++j) {
          const size_t o = j * x.block;
          optim::adam_mini_vmean(&x.v[j], optim::adam_mini_sum_sq(gt.data() + o, x.block, 0.0) * s2, x.block,
                                 ap);
          optim::adam_mini_block(x.p->data() + o, gt.data() + o, scale, x.m.data() + o, x.block, x.v[j],
                                 own[l], x.decay, ap);
        }
      }
    }
  }
  return L;
}

MlpSpec mini_spec() {
  MlpSpec s;
  s.d = 200;  // 40,200 elements a layer: several swapper chunks (sub_group_size 16384)
  s.lr = 1e-2f;
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

TEST(AdamMiniEngine, EveryTierGivesTheReferenceBits) {
  Runtime& rt = test::shared_runtime();
  const MlpSpec s = mini_spec();
  const int steps = 3;
  const auto ref = reference(s, rt.world_size(), steps);
  EXPECT_GT(max_diff(ref, test::init_layers(s)), 1e-3f);  // the loop moved the weights
  for (const Placement& pl : all_placements()) {
    SCOPED_TRACE(describe(pl, ""));
    auto got = train(pl, s, steps);
    ASSERT_OK(got);
    EXPECT_TRUE(identical(got.value(), ref))
        << "differs from the reference loop by " << max_diff(got.value(), ref);
  }
}

TEST(AdamMiniEngine, OneMomentAnElementIsNotTheReference) {
  // The same loop with every block one element (Adam's moments) ends elsewhere, by far more than
  // rounding: the comparison above sees the blocks.
  const MlpSpec s = mini_spec();
  const int world = test::shared_runtime().world_size();
  auto got = train({3, "nvme", "nvme"}, s, 3);
  ASSERT_OK(got);
  EXPECT_TRUE(identical(got.value(), reference(s, world, 3)));
  EXPECT_GT(max_diff(got.value(), reference(s, world, 3, true)), 1e-4f);
}

TEST(AdamMiniEngine, PackedMGivesOneSetOfBitsInEveryTier) {
  // m as int8 or int4 blocks (zoe.optimizer_states): every tier gives the no-offload run's bits, near
  // the fp32 reference and not equal to it; a step without gradients still leaves the first layer
  // as it was.
  Runtime& rt = test::shared_runtime();
  MlpSpec s = mini_spec();
  s.no_grads_at = 1;
  const auto ref = reference(s, rt.world_size(), 3);
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
      // int4's m has 7 levels a sign (optim/lowbit.h): its error is of the order of an update.
      EXPECT_LT(max_diff(got.value(), ref), (std::string(states) == "int8" ? 0.1f : 3.0f) * s.lr) << states;
    }
  }
}

TEST(AdamMiniEngine, OverlappedAndSerialUpdatesGiveTheSameBits) {
  MlpSpec s = mini_spec();
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

TEST(AdamMiniEngine, AStepWithoutGradientsLeavesTheModuleAsItWas) {
  // engine_train gives the first layer no gradients at step no_grads_at: its weights, m and block
  // moments stay as they were (the adam-mini package skips a parameter whose .grad is None), and
  // its bias correction counts its own updates after it.
  MlpSpec s = mini_spec();
  s.d = 64;
  s.no_grads_at = 1;
  const auto ref = reference(s, test::shared_runtime().world_size(), 3);
  for (const Placement& pl : {Placement{1, "cpu", "none"}, Placement{3, "nvme", "nvme"}}) {
    SCOPED_TRACE(describe(pl, ""));
    auto got = train(pl, s, 3);
    ASSERT_OK(got);
    EXPECT_TRUE(identical(got.value(), ref)) << max_diff(got.value(), ref);
  }
}

TEST(AdamMiniEngine, HeadsThatDoNotFitAreRefusedNamingTheKeys) {
  Runtime& rt = test::shared_runtime();
  MlpSpec s = mini_spec();
  s.d = 64;
  test::ScratchDir nvme("nvme");
  std::string text = make_config({1, "cpu", "none"}, nvme.path(), s, "");
  text.replace(text.find("\"n_heads\": 4"), 12, "\"n_heads\": 3");
  auto cfg = config::Config::parse(text, rt.world_size());
  ASSERT_OK(cfg);
  auto e = zero::create_engine(rt, cfg.value());
  ASSERT_OK(e);
  Status st = register_named(*e.value(), s);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("attn.q_proj"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("optimizer.params.dim 64 with optimizer.params.n_heads 3"), std::string::npos)
      << st.message();
}

TEST(AdamMiniCheckpoint, ResumeIsBitIdenticalAndAnAdamWEngineRefusesIt) {
  Runtime& rt = test::shared_runtime();
  MlpSpec s = mini_spec();
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
    ASSERT_OK(register_named(*adamw.value(), s));
    auto loaded = adamw.value()->load(dir);
    ASSERT_FALSE(loaded.is_ok());
    EXPECT_NE(loaded.status().message().find("optimizer.type \"AdamMini\""), std::string::npos)
        << loaded.status().message();
    ASSERT_OK(zero::runtime_comm(rt).barrier());
  }
}

}  // namespace
}  // namespace zoe
