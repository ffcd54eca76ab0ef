// `zoe plan`: memory and predicted step time of every placement of a model on a cluster, before
// anything runs (the engine's own placement planner, and the cost model of docs/cost-model.md).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>

#include "config/config.h"
#include "core/units.h"
#include "io/file.h"
#include "plan/calibration.h"
#include "plan/hf_config.h"
#include "plan/planner.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace zoe::cli {
namespace {

using nlohmann::json;
using plan::Resource;

struct PlanOpts {
  std::string preset;
  int layers = 0, d_model = 0, heads = 0, context = 0;
  std::string params;
  std::string hf_config;
  int nodes = 1, gpus_per_node = 1;
  std::string device_mem, host_mem, nvme_space, nvme_path;
  std::string calibration;
  double nvme_read_gbps = 0, nvme_write_gbps = 0, h2d_gbps = 0, cpu_adam_gbps = 0, flops = 0;
  double net_gbps = 0, intra_gbps = 0, device_mem_gbps = 0;
  int64_t micro_batch = 0, seq = 0, grad_accum = 1;
  std::string precision;
  std::string device = "cuda";
  std::string config;
  int top = 0;
  bool json = false;
};

// "124439808", "7e9", "1.5B", "350M", "20K" (powers of 1000: parameter counts, not bytes).
Result<uint64_t> parse_count(const std::string& s, const char* flag) {
  char* end = nullptr;
  errno = 0;
  const double v = strtod(s.c_str(), &end);
  double mul = 1;
  std::string suffix = end ? end : "";
  if (suffix == "K" || suffix == "k")
    mul = 1e3;
  else if (suffix == "M" || suffix == "m")
    mul = 1e6;
  else if (suffix == "B" || suffix == "b" || suffix == "G" || suffix == "g")
    mul = 1e9;
  else if (suffix == "T" || suffix == "t")
    mul = 1e12;
  else if (!suffix.empty())
    mul = 0;
  const double n = v * mul;
  if (s.empty() || errno || !(n >= 1) || n > 1e15 || std::floor(n) != n) {
    return invalid_argument("%s %s: expected a whole number of parameters (e.g. 124439808, 7e9, 1.5B, 350M)",
                            flag, s.c_str());
  }
  return static_cast<uint64_t>(n);
}

uint64_t bytes_or_fail(const std::string& s, const char* flag) {
  auto r = parse_bytes(s);
  if (!r.is_ok()) fail(r.status().with_context(flag));
  return r.value();
}

plan::ModelDesc model_from(const PlanOpts& o) {
  const int sources = (!o.hf_config.empty()) + (!o.params.empty()) + (!o.preset.empty());
  if (sources > 1) fail(invalid_argument("give one model: --preset, --params or --hf-config"));
  if ((!o.hf_config.empty() || !o.params.empty()) &&
      (o.d_model || o.heads || o.context || (o.layers && o.params.empty()))) {
    fail(invalid_argument(
        "--layers, --d-model, --heads and --context shape zoe's GPT (--preset); with --params only "
        "--layers applies, with --hf-config none"));
  }
  if (!o.hf_config.empty()) return value_or_fail(plan::hf_model(o.hf_config));
  if (!o.params.empty()) {
    const uint64_t n = value_or_fail(parse_count(o.params, "--params"));
    return value_or_fail(
        plan::params_model(n, o.layers ? o.layers : static_cast<int>(std::min<uint64_t>(32, n))));
  }
  return value_or_fail(
      plan::gpt_model(o.preset.empty() ? "small" : o.preset, o.layers, o.d_model, o.heads, o.context));
}

std::string scratch_dir(const PlanOpts& o) {
  if (!o.nvme_path.empty()) return o.nvme_path;
  const char* s = getenv("ZOE_SCRATCH");
  return s && *s ? s : "/var/tmp";
}

plan::PlanInputs inputs_from(const PlanOpts& o) {
  plan::PlanInputs in;
  in.model = model_from(o);
  in.topo = {o.nodes, o.gpus_per_node};
  if (o.nodes < 1 || o.gpus_per_node < 1) {
    fail(
        invalid_argument("--nodes %d --gpus-per-node %d: both must be at least 1", o.nodes, o.gpus_per_node));
  }
  if (o.device != "cuda" && o.device != "cpu")
    fail(invalid_argument("--device %s: expected cuda or cpu", o.device.c_str()));
  in.cuda = o.device == "cuda";
  const uint64_t g = static_cast<uint64_t>(o.gpus_per_node);
  in.device_mem = o.device_mem.empty() ? (64ull << 30) * g : bytes_or_fail(o.device_mem, "--device-mem");
  in.host_mem =
      o.host_mem.empty() ? value_or_fail(plan::host_memory_bytes()) : bytes_or_fail(o.host_mem, "--host-mem");
  if (!o.nvme_space.empty()) {
    in.nvme_space = bytes_or_fail(o.nvme_space, "--nvme-space");
  } else {
    const std::string dir = scratch_dir(o);
    auto fb = io::free_bytes_at(dir);
    if (!fb.is_ok())
      fail(fb.status().with_context("free space of the NVMe path " + dir + " (set --nvme-space)"));
    in.nvme_space = fb.value();
  }
  if (!o.calibration.empty()) {
    Status s = plan::apply_calibration_file(o.calibration, &in.rates);
    if (!s.is_ok()) fail(s.with_context("--calibration"));
  }
  const std::pair<double, double plan::LinkRates::*> flags[] = {
      {o.nvme_read_gbps, &plan::LinkRates::nvme_read_gbps},
      {o.nvme_write_gbps, &plan::LinkRates::nvme_write_gbps},
      {o.h2d_gbps, &plan::LinkRates::h2d_gbps},
      {o.cpu_adam_gbps, &plan::LinkRates::cpu_adam_gbps},
      {o.flops, &plan::LinkRates::flops},
      {o.net_gbps, &plan::LinkRates::net_gbps},
      {o.intra_gbps, &plan::LinkRates::intra_gbps},
      {o.device_mem_gbps, &plan::LinkRates::device_mem_gbps}};
  for (const auto& [v, field] : flags) {
    if (v < 0) fail(invalid_argument("a rate flag is %g: rates are positive", v));
    if (v > 0) in.rates.*field = v;
  }
  if (!o.config.empty()) {
    in.base = value_or_fail(config::Config::load(o.config, in.topo.world()));
  } else {
    in.base.bf16 = true;
  }
  if (!o.precision.empty()) {
    if (o.precision != "bf16" && o.precision != "fp16" && o.precision != "fp32") {
      fail(invalid_argument("--precision %s: expected bf16, fp16 or fp32", o.precision.c_str()));
    }
    in.base.bf16 = o.precision == "bf16";
    in.base.fp16.enabled = o.precision == "fp16";
  }
  if (o.micro_batch < 0 || o.seq < 0 || o.grad_accum < 1) {
    fail(invalid_argument("--micro-batch %lld --seq %lld --grad-accum %lld: expected positive values",
                          static_cast<long long>(o.micro_batch), static_cast<long long>(o.seq),
                          static_cast<long long>(o.grad_accum)));
  }
  in.count_activations = o.micro_batch > 0 || o.seq > 0;
  in.work.micro_batch = o.micro_batch > 0  ? o.micro_batch
                        : o.config.empty() ? 1
                                           : in.base.train_micro_batch_size_per_gpu;
  in.work.seq = o.seq > 0 ? o.seq : in.model.context > 0 ? in.model.context : 1024;
  in.work.grad_accum =
      o.grad_accum > 1 || o.config.empty() ? o.grad_accum : in.base.gradient_accumulation_steps;
  in.base.gradient_accumulation_steps = in.work.grad_accum;
  return in;
}

json placement_json(const plan::RowPlacement& p) {
  const bool off = p.optimizer != config::OffloadDevice::kNone;
  return {{"stage", p.stage},
          {"offload_param", config::offload_device_name(p.param)},
          {"offload_optimizer", config::offload_device_name(p.optimizer)},
          {"offload_ratio", off ? json(p.ratio) : json(nullptr)},
          {"bf16_optimizer_states", p.bf16_states}};
}

json row_json(const plan::PlanRow& r) {
  json j;
  j["placement"] = placement_json(r.placement);
  j["fits"] = r.fits;
  j["bytes"] = {{"device", r.bytes.device}, {"host", r.bytes.host}, {"nvme", r.bytes.nvme}};
  j["predicted_step_s"] = r.cost.step_s;
  j["bottleneck"] = plan::resource_name(r.cost.bottleneck);
  j["bottleneck_share"] = r.cost.bottleneck_share;
  j["lacks"] = {{"device", r.lacks.device}, {"host", r.lacks.host}, {"nvme", r.lacks.nvme}};
  j["activation_bytes"] = r.activation_bytes;
  j["exact"] = r.exact;
  if (!r.refused.empty()) j["refused"] = r.refused;
  const plan::LinkBytes& b = r.cost.bytes;
  j["link_bytes"] = {{"nvme_read", b.nvme_read},
                     {"nvme_write", b.nvme_write},
                     {"host_to_device", b.host_to_device},
                     {"device_to_host", b.device_to_host},
                     {"network", b.network},
                     {"cpu_optimizer", b.cpu_optimizer},
                     {"device_optimizer", b.device_optimizer},
                     {"flops", b.flops}};
  json crit = json::object();
  for (int k = 0; k < plan::kResources; ++k)
    crit[plan::resource_name(static_cast<Resource>(k))] = r.cost.critical_s[k];
  j["critical_s"] = crit;
  return j;
}

void print_table(const plan::PlanResult& res, const plan::PlanInputs& in, const PlanOpts& o) {
  const plan::LinkRates& R = in.rates;
  printf("# zoe plan: %s, %llu parameters, %d node(s) x %d %s rank(s), precision %s\n", in.model.name.c_str(),
         static_cast<unsigned long long>(res.params), in.topo.nodes, in.topo.gpus_per_node,
         in.cuda ? "cuda" : "cpu",
         in.base.bf16           ? "bf16"
         : in.base.fp16.enabled ? "fp16"
                                : "fp32");
  printf("# per rank: device %s, host %s, nvme %s; micro-batch %lld x seq %lld x accumulation %lld%s\n",
         format_bytes(res.per_rank.device).c_str(), format_bytes(res.per_rank.host).c_str(),
         format_bytes(res.per_rank.nvme).c_str(), static_cast<long long>(in.work.micro_batch),
         static_cast<long long>(in.work.seq), static_cast<long long>(in.work.grad_accum),
         in.count_activations ? " (activations counted)"
                              : " (activations not counted: give --micro-batch/--seq)");
  printf(
      "# rates%s: nvme read %.2f / write %.2f GB/s per node, h2d %.1f GB/s, cpu adam %.1f GB/s per node, "
      "%.3g FLOP/s, network %.1f GB/s (%s)\n",
      o.calibration.empty() ? " (defaults and flags)" : (" (" + o.calibration + ")").c_str(),
      R.nvme_read_gbps, R.nvme_write_gbps, R.h2d_gbps, R.cpu_adam_gbps, R.flops,
      in.topo.nodes > 1 ? R.net_gbps : R.intra_gbps, in.topo.nodes > 1 ? "across nodes" : "inside the node");
  Table t({{"stage", "", 5},
           {"params", "", 6},
           {"optim", "", 5},
           {"ratio", "", 5},
           {"bf16st", "", 6},
           {"device", "GiB", 9},
           {"host", "GiB", 9},
           {"nvme", "GiB", 9},
           {"fits", "", 4},
           {"step", "s", 10},
           {"bottleneck", "(share)", 17, true}});
  t.print_header(stdout);
  int shown = 0;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  for (const plan::PlanRow& r : res.rows) {
    if (o.top > 0 && shown++ >= o.top) break;
    const bool off = r.placement.optimizer != config::OffloadDevice::kNone;
    t.print_row(stdout,
                {std::to_string(r.placement.stage), config::offload_device_name(r.placement.param),
                 config::offload_device_name(r.placement.optimizer), off ? fmt("%g", r.placement.ratio) : "-",
                 r.placement.bf16_states ? "on" : "off", fmt("%.3f", r.bytes.device / gib),
                 fmt("%.3f", r.bytes.host / gib), fmt("%.3f", r.bytes.nvme / gib), r.fits ? "yes" : "no",
                 fmt("%.4g", r.cost.step_s),
                 fmt("%s (%.0f%%)", plan::resource_name(r.cost.bottleneck), 100 * r.cost.bottleneck_share)});
  }
  size_t fit = 0;
  for (const auto& r : res.rows) fit += r.fits;
  printf("# %zu of %zu placements fit%s\n", fit, res.rows.size(),
         fit ? "; the first row is the fastest predicted" : "");
}

void run(const PlanOpts& o) {
  plan::PlanInputs in = inputs_from(o);
  fprintf(stderr, "zoe plan: planning %zu placements of %s\n", plan::all_placements().size(),
          in.model.name.c_str());
  plan::PlanResult res = value_or_fail(plan::make_plan(in));
  if (o.json) {
    json rows = json::array();
    for (const auto& r : res.rows) rows.push_back(row_json(r));
    print_json({{"params", res.params}, {"rows", rows}});
  } else {
    print_table(res, in, o);
  }
  if (!res.any_fits()) fail(plan::nothing_fits(res, in));
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanOpts>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Memory and predicted step time of every placement (ZeRO stage 1-3 x parameter offload x optimizer\n"
      "offload x offload ratio x bf16 optimizer states) of a model on a cluster, before anything runs.\n"
      "Bytes per rank are the engine's own placement plan; the step time is the critical path of the\n"
      "engine's pipeline over the link rates (docs/cost-model.md). Rows that fit come first, fastest\n"
      "first. Exit code 1 when nothing fits, naming the closest placement and what it lacks.");
  cmd->add_option("--preset", o->preset, "zoe's GPT: tiny, small, demo, medium, large, 2b (default: small)");
  cmd->add_option(
      "--layers", o->layers,
      "zoe's GPT: transformer blocks (overrides the preset); with --params: modules (default 32)");
  cmd->add_option("--d-model", o->d_model, "zoe's GPT: width (overrides the preset)");
  cmd->add_option("--heads", o->heads, "zoe's GPT: attention heads (overrides the preset)");
  cmd->add_option("--context", o->context, "zoe's GPT: positions (overrides the preset)");
  cmd->add_option("--params", o->params,
                  "A model of exactly N parameters (124439808, 7e9, 1.5B) in --layers "
                  "equal modules");
  cmd->add_option("--hf-config", o->hf_config,
                  "A Hugging Face config.json (model_type gpt2, llama, mistral, "
                  "qwen2, gpt_neox)");
  cmd->add_option("--nodes", o->nodes, "Nodes")->capture_default_str();
  cmd->add_option("--gpus-per-node", o->gpus_per_node, "Ranks (devices) per node")->capture_default_str();
  cmd->add_option("--device-mem", o->device_mem,
                  "Device memory of one node, all its devices together, e.g. "
                  "640GiB (default: 64 GiB per device, the engine's default budget)");
  cmd->add_option("--host-mem", o->host_mem, "Host RAM of one node (default: this host's MemTotal)");
  cmd->add_option("--nvme-space", o->nvme_space,
                  "NVMe space of one node (default: free space of the NVMe path)");
  cmd->add_option("--nvme-path", o->nvme_path,
                  "Directory whose free space is the default --nvme-space (default "
                  "$ZOE_SCRATCH or /var/tmp)");
  cmd->add_option("--calibration", o->calibration,
                  "Link rates from this JSON file (zoe tune --calibrate writes "
                  "one); the flags below override it");
  cmd->add_option("--nvme-read-gbps", o->nvme_read_gbps, "NVMe read GB/s of one node (default 3.0)");
  cmd->add_option("--nvme-write-gbps", o->nvme_write_gbps, "NVMe write GB/s of one node (default 2.0)");
  cmd->add_option("--h2d-gbps", o->h2d_gbps, "Host <-> device GB/s of one rank (default 25)");
  cmd->add_option("--cpu-adam-gbps", o->cpu_adam_gbps,
                  "CPU Adam GB/s of one node, bytes of state touched "
                  "(default 20)");
  cmd->add_option("--flops", o->flops, "Sustained FLOP/s of one device (default 1e14)");
  cmd->add_option("--net-gbps", o->net_gbps, "Collective GB/s per rank across nodes (default 12.5)");
  cmd->add_option("--intra-gbps", o->intra_gbps, "Collective GB/s per rank inside a node (default 150)");
  cmd->add_option("--device-mem-gbps", o->device_mem_gbps,
                  "Device memory GB/s, for device-resident Adam "
                  "(default 1500)");
  cmd->add_option("--micro-batch", o->micro_batch,
                  "Sequences per micro-batch per rank (default 1); given, "
                  "activations count against device memory");
  cmd->add_option("--seq", o->seq,
                  "Tokens per sequence (default: the model's context); given, activations "
                  "count against device memory");
  cmd->add_option("--grad-accum", o->grad_accum, "Micro-batches per optimizer step")->capture_default_str();
  cmd->add_option("--precision", o->precision,
                  "Compute precision: bf16, fp16 or fp32 (default bf16, or the "
                  "--config's)");
  cmd->add_option("--device", o->device,
                  "The engine's device: cuda (gathers on demand) or cpu (zoe's CPU "
                  "device: queued gathers, device memory is host RAM)")
      ->capture_default_str();
  cmd->add_option("--config", o->config,
                  "A DeepSpeed-style config whose other knobs every row keeps (buckets, "
                  "sub_group_size, precision, batch)");
  cmd->add_option("--top", o->top, "Show only the first N rows of the table (0: all)");
  cmd->add_flag("--json", o->json, "Print one JSON object {\"params\": N, \"rows\": [...]}");
  cmd->callback([o] { run(*o); });
}

}  // namespace zoe::cli
