// `zoe tune`, the report: the chosen config written (--out), the candidates and the verified runs
// as JSON (--json, --plot's input) or as text tables, and the --plot of predicted against
// measured.
#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/drive_wear.h"
#include "cli/tune_internal.h"
#include "config/config.h"
#include "core/units.h"
#include "plan/planner.h"
#include "zoe/cli.h"
#include "zoe/files.h"

namespace zoe::cli::tune {

using nlohmann::json;

namespace {

json candidate_fields(const Candidate& c);

// A candidate's wear on a node's NVMe drives (its bytes written per step).
DriveWear candidate_wear(const Candidate& c, const plan::PlanInputs& in, double tbw) {
  return {c.row.cost.bytes.nvme_write, in.topo.gpus_per_node, tbw};
}

json candidate_json(const Candidate& c, const plan::PlanInputs& in, double tbw) {
  json j = candidate_fields(c);
  add_wear_json(&j, candidate_wear(c, in, tbw));
  return j;
}

json candidate_fields(const Candidate& c) {
  const plan::RowPlacement& p = c.row.placement;
  return {{"placement",
           {{"stage", p.stage},
            {"offload_param", offload_name(p.param)},
            {"offload_optimizer", offload_name(p.optimizer)},
            {"offload_ratio", p.optimizer != zoe::Offload::kNone ? json(p.ratio) : json(nullptr)},
            {"bf16_optimizer_states", p.bf16_states},
            {"optimizer_states", p.states}}},
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
          {"schedule", c.knobs.schedule},
          {"bytes", {{"device", c.row.bytes.device}, {"host", c.row.bytes.host}, {"nvme", c.row.bytes.nvme}}},
          {"predicted_step_s", c.row.cost.step_s},
          {"bottleneck", plan::resource_name(c.row.cost.bottleneck)},
          {"bottleneck_share", c.row.cost.bottleneck_share}};
}

}  // namespace

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
  const double tbw = o.plan.drive_tbw;
  j["best"] = candidate_json(t.cands[t.chosen_cand], t.in, tbw);
  json alt = json::array();
  for (size_t i = 0; i < t.cands.size() && alt.size() < 5; ++i) {
    if (i != t.chosen_cand) alt.push_back(candidate_json(t.cands[i], t.in, tbw));
  }
  j["alternatives"] = alt;
  if (!o.out.empty()) j["out"] = o.out;
  if (tbw > 0) {
    j["drive_tbw"] = tbw;
    j["ranks_per_drive"] = t.in.topo.gpus_per_node;
  }
  if (t.in.rates.aio_block_size > 0) {
    j["aio"] = {{"block_size", t.in.rates.aio_block_size}, {"queue_depth", t.in.rates.aio_queue_depth}};
  }
  if (!t.runs.empty()) {
    // `best` is the measured best of the verified candidates; `predicted_best` the model's.
    j["verified"] = verified;
    j["chosen"] = t.chosen + 1;
    j["chosen_differs_from_predicted"] = t.chosen_cand != 0;
    j["predicted_best"] = candidate_json(t.cands.front(), t.in, tbw);
  }
  print_json(j);
}

// The text report: the six best candidates (the chosen one starred) and the aio choice.
void print_candidates(const TuneOpts& o, const TuneResult& t) {
  const plan::PlanInputs& in = t.in;
  printf("# zoe tune: %s, %llu parameters, %d node(s) x %d rank(s); %zu fitting candidates\n",
         in.model.name.c_str(), static_cast<unsigned long long>(t.res.params), in.topo.nodes,
         in.topo.gpus_per_node, t.cands.size());
  Table tb({{"placement", "", 56, true},
            {"micro", "x accum", 8},
            {"schedule", "", 11},
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
         c.knobs.schedule, std::to_string(c.knobs.prefetch_bucket), std::to_string(c.knobs.sub_group),
         fmt("%.4g", c.row.cost.step_s),
         fmt("%s (%.0f%%)", plan::resource_name(c.row.cost.bottleneck), 100 * c.row.cost.bottleneck_share)});
  }
  printf("%s",
         wear_line(candidate_wear(t.cands[t.chosen_cand], in, o.plan.drive_tbw), "the starred candidate")
             .c_str());
  const Candidate& best = t.cands[t.chosen_cand];
  if (best.knobs.schedule == "layer-major") {
    printf(
        "# schedule layer-major: each module's parameters cross from their tier once per step instead of "
        "once per micro-batch (%lld), and NVMe gradient sums are written once: predicted %.4g s against "
        "%.4g s micro-batch by micro-batch\n",
        static_cast<long long>(best.grad_accum), best.row.step_s_layer_major, best.row.step_s_micro_batch);
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

}  // namespace zoe::cli::tune
