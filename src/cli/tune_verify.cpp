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
  std::unique_ptr<model::GptCpu> gm;
  std::unique_ptr<model::GptTrainer> trainer;
  std::vector<int32_t> tokens, targets;
  if (m.zoe_gpt) {
    gm = value_or_fail(model::GptCpu::create(gc, B, T));
    trainer = std::make_unique<model::GptTrainer>(*eng, *gm, gc, T);
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
    for (int64_t j = 0; j < std::max<int64_t>(1, cfg.gradient_accumulation_steps); ++j) {
      if (trainer) {
        (void)value_or_fail(trainer->forward_backward(tokens, targets));
        continue;
      }
      for (size_t i = 0; i < n; ++i) {
        (void)value_or_fail(eng->fetch(i));
        if (Status r = eng->release(i); !r.is_ok()) fail(r);
      }
      for (size_t i = n; i-- > 0;) {
        (void)value_or_fail(eng->fetch(i));
        (void)value_or_fail(eng->grads(i));
        if (Status r = eng->reduce_grads(i); !r.is_ok()) fail(r);
        if (Status r = eng->release(i); !r.is_ok()) fail(r);
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

}  // namespace zoe::cli::tune
