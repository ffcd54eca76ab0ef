// `zoe tune`, the search: every fitting row of the plan at every micro-batch that keeps the
// rank's batch, with the knobs the cost model responds to (stage-3 prefetch and live parameters,
// the tier manager's staging and host cache, the swapper's sub-group and buffers, the aio point),
// ranked by predicted step time; and a candidate as the config --out writes.
#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/tune_internal.h"
#include "config/config.h"
#include "plan/options.h"
#include "plan/planner.h"

namespace zoe::cli::tune {

using nlohmann::json;

namespace {

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
  t.host_addressable = !in.cuda;
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

}  // namespace

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
// (chunks read ahead); where anything is on NVMe, the aio block size and queue depth; and with
// micro-batches, the schedule (zoe.schedule micro-batch or layer-major). Variants the model
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
      // Precision is the user's: only rows with the config's zoe.optimizer_states are proposed.
      if (p.states != in.base.zoe.optimizer_states) continue;
      const bool opt_nvme = p.optimizer == zoe::Offload::kNvme;
      const bool param_nvme = p.stage == 3 && p.param == zoe::Offload::kNvme;
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
      // With micro-batches, every variant in the layer-major schedule too (each module read once
      // per step): the cost model says where it wins.
      if (at.work.grad_accum > 1) {
        const size_t n = variants.size();
        for (size_t i = 0; i < n; ++i) {
          Knobs k = variants[i];
          k.schedule = k.schedule == "layer-major" ? "micro-batch" : "layer-major";
          variants.push_back(k);
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

}  // namespace zoe::cli::tune
