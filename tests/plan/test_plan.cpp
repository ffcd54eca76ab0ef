// zoe_plan: exact parameter counts of Hugging Face configs, the plan's bytes against the engine's
// planner, the cost model's NVMe bytes against the engine's measured bytes for every placement of
// the engine matrix, and clear errors for bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "config/config.h"
#include "model/gpt.h"
#include "plan/calibration.h"
#include "plan/cost_model.h"
#include "plan/hf_config.h"
#include "plan/model_desc.h"
#include "plan/planner.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"
#include "tests/zero/mlp.h"
#include "tests/zero/shared_runtime.h"
#include "zero/engine_internal.h"
#include "zero/placement.h"

namespace zoe {
namespace {

// What the engine plans with on this host (its buffers are sized from the host's memory).
zero::PlanTarget engine_target(const Runtime& rt) {
  zero::PlanTarget t;
  t.host_memory = zero::engine_host_memory(rt.world_size());
  return t;
}

std::string fixture(const std::string& name) { return std::string(ZOE_PLAN_FIXTURES) + "/" + name; }

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// ---------------------------------------------------------------------------------------------
// Models

TEST(HfConfig, ExactParameterCounts) {
  struct Case {
    const char* file;
    uint64_t params;
    const char* last_module;  // "head" when the output projection is untied
  };
  const Case cases[] = {
      {"gpt2.json", 124439808ull, "final"},             // tied head
      {"llama-2-7b.json", 6738415616ull, "head"},       // Llama-2-7B
      {"mistral-7b-v0.1.json", 7241732096ull, "head"},  // grouped-query attention
      {"qwen2-0.5b.json", 494032768ull, "final"},       // q/k/v biases, tied
      {"pythia-160m.json", 162322944ull, "head"},       // gpt_neox
  };
  for (const Case& c : cases) {
    auto m = plan::hf_model(fixture(c.file));
    ASSERT_OK(m) << c.file;
    EXPECT_EQ(m->params, c.params) << c.file;
    EXPECT_EQ(plan::count_params(m->modules), c.params) << c.file;
    EXPECT_EQ(m->modules.front().name, "embed") << c.file;
    EXPECT_EQ(m->modules.back().name, c.last_module) << c.file;
    EXPECT_EQ(static_cast<int>(m->modules.size()),
              m->layers + (std::string(c.last_module) == "head" ? 3 : 2));
  }
  // gpt2 with an untied head adds exactly one vocab x d matrix.
  std::string text = read_text(fixture("gpt2.json"));
  text.replace(text.find("\"vocab_size\""), 0, "\"tie_word_embeddings\": false, ");
  auto untied = plan::hf_model_from_json(text, "gpt2-untied");
  ASSERT_OK(untied);
  EXPECT_EQ(untied->params, 124439808ull + 50257ull * 768ull);
}

TEST(HfConfig, ErrorsNameTheFileTheKeyAndTheValue) {
  auto bert = plan::hf_model(fixture("bert.json"));
  ASSERT_FALSE(bert.is_ok());
  const std::string msg = bert.status().message();
  EXPECT_NE(msg.find("\"bert\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("bert.json"), std::string::npos) << msg;
  for (const auto& t : plan::hf_model_types()) EXPECT_NE(msg.find(t), std::string::npos) << t << ": " << msg;

  auto missing = plan::hf_model(fixture("no-such-config.json"));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("no-such-config.json"), std::string::npos);

  auto corrupt = plan::hf_model_from_json("{\"model_type\": \"llama\", ", "x.json");
  ASSERT_FALSE(corrupt.is_ok());
  EXPECT_NE(corrupt.status().message().find("x.json: not valid JSON"), std::string::npos);

  auto no_type = plan::hf_model_from_json("{\"hidden_size\": 8}", "y.json");
  ASSERT_FALSE(no_type.is_ok());
  EXPECT_NE(no_type.status().message().find("model_type"), std::string::npos);

  std::string text = read_text(fixture("llama-2-7b.json"));
  text.replace(text.find("\"hidden_size\": 4096"), 19, "\"hidden_size\": -3");
  auto neg = plan::hf_model_from_json(text, "z.json");
  ASSERT_FALSE(neg.is_ok());
  EXPECT_NE(neg.status().message().find("\"hidden_size\""), std::string::npos) << neg.status().message();
  EXPECT_NE(neg.status().message().find("-3"), std::string::npos) << neg.status().message();

  std::string no_layers = read_text(fixture("gpt2.json"));
  no_layers.replace(no_layers.find("\"n_layer\""), 9, "\"n_layers_typo\"");
  auto nl = plan::hf_model_from_json(no_layers, "w.json");
  ASSERT_FALSE(nl.is_ok());
  EXPECT_NE(nl.status().message().find("\"n_layer\""), std::string::npos) << nl.status().message();
}

TEST(ModelDesc, ZoeGptAndBareCounts) {
  auto small = plan::gpt_model("small");
  ASSERT_OK(small);
  model::GptConfig c;
  c.layers = 4;
  c.d_model = 128;
  c.heads = 4;
  c.seq = 64;
  c.vocab = 256;
  EXPECT_EQ(small->params, c.num_params());
  EXPECT_EQ(small->modules.size(), model::gpt_modules(c).size());
  auto bad = plan::gpt_model("huge");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("tiny, small"), std::string::npos) << bad.status().message();

  auto p = plan::params_model(1000003, 4);
  ASSERT_OK(p);
  EXPECT_EQ(p->params, 1000003u);
  EXPECT_EQ(p->modules.size(), 4u);
  EXPECT_EQ(p->modules[0].param_numel[0], 250001u);
  EXPECT_EQ(p->modules[3].param_numel[0], 250000u);
  EXPECT_FALSE(plan::params_model(0, 4).is_ok());
  EXPECT_FALSE(plan::params_model(3, 4).is_ok());
}

// ---------------------------------------------------------------------------------------------
// Calibration

TEST(Calibration, FileOverlaysDefaultsAndRejectsBadInput) {
  test::ScratchDir d("plan-cal");
  plan::LinkRates r;
  const std::string good = d.file("cal.json");
  {
    std::ofstream f(good);
    f << "{\"version\": 1, \"host\": \"n1\", \"nvme_read_gbps\": 6.5, \"flops\": 2e14}";
  }
  ASSERT_OK(plan::apply_calibration_file(good, &r));
  EXPECT_EQ(r.nvme_read_gbps, 6.5);
  EXPECT_EQ(r.flops, 2e14);
  EXPECT_EQ(r.nvme_write_gbps, plan::LinkRates{}.nvme_write_gbps);
  EXPECT_EQ(r.host, "n1");
  // Round trip through to_json().
  plan::LinkRates back;
  ASSERT_OK(plan::apply_calibration_json(r.to_json(), "rt", &back));
  EXPECT_EQ(back.nvme_read_gbps, 6.5);
  EXPECT_EQ(back.host, "n1");
  // The I/O sweep and its chosen point round-trip too.
  r.io_sweep = {{262144, 4, 1.5, 2.5}, {1048576, 8, 3.25, 2.75}};
  r.aio_block_size = 1048576;
  r.aio_queue_depth = 8;
  plan::LinkRates back2;
  ASSERT_OK(plan::apply_calibration_json(r.to_json(), "rt", &back2));
  ASSERT_EQ(back2.io_sweep.size(), 2u);
  EXPECT_EQ(back2.io_sweep[1].block_size, 1048576);
  EXPECT_EQ(back2.io_sweep[1].queue_depth, 8);
  EXPECT_EQ(back2.io_sweep[1].read_gbps, 3.25);
  EXPECT_EQ(back2.io_sweep[0].write_gbps, 2.5);
  EXPECT_EQ(back2.aio_block_size, 1048576);
  EXPECT_EQ(back2.aio_queue_depth, 8);
  // The FLOP rate per micro-batch: round-trips, and flops_at falls back to `flops` elsewhere.
  r.flops_by_micro_batch = {{8, 1.5e11}, {4, 1.2e11}};
  plan::LinkRates back3;
  ASSERT_OK(plan::apply_calibration_json(r.to_json(), "rt", &back3));
  EXPECT_EQ(back3.flops_at(8), 1.5e11);
  EXPECT_EQ(back3.flops_at(4), 1.2e11);
  EXPECT_EQ(back3.flops_at(2), r.flops);

  plan::LinkRates keep;
  Status missing = plan::apply_calibration_file(d.file("absent.json"), &keep);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.message().find("absent.json"), std::string::npos) << missing.message();
  struct Bad {
    const char* text;
    const char* expect;
  };
  const Bad bad[] = {
      {"{\"nvme_read_gbps\": 3", "not valid JSON"},
      {"[1, 2]", "expected a JSON object"},
      {"{\"nvme_raed_gbps\": 3}", "unknown key \"nvme_raed_gbps\""},
      {"{\"h2d_gbps\": -1}", "\"h2d_gbps\" is -1"},
      {"{\"flops\": \"fast\"}", "\"flops\" is \"fast\""},
      {"{\"version\": 2}", "\"version\" is 2"},
      {"{\"aio_block_size\": 1000}", "\"aio_block_size\" is 1000, expected a multiple of 4096"},
      {"{\"aio_queue_depth\": 0}", "\"aio_queue_depth\" is 0"},
      {"{\"io_sweep\": 3}", "\"io_sweep\" is 3, expected an array"},
      {"{\"flops_by_micro_batch\": [1]}", "\"flops_by_micro_batch\" is [1], expected an object"},
      {"{\"flops_by_micro_batch\": {\"0\": 1e11}}", "flops_by_micro_batch[\"0\"] is 100000000000.0"},
      {"{\"flops_by_micro_batch\": {\"4\": -1}}", "flops_by_micro_batch[\"4\"] is -1"},
      {"{\"io_sweep\": [{\"block_size\": 4096, \"queue_depth\": 1, \"read_gbps\": -1, \"write_gbps\": 1}]}",
       "io_sweep[0] is"},
  };
  for (const Bad& b : bad) {
    Status s = plan::apply_calibration_json(b.text, "cal.json", &keep);
    ASSERT_FALSE(s.is_ok()) << b.text;
    EXPECT_NE(s.message().find(b.expect), std::string::npos) << b.text << ": " << s.message();
    EXPECT_NE(s.message().find("cal.json"), std::string::npos) << s.message();
  }
  EXPECT_EQ(keep.nvme_read_gbps, plan::LinkRates{}.nvme_read_gbps);  // a failed overlay changes nothing
}

// The spread of repeated timings, from given samples (no clock): the closest `window` samples
// count, computed against a plain reference over every window of the sorted samples.
TEST(Calibration, RepeatedTimingsSettleOnTheirClosestSamples) {
  plan::RepeatPolicy pol;
  pol.window = 3;
  pol.max_samples = 8;
  pol.max_spread = 0.05;
  // The reference: every window of `w` sorted samples, (max - min) / median, the least.
  auto reference = [](std::vector<double> v, size_t w) {
    std::sort(v.begin(), v.end());
    w = std::min(w, v.size());
    double best = INFINITY, med = 0;
    for (size_t i = 0; i + w <= v.size(); ++i) {
      const double s = (v[i + w - 1] - v[i]) / v[i + w / 2];
      if (s < best) best = s, med = v[i + w / 2];
    }
    return std::pair{best, med};
  };
  plan::Repeated r(pol);
  EXPECT_FALSE(r.stable());
  EXPECT_FALSE(r.done());
  EXPECT_TRUE(std::isinf(r.spread()));
  // A slow first sample (a page fault, a passing process), then three that agree within 4 %.
  const std::vector<double> samples = {0.30, 0.100, 0.104, 0.101};
  std::vector<double> seen;
  for (double x : samples) {
    r.add(x);
    seen.push_back(x);
    if (seen.size() >= 2) {
      EXPECT_NEAR(r.spread(), reference(seen, 3).first, 1e-12) << seen.size();
      EXPECT_DOUBLE_EQ(r.value(), reference(seen, 3).second) << seen.size();
    }
  }
  EXPECT_TRUE(r.stable());
  EXPECT_TRUE(r.done());
  EXPECT_NEAR(r.spread(), 0.004 / 0.101, 1e-12);  // the outlier does not count
  EXPECT_EQ(r.median_index(), 3u);                // 0.101, the median of the three that agree
  EXPECT_EQ(r.value(), 0.101);
  EXPECT_OK(plan::check_stable(r, "the FLOP rate"));
  // Samples that never agree: done at max_samples, not stable, and refused naming what, the
  // spread and the threshold.
  plan::Repeated n(pol);
  for (int i = 0; i < 8; ++i) {
    EXPECT_FALSE(n.done()) << i;
    n.add(1.0 + 0.2 * i);
  }
  EXPECT_TRUE(n.done());
  EXPECT_FALSE(n.stable());
  EXPECT_NEAR(n.spread(), reference({1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4}, 3).first, 1e-12);
  Status s = plan::check_stable(n, "the FLOP rate at micro-batch 1");
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("the FLOP rate at micro-batch 1"), std::string::npos) << s.message();
  char pct[64];
  snprintf(pct, sizeof(pct), "spread by %.1f%%", 100 * n.spread());
  EXPECT_NE(s.message().find(pct), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("more than the 5.0%"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("--calibrate-max-spread"), std::string::npos) << s.message();
  // Fewer samples than the window are never stable, even when they agree exactly.
  plan::Repeated few(pol);
  few.add(1.0);
  few.add(1.0);
  EXPECT_EQ(few.spread(), 0.0);
  EXPECT_FALSE(few.stable());
  EXPECT_FALSE(plan::check_stable(few, "x").is_ok());
  // A larger threshold accepts the same samples.
  pol.max_spread = 0.5;
  plan::Repeated loose(pol);
  for (double x : {1.0, 1.2, 1.4}) loose.add(x);
  EXPECT_TRUE(loose.stable());
  EXPECT_DOUBLE_EQ(loose.value(), 1.2);
}

// A rate measured at a calibration's start and again at its end: the two agree, or it is refused.
TEST(Calibration, ARateThatDriftsDuringTheCalibrationIsRefused) {
  EXPECT_DOUBLE_EQ(plan::two_spread(100, 104), 4.0 / 102);
  EXPECT_DOUBLE_EQ(plan::two_spread(104, 100), 4.0 / 102);
  EXPECT_EQ(plan::two_spread(5, 5), 0.0);
  EXPECT_OK(plan::check_drift(6.0e10, 6.2e10, 0.05, "flops@1"));
  // The two runs: 2.1e10 and 6.1e10 at micro-batch 1.
  Status s = plan::check_drift(6.1e10, 2.1e10, 0.05, "flops@1");
  ASSERT_FALSE(s.is_ok());
  for (const char* part : {"flops@1: 6.1e+10 at the start", "2.1e+10 at its end", "97.6% apart",
                           "more than the 5.0%", "--calibrate-max-spread 0.05"}) {
    EXPECT_NE(s.message().find(part), std::string::npos) << part << ": " << s.message();
  }
  EXPECT_OK(plan::check_drift(6.1e10, 2.1e10, 1.0, "flops@1"));  // a threshold that allows it
}

// The spreads a calibration reports round-trip through its file; a bad one is refused.
TEST(Calibration, SpreadsRoundTripAndBadOnesAreRefused) {
  plan::LinkRates r;
  r.spread = {{"flops@8", 0.0125}, {"local_copy_gbps", 0.03}};
  plan::LinkRates back;
  ASSERT_OK(plan::apply_calibration_json(r.to_json(), "rt", &back));
  ASSERT_EQ(back.spread.size(), 2u);
  std::sort(back.spread.begin(), back.spread.end());
  EXPECT_EQ(back.spread[0], (std::pair<std::string, double>{"flops@8", 0.0125}));
  EXPECT_EQ(back.spread[1], (std::pair<std::string, double>{"local_copy_gbps", 0.03}));
  for (const char* bad :
       {"{\"spread\": 1}", "{\"spread\": {\"flops@1\": -0.1}}", "{\"spread\": {\"flops@1\": \"small\"}}"}) {
    Status s = plan::apply_calibration_json(bad, "cal.json", &back);
    ASSERT_FALSE(s.is_ok()) << bad;
    EXPECT_NE(s.message().find("spread"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("cal.json"), std::string::npos) << s.message();
  }
}

// ---------------------------------------------------------------------------------------------
// The plan's bytes are the engine planner's

plan::PlanInputs inputs(const plan::ModelDesc& m, int nodes, int gpus) {
  plan::PlanInputs in;
  in.model = m;
  in.topo = {nodes, gpus};
  in.device_mem = (80ull << 30) * static_cast<uint64_t>(gpus);
  in.host_mem = 1ull << 40;
  in.nvme_space = 4ull << 40;
  in.base.bf16 = true;
  return in;
}

TEST(Plan, RowBytesArePlanPlacementPeaks) {
  auto m = plan::hf_model(fixture("gpt2.json"));
  ASSERT_OK(m);
  for (auto [nodes, gpus] : {std::pair{1, 1}, std::pair{2, 4}}) {
    plan::PlanInputs in = inputs(m.value(), nodes, gpus);
    auto res = plan::make_plan(in);
    ASSERT_OK(res);
    ASSERT_EQ(res->rows.size(), plan::all_placements().size());
    EXPECT_EQ(res->params, 124439808u);
    int checked = 0;
    for (const plan::PlanRow& row : res->rows) {
      const config::Config cfg = plan::config_for(in.base, row.placement);
      zero::PlanTarget t;
      t.device_budget = 80ull << 30;
      t.queued_gathers = false;
      t.host_memory = plan::per_rank_memory(in).host;  // as plan_row() sizes the buffers left to zoe
      auto pl = zero::plan_placement(cfg, m->modules, nodes * gpus, 0, t);
      ASSERT_OK(pl) << row.placement.label();
      EXPECT_EQ(row.bytes.device, pl->peak.device) << row.placement.label();
      EXPECT_EQ(row.bytes.host, pl->peak.host) << row.placement.label();
      EXPECT_EQ(row.bytes.nvme, pl->peak.nvme) << row.placement.label();
      EXPECT_TRUE(row.fits) << row.placement.label();
      EXPECT_TRUE(row.exact);
      checked++;
    }
    EXPECT_EQ(checked, 70);
    // Sorted by predicted time.
    for (size_t i = 1; i < res->rows.size(); ++i) {
      EXPECT_LE(res->rows[i - 1].cost.step_s, res->rows[i].cost.step_s) << i;
    }
  }
}

TEST(Plan, FittingRowsFirstAndNothingFitsNamesTheClosest) {
  auto m = plan::hf_model(fixture("llama-2-7b.json"));
  ASSERT_OK(m);
  plan::PlanInputs in = inputs(m.value(), 1, 1);
  in.device_mem = 24ull << 30;
  in.host_mem = 64ull << 30;
  in.nvme_space = 2ull << 40;
  auto res = plan::make_plan(in);
  ASSERT_OK(res);
  ASSERT_TRUE(res->any_fits());
  bool seen_unfit = false;
  for (const auto& r : res->rows) {
    if (!r.fits) seen_unfit = true;
    EXPECT_FALSE(seen_unfit && r.fits) << "a fitting row after an unfitting one: " << r.placement.label();
    if (!r.fits) {
      EXPECT_GT(r.lacks.device + r.lacks.host + r.lacks.nvme, 0u) << r.placement.label();
    }
    if (r.fits) {
      EXPECT_LE(r.bytes.device, 24ull << 30);
      EXPECT_LE(r.bytes.host, 64ull << 30);
    }
  }
  // 7B parameters do not fit in 8 GiB device + 16 GiB host + 20 GiB NVMe: the states alone are
  // 16 bytes a parameter.
  in.device_mem = 8ull << 30;
  in.host_mem = 16ull << 30;
  in.nvme_space = 20ull << 30;
  auto none = plan::make_plan(in);
  ASSERT_OK(none);
  EXPECT_FALSE(none->any_fits());
  Status s = plan::nothing_fits(none.value(), in);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kOutOfBudget);
  EXPECT_NE(s.message().find("the closest, stage 3"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("of NVMe space per rank"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("6738415616 parameters"), std::string::npos) << s.message();
}

TEST(Plan, ActivationsComeOutOfTheDeviceBudget) {
  auto m = plan::gpt_model("medium");
  ASSERT_OK(m);
  plan::PlanInputs in = inputs(m.value(), 1, 1);
  in.work.micro_batch = 8;
  in.work.seq = 128;
  in.count_activations = true;
  auto res = plan::make_plan(in);
  ASSERT_OK(res);
  const uint64_t act = plan::activation_bytes(m.value(), in.work, 2);
  EXPECT_GT(act, 0u);
  for (const auto& r : res->rows) EXPECT_EQ(r.activation_bytes, act);
  // A device smaller than the activations: nothing fits, and the device is what is lacking.
  in.device_mem = act / 2;
  auto none = plan::make_plan(in);
  ASSERT_OK(none);
  EXPECT_FALSE(none->any_fits());
  Status s = plan::nothing_fits(none.value(), in);
  EXPECT_NE(s.message().find("of device memory per rank"), std::string::npos) << s.message();
}

// Activation checkpointing: the block inputs (layers x micro-batch x seq x d_model, fp32 for zoe's
// GPT) are counted apart from one block's workspace; the activation store's plan keeps them all on
// the device while the row fits, and otherwise fills the device (the last tensor always), then the
// host's activation budget, then NVMe; the cost model counts their traffic on each link.
TEST(Plan, CheckpointedActivationsGoThroughTheTiers) {
  auto m = plan::gpt_model("demo", 0, 0, 0, 1024);
  ASSERT_OK(m);
  plan::PlanInputs in = inputs(m.value(), 1, 1);
  in.work.micro_batch = 8;
  in.work.seq = 1024;
  in.work.grad_accum = 2;
  in.count_activations = true;
  auto plain = plan::make_plan(in);
  ASSERT_OK(plain);
  in.act.checkpointing = true;
  in.act.offload = ActivationOffload::kNvme;
  auto fits = plan::make_plan(in);
  ASSERT_OK(fits);
  const uint64_t tensor = 8ull * 1024 * 256 * 4, all = 6 * tensor;
  for (const auto& r : fits->rows) {
    ASSERT_TRUE(r.fits) << r.placement.label();
    EXPECT_EQ(r.checkpoint_bytes, all);
    EXPECT_EQ(r.checkpoint_tiers.device, all) << "nothing offloaded when the run fits";
    EXPECT_EQ(r.checkpoint_tiers.host + r.checkpoint_tiers.nvme, 0u);
    EXPECT_EQ(r.cost.bytes.act_device_to_host + r.cost.bytes.act_nvme_write, 0u);
    EXPECT_LT(r.activation_bytes, plain->rows.front().activation_bytes) << "one block's workspace, not six";
  }
  // Recompute: a forward more per micro-batch (8 of 6 x params x tokens).
  EXPECT_NEAR(fits->rows.front().cost.bytes.flops / plain->rows.front().cost.bytes.flops, 4.0 / 3.0, 1e-9);
  // Room on the device for two and a half tensors, on the host for three beside the NVMe tier's
  // buffers (two write runs of an eighth of the budget, 8 MiB at most; three read-ahead blocks):
  // 2 / 3 / 1.
  in.act.device_budget = tensor * 5 / 2;
  plan::ActivationSizes one;
  one.tensor = tensor;
  in.act.host_budget = 3 * tensor + (16u << 20) + 3 * tensor;
  EXPECT_EQ(plan::nvme_host_buffers(one, in.act, in.act.host_budget), (16u << 20) + 3 * tensor);
  EXPECT_EQ(plan::nvme_host_buffers(one, in.act, 1u << 20), (256u << 10) + 3 * tensor);
  auto split = plan::make_plan(in);
  ASSERT_OK(split);
  for (const auto& r : split->rows) {
    EXPECT_EQ(r.checkpoint_tiers.device, 2 * tensor) << r.placement.label();
    EXPECT_EQ(r.checkpoint_tiers.host, 3 * tensor);
    EXPECT_EQ(r.checkpoint_tiers.nvme, tensor);
    // Per step (2 micro-batches): every offloaded byte leaves and comes back; NVMe's both ways.
    EXPECT_EQ(r.cost.bytes.act_device_to_host, 2 * 4 * tensor);
    EXPECT_EQ(r.cost.bytes.act_host_to_device, 2 * 4 * tensor);
    EXPECT_EQ(r.cost.bytes.act_nvme_write, 2 * tensor);
    EXPECT_EQ(r.cost.bytes.act_nvme_read, 2 * tensor);
    EXPECT_GE(r.cost.bytes.nvme_write, r.cost.bytes.act_nvme_write);
  }
  // Offload to host only: the rest all goes to the host (its budget is then what it lacks).
  in.act.offload = ActivationOffload::kCpu;
  auto cpu = plan::make_plan(in);
  ASSERT_OK(cpu);
  EXPECT_EQ(cpu->rows.front().checkpoint_tiers.host, 4 * tensor);
  EXPECT_EQ(cpu->rows.front().checkpoint_tiers.nvme, 0u);
  // No room on the device at all: the last tensor stays (keep_last).
  in.act.offload = ActivationOffload::kNvme;
  in.act.device_budget = 1;
  auto last = plan::make_plan(in);
  ASSERT_OK(last);
  EXPECT_EQ(last->rows.front().checkpoint_tiers.device, tensor);
}

// With room on the device only for what the placement and the workspace leave, the store's share is
// that room: a row that does not fit with every checkpoint on the device offloads some, keeps the
// device under its memory and fits; without offload the same row lacks device memory.
TEST(Plan, CheckpointsOffloadOnlyWhatTheDeviceCannotHold) {
  auto m = plan::gpt_model("demo", 0, 0, 0, 1024);
  ASSERT_OK(m);
  plan::PlanInputs in = inputs(m.value(), 1, 1);
  in.work.micro_batch = 8;
  in.work.seq = 1024;
  in.count_activations = true;
  in.act.checkpointing = true;
  auto roomy = plan::make_plan(in);
  ASSERT_OK(roomy);
  uint64_t least = UINT64_MAX;
  for (const auto& r : roomy->rows) least = std::min(least, r.bytes.device);
  const uint64_t tensor = 8ull * 1024 * 256 * 4;
  in.device_mem = least - 3 * tensor;  // even the smallest row lacks three tensors' room
  auto none = plan::make_plan(in);
  ASSERT_OK(none);
  EXPECT_FALSE(none->any_fits());
  in.act.offload = ActivationOffload::kNvme;
  auto off = plan::make_plan(in);
  ASSERT_OK(off);
  ASSERT_TRUE(off->any_fits());
  for (const auto& r : off->rows) {
    if (!r.fits) continue;
    const zero::TierBytes& t = r.checkpoint_tiers;
    EXPECT_EQ(t.device + t.host + t.nvme, 6 * tensor) << r.placement.label();
    EXPECT_GE(t.device, tensor);
    EXPECT_GE(t.host + t.nvme, 3 * tensor) << r.placement.label();
    EXPECT_LE(r.bytes.device, in.device_mem);
  }
}

TEST(Plan, SplitCheckpointsKeepsSmallTensorsAndTheLast) {
  constexpr uint64_t k = 4096;  // one tensor, a 4 KiB multiple as the read-ahead blocks are
  plan::ActivationSizes a;
  a.count = 4;
  a.tensor = k;
  a.checkpoint = 4 * k;
  plan::ActivationOptions o;
  o.offload = ActivationOffload::kNvme;
  o.min_bytes = 0;
  o.write_buffers = 1;
  o.run_bytes = k;  // the NVMe tier's buffers: one run and three read-ahead blocks of the host's room
  zero::TierBytes t = plan::split_checkpoints(a, o, 0, 4 * k + k + k / 2);
  EXPECT_EQ(t.device, k);  // keep_last
  EXPECT_EQ(t.host, k);
  EXPECT_EQ(t.nvme, 2 * k);
  t = plan::split_checkpoints(a, o, 2 * k + k / 2, 4 * k + k);  // room for two on the device
  EXPECT_EQ(t.device, 2 * k);
  EXPECT_EQ(t.host, k);
  EXPECT_EQ(t.nvme, k);
  o.min_bytes = k + 1;  // every tensor below the minimum: all stay
  t = plan::split_checkpoints(a, o, 0, k);
  EXPECT_EQ(t.device, 4 * k);
  o.min_bytes = 0;
  o.offload = ActivationOffload::kCpu;  // everything that leaves goes to the host
  t = plan::split_checkpoints(a, o, 0, 0);
  EXPECT_EQ(t.host, 3 * k);
  o.offload = ActivationOffload::kNone;
  t = plan::split_checkpoints(a, o, 0, 0);
  EXPECT_EQ(t.device, 4 * k);
}

std::vector<zero::ModuleShape> mlp_shapes(int layers, size_t d) {
  std::vector<zero::ModuleShape> sh;
  for (int l = 0; l < layers; ++l) sh.push_back({"layer." + std::to_string(l), {d * d, d}});
  return sh;
}

TEST(Plan, RowsAboveTheDeviceBudgetNeedThePlannersPeak) {
  // 4 modules of 2352 bf16 parameters (4096 padded) with bf16 Adam states on the device: 224 KiB
  // resident (12 bytes of states and 2 of parameters per element) plus what a module in use
  // moves (its 8 KiB gradient buffer). With 228 KiB the planner refuses it (it would fail
  // mid-step); the plan's row needs the planner's peak and lacks the difference.
  plan::ModelDesc m;
  m.modules = mlp_shapes(4, 48);
  m.params = plan::count_params(m.modules);
  plan::PlanInputs in = inputs(m, 1, 1);
  in.device_mem = 228 << 10;
  const plan::RowPlacement stage1{1, Offload::kNone, Offload::kNone, 1.0, true};
  zero::PlanTarget t;
  t.device_budget = in.device_mem;
  t.queued_gathers = false;
  auto pl = zero::plan_placement(plan::config_for(in.base, stage1), m.modules, 1, 0, t);
  ASSERT_FALSE(pl.is_ok());
  EXPECT_EQ(pl.status().code(), StatusCode::kOutOfBudget);
  EXPECT_NE(pl.status().message().find("of device memory at once"), std::string::npos)
      << pl.status().message();
  t.device_budget = 1ull << 40;
  auto unbounded = zero::plan_placement(plan::config_for(in.base, stage1), m.modules, 1, 0, t);
  ASSERT_OK(unbounded);
  EXPECT_GT(unbounded->peak.device, in.device_mem);
  EXPECT_GE(unbounded->peak.device, 224u << 10);
  auto row = plan::plan_row(in, stage1);
  ASSERT_OK(row);
  EXPECT_FALSE(row->fits);
  EXPECT_EQ(row->bytes.device, unbounded->peak.device);
  EXPECT_EQ(row->lacks.device, unbounded->peak.device - in.device_mem);
}

TEST(Calibration, NvmeRateAtABlockAndDepthIsTheSweepsEnvelope) {
  plan::LinkRates r;
  r.io_sweep = {
      {262144, 4, 1.0, 0.8}, {262144, 32, 2.0, 1.6}, {1048576, 4, 2.5, 2.0}, {1048576, 32, 3.0, 2.4}};
  r.aio_block_size = 1048576;
  r.aio_queue_depth = 32;
  r.nvme_read_gbps = 3.0;
  r.nvme_write_gbps = 2.4;
  EXPECT_DOUBLE_EQ(r.nvme_at(false, 1048576, 32), 3.0);  // a point: what it measured
  EXPECT_DOUBLE_EQ(r.nvme_at(true, 262144, 4), 0.8);
  EXPECT_DOUBLE_EQ(r.nvme_at(false, 1048576, 8), 2.5);   // (1 MiB, 4) beats (1 MiB, 32) x 8/32
  EXPECT_DOUBLE_EQ(r.nvme_at(false, 4194304, 64), 3.0);  // nothing measured counts for more
  EXPECT_DOUBLE_EQ(r.nvme_at(false, 131072, 4), 0.5);    // smaller requests: in proportion
  EXPECT_DOUBLE_EQ(r.nvme_at(false, 262144, 2), 0.5);    // (256 KiB, 4) x 2/4 beats (1 MiB, 4) x 1/4 x 2/4
  // A flag that sets the chosen point's rate scales the whole sweep.
  r.nvme_read_gbps = 6.0;
  EXPECT_DOUBLE_EQ(r.nvme_at(false, 1048576, 4), 5.0);
  // No sweep: the rates themselves.
  r.io_sweep.clear();
  EXPECT_DOUBLE_EQ(r.nvme_at(false, 4096, 1), 6.0);
}

TEST(CostModel, StagingDepthAndAioPointMoveTheNvmeTime) {
  // Stage-3 partitions on NVMe with a sweep where depth matters: more staging buffers in flight
  // load faster (until aio.queue_depth caps them), and so does the aio point the sweep favours.
  plan::ModelDesc m;
  m.modules = mlp_shapes(6, 1024);
  m.params = plan::count_params(m.modules);
  plan::PlanInputs in = inputs(m, 1, 1);
  in.device_mem = 20u << 20;
  in.rates.io_sweep = {{1048576, 2, 1.0, 1.0}, {1048576, 8, 3.0, 3.0}};
  in.rates.aio_block_size = 1048576;
  in.rates.aio_queue_depth = 8;
  in.rates.nvme_read_gbps = in.rates.nvme_write_gbps = 3.0;
  in.rates.flops = 1e15;  // compute hides nothing: the loads are on the path
  in.base.aio.block_size = 1048576;
  in.base.aio.queue_depth = 8;
  const plan::RowPlacement nvme{3, Offload::kNvme, Offload::kCpu, 1.0, false};
  struct Nvme {
    double busy_s;
    uint64_t loaded;
  };
  auto nvme_s = [&](int64_t buffers, int64_t depth) {
    plan::PlanInputs k = in;
    k.base.zero.offload_param.max_in_cpu = 0;  // loads from NVMe, not from the host cache
    k.base.zero.offload_param.buffer_count = buffers;
    k.base.zero.offload_param.buffer_size = 262144;  // 512 KiB pieces
    k.base.given_keys.insert(
        {"zero_optimization.offload_param.max_in_cpu", "zero_optimization.offload_param.buffer_size"});
    k.base.aio.queue_depth = depth;
    auto row = plan::plan_row(k, nvme);
    EXPECT_TRUE(row.is_ok() && row->fits);
    if (!row.is_ok()) return Nvme{0, 0};
    return Nvme{row->cost.busy_s[static_cast<int>(plan::Resource::kNvme)], row->cost.bytes.host_to_device};
  };
  // 512 KiB requests: (1 MiB, 2) counts 0.5 x depth/2 GB/s, (1 MiB, 8) 1.5 x depth/8. The step's
  // synchronous partition reads and writes run at depth 1 in every variant: the loads make the
  // difference, at 0.25 GB/s (one buffer), 0.75 (four), 1.5 (32 buffers, queue depth 8) and 0.5
  // (32 buffers, queue depth 2).
  const Nvme one = nvme_s(2, 8), four = nvme_s(5, 8), many = nvme_s(33, 8), shallow = nvme_s(33, 2);
  const double L = static_cast<double>(one.loaded);
  ASSERT_GT(L, 0);
  EXPECT_EQ(four.loaded, one.loaded);
  EXPECT_NEAR(one.busy_s - four.busy_s, L / 0.25e9 - L / 0.75e9, 1e-9);
  EXPECT_NEAR(four.busy_s - many.busy_s, L / 0.75e9 - L / 1.5e9, 1e-9);
  EXPECT_NEAR(shallow.busy_s - many.busy_s, L / 0.5e9 - L / 1.5e9, 1e-9);
}

TEST(CostModel, NvmeTrafficCostsCpuTimeOnTheCpuDeviceAndBurstsStallTheBackward) {
  // NVMe optimizer states at stage 1, compute dominating every overlap group: on zoe's CPU device
  // each NVMe byte moved beside the compute adds 1 / nvme_cpu_gbps seconds; on CUDA nothing.
  plan::ModelDesc m;
  m.modules = mlp_shapes(4, 2048);  // 4 Mi elements a module: 16 chunks of 256 Ki
  m.params = plan::count_params(m.modules);
  plan::PlanInputs in = inputs(m, 1, 1);
  in.rates.flops = 1e9;  // seconds of compute: the NVMe work hides under it
  in.base.zero.sub_group_size = 262144;
  // DeepSpeed's buffer_count (4: three slots), as written, not sized by zoe from the host share.
  in.base.given_keys.insert("zero_optimization.offload_optimizer.buffer_count");
  const plan::RowPlacement nvme{1, Offload::kNone, Offload::kNvme, 1.0, false};
  auto step = [&](bool cuda, double nvme_cpu, plan::PlanRow* out = nullptr, int64_t sub = 262144) {
    plan::PlanInputs k = in;
    k.base.zero.sub_group_size = sub;
    k.cuda = cuda;
    k.rates.nvme_cpu_gbps = nvme_cpu;
    auto row = plan::plan_row(k, nvme);
    EXPECT_TRUE(row.is_ok() && row->fits);
    if (!row.is_ok()) return 0.0;
    if (out) *out = row.value();
    return row->cost.step_s;
  };
  plan::PlanRow cheap, whole;
  const double free_io = step(false, 1e9, &cheap);
  const double costly = step(false, 1.0);
  // The backward's accumulator writes are beside the compute: at least their bytes' CPU time.
  const double sums = 4.0 * static_cast<double>(m.params);
  EXPECT_GT(costly - free_io, 0.99 * sums / 1e9);
  EXPECT_EQ(step(true, 1e9), step(true, 1.0)) << "on CUDA the compute is not the CPU's";
  // Each module's 17 chunks of sums (4 Mi + 2 Ki elements, 1 MiB chunks) leave at once; the
  // swapper's write buffers (8, its most) take 8, the other 9 stall the backward: serial NVMe time
  // on the path, at the write rate; but the first module's first 2 chunks were read ahead (3
  // slots, all but one) and take their sums from memory: 15 chunks, 7 stall. With 4 MiB chunks (5 a module, 5
  // buffers) nothing stalls. (A serial step whose CPU Adam outlasts its NVMe time: no other NVMe time is on
  // the path.)
  in.base.zoe.overlap_step = false;
  in.rates.cpu_adam_gbps = 0.01;
  step(false, 1e9, &cheap);
  step(false, 1e9, &whole, 1 << 20);
  const double stalled = (7.0 + 3 * 9) * (1 << 20) / (in.rates.nvme_write_gbps * 1e9);
  EXPECT_NEAR(cheap.cost.critical_s[static_cast<int>(plan::Resource::kNvme)], stalled, 1e-12);
  EXPECT_EQ(whole.cost.critical_s[static_cast<int>(plan::Resource::kNvme)], 0.0);
}

TEST(CostModel, LongAccumulationsCostTheirSteadyStateInConstantTime) {
  // Micro-batches 2 .. A-2 of a step are alike; from A = 6 on the model runs one and repeats its
  // share. Each further micro-batch then adds what the fifth adds at A = 5 (run one by one):
  // exactly for bytes, to rounding for times, at any A (10^9 here, which a loop would not finish).
  plan::ModelDesc m;
  m.modules = mlp_shapes(6, 1024);  // 2 MiB of bf16 parameters each
  m.params = plan::count_params(m.modules);
  plan::PlanInputs in = inputs(m, 1, 1);
  const plan::RowPlacement nvme{3, Offload::kNvme, Offload::kNvme, 1.0, false};
  zero::PlanTarget t;
  // A device cache smaller than the partitions (12 MiB): loads every micro-batch.
  t.device_budget = 12u << 20;
  t.queued_gathers = false;
  const config::Config cfg = plan::config_for(in.base, nvme, "/unused");
  auto pl = zero::plan_placement(cfg, m.modules, 1, 0, t);
  ASSERT_OK(pl);
  auto cost = [&](int64_t accum) {
    plan::Workload w;
    w.params = m.params;
    w.seq = 64;
    w.grad_accum = accum;
    return plan::estimate_step(cfg, pl.value(), w, in.topo, plan::LinkRates{}, plan::DeviceKind{false});
  };
  const plan::StepCost c4 = cost(4), c5 = cost(5);
  for (const int64_t a : {int64_t{5}, int64_t{9}, int64_t{1000000000}}) {
    const plan::StepCost ca = cost(a), cb = cost(a + 1);
    SCOPED_TRACE("accumulation " + std::to_string(a));
    EXPECT_EQ(cb.bytes.nvme_read - ca.bytes.nvme_read, c5.bytes.nvme_read - c4.bytes.nvme_read);
    EXPECT_EQ(cb.bytes.nvme_write - ca.bytes.nvme_write, c5.bytes.nvme_write - c4.bytes.nvme_write);
    EXPECT_EQ(cb.bytes.host_to_device - ca.bytes.host_to_device,
              c5.bytes.host_to_device - c4.bytes.host_to_device);
    EXPECT_EQ(cb.bytes.network - ca.bytes.network, c5.bytes.network - c4.bytes.network);
    EXPECT_EQ(cb.bytes.cpu_optimizer - ca.bytes.cpu_optimizer,
              c5.bytes.cpu_optimizer - c4.bytes.cpu_optimizer);
    const double d = c5.step_s - c4.step_s;
    EXPECT_GT(d, 0);
    EXPECT_NEAR(cb.step_s - ca.step_s, d, 1e-9 * cb.step_s + 1e-6 * d);
  }
  EXPECT_GT(c5.bytes.host_to_device - c4.bytes.host_to_device, 0u);  // the cache does reload
  // And in all: A = 10^9 is A = 5 plus 10^9 - 5 such micro-batches.
  const uint64_t more = 1000000000 - 5;
  const plan::StepCost big = cost(1000000000);
  EXPECT_EQ(big.bytes.nvme_read, c5.bytes.nvme_read + more * (c5.bytes.nvme_read - c4.bytes.nvme_read));
  EXPECT_EQ(big.bytes.host_to_device,
            c5.bytes.host_to_device + more * (c5.bytes.host_to_device - c4.bytes.host_to_device));
}

// ---------------------------------------------------------------------------------------------
// The cost model's NVMe bytes against the engine's, for every placement of the engine matrix

Runtime& runtime() { return test::shared_runtime(); }

// states / master: zoe.optimizer_states / zoe.master_weights.
std::string engine_cfg(int stage, const char* opt, const char* param, const std::string& nvme, bool bf16,
                       const char* states, const char* master, double ratio, int micro) {
  auto off = [&](const char* dev) {
    std::string s = std::string("{\"device\": \"") + dev + "\"";
    if (std::string(dev) == "nvme") s += ", \"nvme_path\": \"" + nvme + "\"";
    return s + "}";
  };
  char r[32];
  snprintf(r, sizeof(r), "%g", ratio);
  return std::string("{") + (bf16 ? "\"bf16\": {\"enabled\": true}, " : "") +
         "\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": " + std::to_string(micro) +
         ", \"zero_optimization\": {\"stage\": " + std::to_string(stage) +
         ", \"stage3_param_persistence_threshold\": 0, \"stage3_prefetch_bucket_size\": 6000, "
         "\"sub_group_size\": 20000, \"offload_optimizer\": " +
         off(opt) + ", \"offload_param\": " + off(param) +
         "}, \"zoe\": {\"device_budget\": \"64MiB\", \"offload_ratio\": " + r + ", \"optimizer_states\": \"" +
         states + "\", \"master_weights\": \"" + master + "\"}}";
}

TEST(CostModelVsEngine, NvmeBytesPerStepForEveryPlacement) {
  Runtime& rt = runtime();
  using Case = test::MatrixPlacement;
  const std::vector<Case> cases = test::matrix_placements();
  test::MlpSpec s;
  s.layers = 4;
  s.d = 48;
  int ran = 0, partitioned = 0;
  for (const int micro : {1, 2}) {
    for (const bool bf16 : {false, true}) {
      for (const Case& k : cases) {
        // NVMe-homed partitions: with the host cache holding them all (max_in_cpu's default), and
        // with none beyond the step's two working copies (max_in_cpu 0).
        for (const bool cache : {true, false}) {
          if (!cache && std::string(k.param) != "nvme") continue;
          // bf16 runs: bf16 states at stage 1, int4 states at stage 2, int8 with a bf16 master (the
          // compute copy itself) at stage 3.
          const char* states = !bf16 || k.stage == 0 ? "fp32"
                               : k.stage == 1        ? "bf16"
                               : k.stage == 2        ? "int4"
                                                     : "int8";
          const char* master = bf16 && k.stage == 3 ? "bf16" : "fp32";
          const double ratio = std::string(k.opt) == "none" ? 1.0 : micro == 2 ? 0.5 : 1.0;
          test::ScratchDir nvme("plan-engine");
          const std::string text =
              engine_cfg(k.stage, k.opt, k.param, nvme.path(), bf16, states, master, ratio, micro);
          const std::string what =
              std::string(bf16 ? "bf16" : "fp32") + " states " + states + " master " + master + " micro " +
              std::to_string(micro) + " stage " + std::to_string(k.stage) + " optimizer " + k.opt + " x" +
              std::to_string(ratio) + " params " + k.param + (cache ? "" : " max_in_cpu 0");
          auto cfg = config::Config::parse(text, rt.world_size());
          ASSERT_OK(cfg) << what;
          if (!cache) {
            cfg.value().zero.offload_param.max_in_cpu = 0;
            cfg.value().given_keys.insert("zero_optimization.offload_param.max_in_cpu");
          }
          std::vector<zero::ModuleShape> sh;
          for (int l = 0; l < s.layers; ++l) {
            sh.push_back(
                {"layer." + std::to_string(l), {static_cast<size_t>(s.d * s.d), static_cast<size_t>(s.d)}});
          }
          auto plan = zero::plan_placement(cfg.value(), sh, rt.world_size(), rt.rank(), engine_target(rt));
          ASSERT_OK(plan) << what;
          plan::Workload w;
          w.params = plan::count_params(sh);
          w.micro_batch = s.batch;
          w.seq = 1;
          w.grad_accum = micro;
          const plan::StepCost cost = plan::estimate_step(cfg.value(), plan.value(), w, {1, 1},
                                                          plan::LinkRates{}, plan::DeviceKind{true});

          // The serial step: with the update overlapped behind the next forward (the default), whether
          // a partition reaches the device by a prefetch or by a queued gather's read depends on how
          // far the update has come, so the per-link counts below are checked on the serial schedule.
          cfg.value().zoe.overlap_step = false;
          auto e = zero::create_engine(rt, cfg.value());
          ASSERT_OK(e) << what;
          ASSERT_OK(test::register_mlp(*e.value(), s)) << what;
          std::vector<test::Layer> out;
          std::vector<StepStats> stats;
          Status st =
              test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 4, &out, &stats, -1, micro);
          ASSERT_OK(st) << what;
          ran++;
          // Steady state: the bytes of the last step (counters run from initialize()).
          const StepStats& a = stats[stats.size() - 2];
          const StepStats& b = stats.back();
          const uint64_t rd = b.bytes_nvme_read - a.bytes_nvme_read,
                         wr = b.bytes_nvme_write - a.bytes_nvme_write;
          const uint64_t h2d = b.bytes_host_to_device - a.bytes_host_to_device;
          const uint64_t d2h = b.bytes_device_to_host - a.bytes_device_to_host;
          // StepStats' own per-step figures are these deltas, and per parameter over the model's count.
          EXPECT_EQ(b.step_bytes_nvme_read, rd) << what;
          EXPECT_EQ(b.step_bytes_nvme_write, wr) << what;
          EXPECT_EQ(b.step_bytes_host_to_device, b.bytes_host_to_device - a.bytes_host_to_device) << what;
          EXPECT_EQ(b.step_bytes_device_to_host, d2h) << what;
          EXPECT_DOUBLE_EQ(b.per_param_nvme_write, static_cast<double>(wr) / static_cast<double>(w.params))
              << what;
          EXPECT_DOUBLE_EQ(b.per_param_device_to_host,
                           static_cast<double>(d2h) / static_cast<double>(w.params))
              << what;
          // Optimizer states (swapper step, NVMe gradient accumulation) and stage-3 partition
          // write-backs: exact.
          EXPECT_EQ(wr, cost.bytes.nvme_write) << what;
          EXPECT_EQ(d2h, cost.bytes.device_to_host) << what;
          // Stage-3 partitions offloaded from the device (P bytes in all): each step starts with no
          // device copy (the update wrote the home), so every partition moves at least once; each
          // fetch moves its partition at most once, and each of its prefetches (at most k =
          // ceil(stage3_prefetch_bucket_size / part)) at most once more. Which fetches hit the device
          // cache depends on the timing of the prefetches: the model's count (Belady over the
          // recorded order) and the engine's must both lie in [P, 2 A P (1 + k)].
          uint64_t P = 0;
          size_t min_part = SIZE_MAX;
          for (const auto& m : plan->modules) {
            if (!m.partitioned_params || m.param_home == offload::Tier::kDevice) continue;
            P += m.part * plan->compute_bytes;
            min_part = std::min(min_part, m.part);
          }
          if (P == 0) {
            EXPECT_EQ(rd, cost.bytes.nvme_read) << what;
            EXPECT_EQ(h2d, 0u) << what;
            EXPECT_EQ(cost.bytes.host_to_device, 0u) << what;
            continue;
          }
          partitioned++;
          const uint64_t kp = (6000 + min_part - 1) / min_part;
          const uint64_t hi = 2 * static_cast<uint64_t>(micro) * P * (1 + kp);
          EXPECT_GE(h2d, P) << what;
          EXPECT_LE(h2d, hi) << what;
          EXPECT_GE(cost.bytes.host_to_device, P) << what;
          EXPECT_LE(cost.bytes.host_to_device, 2 * static_cast<uint64_t>(micro) * P) << what;
          if (std::string(k.param) == "cpu") {
            EXPECT_EQ(rd, cost.bytes.nvme_read) << what;  // the optimizer's part: exact
            continue;
          }
          // NVMe-homed: the model's reads are the optimizer's, the device loads, and the update
          // reading every partition once. The engine's partition reads: the same update pass (P), the
          // moves to the device, and on a host-memory device the queued gathers reading partitions
          // that are not on the device (at most one per fetch).
          if (cache) {
            // Every partition stays in the host cache: the device loads, the gathers' reads and the
            // update copy from it, and the NVMe reads are the optimizer's alone: exact.
            EXPECT_EQ(rd, cost.bytes.nvme_read) << what;
            continue;
          }
          // Beyond the two working copies the step's last updates leave, nothing is cached (their
          // later hits are timing: the model counts none, and the engine at most those two).
          const uint64_t opt_rd = cost.bytes.nvme_read - cost.bytes.host_to_device - P;
          ASSERT_GE(rd, opt_rd) << what;
          uint64_t biggest = 0;
          for (const auto& m : plan->modules)
            biggest = std::max<uint64_t>(biggest, m.part * plan->compute_bytes);
          EXPECT_GE(rd - opt_rd + 4 * biggest, 2 * P) << what;
          EXPECT_LE(rd - opt_rd, P + hi + 2 * static_cast<uint64_t>(micro) * P) << what;
        }
      }
    }
  }
  EXPECT_EQ(ran, 2 * 2 * 16 + 2 * 2 * 3);  // + the 3 NVMe-homed placements without the cache
  EXPECT_EQ(partitioned, 2 * 2 * 6 + 2 * 2 * 3);
}

// One case of the optimizers' cost tests below: `type` at placement k with `states` and `micro`
// micro-batches on the MLP (serial update); the model's NVMe bytes per step against the engine's
// last step. The placement and the last step's statistics go to *plan and *last.
void expect_optimizer_bytes(const char* type, const test::MatrixPlacement& k, const char* states, int micro,
                            zero::Placement* plan_out, StepStats* last) {
  Runtime& rt = runtime();
  test::MlpSpec s;
  s.layers = 4;
  s.d = 48;
  test::ScratchDir nvme("plan-engine");
  std::string text = engine_cfg(k.stage, k.opt, k.param, nvme.path(), false, states, "fp32", 1.0, micro);
  text.insert(1, std::string("\"optimizer\": {\"type\": \"") + type + "\"}, ");
  const std::string what = std::string(type) + " stage " + std::to_string(k.stage) + " params " + k.param +
                           " micro " + std::to_string(micro) + " " + states;
  auto cfg = config::Config::parse(text, rt.world_size());
  ASSERT_OK(cfg) << what;
  cfg.value().zoe.overlap_step = false;
  std::vector<zero::ModuleShape> sh;
  for (int l = 0; l < s.layers; ++l) {
    sh.push_back({"layer." + std::to_string(l),
                  {static_cast<size_t>(s.d * s.d), static_cast<size_t>(s.d)},
                  false,
                  false,
                  {{"w", {s.d, s.d}}, {"b", {s.d}}}});
  }
  auto plan = zero::plan_placement(cfg.value(), sh, rt.world_size(), rt.rank(), engine_target(rt));
  ASSERT_OK(plan) << what;
  plan::Workload w;
  w.params = plan::count_params(sh);
  w.micro_batch = s.batch;
  w.seq = 1;
  w.grad_accum = micro;
  const plan::StepCost cost =
      plan::estimate_step(cfg.value(), plan.value(), w, {1, 1}, plan::LinkRates{}, plan::DeviceKind{true});
  auto e = zero::create_engine(rt, cfg.value());
  ASSERT_OK(e) << what;
  ASSERT_OK(test::register_mlp(*e.value(), s)) << what;
  std::vector<test::Layer> out;
  std::vector<StepStats> stats;
  ASSERT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 4, &out, &stats, -1, micro))
      << what;
  const StepStats& a = stats[stats.size() - 2];
  const StepStats& b = stats.back();
  EXPECT_EQ(b.bytes_nvme_read - a.bytes_nvme_read, cost.bytes.nvme_read) << what;
  EXPECT_EQ(b.bytes_nvme_write - a.bytes_nvme_write, cost.bytes.nvme_write) << what;
  *plan_out = std::move(plan).value();
  *last = b;
}

// optimizer.type Muon: the model's NVMe bytes per step equal the engine's where the optimizer's are
// the only NVMe traffic (its update reads and writes the gradient sums and the momentum once more, as
// stored: packed int8 where micro is 2, and reads nothing ahead), and each module's Newton-Schulz
// flops are counted from its matrices' shapes.
TEST(CostModelVsEngine, MuonNvmeBytesPerStep) {
  for (const int micro : {1, 2}) {
    for (const test::MatrixPlacement& k :
         {test::MatrixPlacement{1, "nvme", "none"}, test::MatrixPlacement{2, "nvme", "none"},
          test::MatrixPlacement{3, "nvme", "cpu"}}) {
      zero::Placement plan;
      StepStats last;
      expect_optimizer_bytes("Muon", k, micro == 2 ? "int8" : "fp32", micro, &plan, &last);
      for (const auto& m : plan.modules) {
        EXPECT_TRUE(m.muon_matrices);
        EXPECT_GT(m.muon_flops, 0.0);  // at 1 rank every rank's range holds the matrix
      }
      EXPECT_GT(last.t_newton_schulz, 0.0);
    }
  }
}

// optimizer.type AdamMini: one state (m) beside the master on NVMe (int4 where micro is 2), its block
// moments in host memory and its block sums taken as the last micro-batch writes the gradient sums:
// the model's NVMe bytes per step (Lion's: the same one state) equal the engine's.
TEST(CostModelVsEngine, AdamMiniNvmeBytesPerStep) {
  for (const int micro : {1, 2}) {
    for (const test::MatrixPlacement& k :
         {test::MatrixPlacement{1, "nvme", "none"}, test::MatrixPlacement{3, "nvme", "nvme"}}) {
      zero::Placement plan;
      StepStats last;
      expect_optimizer_bytes("AdamMini", k, micro == 2 ? "int4" : "fp32", micro, &plan, &last);
    }
  }
}

// The layer-major schedule (zoe.schedule "layer-major", 3 micro-batches): the model's NVMe bytes per
// step equal the engine's where the engine's are deterministic (the optimizer's: gradient sums held
// over a module's micro-batches and written once, never read back): the micro-batch schedule's
// write the sums 3 times and read them back twice.
TEST(CostModelVsEngine, LayerMajorNvmeBytesPerStep) {
  Runtime& rt = runtime();
  test::MlpSpec s;
  s.layers = 4;
  s.d = 48;
  const int micro = 3;
  for (const test::MatrixPlacement& k : test::matrix_placements()) {
    if (std::string(k.opt) != "nvme" && std::string(k.param) != "nvme") continue;
    test::ScratchDir nvme("plan-engine");
    const std::string what = std::string("stage ") + std::to_string(k.stage) + " optimizer " + k.opt +
                             " params " + k.param + ", layer-major x" + std::to_string(micro);
    auto cfg = config::Config::parse(
        engine_cfg(k.stage, k.opt, k.param, nvme.path(), true, "fp32", "fp32", 1.0, micro), rt.world_size());
    ASSERT_OK(cfg) << what;
    cfg.value().zoe.schedule = "layer-major";
    cfg.value().zoe.overlap_step = false;
    std::vector<zero::ModuleShape> sh;
    for (int l = 0; l < s.layers; ++l)
      sh.push_back(
          {"layer." + std::to_string(l), {static_cast<size_t>(s.d * s.d), static_cast<size_t>(s.d)}});
    auto plan = zero::plan_placement(cfg.value(), sh, rt.world_size(), rt.rank(), engine_target(rt));
    ASSERT_OK(plan) << what;
    plan::Workload w;
    w.params = plan::count_params(sh);
    w.micro_batch = s.batch;
    w.seq = 1;
    w.grad_accum = micro;
    w.layer_major = true;
    const plan::StepCost lm =
        plan::estimate_step(cfg.value(), plan.value(), w, {1, 1}, plan::LinkRates{}, plan::DeviceKind{true});
    w.layer_major = false;
    const plan::StepCost mb =
        plan::estimate_step(cfg.value(), plan.value(), w, {1, 1}, plan::LinkRates{}, plan::DeviceKind{true});
    auto e = zero::create_engine(rt, cfg.value());
    ASSERT_OK(e) << what;
    ASSERT_OK(test::register_mlp(*e.value(), s)) << what;
    std::vector<test::Layer> out;
    std::vector<StepStats> stats;
    ASSERT_OK(
        test::engine_train_layer_major(*e.value(), s, rt.rank(), rt.world_size(), 4, &out, &stats, micro))
        << what;
    const StepStats& a = stats[stats.size() - 2];
    const StepStats& b = stats.back();
    const uint64_t rd = b.bytes_nvme_read - a.bytes_nvme_read, wr = b.bytes_nvme_write - a.bytes_nvme_write;
    EXPECT_EQ(wr, lm.bytes.nvme_write) << what;
    // NVMe-homed partitions stay in the host cache (max_in_cpu's default): the reads are the
    // optimizer's alone, exact.
    EXPECT_EQ(rd, lm.bytes.nvme_read) << what;
    if (std::string(k.opt) == "nvme") {
      // Each module's sums: micro-batch reads them back twice and writes them three times.
      uint64_t sums = 0;
      for (const auto& m : plan->modules) sums += m.opt_n * 4;
      EXPECT_EQ(mb.bytes.nvme_write - lm.bytes.nvme_write, 2 * sums) << what;
      EXPECT_GE(mb.bytes.nvme_read - lm.bytes.nvme_read, 2 * sums) << what;
    }
  }
}

TEST(CostModel, NetworkTermIsBytesOverRatePlusOneLatencyPerRound) {
  // Stage 3 on 2 nodes x 2 ranks, bf16, 4 modules of 1 Mi + 1 Ki elements (1,056,768 padded to
  // 2048 x 4), the first fetched twice a pass (as zoe's GPT fetches its tied embedding), and
  // reduce_bucket_size 400000: 100000 elements per rank, so each 264,192-element partition is
  // reduced in 3 reduce-scatters. Per step: 5 + 5 gathers, 4 x 3 reduce-scatters, and the step's
  // 3 all-reduces (norm, module sequence, 8 tensors' gradient flags): 25 collectives.
  plan::ModelDesc m;
  m.modules = mlp_shapes(4, 1024);
  m.params = plan::count_params(m.modules);
  plan::PlanInputs in = inputs(m, 2, 2);
  const plan::RowPlacement none{3, Offload::kNone, Offload::kNone, 1.0, false};
  config::Config cfg = plan::config_for(in.base, none, "/unused");
  cfg.zero.reduce_bucket_size = 400000;
  zero::PlanTarget t;
  t.device_budget = 1ull << 40;
  t.queued_gathers = false;
  auto pl = zero::plan_placement(cfg, m.modules, 4, 0, t);
  ASSERT_OK(pl);
  const uint64_t P = 1056768;
  for (const auto& mp : pl->modules) {
    ASSERT_EQ(mp.padded, P);
    ASSERT_TRUE(mp.partitioned_params);
  }
  plan::Workload w;
  w.params = m.params;
  w.seq = 64;
  w.fetches_per_pass = {2, 1, 1, 1};
  auto cost = [&](plan::Topology topo, double latency_us, int64_t accum) {
    plan::LinkRates r;
    r.net_gbps = 0.5;
    r.intra_gbps = 2.0;
    r.net_latency_us = latency_us;
    w.grad_accum = accum;
    return plan::estimate_step(cfg, pl.value(), w, topo, r, plan::DeviceKind{false});
  };
  const int net = static_cast<int>(plan::Resource::kNetwork);
  // Bytes (ring: 3/4 of each collective's size, bf16): gathers 2 x (5 P), reduce-scatters 4 P,
  // the all-reduces 2 x 3/4 x 11 doubles.
  const uint64_t gathers = static_cast<uint64_t>(0.75 * static_cast<double>(5 * P * 2));
  const uint64_t reduce = static_cast<uint64_t>(0.75 * static_cast<double>(P * 2));
  const uint64_t bytes1 = 2 * gathers + 4 * reduce + 132;
  const plan::StepCost a = cost({2, 2}, 20000.0, 1);
  EXPECT_EQ(a.bytes.network, bytes1);
  EXPECT_EQ(a.bytes.collectives, 25u);
  // Each all-reduce pays the latency twice (a reduce-scatter, then an all-gather): 22 + 2 x 3.
  EXPECT_NEAR(a.busy_s[net], static_cast<double>(bytes1) / 0.5e9 + 28 * 0.02, 1e-12);
  // Two micro-batches: the gathers and reductions twice, the step's all-reduces once.
  const uint64_t bytes2 = 4 * gathers + 8 * reduce + 132;
  const plan::StepCost b = cost({2, 2}, 20000.0, 2);
  EXPECT_EQ(b.bytes.network, bytes2);
  EXPECT_EQ(b.bytes.collectives, 47u);
  EXPECT_NEAR(b.busy_s[net], static_cast<double>(bytes2) / 0.5e9 + 50 * 0.02, 1e-12);
  // The compute is microseconds here (1e14 FLOP/s): nothing hides the network, all of it is on
  // the critical path.
  EXPECT_NEAR(a.critical_s[net], a.busy_s[net], 1e-12);
  // Inside one node (1 x 4 ranks: the same placement) the latency is not modelled.
  const plan::StepCost one = cost({1, 4}, 20000.0, 1);
  EXPECT_EQ(one.bytes.collectives, 25u);
  EXPECT_NEAR(one.busy_s[net], static_cast<double>(bytes1) / 2e9, 1e-12);
  // Without the repeated fetch: one gather fewer per pass, P x 3/4 x 2 bytes fewer each.
  w.fetches_per_pass.clear();
  const plan::StepCost c = cost({2, 2}, 20000.0, 1);
  EXPECT_EQ(c.bytes.collectives, 23u);
  EXPECT_EQ(a.bytes.network - c.bytes.network,
            2 * (gathers - static_cast<uint64_t>(0.75 * static_cast<double>(4 * P * 2))));
}

TEST(CostModel, GptFetchesItsTiedEmbeddingTwiceAPass) {
  auto m = plan::gpt_model("demo");
  ASSERT_OK(m);
  ASSERT_EQ(m->fetches_per_pass.size(), m->modules.size());
  EXPECT_EQ(m->modules[0].name, "embed");
  EXPECT_EQ(m->fetches_per_pass[0], 2);
  for (size_t i = 1; i < m->modules.size(); ++i) EXPECT_EQ(m->fetches_per_pass[i], 1) << m->modules[i].name;
}

}  // namespace
}  // namespace zoe
