// `zoe tune`: measures this host's link rates (--calibrate: NVMe through zoe's I/O benchmark, CPU
// Adam through zoe's Adam benchmark, FLOP/s of zoe's GPT kernels), searches the plan's rows and a
// few knobs with the cost model, writes the best as a DeepSpeed-compatible config that `zoe train
// --config` runs (--out), and runs the K best for a few steps each to check the plan and choose (--verify K).
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

namespace zoe::cli {
namespace {

using nlohmann::json;

struct TuneOpts {
  plan::PlanOptions plan;
  bool calibrate = false;
  std::string calibration_out = "zoe-calibration.json";
  std::string calibrate_bytes = "256MiB";
  std::string out;
  int verify = 0;        // the K best candidates run
  int verify_steps = 3;  // timed engine steps of each
  std::string plot;      // predicted against measured step time per verified candidate
  bool json = false;
};

// The process's runtime, started once (calibration and --verify both train through engines).
Runtime& runtime() {
  static std::unique_ptr<Runtime> rt = value_or_fail(Runtime::init());
  return *rt;
}

// zoe's GPT of a model description's dimensions (meaningful where m.zoe_gpt).
model::GptConfig gpt_config_of(const plan::ModelDesc& m) {
  model::GptConfig c;
  c.layers = m.layers;
  c.d_model = m.d_model;
  c.heads = m.heads;
  c.seq = m.context;
  c.vocab = m.vocab;
  return c;
}

// --- Calibration ----------------------------------------------------------------------------

// The I/O engine over aio block sizes x queue depths on `dir`: reads of a laid-out file, then
// writes over it (each point: one untimed and two timed passes over `bytes`).
Result<std::vector<plan::IoPoint>> sweep_nvme(const std::string& dir, uint64_t bytes, Progress* progress) {
  io::SwapFileOptions so;
  so.dirs = {dir};
  so.name = "zoe-tune-calibrate";
  so.grow_bytes = 0;
  ZOE_ASSIGN_OR_RETURN(auto sf, io::SwapFile::create(so));
  ZOE_ASSIGN_OR_RETURN(io::Extent ext, sf->allocate(bytes));
  progress->update("calibrate: laying out " + format_bytes(bytes) + " at " + dir);
  ZOE_RETURN_IF_ERROR_CTX(io::write_pattern(*sf, ext, 0x5eed), "laying out " + dir);
  const size_t kBlocks[] = {256u << 10, 1u << 20, 4u << 20};
  const uint32_t kDepths[] = {4, 8, 32};
  std::vector<plan::IoPoint> pts;
  for (size_t bs : kBlocks) {
    for (uint32_t qd : kDepths) pts.push_back({static_cast<int64_t>(bs), qd, 0, 0});
  }
  const size_t n = pts.size();
  for (int w = 0; w < 2; ++w) {
    const io::IoOp op = w ? io::IoOp::kWrite : io::IoOp::kRead;
    for (size_t i = 0; i < n; ++i) {
      plan::IoPoint& p = pts[i];
      io::IoBenchConfig cfg;
      cfg.file = sf.get();
      cfg.extent = ext;
      cfg.loops = 2;
      cfg.warmup = 1;
      cfg.on_pass = [&](int pass, int passes) {
        progress->update(fmt("calibrate: NVMe %s at %s, %s x qd %lld (%zu/%zu), pass %d/%d",
                             w ? "write" : "read", dir.c_str(),
                             format_bytes(static_cast<uint64_t>(p.block_size)).c_str(),
                             static_cast<long long>(p.queue_depth), i + 1, n, pass + 1, passes));
      };
      io::IoBenchCase c{io::IoBackend::kAuto, static_cast<size_t>(p.block_size),
                        static_cast<uint32_t>(p.queue_depth), op};
      ZOE_ASSIGN_OR_RETURN(io::IoBenchRow row, io::run_io_bench(cfg, c));
      (w ? p.write_gbps : p.read_gbps) = row.gbps;
    }
  }
  return pts;
}

// The sweep's point for the engine: the fastest read followed by a write of the same bytes (the
// optimizer's swap), 1 / (1/read + 1/write).
const plan::IoPoint& best_io_point(const std::vector<plan::IoPoint>& pts) {
  auto score = [](const plan::IoPoint& p) { return 1.0 / (1.0 / p.read_gbps + 1.0 / p.write_gbps); };
  return *std::max_element(pts.begin(), pts.end(), [&](const plan::IoPoint& a, const plan::IoPoint& b) {
    return score(a) < score(b);
  });
}

// FLOP/s of zoe's GPT kernels on this host (what zoe's CPU device computes with): forward and
// backward, 6 N tokens per pass, of the planned model's shape at its micro-batch (a GEMM's rate
// depends on its shape: a small model's is far below a large one's): the whole model where it
// is small enough, else one block of it; the "small" preset when the model has no dimensions
// (--params).
Result<double> measure_flops(const plan::ModelDesc& m, const plan::Workload& w, Progress* progress) {
  const model::GptPreset* small = model::find_gpt_preset("small");
  model::GptConfig c;
  c.layers = small->layers;
  c.d_model = small->d_model;
  c.heads = small->heads;
  c.seq = small->context;
  c.vocab = 256;
  int batch = 8, T = c.seq;
  if (m.d_model > 0 && m.heads > 0 && m.context > 0) {
    // Bounded so that calibration stays short and small: a width above 4096 is measured at 4096
    // (the rate of wider GEMMs is no lower), at most 512 positions and 2048 tokens a pass.
    // The whole model when its fp32 parameters and gradients take at most 2 GiB, else one block.
    c.layers = 8.0 * static_cast<double>(m.params) <= 2.0 * (1u << 30) ? std::max(1, m.layers) : 1;
    c.d_model = std::min(m.d_model, 4096);
    c.heads = c.d_model == m.d_model ? m.heads : c.d_model / 128;
    T = static_cast<int>(std::min<int64_t>({w.seq > 0 ? w.seq : m.context, m.context, 512}));
    c.seq = T;
    batch = static_cast<int>(std::clamp<int64_t>(w.micro_batch, 1, std::max(1, 2048 / T)));
  }
  ZOE_ASSIGN_OR_RETURN(auto k, model::GptCpu::create(c, batch, T));
  const auto mods = model::gpt_modules(c);
  std::vector<std::vector<std::vector<float>>> p(mods.size()), g(mods.size());
  std::vector<std::vector<const float*>> pp(mods.size());
  std::vector<std::vector<float*>> gp(mods.size());
  for (size_t m = 0; m < mods.size(); ++m) {
    for (size_t t = 0; t < mods[m].params.size(); ++t) {
      p[m].emplace_back(mods[m].params[t].numel());
      g[m].emplace_back(mods[m].params[t].numel(), 0.0f);
      model::gpt_init(c, 1, m, t, p[m].back().data(), p[m].back().size());
    }
    for (auto& v : p[m]) pp[m].push_back(v.data());
    for (auto& v : g[m]) gp[m].push_back(v.data());
  }
  std::vector<int32_t> tokens(static_cast<size_t>(batch * T)), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 7) % 256);
    targets[i] = static_cast<int32_t>((i * 7 + 1) % 256);
  }
  const size_t L = static_cast<size_t>(c.layers);
  auto pass = [&] {
    k->embed_forward(tokens.data(), pp[0].data());
    for (size_t l = 0; l < L; ++l) k->block_forward(static_cast<int>(l), pp[l + 1].data());
    (void)k->head_forward(pp[L + 1].data(), pp[0].data(), targets.data());
    k->head_backward(pp[L + 1].data(), pp[0].data(), gp[L + 1].data(), gp[0].data());
    for (size_t l = L; l-- > 0;) k->block_backward(static_cast<int>(l), pp[l + 1].data(), gp[l + 1].data());
    k->embed_backward(gp[0].data());
  };
  progress->update("calibrate: FLOP/s of zoe's GPT kernels");
  pass();  // warm-up
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    const uint64_t t0 = now_ns();
    pass();
    best = std::min(best, static_cast<double>(now_ns() - t0) * 1e-9);
  }
  return 6.0 * static_cast<double>(c.num_params()) * batch * T / best;
}

// FLOP/s of zoe's GPT as `zoe train` computes: a few steps of the planned model through an
// engine that keeps every state in memory (stage 1, no offload), 6 N tokens over the step's
// compute time (StepStats::t_compute: the kernels and the trainer's dtype conversions, outside
// the engine's calls). 0 when the model is not zoe's GPT or its states would take more than a
// quarter of the host's available memory.
Result<double> measure_train_flops(const plan::PlanInputs& pre, Progress* progress) {
  const plan::ModelDesc& m = pre.model;
  if (!m.zoe_gpt) return 0.0;
  const double state_bytes = 16.0 * static_cast<double>(m.params);
  const uint64_t avail = host_memory_available();
  if (avail == 0 || state_bytes > static_cast<double>(avail) / 4) return 0.0;
  config::Config cfg = pre.base;
  cfg.zero.stage = 1;
  cfg.zero.offload_param.device = config::OffloadDevice::kNone;
  cfg.zero.offload_optimizer.device = config::OffloadDevice::kNone;
  cfg.zoe.device = "cpu";
  cfg.zoe.device_budget_bytes = 0;
  const int B = static_cast<int>(std::max<int64_t>(1, pre.work.micro_batch));
  const int T = static_cast<int>(std::min<int64_t>(pre.work.seq > 0 ? pre.work.seq : m.context, m.context));
  cfg.train_micro_batch_size_per_gpu = B;
  cfg.gradient_accumulation_steps = 1;
  Runtime& rt = runtime();
  cfg.train_batch_size = static_cast<int64_t>(B) * rt.world_size();
  ZOE_ASSIGN_OR_RETURN(auto eng, zero::create_engine(rt, cfg));
  const model::GptConfig gc = gpt_config_of(m);
  ZOE_RETURN_IF_ERROR(model::add_gpt_modules(*eng, gc));
  ZOE_RETURN_IF_ERROR(
      eng->initialize([&](size_t mi, size_t p, float* x, size_t n) { model::gpt_init(gc, 1, mi, p, x, n); }));
  ZOE_ASSIGN_OR_RETURN(auto gm, model::GptCpu::create(gc, B, T));
  model::GptTrainer trainer(*eng, *gm, gc, T);
  std::vector<int32_t> tokens(static_cast<size_t>(B) * static_cast<size_t>(T)), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 7) % static_cast<size_t>(gc.vocab));
    targets[i] = static_cast<int32_t>((i * 7 + 1) % static_cast<size_t>(gc.vocab));
  }
  std::vector<double> t;
  for (int k = 0; k < 4; ++k) {  // the first is a warm-up
    progress->update(fmt("calibrate: FLOP/s of %s through the engine, step %d/4", m.name.c_str(), k + 1));
    ZOE_RETURN_IF_ERROR(trainer.forward_backward(tokens, targets).status());
    ZOE_ASSIGN_OR_RETURN(StepStats st, eng->step());
    if (k > 0) t.push_back(st.t_compute);
  }
  std::sort(t.begin(), t.end());
  if (!(t[1] > 0)) return 0.0;
  return 6.0 * static_cast<double>(m.params) * B * T / t[1];
}

// Host memory copy GB/s: zoe's CPU device's "host <-> device" and device-memory rate.
double measure_memcpy() {
  const size_t n = 64u << 20;
  std::vector<char> a(n, 1), b(n, 0);
  double best = 1e30;
  for (int r = 0; r < 4; ++r) {
    const uint64_t t0 = now_ns();
    memcpy(b.data(), a.data(), n);
    best = std::min(best, static_cast<double>(now_ns() - t0) * 1e-9);
  }
  return 2.0 * static_cast<double>(n) / best / 1e9;  // read + write
}

plan::LinkRates calibrate(const TuneOpts& o, const plan::PlanInputs& pre) {
  Progress progress(true);
  plan::LinkRates r;
  const std::string dir = plan::nvme_dir(o.plan);
  const uint64_t bytes = value_or_fail(parse_bytes(o.calibrate_bytes)) / 4096 * 4096;
  if (bytes < (16u << 20))
    fail(invalid_argument("--calibrate-bytes %s: at least 16MiB", o.calibrate_bytes.c_str()));
  auto sweep = sweep_nvme(dir, bytes, &progress);
  if (!sweep.is_ok()) fail(sweep.status().with_context("calibrating NVMe reads and writes"));
  r.io_sweep = std::move(sweep).value();
  const plan::IoPoint& best = best_io_point(r.io_sweep);
  r.nvme_read_gbps = best.read_gbps;
  r.nvme_write_gbps = best.write_gbps;
  r.aio_block_size = best.block_size;
  r.aio_queue_depth = best.queue_depth;
  progress.update("calibrate: CPU Adam");
  optim::bench::Config ac;
  ac.params = size_t{16} << 20;
  ac.out_dtype = DType::kBF16;
  ac.repeats = 3;
  auto adam = optim::bench::run(ac);
  if (!adam.is_ok()) fail(adam.status().with_context("calibrating CPU Adam"));
  r.cpu_adam_gbps = adam->fused_gbps();
  // The rate `zoe train` sees where the model fits in memory here, else its kernels' rate.
  const double train_flops = value_or_fail(measure_train_flops(pre, &progress));
  r.flops = train_flops > 0 ? train_flops : value_or_fail(measure_flops(pre.model, pre.work, &progress));
  r.h2d_gbps = r.device_mem_gbps = measure_memcpy();
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  r.host = host;
  progress.done();
  return r;
}

// --- Search ---------------------------------------------------------------------------------

struct Candidate {
  plan::PlanRow row;
  int64_t prefetch_bucket = 0, sub_group = 0;
};

// Every fitting row, with the knobs the model sees: the stage-3 prefetch bucket (the device
// cache and gather window) and the swapper's sub-group (its pipeline fill).
std::vector<Candidate> search(const plan::PlanInputs& in, const plan::PlanResult& res) {
  std::vector<Candidate> out;
  for (const plan::PlanRow& r : res.rows) {
    if (!r.fits) continue;
    std::vector<int64_t> buckets = {in.base.zero.stage3_prefetch_bucket_size};
    if (r.placement.stage == 3) buckets.insert(buckets.end(), {10000000, 200000000});
    std::vector<int64_t> subs = {in.base.zero.sub_group_size};
    if (r.placement.optimizer == config::OffloadDevice::kNvme) subs.push_back(100000000);
    for (int64_t b : buckets) {
      for (int64_t s : subs) {
        plan::PlanInputs k = in;
        k.base.zero.stage3_prefetch_bucket_size = b;
        k.base.zero.sub_group_size = s;
        auto row = plan::plan_row(k, r.placement);
        if (!row.is_ok() || !row->fits) continue;
        out.push_back({row.value(), b, s});
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    return a.row.cost.step_s < b.row.cost.step_s;
  });
  return out;
}

config::Config tuned_config(const plan::PlanInputs& in, const Candidate& c, const std::string& nvme) {
  config::Config base = in.base;
  // The calibrated I/O point (the sweep's best), where the calibration has one.
  if (in.rates.aio_block_size > 0) {
    base.aio.block_size = in.rates.aio_block_size;
    base.aio.queue_depth = in.rates.aio_queue_depth;
  }
  base.zero.stage3_prefetch_bucket_size = c.prefetch_bucket;
  base.zero.sub_group_size = c.sub_group;
  config::Config cfg = plan::config_for(base, c.row.placement, nvme);
  const uint64_t dev = plan::per_rank_memory(in).device;
  cfg.zoe.device_budget_bytes =
      static_cast<int64_t>(dev > c.row.activation_bytes ? dev - c.row.activation_bytes : dev);
  cfg.zoe.device = in.cuda ? "cuda" : "cpu";
  cfg.train_micro_batch_size_per_gpu = in.work.micro_batch;
  cfg.gradient_accumulation_steps = in.work.grad_accum;
  cfg.train_batch_size = in.work.micro_batch * in.work.grad_accum * in.topo.world();
  return cfg;
}

// --- Verification ---------------------------------------------------------------------------

struct Verified {
  bool with_compute = false;  // the model's kernels ran (zoe's GPT), else the engine's part alone
  double step_s = 0;
  uint64_t nvme_read = 0, nvme_write = 0;
  uint64_t high_water[3] = {0, 0, 0};
};

// `steps` timed steps (after one that records the fetch order) of the tuned config. zoe's GPT runs
// its CPU kernels on random tokens through model::GptTrainer: the whole step, as `zoe train` runs
// it. Any other model runs on its modules with the caller's compute left out (zero gradients): the
// engine's I/O, collectives and optimizer as the plan placed them.
Verified verify(Runtime& rt, const config::Config& cfg, const plan::PlanInputs& in, int steps,
                const std::string& what) {
  const plan::ModelDesc& m = in.model;
  auto eng = value_or_fail(zero::create_engine(rt, cfg));
  model::GptConfig gc;
  const int T = static_cast<int>(std::min<int64_t>(in.work.seq, m.context > 0 ? m.context : in.work.seq));
  const int B = static_cast<int>(in.work.micro_batch);
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
  for (int k = 0; k < steps + kUntimed; ++k) {
    progress.update(fmt("verify %s: step %d/%d", what.c_str(), k + 1, steps + kUntimed));
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
    if (k >= kUntimed) times.push_back(static_cast<double>(now_ns() - t0) * 1e-9);
  }
  progress.done();
  Verified v;
  v.with_compute = m.zoe_gpt;
  std::sort(times.begin(), times.end());
  v.step_s = times[times.size() / 2];
  const StepStats& a = stats[stats.size() - 2];
  const StepStats& b = stats.back();
  v.nvme_read = b.bytes_nvme_read - a.bytes_nvme_read;
  v.nvme_write = b.bytes_nvme_write - a.bytes_nvme_write;
  for (int t = 0; t < 3; ++t) v.high_water[t] = b.high_water[t];
  return v;
}

// --- The command ----------------------------------------------------------------------------

json candidate_json(const Candidate& c) {
  const plan::RowPlacement& p = c.row.placement;
  return {{"placement",
           {{"stage", p.stage},
            {"offload_param", config::offload_device_name(p.param)},
            {"offload_optimizer", config::offload_device_name(p.optimizer)},
            {"offload_ratio", p.optimizer != config::OffloadDevice::kNone ? json(p.ratio) : json(nullptr)},
            {"bf16_optimizer_states", p.bf16_states}}},
          {"stage3_prefetch_bucket_size", c.prefetch_bucket},
          {"sub_group_size", c.sub_group},
          {"bytes", {{"device", c.row.bytes.device}, {"host", c.row.bytes.host}, {"nvme", c.row.bytes.nvme}}},
          {"predicted_step_s", c.row.cost.step_s},
          {"bottleneck", plan::resource_name(c.row.cost.bottleneck)},
          {"bottleneck_share", c.row.cost.bottleneck_share}};
}

void run(const TuneOpts& o) {
  if (o.verify < 0) fail(invalid_argument("--verify %d: expected a number of candidates >= 1", o.verify));
  if (o.verify_steps < 1 || o.verify_steps > 1000) {
    fail(invalid_argument("--verify-steps %d is out of range (expected an integer in [1, 1000])",
                          o.verify_steps));
  }
  if (o.verify_steps != 3 && o.verify == 0)
    fail(invalid_argument("--verify-steps has no effect without --verify K"));
  if (!o.plot.empty()) {
    if (o.verify == 0)
      fail(invalid_argument("--plot %s needs --verify K (it draws predicted against measured)",
                            o.plot.c_str()));
    Status ps = plot_available();
    if (!ps.is_ok()) fail(ps.with_context("checking for --plot " + o.plot + " before tuning"));
  }
  json j;
  plan::PlanOptions po = o.plan;
  if (o.calibrate) {
    // The model and workload first (without a calibration): the FLOP rate is measured at its shape.
    plan::PlanOptions bare = o.plan;
    bare.calibration.clear();
    const plan::PlanInputs pre = value_or_fail(plan::plan_inputs(bare));
    plan::LinkRates r = calibrate(o, pre);
    std::ofstream f(o.calibration_out);
    f << r.to_json();
    f.close();
    if (!f) fail(sys_error("write", o.calibration_out, errno).with_context("saving the calibration"));
    fprintf(stderr, "zoe tune: calibration saved to %s\n", o.calibration_out.c_str());
    po.calibration = o.calibration_out;
    j["calibration"] = json::parse(r.to_json());
  }
  plan::PlanInputs in = value_or_fail(plan::plan_inputs(po));
  plan::PlanResult res = value_or_fail(plan::make_plan(in));
  if (!res.any_fits()) fail(plan::nothing_fits(res, in));
  std::vector<Candidate> cands = search(in, res);
  if (cands.empty()) fail(internal_error("no candidate fits after the knob search"));
  // --verify K: the K best candidates by prediction, each run for a few engine steps without the
  // model's compute; the choice is the measured best.
  struct Run {
    size_t index;  // into cands
    config::Config cfg;
    Verified v;
    double predicted_no_compute;
  };
  std::vector<Run> runs;
  size_t chosen = 0;
  if (o.verify > 0) {
    Runtime* rt = &runtime();
    if (rt->world_size() != in.topo.world()) {
      fail(invalid_argument(
          "--verify runs the plan's world of %d rank(s) but this process has %d: launch it under "
          "mpirun -np %d, or plan one node with one rank",
          in.topo.world(), rt->world_size(), in.topo.world()));
    }
    const size_t k = std::min(static_cast<size_t>(o.verify), cands.size());
    for (size_t i = 0; i < k; ++i) {
      const Candidate& c = cands[i];
      Run r{i, tuned_config(in, c, plan::nvme_dir(po)), {}, 0};
      r.v = verify(*rt, r.cfg, in, o.verify_steps,
                   fmt("candidate %zu/%zu (%s)", i + 1, k, c.row.placement.label().c_str()));
      // What was measured: the whole step, or without the compute when the model's kernels are not zoe's.
      r.predicted_no_compute =
          r.v.with_compute
              ? c.row.cost.step_s
              : c.row.cost.step_s - c.row.cost.critical_s[static_cast<int>(plan::Resource::kCompute)];
      const Verified& v = r.v;
      if (v.high_water[0] > c.row.bytes.device || v.high_water[1] > c.row.bytes.host ||
          v.high_water[2] > c.row.bytes.nvme) {
        fail(internal_error(
            "--verify: candidate %zu (%s): a tier's high-water mark exceeded the plan (device %llu > %llu, "
            "host %llu > %llu or nvme %llu > %llu)",
            i + 1, c.row.placement.label().c_str(), static_cast<unsigned long long>(v.high_water[0]),
            static_cast<unsigned long long>(c.row.bytes.device),
            static_cast<unsigned long long>(v.high_water[1]),
            static_cast<unsigned long long>(c.row.bytes.host),
            static_cast<unsigned long long>(v.high_water[2]),
            static_cast<unsigned long long>(c.row.bytes.nvme)));
      }
      runs.push_back(std::move(r));
    }
    for (size_t i = 1; i < runs.size(); ++i) {
      if (runs[i].v.step_s < runs[chosen].v.step_s) chosen = i;
    }
  }
  const Candidate& best = cands[chosen];
  const config::Config cfg = runs.empty() ? tuned_config(in, best, plan::nvme_dir(po)) : runs[chosen].cfg;
  if (!o.out.empty()) {
    const std::string text = cfg.to_json();
    // What zoe train --config will read must parse back to the same config.
    auto back = config::Config::parse(text, in.topo.world());
    if (!back.is_ok()) fail(back.status().with_context("the tuned config does not parse back"));
    std::ofstream f(o.out);
    f << text;
    f.close();
    if (!f) fail(sys_error("write", o.out, errno).with_context("writing the tuned config"));
    fprintf(stderr, "zoe tune: config written to %s\n", o.out.c_str());
  }
  auto verified_json = [&] {
    json a = json::array();
    for (const Run& r : runs) {
      const Candidate& c = cands[r.index];
      a.push_back(
          {{"rank_predicted", r.index + 1},
           {"placement", c.row.placement.label()},
           {"predicted_step_s", c.row.cost.step_s},
           {"with_compute", r.v.with_compute},
           {"predicted_step_s_as_measured", r.predicted_no_compute},
           {"error", (r.predicted_no_compute - r.v.step_s) / std::max(r.v.step_s, 1e-12)},
           {"measured_step_s", r.v.step_s},
           {"steps", o.verify_steps},
           {"nvme_read", r.v.nvme_read},
           {"nvme_write", r.v.nvme_write},
           {"predicted_nvme_read", c.row.cost.bytes.nvme_read},
           {"predicted_nvme_write", c.row.cost.bytes.nvme_write},
           {"high_water",
            {{"device", r.v.high_water[0]}, {"host", r.v.high_water[1]}, {"nvme", r.v.high_water[2]}}},
           {"config", json::parse(r.cfg.to_json())}});
    }
    return a;
  };
  json verified = runs.empty() ? json() : verified_json();
  if (!o.plot.empty()) {
    Progress plotting(true);
    plotting.update("plotting " + o.plot);
    json pj = {{"verified", verified}};
    if (!in.rates.io_sweep.empty()) pj["io_sweep"] = json::parse(in.rates.to_json())["io_sweep"];
    Status ps = write_plot("tune", pj.dump(), o.plot);
    plotting.done();
    if (!ps.is_ok()) fail(ps.with_context("--plot " + o.plot));
  }
  if (o.json) {
    j["params"] = res.params;
    j["best"] = candidate_json(best);
    json alt = json::array();
    for (size_t i = 0; i < cands.size() && alt.size() < 5; ++i) {
      if (i != chosen) alt.push_back(candidate_json(cands[i]));
    }
    j["alternatives"] = alt;
    if (!o.out.empty()) j["out"] = o.out;
    if (in.rates.aio_block_size > 0) {
      j["aio"] = {{"block_size", in.rates.aio_block_size}, {"queue_depth", in.rates.aio_queue_depth}};
    }
    if (!runs.empty()) {
      // `best` is the measured best of the verified candidates; `predicted_best` the model's.
      j["verified"] = verified;
      j["chosen"] = chosen + 1;
      j["chosen_differs_from_predicted"] = chosen != 0;
      j["predicted_best"] = candidate_json(cands.front());
    }
    print_json(j);
    return;
  }
  printf("# zoe tune: %s, %llu parameters, %d node(s) x %d rank(s); %zu fitting candidates\n",
         in.model.name.c_str(), static_cast<unsigned long long>(res.params), in.topo.nodes,
         in.topo.gpus_per_node, cands.size());
  Table t({{"placement", "", 56, true},
           {"bucket", "elems", 10},
           {"subgroup", "elems", 10},
           {"step", "s", 10},
           {"bottleneck", "(share)", 17, true}});
  t.print_header(stdout);
  for (size_t i = 0; i < cands.size() && i < 6; ++i) {
    const Candidate& c = cands[i];
    t.print_row(
        stdout,
        {(i == chosen ? "* " : "  ") + c.row.placement.label(), std::to_string(c.prefetch_bucket),
         std::to_string(c.sub_group), fmt("%.4g", c.row.cost.step_s),
         fmt("%s (%.0f%%)", plan::resource_name(c.row.cost.bottleneck), 100 * c.row.cost.bottleneck_share)});
  }
  if (in.rates.aio_block_size > 0) {
    printf(
        "# I/O: aio.block_size %s, aio.queue_depth %lld: the calibration's fastest read-then-write of %zu "
        "points (read %.2f GB/s, write %.2f GB/s)\n",
        format_bytes(static_cast<uint64_t>(in.rates.aio_block_size)).c_str(),
        static_cast<long long>(in.rates.aio_queue_depth), in.rates.io_sweep.size(), in.rates.nvme_read_gbps,
        in.rates.nvme_write_gbps);
  }
  if (!runs.empty()) {
    if (runs.front().v.with_compute) {
      printf("\n# verified: %d steps of each, the GPT's kernels on random tokens (the whole step)\n",
             o.verify_steps);
    } else {
      printf(
          "\n# verified: %d steps of each without the model's compute (predicted: the step less its "
          "compute)\n",
          o.verify_steps);
    }
    Table vt({{"candidate", "", 56, true},
              {"predicted", "s", 11},
              {"measured", "s", 11},
              {"error", "", 8},
              {"nvme read", "bytes", 11},
              {"(model)", "bytes", 11}});
    vt.print_header(stdout);
    for (size_t i = 0; i < runs.size(); ++i) {
      const Run& r = runs[i];
      const Candidate& c = cands[r.index];
      vt.print_row(
          stdout, {(i == chosen ? "* " : "  ") + c.row.placement.label(), fmt("%.4g", r.predicted_no_compute),
                   fmt("%.4g", r.v.step_s),
                   fmt("%+.0f%%", 100 * (r.predicted_no_compute - r.v.step_s) / std::max(r.v.step_s, 1e-12)),
                   format_bytes(r.v.nvme_read), format_bytes(c.row.cost.bytes.nvme_read)});
    }
    if (chosen != 0) {
      printf("# the measured best is candidate %zu, not the predicted best (candidate 1): %s is written\n",
             chosen + 1, o.out.empty() ? "it" : o.out.c_str());
    } else {
      printf("# the predicted best is also the measured best\n");
    }
  }
  if (!o.out.empty()) printf("# config: %s (zoe train --config %s)\n", o.out.c_str(), o.out.c_str());
}

}  // namespace

static void add_tune_command(CLI::App& app) {
  auto o = std::make_shared<TuneOpts>();
  CLI::App* cmd = app.add_subcommand(
      "tune",
      "Pick the fastest placement that fits: the rows of `zoe plan` and a few knobs (stage-3 prefetch\n"
      "bucket, swapper sub-group) searched with the cost model (docs/cost-model.md). --calibrate first\n"
      "measures this host (NVMe read/write, CPU Adam, FLOP/s of zoe's GPT kernels, memory copies) and\n"
      "saves the rates; --out writes the choice as a config for zoe train --config; --verify K runs the\n"
      "K best and chooses the measured best.\n"
      "The network rate is not measured: give --net-gbps/--intra-gbps.");
  plan::add_plan_options(*cmd, &o->plan);
  cmd->add_flag("--calibrate", o->calibrate, "Measure this host's rates first and use them");
  cmd->add_option("--calibration-out", o->calibration_out, "Where --calibrate saves the rates (JSON)")
      ->capture_default_str();
  cmd->add_option("--calibrate-bytes", o->calibrate_bytes, "Bytes of the NVMe calibration file")
      ->capture_default_str();
  cmd->add_option("--out", o->out, "Write the chosen placement as a DeepSpeed-compatible config here");
  cmd->add_option("--verify", o->verify,
                  "Run the K best candidates for --verify-steps engine steps each on the model's modules (no "
                  "model compute), print predicted against measured, and choose the measured best; exit 1 "
                  "if a tier's high-water mark exceeds the plan");
  cmd->add_option("--verify-steps", o->verify_steps, "Timed engine steps per verified candidate")
      ->capture_default_str();
  cmd->add_option("--plot", o->plot,
                  "With --verify: draw predicted against measured step time per candidate into this PNG "
                  "(python3-matplotlib)");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o] { run(*o); });
}

// Joins every program this file is linked into (the `zoe` program links all of src/cli).
static const CommandRegistrar kRegister(41, "", "", add_tune_command);

}  // namespace zoe::cli
