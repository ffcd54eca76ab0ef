// `zoe bench adam`: the fused CPU Adam (or Lion, Adagrad) step against its memory roofline and
// the unfused step.
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/units.h"
#include "optim/adam_bench.h"
#include "zoe/cli.h"

namespace zoe::cli {
namespace {

using nlohmann::json;

struct Opts {
  std::string optimizer = "adam";
  std::string params = "64M";
  int threads = 0;
  int numa_node = -1;
  std::string grad_dtype = "fp32";
  std::string out_dtype = "bf16";
  std::string state_dtype = "fp32";
  std::string simd;
  bool stochastic_rounding = false;
  int repeats = 5;
  bool json = false;
};

DType dtype_or_fail(const std::string& s, const char* flag) {
  DType d;
  if (!parse_dtype(s, &d)) fail(invalid_argument("%s %s: expected fp32, bf16 or fp16", flag, s.c_str()));
  return d;
}

optim::bench::Config config_from(const Opts& o) {
  optim::bench::Config c;
  if (o.optimizer == "adam" || o.optimizer == "adamw")
    c.optimizer = optim::bench::Optimizer::kAdam;
  else if (o.optimizer == "lion")
    c.optimizer = optim::bench::Optimizer::kLion;
  else if (o.optimizer == "adagrad")
    c.optimizer = optim::bench::Optimizer::kAdagrad;
  else
    fail(invalid_argument("--optimizer %s: expected adam, lion or adagrad", o.optimizer.c_str()));
  c.params = value_or_fail(parse_bytes(o.params));
  c.threads = o.threads;
  c.numa_node = o.numa_node;
  c.grad_dtype = dtype_or_fail(o.grad_dtype, "--grad-dtype");
  if (o.out_dtype != "none") {
    c.out_dtype = dtype_or_fail(o.out_dtype, "--out-dtype");
    if (*c.out_dtype == DType::kF32) fail(invalid_argument("--out-dtype fp32: expected none, bf16 or fp16"));
  }
  c.state_dtype = dtype_or_fail(o.state_dtype, "--state-dtype");
  if (c.state_dtype == DType::kF16) fail(invalid_argument("--state-dtype fp16: expected fp32 or bf16"));
  c.repeats = o.repeats;
  c.stochastic_rounding = o.stochastic_rounding;
  if (c.stochastic_rounding && c.state_dtype != DType::kBF16) {
    fail(invalid_argument("--stochastic-rounding applies to --state-dtype bf16 only"));
  }
  if (!o.simd.empty()) {
    if (o.simd == "scalar")
      c.simd = SimdLevel::kScalar;
    else if (o.simd == "avx2")
      c.simd = SimdLevel::kAvx2;
    else if (o.simd == "avx512")
      c.simd = SimdLevel::kAvx512;
    else
      fail(invalid_argument("--simd %s: expected scalar, avx2 or avx512", o.simd.c_str()));
  }
  return c;
}

// The targets: fused >= 0.90 of roofline; full step >= 0.85; separate/full >= 1.4x
// (>= 1.8x with bf16 m/v, against the fp32-m/v separate passes).
struct Targets {
  double fused = 0.90, full = 0.85, speedup;
};
Targets targets_for(const optim::bench::Config& c) {
  return Targets{0.90, 0.85, c.state_dtype == DType::kBF16 ? 1.8 : 1.4};
}

json to_json(const optim::bench::Report& r) {
  const auto& c = r.config;
  Targets t = targets_for(c);
  auto ms = [](const optim::bench::Stat& s) {
    return json{{"median", s.median_s * 1e3}, {"min", s.min_s * 1e3}};
  };
  double p = double(c.params);
  return json{{"optimizer", optim::bench::optimizer_name(c.optimizer)},
              {"params", c.params},
              {"threads", r.threads},
              {"grad_dtype", dtype_name(c.grad_dtype)},
              {"out_dtype", c.out_dtype ? dtype_name(*c.out_dtype) : "none"},
              {"state_dtype", dtype_name(c.state_dtype)},
              {"state_rounding", c.state_dtype == DType::kF32 ? "none"
                                 : c.stochastic_rounding      ? "stochastic"
                                                              : "rne"},
              {"simd", r.simd_path},
              {"pool", r.pool_backend},
              {"repeats", c.repeats},
              {"bytes_per_param", r.bytes.fused},
              // the fused kernel
              {"params_per_s", p / r.fused.median_s},
              {"gbps", r.fused_gbps()},
              {"roofline_gbps", r.roofline_gbps()},
              {"fraction_of_roofline", r.fused_fraction()},
              // norm + fused pass, its minimal bytes (= the fused pass's) over its time
              {"full_step",
               {{"params_per_s", p / r.full.median_s},
                {"gbps_minimal_bytes", r.full_gbps_minimal()},
                {"fraction_of_roofline", r.full_fraction()},
                {"bytes_per_param_moved", r.bytes.full},
                // counting the norm pass's bytes too (what this step, as two passes, moves)
                {"gbps", r.gbps(r.full, r.bytes.full)},
                {"fraction_of_roofline_own_bytes", r.full_fraction_own_bytes()}}},
              {"separate_pass",
               {{"params_per_s", p / r.separate.median_s},
                {"gbps", r.gbps(r.separate, r.bytes.separate)},
                {"bytes_per_param", r.bytes.separate}}},
              {"separate_pass_speedup", r.separate_speedup()},
              {"separate_pass_fp32_grads",
               {{"params_per_s", p / r.separate_fp32.median_s},
                {"gbps", r.gbps(r.separate_fp32, r.bytes.separate_fp32)},
                {"bytes_per_param", r.bytes.separate_fp32}}},
              {"separate_pass_fp32_grads_speedup", r.separate_fp32_speedup()},
              {"norm_gbps", r.gbps(r.norm, r.bytes.norm)},
              {"time_ms",
               {{"roofline", ms(r.roofline)},
                {"fused", ms(r.fused)},
                {"norm", ms(r.norm)},
                {"full", ms(r.full)},
                {"separate", ms(r.separate)},
                {"separate_fp32_grads", ms(r.separate_fp32)}}},
              {"targets",
               {{"fraction_of_roofline", t.fused},
                {"full_step_fraction_of_roofline", t.full},
                {"separate_pass_speedup", t.speedup}}},
              {"ok", r.fused_fraction() >= t.fused && r.full_fraction() >= t.full &&
                         r.separate_speedup() >= t.speedup}};
}

void print_human(const optim::bench::Report& r) {
  const auto& c = r.config;
  Targets t = targets_for(c);
  const char* opt = optim::bench::optimizer_name(c.optimizer);
  printf("# zoe bench adam: %s, %zu params, %d thread(s) (%s), path %s\n", opt, c.params, r.threads,
         r.pool_backend.c_str(), r.simd_path.c_str());
  printf("#   grad %s, %s %s%s, param copy %s; medians of %d rounds run alternately\n",
         dtype_name(c.grad_dtype), optim::bench::state_count(c.optimizer) == 2 ? "m/v" : "state",
         dtype_name(c.state_dtype),
         c.state_dtype == DType::kF32 ? ""
         : c.stochastic_rounding      ? " (stochastic rounding)"
                                      : " (RNE)",
         c.out_dtype ? dtype_name(*c.out_dtype) : "none", c.repeats);
  printf("#\n");
  Table tab({{"kernel", "", 32, true},
             {"bytes", "B/param", 8},
             {"time", "ms", 9},
             {"min", "ms", 9},
             {"rate", "Gparam/s", 9},
             {"bw", "GB/s", 8},
             {"vs_roof", "", 8}});
  printf("# ");
  tab.print_header(stdout);
  double roof = r.roofline_gbps();
  auto row = [&](const char* name, double bytes, const optim::bench::Stat& s, double bw_bytes) {
    double bw = r.gbps(s, bw_bytes);
    tab.print_row(stdout, {std::string("  ") + name, fmt("%.0f", bytes), fmt("%.2f", s.median_s * 1e3),
                           fmt("%.2f", s.min_s * 1e3), fmt("%.3f", double(c.params) / s.median_s / 1e9),
                           fmt("%.2f", bw), fmt("%.3f", bw / roof)});
  };
  row("roofline (same streams)", r.bytes.fused, r.roofline, r.bytes.fused);
  row((std::string("fused ") + opt).c_str(), r.bytes.fused, r.fused, r.bytes.fused);
  row("norm", r.bytes.norm, r.norm, r.bytes.norm);
  row("full = norm + fused *", r.bytes.full, r.full, r.bytes.fused);
  row((std::string("separate: norm,scale,") + opt + ",cast").c_str(), r.bytes.separate, r.separate,
      r.bytes.separate);
  if (c.grad_dtype != DType::kF32)
    row("separate, fp32 grads", r.bytes.separate_fp32, r.separate_fp32, r.bytes.separate_fp32);
  printf("#  * GB/s of the full step counts its minimal bytes (%.0f B/param), as if the norm came from\n",
         r.bytes.fused);
  printf("#    the pass that receives the gradients.\n#\n");
  auto verdict = [](bool ok) { return ok ? "OK" : "BELOW TARGET"; };
  printf("# fused kernel / roofline        %6.3f  (target >= %.2f)  %s\n", r.fused_fraction(), t.fused,
         verdict(r.fused_fraction() >= t.fused));
  printf("# full step / roofline           %6.3f  (target >= %.2f)  %s\n", r.full_fraction(), t.full,
         verdict(r.full_fraction() >= t.full));
  printf("#   counting the norm pass's bytes  %6.3f\n", r.full_fraction_own_bytes());
  printf("# separate passes / full step    %6.3fx (target >= %.1fx) %s\n", r.separate_speedup(), t.speedup,
         verdict(r.separate_speedup() >= t.speedup));
  if (c.grad_dtype != DType::kF32) {
    printf("#   vs separate passes on fp32 gradients (DeepSpeed's flow)  %6.3fx\n",
           r.separate_fp32_speedup());
  }
}

}  // namespace

static void add_bench_adam_command(CLI::App& bench) {
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = bench.add_subcommand(
      "adam",
      "CPU optimizer step: the fused Adam (or --optimizer lion|adagrad) pass against a roofline\n"
      "kernel with its exact memory streams, the full step (norm + fused pass), and the unfused\n"
      "step (norm; scale; optimizer; cast), all measured alternately in one run");
  cmd->add_option("--optimizer", o->optimizer, "adam|lion|adagrad: whose fused step (default adam)");
  cmd->add_option("--params", o->params, "Parameters in the shard, e.g. 64M, 256M, 1e8 (default 64M)");
  int_range(cmd->add_option("--threads", o->threads, "Threads (default: all)"), 0, kMaxThreads);
  int_range(cmd->add_option("--numa-node", o->numa_node, "Bind the threads to this NUMA node's cores"), -1,
            kMaxNumaNode);
  cmd->add_option("--grad-dtype", o->grad_dtype, "fp32|bf16|fp16 (default fp32)");
  cmd->add_option("--out-dtype", o->out_dtype,
                  "none|bf16|fp16: the param copy for the device (default bf16)");
  cmd->add_option("--state-dtype", o->state_dtype,
                  "fp32|bf16: Adam's m and v, Lion's m, Adagrad's sum (default fp32)");
  cmd->add_flag("--stochastic-rounding", o->stochastic_rounding,
                "bf16 states: round stochastically (default RNE)");
  cmd->add_option("--simd", o->simd, "scalar|avx2|avx512 (default: the best this CPU has, or $ZOE_SIMD)");
  int_range(cmd->add_option("--repeats", o->repeats, "Measured rounds after one warm-up (default 5)"), 1,
            kMaxRepeats);
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o] {
    optim::bench::Config c = config_from(*o);
    Progress prog(true);
    auto r = value_or_fail(optim::bench::run(
        c, [&](int i, int n) { prog.update(fmt("bench adam: round %d/%d (%zu params)", i, n, c.params)); }));
    prog.done();
    if (o->json)
      print_json(to_json(r));
    else
      print_human(r);
  });
}

// Joins every program this file is linked into (the `zoe` program links all of src/cli).
static const CommandRegistrar kRegister(
    51, "bench",
    "Benchmarks: drive swap bandwidth (io), CPU Adam (adam), NVMe optimizer step (swap), engine (engine), "
    "collectives across the ranks (comm)",
    add_bench_adam_command);

}  // namespace zoe::cli
