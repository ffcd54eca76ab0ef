// The shared options of `zoe plan` and `zoe tune`, parsed and validated.
#include "plan/options.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "config/config.h"
#include "config/paths.h"
#include "core/units.h"
#include "io/file.h"
#include "plan/calibration.h"
#include "plan/hf_config.h"

namespace zoe::plan {

namespace {

Result<uint64_t> bytes_of(const std::string& s, const char* flag) {
  auto r = parse_bytes(s);
  if (!r.is_ok()) return r.status().with_context(flag);
  return r.value();
}

// The rate flags given (0: not given, the calibration's or the default rate stays); any other
// value that is not a positive finite number is refused, naming its flag.
Status apply_rate_flags(const PlanOptions& o, LinkRates* rates) {
  struct RateFlag {
    const char* flag;
    double value;
    double LinkRates::*field;
  };
  const RateFlag flags[] = {{"--nvme-read-gbps", o.nvme_read_gbps, &LinkRates::nvme_read_gbps},
                            {"--nvme-write-gbps", o.nvme_write_gbps, &LinkRates::nvme_write_gbps},
                            {"--h2d-gbps", o.h2d_gbps, &LinkRates::h2d_gbps},
                            {"--cpu-adam-gbps", o.cpu_adam_gbps, &LinkRates::cpu_adam_gbps},
                            {"--flops", o.flops, &LinkRates::flops},
                            {"--net-gbps", o.net_gbps, &LinkRates::net_gbps},
                            {"--net-latency-us", o.net_latency_us, &LinkRates::net_latency_us},
                            {"--intra-gbps", o.intra_gbps, &LinkRates::intra_gbps},
                            {"--device-mem-gbps", o.device_mem_gbps, &LinkRates::device_mem_gbps},
                            {"--local-copy-gbps", o.local_copy_gbps, &LinkRates::local_copy_gbps},
                            {"--nvme-cpu-gbps", o.nvme_cpu_gbps, &LinkRates::nvme_cpu_gbps}};
  for (const RateFlag& f : flags) {
    if (f.value == 0) continue;
    if (!std::isfinite(f.value) || f.value < 0) {
      return invalid_argument("%s %g is not a positive finite number", f.flag, f.value);
    }
    rates->*f.field = f.value;
  }
  return Status::ok();
}

// --activation-checkpointing, --activation-offload and the activation budgets, over the config's
// activation_checkpointing section and zoe.activation_* keys: into in->act.
Status activation_inputs(const PlanOptions& o, PlanInputs* in) {
  ActivationOptions& a = in->act;
  const config::Config& c = in->base;
  a.checkpointing = c.activation_checkpointing.given || o.activation_checkpointing;
  auto off = parse_activation_offload(o.activation_offload.empty() ? c.zoe.activation_offload
                                                                   : o.activation_offload);
  if (!off.is_ok())
    return invalid_argument("--activation-offload %s: expected none, cpu or nvme",
                            o.activation_offload.c_str());
  a.offload = off.value();
  a.host_budget = static_cast<uint64_t>(c.zoe.activation_host_budget_bytes);
  a.device_budget = static_cast<uint64_t>(c.zoe.activation_device_budget_bytes);
  a.min_bytes = static_cast<uint64_t>(c.zoe.activation_min_bytes);
  a.prefetch = static_cast<uint32_t>(c.zoe.activation_prefetch);
  a.host_share = c.zoe.host_budget_bytes > 0 ? static_cast<uint64_t>(c.zoe.host_budget_bytes) / 4 : 0;
  if (a.offload != ActivationOffload::kNone && !a.checkpointing) {
    return invalid_argument(
        "%s needs --activation-checkpointing: only checkpointed activations (each block's input) are "
        "offloaded",
        o.activation_offload.empty()
            ? ("zoe.activation_offload " + c.zoe.activation_offload + " of --config").c_str()
            : ("--activation-offload " + o.activation_offload).c_str());
  }
  if (!o.activation_host_budget.empty()) {
    ZOE_ASSIGN_OR_RETURN(a.host_budget, bytes_of(o.activation_host_budget, "--activation-host-budget"));
  }
  if (!o.activation_device_budget.empty()) {
    ZOE_ASSIGN_OR_RETURN(a.device_budget, bytes_of(o.activation_device_budget, "--activation-device-budget"));
  }
  if (a.checkpointing) in->count_activations = true;
  return Status::ok();
}

}  // namespace

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
  if (s.empty() || errno || !(n >= 1) || n > static_cast<double>(kMaxModelParams) || std::floor(n) != n) {
    return invalid_argument("%s %s: expected a whole number of parameters (e.g. 124439808, 7e9, 1.5B, 350M)",
                            flag, s.c_str());
  }
  return static_cast<uint64_t>(n);
}

Result<ModelDesc> model_from(const PlanOptions& o) {
  const int sources = (!o.hf_config.empty()) + (!o.params.empty()) + (!o.preset.empty());
  if (sources > 1) return invalid_argument("give one model: --preset, --params or --hf-config");
  if ((!o.hf_config.empty() || !o.params.empty()) &&
      (o.d_model || o.heads || o.context || (o.layers && o.params.empty()))) {
    return invalid_argument(
        "--layers, --d-model, --heads and --context shape zoe's GPT (--preset); with --params only "
        "--layers applies, with --hf-config none");
  }
  if (!o.hf_config.empty()) return hf_model(o.hf_config);
  if (!o.params.empty()) {
    ZOE_ASSIGN_OR_RETURN(const uint64_t n, parse_count(o.params, "--params"));
    return params_model(n, o.layers ? o.layers : static_cast<int>(std::min<uint64_t>(32, n)));
  }
  ZOE_ASSIGN_OR_RETURN(
      ModelDesc m, gpt_model(o.preset.empty() ? "small" : o.preset, o.layers, o.d_model, o.heads, o.context));
  if (m.params > kMaxModelParams) {
    return invalid_argument(
        "--preset %s with --layers/--d-model/--heads/--context: %llu parameters, more than the %llu zoe "
        "plans "
        "for",
        o.preset.empty() ? "small" : o.preset.c_str(), static_cast<unsigned long long>(m.params),
        static_cast<unsigned long long>(kMaxModelParams));
  }
  return m;
}

std::string nvme_dir(const PlanOptions& o) {
  if (!o.nvme_path.empty()) return o.nvme_path;
  const char* s = getenv("ZOE_SCRATCH");
  return s && *s ? s : "/var/tmp";
}

Result<std::string> local_nvme_dir(const PlanOptions& o) {
  if (o.nvme_path.empty()) return nvme_dir(o);
  return config::check_flag_dir("--nvme-path", o.nvme_path, config::process_path_vars());
}

Status apply_device_budget(PlanOptions* o) {
  if (o->device_budget.empty()) return Status::ok();
  auto b = parse_bytes(o->device_budget);
  if (!b.is_ok() || b.value() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return invalid_argument("--device-budget %s is not a byte size (expected e.g. 256MiB, 4GiB)",
                            o->device_budget.c_str());
  }
  if (b.value() == 0) return Status::ok();  // the whole device: --device-mem, or its default
  uint64_t node = 0;
  if (__builtin_mul_overflow(b.value(), static_cast<uint64_t>(o->gpus_per_node), &node)) {
    return invalid_argument("--device-budget %s x --gpus-per-node %d overflows 64 bits",
                            o->device_budget.c_str(), o->gpus_per_node);
  }
  if (!o->device_mem.empty()) {
    auto m = parse_bytes(o->device_mem);
    if (m.is_ok() && m.value() != node) {
      return invalid_argument(
          "--device-budget %s (one rank's device memory) and --device-mem %s (one node's, %d rank(s)) "
          "disagree: give one of them",
          o->device_budget.c_str(), o->device_mem.c_str(), o->gpus_per_node);
    }
    if (m.is_ok()) return Status::ok();  // the same bytes; a bad --device-mem is refused naming it
  }
  o->device_mem = std::to_string(node);
  return Status::ok();
}

Result<PlanInputs> plan_inputs(const PlanOptions& o) {
  PlanInputs in;
  ZOE_ASSIGN_OR_RETURN(in.model, model_from(o));
  if (o.nodes < 1 || o.gpus_per_node < 1) {
    return invalid_argument("--nodes %d --gpus-per-node %d: both must be at least 1", o.nodes,
                            o.gpus_per_node);
  }
  // In 64 bits: two flags of 2^16 each would wrap an int to a world of 0.
  const uint64_t world = static_cast<uint64_t>(o.nodes) * static_cast<uint64_t>(o.gpus_per_node);
  if (world > static_cast<uint64_t>(kMaxRanks)) {
    return invalid_argument(
        "--nodes %d x --gpus-per-node %d is %llu ranks: more than the %lld ranks zoe plans for (2^20)",
        o.nodes, o.gpus_per_node, static_cast<unsigned long long>(world), static_cast<long long>(kMaxRanks));
  }
  in.topo = {o.nodes, o.gpus_per_node};
  if (o.device != "cuda" && o.device != "cpu")
    return invalid_argument("--device %s: expected cuda or cpu", o.device.c_str());
  in.cuda = o.device == "cuda";
  const uint64_t g = static_cast<uint64_t>(o.gpus_per_node);
  if (o.device_mem.empty()) {
    in.device_mem = (64ull << 30) * g;
  } else {
    ZOE_ASSIGN_OR_RETURN(in.device_mem, bytes_of(o.device_mem, "--device-mem"));
  }
  if (o.host_mem.empty()) {
    ZOE_ASSIGN_OR_RETURN(in.host_mem, host_memory_bytes());
  } else {
    ZOE_ASSIGN_OR_RETURN(in.host_mem, bytes_of(o.host_mem, "--host-mem"));
  }
  if (!o.nvme_space.empty()) {
    ZOE_ASSIGN_OR_RETURN(in.nvme_space, bytes_of(o.nvme_space, "--nvme-space"));
  } else {
    ZOE_ASSIGN_OR_RETURN(const std::string dir, local_nvme_dir(o));
    auto fb = io::free_bytes_at(dir);
    if (!fb.is_ok())
      return fb.status().with_context("free space of the NVMe path " + dir + " (set --nvme-space)");
    in.nvme_space = fb.value();
  }
  if (!o.calibration.empty()) {
    Status s = apply_calibration_file(o.calibration, &in.rates);
    if (!s.is_ok()) return s.with_context("--calibration");
  }
  if (!o.calibration_json.empty()) {
    ZOE_RETURN_IF_ERROR(apply_calibration_json(o.calibration_json, "--calibrate's measurements", &in.rates));
  }
  ZOE_RETURN_IF_ERROR(apply_rate_flags(o, &in.rates));
  if (!o.config.empty()) {
    ZOE_ASSIGN_OR_RETURN(in.base, config::Config::load(o.config, in.topo.world()));
  } else {
    in.base.bf16 = true;
  }
  if (!o.precision.empty()) {
    if (o.precision != "bf16" && o.precision != "fp16" && o.precision != "fp32") {
      return invalid_argument("--precision %s: expected bf16, fp16 or fp32", o.precision.c_str());
    }
    in.base.bf16 = o.precision == "bf16";
    in.base.fp16.enabled = o.precision == "fp16";
  }
  if (o.micro_batch < 0 || o.seq < 0 || o.grad_accum < 1 || o.micro_batch > kMaxPlanMicroBatch ||
      o.seq > kMaxPlanContext || o.grad_accum > kMaxPlanAccum) {
    return invalid_argument(
        "--micro-batch %lld --seq %lld --grad-accum %lld: expected positive values (at most %lld, %lld and "
        "%lld)",
        static_cast<long long>(o.micro_batch), static_cast<long long>(o.seq),
        static_cast<long long>(o.grad_accum), static_cast<long long>(kMaxPlanMicroBatch),
        static_cast<long long>(kMaxPlanContext), static_cast<long long>(kMaxPlanAccum));
  }
  in.count_activations = o.micro_batch > 0 || o.seq > 0;
  ZOE_RETURN_IF_ERROR(activation_inputs(o, &in));
  in.work.micro_batch = o.micro_batch > 0  ? o.micro_batch
                        : o.config.empty() ? 1
                                           : in.base.train_micro_batch_size_per_gpu;
  in.work.seq = o.seq > 0 ? o.seq : in.model.context > 0 ? in.model.context : 1024;
  in.work.grad_accum =
      o.grad_accum > 1 || o.config.empty() ? o.grad_accum : in.base.gradient_accumulation_steps;
  in.base.gradient_accumulation_steps = in.work.grad_accum;
  if (!o.schedule.empty() && o.schedule != "micro-batch" && o.schedule != "layer-major")
    return invalid_argument("--schedule %s: expected micro-batch or layer-major", o.schedule.c_str());
  if (!o.schedule.empty()) in.base.zoe.schedule = o.schedule;
  in.work.layer_major = in.base.zoe.schedule == "layer-major";
  // The FLOP rate at this micro-batch where the calibration measured it; a --flops flag wins at
  // every micro-batch.
  if (o.flops > 0) in.rates.flops_by_micro_batch.clear();
  in.rates.flops = in.rates.flops_at(in.work.micro_batch);
  return in;
}

}  // namespace zoe::plan
