// `zoe plan`: memory and predicted step time of every placement of a model on a cluster, before
// anything runs (the engine's own placement planner, and the cost model of docs/cost-model.md).
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/drive_wear.h"
#include "config/config.h"
#include "core/units.h"
#include "plan/options.h"
#include "plan/planner.h"
#include "zoe/cli.h"

namespace zoe::cli {
namespace {

using nlohmann::json;
using plan::Resource;

struct PlanOpts {
  plan::PlanOptions plan;
  int top = 0;
  bool json = false;
};

json placement_json(const plan::RowPlacement& p) {
  const bool off = p.optimizer != zoe::Offload::kNone;
  return {{"stage", p.stage},
          {"offload_param", offload_name(p.param)},
          {"offload_optimizer", offload_name(p.optimizer)},
          {"offload_ratio", off ? json(p.ratio) : json(nullptr)},
          {"bf16_optimizer_states", p.bf16_states},
          {"optimizer_states", p.states}};
}

const char* act_offload_name(ActivationOffload o) {
  return o == ActivationOffload::kCpu ? "cpu" : o == ActivationOffload::kNvme ? "nvme" : "none";
}

// The activations of one micro-batch: with checkpointing, the checkpointed bytes and where the
// activation store keeps them; on the device, the workspace with the checkpoints kept there.
json activations_json(const plan::PlanRow& r, const plan::PlanInputs& in) {
  const zero::TierBytes& t = r.checkpoint_tiers;
  return {{"checkpointing", in.act.checkpointing},
          {"offload", act_offload_name(in.act.offload)},
          {"checkpoint_bytes", r.checkpoint_bytes},
          {"device_bytes", r.activation_bytes},
          {"tier_bytes", {{"device", t.device}, {"host", t.host}, {"nvme", t.nvme}}}};
}

// The wear of a row's placement on a node's NVMe drives (its bytes written per step).
DriveWear row_wear(const plan::PlanRow& r, const plan::PlanInputs& in, const PlanOpts& o) {
  return {r.cost.bytes.nvme_write, in.topo.gpus_per_node, o.plan.drive_tbw};
}

json row_json(const plan::PlanRow& r, const plan::PlanInputs& in, const PlanOpts& o) {
  json j;
  j["placement"] = placement_json(r.placement);
  j["fits"] = r.fits;
  j["bytes"] = {{"device", r.bytes.device}, {"host", r.bytes.host}, {"nvme", r.bytes.nvme}};
  j["predicted_step_s"] = r.cost.step_s;
  j["schedule"] = in.base.zoe.schedule;
  if (in.work.grad_accum > 1) {
    j["predicted_step_s_by_schedule"] = {{"micro-batch", r.step_s_micro_batch},
                                         {"layer-major", r.step_s_layer_major}};
  }
  j["bottleneck"] = plan::resource_name(r.cost.bottleneck);
  j["bottleneck_share"] = r.cost.bottleneck_share;
  j["lacks"] = {{"device", r.lacks.device}, {"host", r.lacks.host}, {"nvme", r.lacks.nvme}};
  j["activation_bytes"] = r.activation_bytes;
  j["activations"] = activations_json(r, in);
  j["exact"] = r.exact;
  if (!r.refused.empty()) j["refused"] = r.refused;
  const plan::LinkBytes& b = r.cost.bytes;
  j["link_bytes"] = {{"nvme_read", b.nvme_read},
                     {"nvme_write", b.nvme_write},
                     {"host_to_device", b.host_to_device},
                     {"device_to_host", b.device_to_host},
                     {"network", b.network},
                     {"collectives", b.collectives},
                     {"cpu_optimizer", b.cpu_optimizer},
                     {"device_optimizer", b.device_optimizer},
                     {"flops", b.flops},
                     {"activation_nvme_read", b.act_nvme_read},
                     {"activation_nvme_write", b.act_nvme_write},
                     {"activation_host_to_device", b.act_host_to_device},
                     {"activation_device_to_host", b.act_device_to_host}};
  json crit = json::object();
  for (int k = 0; k < plan::kResources; ++k)
    crit[plan::resource_name(static_cast<Resource>(k))] = r.cost.critical_s[k];
  j["critical_s"] = crit;
  json busy = json::object();
  for (int k = 0; k < plan::kResources; ++k)
    busy[plan::resource_name(static_cast<Resource>(k))] = r.cost.busy_s[k];
  j["busy_s"] = busy;
  add_wear_json(&j, row_wear(r, in, o));
  return j;
}

void print_header(const plan::PlanResult& res, const plan::PlanInputs& in, const PlanOpts& o) {
  const plan::LinkRates& R = in.rates;
  printf("# zoe plan: %s, %llu parameters, %d node(s) x %d %s rank(s), precision %s\n", in.model.name.c_str(),
         static_cast<unsigned long long>(res.params), in.topo.nodes, in.topo.gpus_per_node,
         in.cuda ? "cuda" : "cpu",
         in.base.bf16           ? "bf16"
         : in.base.fp16.enabled ? "fp16"
                                : "fp32");
  printf(
      "# per rank: device %s, host %s, nvme %s; micro-batch %lld x seq %lld x accumulation %lld (schedule "
      "%s)%s\n",
      format_bytes(res.per_rank.device).c_str(), format_bytes(res.per_rank.host).c_str(),
      format_bytes(res.per_rank.nvme).c_str(), static_cast<long long>(in.work.micro_batch),
      static_cast<long long>(in.work.seq), static_cast<long long>(in.work.grad_accum),
      in.base.zoe.schedule.c_str(),
      in.count_activations ? " (activations counted)"
                           : " (activations not counted: give --micro-batch/--seq)");
  printf(
      "# rates%s: nvme read %.2f / write %.2f GB/s per node, h2d %.1f GB/s, cpu adam %.1f GB/s per node, "
      "%.3g FLOP/s, network %.3g GB/s%s (%s)\n",
      o.plan.calibration.empty() ? " (defaults and flags)" : (" (" + o.plan.calibration + ")").c_str(),
      R.nvme_read_gbps, R.nvme_write_gbps, R.h2d_gbps, R.cpu_adam_gbps, R.flops,
      in.topo.nodes > 1 ? R.net_gbps : R.intra_gbps,
      in.topo.nodes > 1 ? fmt(" + %.3g us per collective", R.net_latency_us).c_str() : "",
      in.topo.nodes > 1 ? "across nodes" : "inside the node");
  if (in.act.checkpointing && !res.rows.empty()) {
    printf(
        "# activation checkpointing, offload %s: %s of block inputs per micro-batch; ckpt columns: where the "
        "activation store keeps them\n",
        act_offload_name(in.act.offload), format_bytes(res.rows.front().checkpoint_bytes).c_str());
  }
}

void print_table(const plan::PlanResult& res, const plan::PlanInputs& in, const PlanOpts& o) {
  print_header(res, in, o);
  const bool ckpt = in.act.checkpointing;
  std::vector<Table::Column> cols = {{"stage", "", 5},   {"params", "", 6}, {"optim", "", 5},
                                     {"ratio", "", 5},   {"states", "", 6}, {"device", "GiB", 9},
                                     {"host", "GiB", 9}, {"nvme", "GiB", 9}};
  if (ckpt)
    cols.insert(cols.end(), {{"ckpt dev", "GiB", 9}, {"ckpt host", "GiB", 9}, {"ckpt nvme", "GiB", 9}});
  const bool both = in.work.grad_accum > 1;
  cols.insert(cols.end(), {{"fits", "", 4}, {"step", "s", 10}});
  if (both) cols.insert(cols.end(), {{"micro-batch", "s", 11}, {"layer-major", "s", 11}});
  cols.push_back({"bottleneck", "(share)", 17, true});
  Table t(cols);
  t.print_header(stdout);
  int shown = 0;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  auto g = [&](uint64_t b) { return fmt("%.3f", static_cast<double>(b) / gib); };
  for (const plan::PlanRow& r : res.rows) {
    if (o.top > 0 && shown++ >= o.top) break;
    const bool off = r.placement.optimizer != zoe::Offload::kNone;
    std::vector<std::string> cells = {std::to_string(r.placement.stage),
                                      offload_name(r.placement.param),
                                      offload_name(r.placement.optimizer),
                                      off ? fmt("%g", r.placement.ratio) : "-",
                                      r.placement.states,
                                      g(r.bytes.device),
                                      g(r.bytes.host),
                                      g(r.bytes.nvme)};
    if (ckpt)
      cells.insert(cells.end(),
                   {g(r.checkpoint_tiers.device), g(r.checkpoint_tiers.host), g(r.checkpoint_tiers.nvme)});
    cells.insert(cells.end(), {r.fits ? "yes" : "no", fmt("%.4g", r.cost.step_s)});
    if (both)
      cells.insert(cells.end(), {fmt("%.4g", r.step_s_micro_batch), fmt("%.4g", r.step_s_layer_major)});
    cells.push_back(
        fmt("%s (%.0f%%)", plan::resource_name(r.cost.bottleneck), 100 * r.cost.bottleneck_share));
    t.print_row(stdout, cells);
  }
  size_t fit = 0;
  for (const auto& r : res.rows) fit += r.fits;
  printf("# %zu of %zu placements fit%s\n", fit, res.rows.size(),
         fit ? "; the first row is the fastest predicted" : "");
  if (!res.rows.empty()) printf("%s", wear_line(row_wear(res.rows.front(), in, o), "the first row").c_str());
}

void run(const PlanOpts& o) {
  plan::PlanOptions po = o.plan;
  if (Status s = plan::apply_device_budget(&po); !s.is_ok()) usage_fail(s);
  plan::PlanInputs in = value_or_fail(plan::plan_inputs(po));
  fprintf(stderr, "zoe plan: planning %zu placements of %s\n",
          plan::all_placements(in.base.zoe.optimizer_states, in.base.optimizer.type).size(),
          in.model.name.c_str());
  plan::PlanResult res = value_or_fail(plan::make_plan(in));
  if (o.json) {
    json rows = json::array();
    for (const auto& r : res.rows) rows.push_back(row_json(r, in, o));
    json out = {{"params", res.params}, {"rows", rows}};
    if (o.plan.drive_tbw > 0) {
      out["drive_tbw"] = o.plan.drive_tbw;
      out["ranks_per_drive"] = in.topo.gpus_per_node;
    }
    print_json(out);
  } else {
    print_table(res, in, o);
  }
  if (!res.any_fits()) fail(plan::nothing_fits(res, in));
}

}  // namespace

static void add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanOpts>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Memory and predicted step time of every placement (ZeRO stage 1-3 x parameter offload x optimizer\n"
      "offload x offload ratio x fp32/bf16 optimizer states) of a model on a cluster, before anything runs.\n"
      "Each row also gives the bytes a rank writes to NVMe per step and per 1,000 steps (the drive's\n"
      "wear; with --drive-tbw, the steps the drive's rated endurance allows).\n"
      "Bytes per rank are the engine's own placement plan; the step time is the critical path of the\n"
      "engine's pipeline over the link rates (docs/cost-model.md). Rows that fit come first, fastest\n"
      "first. Exit code 1 when nothing fits, naming the closest placement and what it lacks.");
  plan::add_plan_options(*cmd, &o->plan, int_range, positive_real);
  int_range(cmd->add_option("--top", o->top, "Show only the first N rows of the table (0: all)"), 0,
            INT32_MAX);
  cmd->add_flag(
      "--activation-checkpointing", o->plan.activation_checkpointing,
      "Plan a run with activation checkpointing: each block's input kept for the backward, the rest "
      "recomputed (activations are then counted)");
  cmd->add_option("--activation-offload", o->plan.activation_offload,
                  "none, cpu or nvme: where the activation store may move checkpoints the device cannot hold "
                  "(needs --activation-checkpointing)");
  cmd->add_option("--activation-host-budget", o->plan.activation_host_budget,
                  "Host bytes for checkpointed activations, e.g. 8GiB (default: what the host has left); "
                  "beyond it they go to NVMe");
  cmd->add_option("--activation-device-budget", o->plan.activation_device_budget,
                  "Device bytes for checkpointed activations (default: what the device has left)");
  cmd->add_flag("--json", o->json, "Print one JSON object {\"params\": N, \"rows\": [...]}");
  cmd->callback([o] { run(*o); });
}

// Joins every program this file is linked into (the `zoe` program links all of src/cli).
static const CommandRegistrar kRegister(40, "", "", add_plan_command);

}  // namespace zoe::cli
