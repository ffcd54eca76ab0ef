// `zoe tune --verify K`: the K best candidates trained for a few steps each (see tune_internal.h).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/tune_internal.h"
#include "config/config.h"
#include "core/clock.h"
#include "core/units.h"
#include "io/buffer.h"
#include "io/io_bench.h"
#include "io/swap_file.h"
#include "model/gpt.h"
#include "model/gpt_trainer.h"
#include "optim/adam_bench.h"
#include "plan/calibration.h"
#include "plan/options.h"
#include "plan/planner.h"
#include "zero/engine_internal.h"
#include "zoe/cli.h"
#include "zoe/engine.h"

namespace zoe::cli::tune {

using nlohmann::json;

Verified verify(Runtime& rt, const config::Config& cfg, const plan::PlanInputs& in, int steps,
                const std::string& what) {
  const plan::ModelDesc& m = in.model;
  auto eng = value_or_fail(zero::create_engine(rt, cfg));
  model::GptConfig gc;
  const int T = static_cast<int>(std::min<int64_t>(in.work.seq, m.context > 0 ? m.context : in.work.seq));
  const int B = static_cast<int>(std::max<int64_t>(1, cfg.train_micro_batch_size_per_gpu));
  if (m.zoe_gpt) {
    gc = gpt_config_of(m);
    if (Status s = model::add_gpt_modules(*eng, gc); !s.is_ok()) fail(s);
  } else {
    for (const auto& mod : m.modules) {
      std::vector<ParamSpec> ps;
      for (size_t i = 0; i < mod.param_numel.size(); ++i) {
        ps.push_back({"p" + std::to_string(i), {static_cast<int64_t>(mod.param_numel[i])}});
      }
      Status s = eng->add_module(mod.name, ps);
      if (!s.is_ok()) fail(s);
    }
  }
  Status s = m.zoe_gpt ? eng->initialize([&](size_t mi, size_t p, float* x, size_t n) {
    model::gpt_init(gc, 1, mi, p, x, n);
  })
                       : eng->initialize([](size_t, size_t, float* x, size_t n) {
                           for (size_t i = 0; i < n; ++i)
                             x[i] = 0.01f * std::sin(0.37f * static_cast<float>(i));
                         });
  if (!s.is_ok()) fail(s.with_context("--verify: initialising the engine with " + what));
  const int64_t G = std::max<int64_t>(1, cfg.gradient_accumulation_steps);
  const bool layer_major = cfg.zoe.schedule == "layer-major" && G > 1;
  std::vector<std::unique_ptr<model::GptCpu>> gms;  // layer-major: one per micro-batch
  std::vector<model::GptCpu*> models;
  std::unique_ptr<model::GptTrainer> trainer;
  std::vector<int32_t> tokens, targets;
  if (m.zoe_gpt) {
    for (int64_t g = 0; g < (layer_major ? G : 1); ++g) {
      gms.push_back(value_or_fail(model::GptCpu::create(gc, B, T)));
      models.push_back(gms.back().get());
    }
    trainer = std::make_unique<model::GptTrainer>(*eng, *gms[0], gc, T);
    tokens.resize(static_cast<size_t>(B) * static_cast<size_t>(T));
    targets.resize(tokens.size());
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < tokens.size(); ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      tokens[i] = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(gc.vocab));
      targets[i] = static_cast<int32_t>((x >> 17) % static_cast<uint64_t>(gc.vocab));
    }
  }
  Progress progress(true);
  std::vector<StepStats> stats;
  std::vector<double> times;
  const size_t n = eng->num_modules();
  // Two steps are not timed: the first records the fetch order, the second is the first with
  // prefetching (and warms the thread pools and the page cache of a cold process).
  constexpr int kUntimed = 2;
  // steps 0 (auto): at least 3 timed steps and at least 2 s of them, at most 50, sized by the
  // second untimed step.
  int timed = steps > 0 ? steps : 3;
  for (int k = 0; k < timed + kUntimed; ++k) {
    progress.update(fmt("verify %s: step %d/%d", what.c_str(), k + 1, timed + kUntimed));
    const uint64_t t0 = now_ns();
    if (trainer && layer_major) {
      const std::vector<std::vector<int32_t>> tk(static_cast<size_t>(G), tokens),
          tg(static_cast<size_t>(G), targets);
      (void)value_or_fail(trainer->forward_backward_layer_major(tk, tg, models));
    } else if (trainer) {
      for (int64_t j = 0; j < G; ++j) (void)value_or_fail(trainer->forward_backward(tokens, targets));
    } else {
      // The modules' fetches and reductions alone, in the schedule's order (include/zoe/engine.h):
      // layer-major, each module fetched once per pass and its G reductions together.
      const int64_t passes = layer_major ? 1 : G, per_fetch = layer_major ? G : 1;
      for (int64_t j = 0; j < passes; ++j) {
        for (size_t i = 0; i < n; ++i) {
          (void)value_or_fail(eng->fetch(i));
          if (Status r = eng->release(i); !r.is_ok()) fail(r);
        }
        for (size_t i = n; i-- > 0;) {
          (void)value_or_fail(eng->fetch(i));
          for (int64_t g = 0; g < per_fetch; ++g) {
            (void)value_or_fail(eng->grads(i));
            if (Status r = eng->reduce_grads(i); !r.is_ok()) fail(r);
          }
          if (Status r = eng->release(i); !r.is_ok()) fail(r);
        }
      }
    }
    stats.push_back(value_or_fail(eng->step()));
    const double wall = static_cast<double>(now_ns() - t0) * 1e-9;
    if (k >= kUntimed) times.push_back(wall);
    if (k == kUntimed - 1 && steps == 0 && wall > 0) {
      timed = static_cast<int>(std::clamp(std::ceil(2.0 / wall), 3.0, 50.0));
    }
  }
  progress.done();
  Verified v;
  v.with_compute = m.zoe_gpt;
  std::sort(times.begin(), times.end());
  v.step_s = times[times.size() / 2];
  v.steps = static_cast<int>(times.size());
  const StepStats& a = stats[stats.size() - 2];
  const StepStats& b = stats.back();
  v.nvme_read = b.bytes_nvme_read - a.bytes_nvme_read;
  v.nvme_write = b.bytes_nvme_write - a.bytes_nvme_write;
  for (int t = 0; t < 3; ++t) v.high_water[t] = b.high_water[t];
  return v;
}

namespace {

// The K best by prediction, one per placement first (knob variants of one placement are
// predicted within a few percent of each other, and the model's error is larger than that, so
// K distinct placements give the measurement more to choose from), then the next best variants
// when there are fewer than K placements.
std::vector<size_t> verify_picks(const std::vector<Candidate>& cands, size_t k) {
  std::vector<size_t> picks;
  std::vector<std::string> seen;
  for (size_t i = 0; i < cands.size() && picks.size() < k; ++i) {
    const std::string label = cands[i].row.placement.label();
    if (std::find(seen.begin(), seen.end(), label) != seen.end()) continue;
    seen.push_back(label);
    picks.push_back(i);
  }
  for (size_t i = 0; i < cands.size() && picks.size() < k; ++i) {
    if (std::find(picks.begin(), picks.end(), i) == picks.end()) picks.push_back(i);
  }
  return picks;
}

// A verified candidate's measured high-water marks must stay within the plan's tiers.
void check_high_water(size_t i, const Candidate& c, const Verified& v) {
  if (v.high_water[0] > c.row.bytes.device || v.high_water[1] > c.row.bytes.host ||
      v.high_water[2] > c.row.bytes.nvme) {
    fail(internal_error(
        "--verify: candidate %zu (%s): a tier's high-water mark exceeded the plan (device %llu > %llu, "
        "host %llu > %llu or nvme %llu > %llu)",
        i + 1, c.row.placement.label().c_str(), static_cast<unsigned long long>(v.high_water[0]),
        static_cast<unsigned long long>(c.row.bytes.device), static_cast<unsigned long long>(v.high_water[1]),
        static_cast<unsigned long long>(c.row.bytes.host), static_cast<unsigned long long>(v.high_water[2]),
        static_cast<unsigned long long>(c.row.bytes.nvme)));
  }
}

}  // namespace

// --verify K: the K best candidates by prediction, each run for a few engine steps without the
// model's compute; the choice is the measured best.
void verify_candidates(const TuneOpts& o, const plan::PlanOptions& po, TuneResult* t) {
  Runtime* rt = &runtime();
  if (rt->world_size() != t->in.topo.world()) {
    fail(invalid_argument(
        "--verify runs the plan's world of %d rank(s) but this process has %d: launch it under "
        "mpirun -np %d, or plan one node with one rank",
        t->in.topo.world(), rt->world_size(), t->in.topo.world()));
  }
  const size_t k = std::min(static_cast<size_t>(o.verify), t->cands.size());
  const std::vector<size_t> picks = verify_picks(t->cands, k);
  for (size_t pi = 0; pi < picks.size(); ++pi) {
    const size_t i = picks[pi];
    const Candidate& c = t->cands[i];
    VerifiedRun r{i, tuned_config(t->in, c, plan::nvme_dir(po)), {}, 0};
    r.v = verify(*rt, r.cfg, t->in, o.verify_steps,
                 fmt("candidate %zu/%zu (%s)", pi + 1, k, c.row.placement.label().c_str()));
    // What was measured: the whole step, or without the compute when the model's kernels are not zoe's.
    r.predicted_no_compute =
        r.v.with_compute
            ? c.row.cost.step_s
            : c.row.cost.step_s - c.row.cost.critical_s[static_cast<int>(plan::Resource::kCompute)];
    check_high_water(i, c, r.v);
    t->runs.push_back(std::move(r));
  }
  for (size_t i = 1; i < t->runs.size(); ++i) {
    if (t->runs[i].v.step_s < t->runs[t->chosen].v.step_s) t->chosen = i;
  }
}

}  // namespace zoe::cli::tune
