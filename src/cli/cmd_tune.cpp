// `zoe tune`: measures this host's link rates (--calibrate: NVMe through zoe's I/O benchmark, CPU
// Adam through zoe's Adam benchmark, FLOP/s of zoe's GPT kernels), searches the plan's rows and a
// few knobs with the cost model, writes the best as a DeepSpeed-compatible config that `zoe train
// --config` runs (--out), and runs the K best for a few steps each to check the plan and choose (--verify K).
// This file holds the command: its flags, their checks and the order of its phases (tune_internal.h
// names the files of the others).
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/tune_internal.h"
#include "config/config.h"
#include "device/device.h"
#include "model/gpt.h"
#include "plan/calibration.h"
#include "plan/options.h"
#include "plan/planner.h"
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

// --- The command ----------------------------------------------------------------------------

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
  print_candidates(o, t);
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
