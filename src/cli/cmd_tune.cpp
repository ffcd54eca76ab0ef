// `zoe tune`: measures this host's link rates (--calibrate: NVMe through zoe's I/O benchmark, CPU
// Adam through zoe's Adam benchmark, FLOP/s of zoe's GPT kernels), searches the plan's rows and a
// few knobs with the cost model, writes the best as a DeepSpeed-compatible config that `zoe train
// --config` runs (--out), and runs the K best for a few steps each to check the plan and choose (--verify K).
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/tune_internal.h"
#include "config/config.h"
#include "core/clock.h"
#include "core/units.h"
#include "device/device.h"
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
#include "zoe/files.h"

namespace zoe::cli {
namespace tune {

using nlohmann::json;

// The process's runtime, started once (calibration and --verify both train through engines).
Runtime& runtime() {
  static std::unique_ptr<Runtime> rt = value_or_fail(Runtime::init());
  return *rt;
}

Runtime& local_runtime() {
  static std::unique_ptr<Runtime> rt = value_or_fail(Runtime::init(/*force_local=*/true));
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

}  // namespace tune

namespace {

using namespace tune;
using nlohmann::json;

// --- Search ---------------------------------------------------------------------------------

// The knobs the search sets beyond the placement, as config values (what --out writes).
struct Knobs {
  int64_t prefetch_bucket = 0;           // zero_optimization.stage3_prefetch_bucket_size
  int64_t max_live = 0;                  // zero_optimization.stage3_max_live_parameters
  int64_t sub_group = 0;                 // zero_optimization.sub_group_size
  int64_t opt_buffers = 0;               // offload_optimizer.buffer_count
  int64_t param_buffers = 0;             // offload_param.buffer_count
  int64_t param_buffer_size = 0;         // offload_param.buffer_size (elements)
  int64_t max_in_cpu = 0;                // offload_param.max_in_cpu (elements)
  int64_t aio_block = 0, aio_depth = 0;  // aio.block_size, aio.queue_depth

  void apply(config::Config* c) const {
    // A sizing knob the variant sets to another value than the base config's is given: the
    // planner uses it as it is instead of sizing it from the host share.
    auto set = [c](int64_t* field, int64_t v, const char* key) {
      if (*field != v) c->given_keys.insert(key);
      *field = v;
    };
    c->zero.stage3_prefetch_bucket_size = prefetch_bucket;
    c->zero.stage3_max_live_parameters = max_live;
    set(&c->zero.sub_group_size, sub_group, "zero_optimization.sub_group_size");
    set(&c->zero.offload_optimizer.buffer_count, opt_buffers,
        "zero_optimization.offload_optimizer.buffer_count");
    c->zero.offload_param.buffer_count = param_buffers;
    set(&c->zero.offload_param.buffer_size, param_buffer_size, "zero_optimization.offload_param.buffer_size");
    set(&c->zero.offload_param.max_in_cpu, max_in_cpu, "zero_optimization.offload_param.max_in_cpu");
    c->aio.block_size = aio_block;
    c->aio.queue_depth = aio_depth;
  }
  static Knobs of(const config::Config& c) {
    return {c.zero.stage3_prefetch_bucket_size,
            c.zero.stage3_max_live_parameters,
            c.zero.sub_group_size,
            c.zero.offload_optimizer.buffer_count,
            c.zero.offload_param.buffer_count,
            c.zero.offload_param.buffer_size,
            c.zero.offload_param.max_in_cpu,
            c.aio.block_size,
            c.aio.queue_depth};
  }
};

struct Candidate {
  plan::PlanRow row;
  Knobs knobs;
  int64_t micro_batch = 1, grad_accum = 1;  // micro_batch x grad_accum: the rank's batch per step
};

// The workload at micro-batch `micro`, with the accumulation that keeps this rank's batch.
plan::PlanInputs at_micro_batch(const plan::PlanInputs& in, int64_t micro) {
  plan::PlanInputs k = in;
  const int64_t total = in.work.micro_batch * in.work.grad_accum;
  k.work.micro_batch = micro;
  k.work.grad_accum = total / micro;
  k.base.train_micro_batch_size_per_gpu = micro;
  k.base.gradient_accumulation_steps = total / micro;
  k.rates.flops = in.rates.flops_at(micro);  // measured there by the calibration, if it was
  return k;
}

// The micro-batch sizes searched: every divisor of this rank's batch per step (--micro-batch x
// --grad-accum), largest first, so the batch and hence the training stay the same; only the
// given one with --fixed-micro-batch.
std::vector<int64_t> micro_batches(const plan::Workload& w, bool fixed) {
  if (fixed) return {w.micro_batch};
  int64_t total = 0;
  if (__builtin_mul_overflow(w.micro_batch, w.grad_accum, &total)) {
    fail(invalid_argument("micro-batch %lld x gradient accumulation %lld overflows 64 bits",
                          static_cast<long long>(w.micro_batch), static_cast<long long>(w.grad_accum)));
  }
  // The divisors in pairs (d, total / d) up to the square root: a large batch costs its root.
  std::vector<int64_t> small, large;
  for (int64_t d = 1; d <= total / d; ++d) {
    if (total % d != 0) continue;
    small.push_back(d);
    if (d != total / d) large.push_back(total / d);
  }
  std::vector<int64_t> out(large.begin(), large.end());
  out.insert(out.end(), small.rbegin(), small.rend());
  return out;
}

// The aio points searched: the calibration's chosen point and the two next best read-then-write
// points of its sweep (where the model's NVMe streams differ from the sweep's, one with deeper
// queues or other blocks can serve them better); without a sweep, the base config's.
std::vector<std::pair<int64_t, int64_t>> aio_points(const plan::PlanInputs& in) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (in.rates.aio_block_size > 0) out.emplace_back(in.rates.aio_block_size, in.rates.aio_queue_depth);
  std::vector<plan::IoPoint> pts = in.rates.io_sweep;
  std::stable_sort(pts.begin(), pts.end(), [](const plan::IoPoint& a, const plan::IoPoint& b) {
    return a.read_then_write_gbps() > b.read_then_write_gbps();
  });
  for (const plan::IoPoint& p : pts) {
    if (out.size() >= 3) break;
    if (!(p.read_gbps > 0 && p.write_gbps > 0)) continue;
    const std::pair<int64_t, int64_t> at{p.block_size, p.queue_depth};
    if (std::find(out.begin(), out.end(), at) == out.end()) out.push_back(at);
  }
  if (out.empty()) out.emplace_back(in.base.aio.block_size, in.base.aio.queue_depth);
  return out;
}

// The sizes the planner picks from the host share for the keys the config leaves out
// (Placement::chosen), written into it as values: the config --out writes then plans the same
// buffers wherever it runs.
void write_chosen_sizes(const plan::PlanInputs& in, config::Config* cfg) {
  zero::PlanTarget t;
  t.device_budget = static_cast<uint64_t>(cfg->zoe.device_budget_bytes);
  t.queued_gathers = !in.cuda;
  t.host_memory = plan::per_rank_memory(in).host;
  auto pl = zero::plan_placement(*cfg, in.model.modules, in.topo.world(), 0, t);
  if (!pl.is_ok()) return;  // the candidate was planned; nothing to write otherwise
  const int64_t es = cfg->bf16 || cfg->fp16.enabled ? 2 : 4;
  for (const std::string& key : pl->chosen) {
    if (key == "zero_optimization.offload_optimizer.buffer_count")
      cfg->zero.offload_optimizer.buffer_count = static_cast<int64_t>(pl->swap_buffer_count);
    else if (key == "zero_optimization.offload_param.buffer_size")
      cfg->zero.offload_param.buffer_size = static_cast<int64_t>(pl->tm_staging_bytes) / es;
    else if (key == "zero_optimization.offload_param.max_in_cpu")
      cfg->zero.offload_param.max_in_cpu = static_cast<int64_t>(pl->tm_host_cache) / es;
    cfg->given_keys.insert(key);
  }
}

config::Config tuned_config(const plan::PlanInputs& in, const Candidate& c, const std::string& nvme) {
  config::Config base = in.base;
  c.knobs.apply(&base);
  config::Config cfg = plan::config_for(base, c.row.placement, nvme);
  const uint64_t dev = plan::per_rank_memory(in).device;
  cfg.zoe.device_budget_bytes =
      static_cast<int64_t>(dev > c.row.activation_bytes ? dev - c.row.activation_bytes : dev);
  cfg.zoe.device = in.cuda ? "cuda" : "cpu";
  cfg.train_micro_batch_size_per_gpu = c.micro_batch;
  cfg.gradient_accumulation_steps = c.grad_accum;
  cfg.train_batch_size = c.micro_batch * c.grad_accum * in.topo.world();
  write_chosen_sizes(in, &cfg);
  return cfg;
}

// Every fitting row at every searched micro-batch, with the knobs the model responds to, each
// where it acts: the stage-3 prefetch bucket and stage3_max_live_parameters (the gather window
// and the partitions' device cache share the device memory left); for NVMe-homed
// partitions the tier manager's staging (offload_param.buffer_count x buffer_size: the pieces in
// flight) and its host cache (offload_param.max_in_cpu: host memory against NVMe reads); for NVMe optimizer
// states the swapper's sub-group (chunk: pipeline fill and request size) and offload_optimizer.buffer_count
// (chunks read ahead); and, where anything is on NVMe, the aio block size and queue depth. Variants the model
// cannot tell apart are kept once. An exact search: the product is at most a few thousand rows, each planned
// by the engine's planner and costed in microseconds.
Result<std::vector<Candidate>> search(const plan::PlanInputs& in, bool fixed_micro) {
  std::vector<Candidate> out;
  const auto aio = aio_points(in);
  Knobs base = Knobs::of(in.base);
  std::tie(base.aio_block, base.aio_depth) = aio.front();  // the calibration's point, if any
  for (int64_t micro : micro_batches(in.work, fixed_micro)) {
    const plan::PlanInputs at = at_micro_batch(in, micro);
    ZOE_ASSIGN_OR_RETURN(plan::PlanResult res, plan::make_plan(at));
    for (const plan::PlanRow& r : res.rows) {
      if (!r.fits) continue;
      const plan::RowPlacement& p = r.placement;
      const bool opt_nvme = p.optimizer == config::OffloadDevice::kNvme;
      const bool param_nvme = p.stage == 3 && p.param == config::OffloadDevice::kNvme;
      // The variants: the base config's knobs, and each knob's alternatives where it acts (their
      // product, built one knob at a time).
      std::vector<Knobs> variants = {base};
      auto vary = [&](bool where, int64_t Knobs::*knob, std::initializer_list<int64_t> values) {
        if (!where) return;
        const size_t n = variants.size();
        for (int64_t v : values) {
          for (size_t i = 0; i < n; ++i) {
            if (variants[i].*knob == v) continue;
            Knobs k = variants[i];
            k.*knob = v;
            variants.push_back(k);
          }
        }
      };
      const bool stage3 = p.stage == 3;
      vary(stage3, &Knobs::prefetch_bucket, {10000000, 200000000});
      // Room for one queued gather of the largest module beside the one in use: the window gives
      // its device memory to the partitions' cache.
      const int64_t one_queued = 2 * static_cast<int64_t>(r.largest_gathered);
      vary(stage3 && one_queued > 0 && one_queued < base.max_live, &Knobs::max_live, {one_queued});
      vary(opt_nvme, &Knobs::sub_group, {262144});
      vary(opt_nvme, &Knobs::opt_buffers, {24, 36});
      vary(param_nvme, &Knobs::param_buffers, {9});
      vary(param_nvme, &Knobs::param_buffer_size, {524288});
      vary(param_nvme, &Knobs::max_in_cpu, {0});
      if (opt_nvme || param_nvme) {  // the aio point: block size and queue depth together
        const size_t n = variants.size();
        for (size_t a = 1; a < aio.size(); ++a) {
          for (size_t i = 0; i < n; ++i) {
            Knobs k = variants[i];
            std::tie(k.aio_block, k.aio_depth) = aio[a];
            variants.push_back(k);
          }
        }
      }
      std::vector<std::vector<uint64_t>> seen;  // per variant: its time and memory
      for (const Knobs& kn : variants) {
        plan::PlanInputs k = at;
        kn.apply(&k.base);
        auto row = plan::plan_row(k, p);
        if (!row.is_ok() || !row->fits) continue;
        // Variants the model cannot tell apart (the same time and memory): the first,
        // nearest the base config, is kept.
        std::vector<uint64_t> key = {std::bit_cast<uint64_t>(row->cost.step_s), row->bytes.device,
                                     row->bytes.host, row->bytes.nvme};
        if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
        seen.push_back(std::move(key));
        // The knobs as the plan used them: a size left to zoe is the one it chose (what --out writes).
        Candidate c{row.value(), kn, micro, at.work.grad_accum};
        c.knobs = Knobs::of(tuned_config(at, c, ""));
        out.push_back(std::move(c));
      }
    }
  }
  // The fastest first; among equals, the one that holds the least host memory.
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    if (a.row.cost.step_s != b.row.cost.step_s) return a.row.cost.step_s < b.row.cost.step_s;
    return a.row.bytes.host < b.row.bytes.host;
  });
  return out;
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
          {"stage3_prefetch_bucket_size", c.knobs.prefetch_bucket},
          {"stage3_max_live_parameters", c.knobs.max_live},
          {"sub_group_size", c.knobs.sub_group},
          {"offload_optimizer_buffer_count", c.knobs.opt_buffers},
          {"offload_param_buffer_count", c.knobs.param_buffers},
          {"offload_param_buffer_size", c.knobs.param_buffer_size},
          {"offload_param_max_in_cpu", c.knobs.max_in_cpu},
          {"aio", {{"block_size", c.knobs.aio_block}, {"queue_depth", c.knobs.aio_depth}}},
          {"micro_batch", c.micro_batch},
          {"gradient_accumulation_steps", c.grad_accum},
          {"bytes", {{"device", c.row.bytes.device}, {"host", c.row.bytes.host}, {"nvme", c.row.bytes.nvme}}},
          {"predicted_step_s", c.row.cost.step_s},
          {"bottleneck", plan::resource_name(c.row.cost.bottleneck)},
          {"bottleneck_share", c.row.cost.bottleneck_share}};
}

// The flags' rules: --verify K >= 1, --verify-steps in [0, 1000] and only with --verify, --plot
// only with --verify (and its tools present); every output path writable (zoe/files.h) before the
// measurements.
void check_tune_flags(const TuneOpts& o) {
  check_output_flag("--out", o.out);
  check_output_flag("--plot", o.plot);
  if (!o.calibration_out.empty() && !o.calibrate)
    usage_fail(invalid_argument("--calibration-out %s has no effect without --calibrate",
                                o.calibration_out.c_str()));
  check_output_flag("--calibration-out", o.calibration_out);
  if (o.verify < 0) fail(invalid_argument("--verify %d: expected a number of candidates >= 1", o.verify));
  if (o.verify_steps < 0 || o.verify_steps > 1000) {
    fail(invalid_argument("--verify-steps %d is out of range (expected an integer in [1, 1000], or 0: auto)",
                          o.verify_steps));
  }
  if (o.verify_steps != 0 && o.verify == 0)
    fail(invalid_argument("--verify-steps has no effect without --verify K"));
  if (!o.plot.empty()) {
    if (o.verify == 0)
      fail(invalid_argument("--plot %s needs --verify K (it draws predicted against measured)",
                            o.plot.c_str()));
    Status ps = plot_available();
    if (!ps.is_ok()) fail(ps.with_context("checking for --plot " + o.plot + " before tuning"));
  }
}

// --calibrate: measures this host and plans with the rates; saves them to --calibration-out where
// given (nothing is written unasked), and says where they went.
void calibrate_and_save(const TuneOpts& o, plan::PlanOptions* po, json* j) {
  // The model and workload first (without a calibration): the FLOP rate is measured at its shape.
  plan::PlanOptions bare = *po;
  bare.calibration.clear();
  const plan::PlanInputs pre = value_or_fail(plan::plan_inputs(bare));
  plan::LinkRates r = calibrate(o, pre);
  po->calibration.clear();
  po->calibration_json = r.to_json();
  if (o.calibration_out.empty()) {
    fprintf(stderr,
            "zoe tune: calibration used for this plan and not saved (--calibration-out FILE keeps it for "
            "zoe plan/tune --calibration FILE)\n");
  } else {
    Status ws = write_output_file(o.calibration_out, po->calibration_json, "--calibration-out");
    if (!ws.is_ok()) fail(ws.with_context("saving the calibration"));
    fprintf(stderr, "zoe tune: calibration saved to %s\n", o.calibration_out.c_str());
  }
  (*j)["calibration"] = json::parse(po->calibration_json);
  if (!o.calibration_out.empty()) (*j)["calibration_out"] = o.calibration_out;
}

// --calibrate and --verify measure this host, so they use its device: without --device, the one
// zoe.device "auto" picks here; a --device that cannot be used here is refused before anything is
// measured, naming the flag.
void choose_measured_device(const TuneOpts& o, plan::PlanOptions* po) {
  if (!o.calibrate && o.verify == 0) return;
  if (!o.device_given) {
    po->device = config::auto_device();
    return;
  }
  if (po->device != "cuda") return;  // cpu; anything else is refused by plan_inputs, naming --device
  std::string why;
  if (device::cuda_device_count(&why) > 0) return;
  usage_fail(invalid_argument(
      "--device cuda: this host has no usable GPU (%s), and %s measures this host: give --device cpu (zoe's "
      "CPU device, what a measured tune uses here without --device), or run on a host with a GPU",
      why.empty() ? "none found" : why.c_str(), o.calibrate ? "--calibrate" : "--verify"));
}

// No candidate fits: the plan's reason, and the smaller micro-batches that were tried.
[[noreturn]] void fail_nothing_fits(const TuneOpts& o, const plan::PlanInputs& in,
                                    const plan::PlanResult& res) {
  if (res.any_fits()) fail(internal_error("no candidate fits after the knob search"));
  Status nf = plan::nothing_fits(res, in);
  if (!o.fixed_micro && in.work.micro_batch * in.work.grad_accum > 1) {
    nf = nf.with_context(fmt("at micro-batch %lld, and no smaller micro-batch dividing %lld fits either",
                             static_cast<long long>(in.work.micro_batch),
                             static_cast<long long>(in.work.micro_batch * in.work.grad_accum)));
  }
  fail(nf);
}

// A candidate --verify ran.
struct VerifiedRun {
  size_t index;  // into the candidates
  config::Config cfg;
  Verified v;
  double predicted_no_compute;
};

// The search and its verification: the candidates by prediction, the runs of --verify and the
// choice.
struct TuneResult {
  plan::PlanInputs in;
  plan::PlanResult res;
  std::vector<Candidate> cands;
  std::vector<VerifiedRun> runs;
  size_t chosen = 0;       // into runs (the verified, in the order run)
  size_t chosen_cand = 0;  // into cands (by prediction)
};

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

// --out: the chosen config, checked to parse back to itself (what zoe train --config reads).
void write_tuned_config(const TuneOpts& o, const config::Config& cfg, const plan::PlanInputs& in) {
  // The sizes zoe chose for this placement are given (write_chosen_sizes); the others, left to
  // zoe, are not written, so that the config with another placement is sized for it.
  const std::string text = cfg.to_json(config::Config::JsonKeys::kGivenSizes);
  // What zoe train --config will read must parse back to the same config.
  auto back = config::Config::parse(text, in.topo.world());
  if (!back.is_ok()) fail(back.status().with_context("the tuned config does not parse back"));
  Status ws = write_output_file(o.out, text, "--out");
  if (!ws.is_ok()) fail(ws.with_context("writing the tuned config"));
  fprintf(stderr, "zoe tune: config written to %s\n", o.out.c_str());
}

// The verified candidates, predicted against measured (the JSON's "verified", and --plot's input).
json verified_json(const TuneResult& t) {
  json a = json::array();
  for (const VerifiedRun& r : t.runs) {
    const Candidate& c = t.cands[r.index];
    a.push_back({{"rank_predicted", r.index + 1},
                 {"placement", c.row.placement.label()},
                 {"predicted_step_s", c.row.cost.step_s},
                 {"with_compute", r.v.with_compute},
                 {"predicted_step_s_as_measured", r.predicted_no_compute},
                 {"error", (r.predicted_no_compute - r.v.step_s) / std::max(r.v.step_s, 1e-12)},
                 {"measured_step_s", r.v.step_s},
                 {"steps", r.v.steps},
                 {"nvme_read", r.v.nvme_read},
                 {"nvme_write", r.v.nvme_write},
                 {"predicted_nvme_read", c.row.cost.bytes.nvme_read},
                 {"predicted_nvme_write", c.row.cost.bytes.nvme_write},
                 {"high_water",
                  {{"device", r.v.high_water[0]}, {"host", r.v.high_water[1]}, {"nvme", r.v.high_water[2]}}},
                 {"config", json::parse(r.cfg.to_json(config::Config::JsonKeys::kGivenSizes))}});
  }
  return a;
}

// --plot: predicted against measured per verified candidate (and the calibration's I/O sweep).
void plot_verified(const TuneOpts& o, const plan::PlanInputs& in, const json& verified) {
  Progress plotting(true);
  plotting.update("plotting " + o.plot);
  json pj = {{"verified", verified}};
  if (!in.rates.io_sweep.empty()) pj["io_sweep"] = json::parse(in.rates.to_json())["io_sweep"];
  Status ps = write_plot("tune", pj.dump(), o.plot);
  plotting.done();
  if (!ps.is_ok()) fail(ps.with_context("--plot " + o.plot));
}

// --json: the best, up to five alternatives, the aio choice and the verified runs.
void print_tune_json(const TuneOpts& o, const TuneResult& t, const json& verified, json j) {
  j["params"] = t.res.params;
  j["best"] = candidate_json(t.cands[t.chosen_cand]);
  json alt = json::array();
  for (size_t i = 0; i < t.cands.size() && alt.size() < 5; ++i) {
    if (i != t.chosen_cand) alt.push_back(candidate_json(t.cands[i]));
  }
  j["alternatives"] = alt;
  if (!o.out.empty()) j["out"] = o.out;
  if (t.in.rates.aio_block_size > 0) {
    j["aio"] = {{"block_size", t.in.rates.aio_block_size}, {"queue_depth", t.in.rates.aio_queue_depth}};
  }
  if (!t.runs.empty()) {
    // `best` is the measured best of the verified candidates; `predicted_best` the model's.
    j["verified"] = verified;
    j["chosen"] = t.chosen + 1;
    j["chosen_differs_from_predicted"] = t.chosen_cand != 0;
    j["predicted_best"] = candidate_json(t.cands.front());
  }
  print_json(j);
}

// The text report: the six best candidates (the chosen one starred) and the aio choice.
void print_candidates(const TuneResult& t) {
  const plan::PlanInputs& in = t.in;
  printf("# zoe tune: %s, %llu parameters, %d node(s) x %d rank(s); %zu fitting candidates\n",
         in.model.name.c_str(), static_cast<unsigned long long>(t.res.params), in.topo.nodes,
         in.topo.gpus_per_node, t.cands.size());
  Table tb({{"placement", "", 56, true},
            {"micro", "x accum", 8},
            {"bucket", "elems", 10},
            {"subgroup", "elems", 10},
            {"step", "s", 10},
            {"bottleneck", "(share)", 17, true}});
  tb.print_header(stdout);
  for (size_t i = 0; i < t.cands.size() && i < 6; ++i) {
    const Candidate& c = t.cands[i];
    tb.print_row(
        stdout,
        {(i == t.chosen_cand ? "* " : "  ") + c.row.placement.label(),
         fmt("%lldx%lld", static_cast<long long>(c.micro_batch), static_cast<long long>(c.grad_accum)),
         std::to_string(c.knobs.prefetch_bucket), std::to_string(c.knobs.sub_group),
         fmt("%.4g", c.row.cost.step_s),
         fmt("%s (%.0f%%)", plan::resource_name(c.row.cost.bottleneck), 100 * c.row.cost.bottleneck_share)});
  }
  if (!in.rates.spread.empty()) {
    std::string sp;
    for (const auto& [what, v] : in.rates.spread)
      sp += fmt("%s%s %.1f%%", sp.empty() ? "" : ", ", what.c_str(), 100 * v);
    printf("# calibration's spread (the closest repeats of each timing): %s\n", sp.c_str());
  }
  if (in.rates.aio_block_size > 0) {
    printf(
        "# I/O: aio.block_size %s, aio.queue_depth %lld: the calibration's fastest read-then-write of %zu "
        "points (read %.2f GB/s, write %.2f GB/s)\n",
        format_bytes(static_cast<uint64_t>(in.rates.aio_block_size)).c_str(),
        static_cast<long long>(in.rates.aio_queue_depth), in.rates.io_sweep.size(), in.rates.nvme_read_gbps,
        in.rates.nvme_write_gbps);
  }
}

// The text report of --verify: predicted against measured per candidate, and which was chosen.
void print_verified(const TuneOpts& o, const TuneResult& t) {
  const std::string steps = o.verify_steps > 0 ? fmt("%d steps of each", o.verify_steps)
                                               : std::string("at least 3 steps and 2 s of steps of each");
  if (t.runs.front().v.with_compute) {
    printf("\n# verified: %s, the GPT's kernels on random tokens (the whole step)\n", steps.c_str());
  } else {
    printf("\n# verified: %s without the model's compute (predicted: the step less its compute)\n",
           steps.c_str());
  }
  Table vt({{"candidate", "", 56, true},
            {"predicted", "s", 11},
            {"measured", "s", 11},
            {"error", "", 8},
            {"nvme read", "bytes", 11},
            {"(model)", "bytes", 11}});
  vt.print_header(stdout);
  for (size_t i = 0; i < t.runs.size(); ++i) {
    const VerifiedRun& r = t.runs[i];
    const Candidate& c = t.cands[r.index];
    vt.print_row(
        stdout, {(i == t.chosen ? "* " : "  ") + c.row.placement.label(), fmt("%.4g", r.predicted_no_compute),
                 fmt("%.4g", r.v.step_s),
                 fmt("%+.0f%%", 100 * (r.predicted_no_compute - r.v.step_s) / std::max(r.v.step_s, 1e-12)),
                 format_bytes(r.v.nvme_read), format_bytes(c.row.cost.bytes.nvme_read)});
  }
  if (t.chosen_cand != 0) {
    printf("# the measured best is candidate %zu, not the predicted best (candidate 1): %s is written\n",
           t.chosen_cand + 1, o.out.empty() ? "it" : o.out.c_str());
  } else {
    printf("# the predicted best is also the measured best\n");
  }
}

void run(const TuneOpts& o) {
  check_tune_flags(o);
  json j;
  plan::PlanOptions po = o.plan;
  if (Status s = plan::apply_device_budget(&po); !s.is_ok()) usage_fail(s);
  choose_measured_device(o, &po);
  if (o.calibrate) calibrate_and_save(o, &po, &j);
  TuneResult t{value_or_fail(plan::plan_inputs(po)), {}, {}, {}};
  t.res = value_or_fail(plan::make_plan(t.in));
  t.cands = value_or_fail(search(t.in, o.fixed_micro));
  if (t.cands.empty()) fail_nothing_fits(o, t.in, t.res);
  if (o.verify > 0) verify_candidates(o, po, &t);
  t.chosen_cand = t.runs.empty() ? 0 : t.runs[t.chosen].index;
  const Candidate& best = t.cands[t.chosen_cand];
  const config::Config cfg =
      t.runs.empty() ? tuned_config(t.in, best, plan::nvme_dir(po)) : t.runs[t.chosen].cfg;
  if (!o.out.empty()) write_tuned_config(o, cfg, t.in);
  json verified = t.runs.empty() ? json() : verified_json(t);
  if (!o.plot.empty()) plot_verified(o, t.in, verified);
  if (o.json) {
    print_tune_json(o, t, verified, std::move(j));
    return;
  }
  print_candidates(t);
  if (!t.runs.empty()) print_verified(o, t);
  if (!o.out.empty()) printf("# config: %s (zoe train --config %s)\n", o.out.c_str(), o.out.c_str());
}

}  // namespace

static void add_tune_command(CLI::App& app) {
  auto o = std::make_shared<TuneOpts>();
  CLI::App* cmd = app.add_subcommand(
      "tune",
      "Pick the fastest placement that fits: the rows of `zoe plan` at every micro-batch that keeps the\n"
      "batch (--micro-batch x --grad-accum) and the knobs the cost model responds to (stage-3 prefetch\n"
      "bucket and max live parameters, offload_param buffer count and size, offload_optimizer buffer\n"
      "count, sub-group size, aio block size and queue depth), searched exhaustively with the cost\n"
      "model (docs/cost-model.md). --calibrate first measures this\n"
      "host (the I/O engine over aio block size x queue depth, CPU Adam, the planned model through an\n"
      "in-memory engine for the FLOP and update rates, memory copies) and saves the rates; --out writes\n"
      "the choice as a config for zoe train --config; --verify K runs the K best placements and chooses\n"
      "the measured best.\n"
      "The network rate is not measured: give --net-gbps/--intra-gbps.");
  plan::add_plan_options(*cmd, &o->plan, int_range, positive_real);
  cmd->add_flag("--calibrate", o->calibrate, "Measure this host's rates first and use them");
  cmd->add_option("--calibration-out", o->calibration_out,
                  "Where --calibrate saves the rates (JSON) for zoe plan/tune --calibration (default: not "
                  "saved; --json prints them)");
  cmd->add_option("--calibrate-bytes", o->calibrate_bytes, "Bytes of the NVMe calibration file")
      ->capture_default_str();
  positive_real(
      cmd->add_option("--calibrate-max-spread", o->calibrate_max_spread,
                      "The largest relative spread ((max - min) / median) --calibrate accepts among "
                      "the closest 5 of a timing's repeats (each is repeated until they agree, at "
                      "most 30 times); beyond it the calibration is refused and nothing is written"))
      ->capture_default_str();
  cmd->add_option("--out", o->out, "Write the chosen placement as a DeepSpeed-compatible config here");
  int_range(cmd->add_option(
                "--verify", o->verify,
                "Run the K best candidates for --verify-steps engine steps each on the model's modules (no "
                "model compute), print predicted against measured, and choose the measured best; exit 1 "
                "if a tier's high-water mark exceeds the plan"),
            1, 1000);
  int_range(cmd->add_option(
                "--verify-steps", o->verify_steps,
                "Timed engine steps per verified candidate (default 0: auto, at least 3 and at least 2 s "
                "of steps, at most 50: a short step is noisy)"),
            0, 1000)
      ->capture_default_str();
  cmd->add_flag(
      "--fixed-micro-batch", o->fixed_micro,
      "Search only --micro-batch (default: every micro-batch dividing --micro-batch x --grad-accum, "
      "with the accumulation that keeps that batch, so training is the same; the largest that fits "
      "is usually the fastest)");
  cmd->add_option("--plot", o->plot,
                  "With --verify: draw predicted against measured step time per candidate into this PNG "
                  "(python3-matplotlib)");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  CLI::Option* device = cmd->get_option("--device");
  device->description(
      "The engine's device: cuda (gathers on demand) or cpu (zoe's CPU device: queued gathers, device "
      "memory is host RAM). Default cuda; with --calibrate or --verify, which measure this host, the device "
      "zoe.device \"auto\" picks here (cpu)");
  cmd->callback([o, device] {
    o->device_given = device->count() > 0;
    run(*o);
  });
}

// Joins every program this file is linked into (the `zoe` program links all of src/cli).
static const CommandRegistrar kRegister(41, "", "", add_tune_command);

}  // namespace zoe::cli
