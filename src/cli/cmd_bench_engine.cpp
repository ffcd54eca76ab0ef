// `zoe bench engine`: training steps through the engine for models of several depths; the step
// time breakdown and each tier's high-water mark against the per-rank model-state bytes.
#include <sys/stat.h>

#include <cmath>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "config/config.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/units.h"
#include "zero/engine_internal.h"
#include "zoe/cli.h"
#include "zoe/engine.h"

namespace zoe::cli {
namespace {

using nlohmann::json;

struct BenchEngineOpts {
  std::string modules = "8,32";
  int64_t d = 512;
  int steps = 3;
  int stage = 3;
  std::string offload = "nvme";  // none, cpu, nvme (parameters and optimizer)
  std::vector<std::string> paths;
  std::string device_budget = "256MiB";
  std::string precision = "bf16";
  std::string config;  // a config file instead of the flags above
  bool json = false;
};

std::string make_config(const BenchEngineOpts& o, const std::string& nvme) {
  auto off = [&](bool param) {
    if (o.offload == "none" || (param && o.stage != 3)) return std::string("{\"device\": \"none\"}");
    std::string s = "{\"device\": \"" + o.offload + "\"";
    if (o.offload == "nvme") s += ", \"nvme_path\": \"" + nvme + "\"";
    return s + "}";
  };
  std::string prec = o.precision == "bf16"   ? "\"bf16\": {\"enabled\": true},"
                     : o.precision == "fp16" ? "\"fp16\": {\"enabled\": true},"
                                             : "";
  // A prefetch window of two modules, so that deeper models exceed it.
  std::string window = std::to_string(2 * (o.d * o.d + o.d));
  return "{" + prec + "\"zero_optimization\": {\"stage\": " + std::to_string(o.stage) +
         ", \"stage3_param_persistence_threshold\": 0, \"stage3_prefetch_bucket_size\": " + window +
         ", \"offload_optimizer\": " + (o.stage == 0 ? std::string("{\"device\": \"none\"}") : off(false)) +
         ", \"offload_param\": " + off(true) + "}, \"zoe\": {\"device_budget\": \"" + o.device_budget +
         "\"}}";
}

json run_depth(Runtime& rt, const config::Config& cfg, const BenchEngineOpts& o, int depth) {
  auto eng = value_or_fail(zero::create_engine(rt, cfg));
  for (int l = 0; l < depth; ++l) {
    Status s = eng->add_module("block." + std::to_string(l), {{"w", {o.d, o.d}}, {"b", {o.d}}});
    if (!s.is_ok()) fail(s);
  }
  Status s = eng->initialize([&](size_t m, size_t p, float* x, size_t n) {
    for (size_t i = 0; i < n; ++i)
      x[i] = 0.02f * std::sin(0.001f * static_cast<float>(i) + static_cast<float>(m + p));
  });
  if (!s.is_ok()) fail(s.with_context("initialising a " + std::to_string(depth) + "-module model"));
  const size_t d = static_cast<size_t>(o.d);
  std::vector<float> x(d, 0.5f), y(d);
  json steps = json::array();
  StepStats last;
  for (int k = 0; k < o.steps; ++k) {
    // Forward: y = W x + b per module (the compute); backward writes dL/dW = y x^T-shaped values.
    for (int pass = 0; pass < 2; ++pass) {
      for (int i = 0; i < depth; ++i) {
        size_t m = static_cast<size_t>(pass == 0 ? i : depth - 1 - i);
        auto p = value_or_fail(eng->fetch(m));
        for (size_t r = 0; r < d; ++r) {
          float acc = 0;
          for (size_t c = 0; c < d; c += 8) {
            const void* w = p.data[0];
            float wv = p.dtype == ComputeDType::kF32
                           ? static_cast<const float*>(w)[r * d + c]
                           : bf16_to_f32(static_cast<const uint16_t*>(w)[r * d + c]);
            acc += wv * x[c];
          }
          y[r] = acc;
        }
        if (pass == 1) {
          auto g = value_or_fail(eng->grads(m));
          for (size_t i2 = 0; i2 < g.data.size(); ++i2) {
            for (size_t e = 0; e < g.numel[i2]; ++e) {
              float v = 1e-3f * y[e % d] * static_cast<float>(eng->loss_scale());
              if (g.dtype == ComputeDType::kF32)
                static_cast<float*>(g.data[i2])[e] = v;
              else if (g.dtype == ComputeDType::kBF16)
                static_cast<uint16_t*>(g.data[i2])[e] = f32_to_bf16(v);
              else
                static_cast<uint16_t*>(g.data[i2])[e] = f32_to_f16(v);
            }
          }
          Status rs = eng->reduce_grads(m);
          if (!rs.is_ok()) fail(rs);
        }
        Status rl = eng->release(m);
        if (!rl.is_ok()) fail(rl);
      }
    }
    last = value_or_fail(eng->step());
    steps.push_back({{"step", last.step},
                     {"t_compute", last.t_compute},
                     {"t_comm", last.t_comm},
                     {"t_io_stall", last.t_io_stall},
                     {"t_optimizer", last.t_optimizer},
                     {"gathers_prefetched", last.gathers_prefetched},
                     {"gathers_on_demand", last.gathers_on_demand}});
  }
  uint64_t n = static_cast<uint64_t>(depth) * (d * d + d);
  uint64_t world = static_cast<uint64_t>(rt.world_size());
  uint64_t cbytes = o.precision == "fp32" ? 4 : 2;
  // Per rank: compute params (partitioned at stage 3), gradients, fp32 master + m + v.
  uint64_t params_b = (o.stage == 3 ? n / world : n) * cbytes;
  uint64_t grads_b = (o.stage >= 2 ? n / world : n) * 4;
  uint64_t optim_b = (o.stage >= 1 ? n / world : n) * 12;
  uint64_t module_b = (d * d + d) * cbytes;
  return {{"modules", depth},
          {"params", n},
          {"state_bytes_per_rank", params_b + grads_b + optim_b},
          {"largest_module_bytes", module_b},
          {"high_water_bytes",
           {{"device", last.high_water[0]}, {"host", last.high_water[1]}, {"nvme", last.high_water[2]}}},
          {"device_high_water_in_modules",
           static_cast<double>(last.high_water[0]) / static_cast<double>(module_b)},
          {"steps", steps}};
}

// Limits of the flags: a step count, a width and depths whose model fits a large host.
constexpr int64_t kMaxBenchSteps = 1000000;
constexpr int64_t kMaxBenchWidth = 16384;
constexpr uint64_t kMaxDepth = 100000;

// Every flag's value, checked before anything runs; a bad one is a usage error naming the flag.
std::vector<uint64_t> check_flags(const BenchEngineOpts& o) {
  check_flag_range("--steps", o.steps, 1, kMaxBenchSteps);
  check_flag_range("--d", o.d, 1, kMaxBenchWidth);
  check_flag_range("--stage", o.stage, 0, 3);
  auto one_of = [](const char* flag, const std::string& v, std::initializer_list<const char*> ok) {
    std::string list;
    for (const char* w : ok) {
      if (v == w) return;
      list += list.empty() ? w : std::string(", ") + w;
    }
    usage_fail(invalid_argument("%s '%s': expected one of %s", flag, v.c_str(), list.c_str()));
  };
  one_of("--offload", o.offload, {"none", "cpu", "nvme"});
  one_of("--precision", o.precision, {"fp32", "bf16", "fp16"});
  Result<uint64_t> budget = parse_bytes(o.device_budget);
  if (!budget.is_ok()) {
    usage_fail(invalid_argument("--device-budget %s: %s", o.device_budget.c_str(),
                                budget.status().message().c_str()));
  }
  if (*budget == 0)
    usage_fail(invalid_argument("--device-budget %s: expected a size above 0", o.device_budget.c_str()));
  Result<std::vector<uint64_t>> depths = parse_uint_list(o.modules, "--modules");
  if (!depths.is_ok()) {
    usage_fail(invalid_argument("%s; expected depths in [1, %llu], comma separated",
                                depths.status().message().c_str(),
                                static_cast<unsigned long long>(kMaxDepth)));
  }
  for (uint64_t depth : *depths) {
    if (depth > kMaxDepth) {
      usage_fail(invalid_argument("--modules %s: depth %llu is out of range (expected integers in [1, %llu])",
                                  o.modules.c_str(), static_cast<unsigned long long>(depth),
                                  static_cast<unsigned long long>(kMaxDepth)));
    }
  }
  return std::move(depths).value();
}

void run(const BenchEngineOpts& o) {
  const std::vector<uint64_t> depths = check_flags(o);
  auto rt = value_or_fail(Runtime::init());
  std::vector<std::string> paths = o.paths;
  if (paths.empty()) {
    const char* env = getenv("ZOE_SCRATCH");
    paths.push_back(env && *env ? env : "/var/tmp");
  }
  std::string text;
  if (!o.config.empty()) {
    auto c = value_or_fail(config::Config::load(o.config, rt->world_size()));
    text = c.to_json();
  } else {
    text = make_config(o, paths[0]);
  }
  auto cfg = value_or_fail(config::Config::parse(text, rt->world_size()));
  json rows = json::array();
  Progress progress(rt->rank() == 0);
  for (uint64_t depth : depths) {
    progress.update("zoe bench engine: " + std::to_string(depth) + " modules of " + std::to_string(o.d) +
                    "x" + std::to_string(o.d));
    rows.push_back(run_depth(*rt, cfg, o, static_cast<int>(depth)));
  }
  progress.done();
  if (rt->rank() != 0) return;
  json j = {{"world_size", rt->world_size()}, {"stage", cfg.zero.stage},          {"precision", o.precision},
            {"offload", o.offload},           {"device_budget", o.device_budget}, {"rows", rows}};
  if (o.json) {
    print_json(j);
    return;
  }
  printf("# zoe bench engine: stage %d, offload %s, %s, world %d, modules of %lldx%lld, device budget %s\n",
         cfg.zero.stage, o.offload.c_str(), o.precision.c_str(), rt->world_size(),
         static_cast<long long>(o.d), static_cast<long long>(o.d), o.device_budget.c_str());
  Table t({{"modules", "", 8},
           {"params", "", 11},
           {"state", "(B/rank)", 12},
           {"dev hwm", "(B)", 12},
           {"hwm", "(modules)", 10},
           {"host hwm", "(B)", 12},
           {"nvme hwm", "(B)", 12},
           {"compute", "(s)", 8},
           {"comm", "(s)", 8},
           {"io stall", "(s)", 8},
           {"optim", "(s)", 8},
           {"gathers", "prefetched", 11}});
  t.print_header(stdout);
  for (const auto& r : rows) {
    const auto& s = r["steps"].back();
    t.print_row(stdout,
                {std::to_string(r["modules"].get<int>()), std::to_string(r["params"].get<uint64_t>()),
                 std::to_string(r["state_bytes_per_rank"].get<uint64_t>()),
                 std::to_string(r["high_water_bytes"]["device"].get<uint64_t>()),
                 fmt("%.1f", r["device_high_water_in_modules"].get<double>()),
                 std::to_string(r["high_water_bytes"]["host"].get<uint64_t>()),
                 std::to_string(r["high_water_bytes"]["nvme"].get<uint64_t>()),
                 fmt("%.3f", s["t_compute"].get<double>()), fmt("%.3f", s["t_comm"].get<double>()),
                 fmt("%.3f", s["t_io_stall"].get<double>()), fmt("%.3f", s["t_optimizer"].get<double>()),
                 fmt("%llu/%llu", static_cast<unsigned long long>(s["gathers_prefetched"].get<uint64_t>()),
                     static_cast<unsigned long long>(s["gathers_prefetched"].get<uint64_t>() +
                                                     s["gathers_on_demand"].get<uint64_t>()))});
  }
}

}  // namespace

static void add_bench_engine_command(CLI::App& bench) {
  auto o = std::make_shared<BenchEngineOpts>();
  CLI::App* cmd = bench.add_subcommand(
      "engine",
      "Train a few steps of models of several depths through the engine (default: ZeRO-3, parameters and\n"
      "optimizer states on NVMe) and report the step-time breakdown (compute, comm, I/O stall,\n"
      "optimizer) and each tier's high-water mark against the per-rank model-state bytes. The device\n"
      "high-water mark should not grow with depth. Runs under mpirun too.");
  cmd->add_option("--modules", o->modules, "Model depths to run, comma separated")->capture_default_str();
  int_range(cmd->add_option("--d", o->d, "Width: each module holds a d x d weight and a bias"), 1,
            kMaxBenchWidth)
      ->capture_default_str();
  int_range(cmd->add_option("--steps", o->steps, "Steps per depth"), 1, kMaxBenchSteps)
      ->capture_default_str();
  int_range(cmd->add_option("--stage", o->stage, "ZeRO stage"), 0, 3)->capture_default_str();
  cmd->add_option("--offload", o->offload, "none, cpu or nvme (parameters at stage 3, and optimizer states)")
      ->capture_default_str();
  cmd->add_option("--path", o->paths, "NVMe directory (default $ZOE_SCRATCH or /var/tmp)");
  cmd->add_option("--device-budget", o->device_budget, "Device memory budget")->capture_default_str();
  cmd->add_option("--precision", o->precision, "fp32, bf16 or fp16")->capture_default_str();
  cmd->add_option("--config", o->config, "A DeepSpeed-style config file instead of the flags above");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o] { run(*o); });
}

// Joins every program this file is linked into (the `zoe` program links all of src/cli).
static const CommandRegistrar kRegister(
    53, "bench",
    "Benchmarks: drive swap bandwidth (io), CPU Adam (adam), NVMe optimizer step (swap), engine (engine), "
    "collectives across the ranks (comm)",
    add_bench_engine_command);

}  // namespace zoe::cli
