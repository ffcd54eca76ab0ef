// The options `zoe plan` and `zoe tune` share (model, cluster, memory, link rates, workload),
// turned into PlanInputs. The CLI registration is a template over the CLI library's App, so this
// library does not depend on it.
#pragma once

#include <cstdint>
#include <string>

#include "plan/planner.h"
#include "zoe/status.h"

namespace zoe::plan {

struct PlanOptions {
  std::string preset;
  int layers = 0, d_model = 0, heads = 0, context = 0;
  std::string params;
  std::string hf_config;
  int nodes = 1, gpus_per_node = 1;
  std::string device_mem, host_mem, nvme_space, nvme_path;
  std::string device_budget;  // zoe train's --device-budget: one rank's device memory ("": not given)
  std::string calibration;
  std::string
      calibration_json;  // rates as a calibration file's text (tune --calibrate's own); over --calibration
  double nvme_read_gbps = 0, nvme_write_gbps = 0, h2d_gbps = 0, cpu_adam_gbps = 0, flops = 0;
  double net_gbps = 0, net_latency_us = 0, intra_gbps = 0, device_mem_gbps = 0, local_copy_gbps = 0,
         nvme_cpu_gbps = 0;
  int64_t micro_batch = 0, seq = 0, grad_accum = 1;
  std::string precision;
  std::string device = "cuda";
  std::string config;
  // Activation checkpointing and the activation store's tiers (`zoe plan` only): given, the
  // activations are counted; "" where not given (the --config's keys, else none).
  bool activation_checkpointing = false;
  std::string activation_offload, activation_host_budget, activation_device_budget;
  // --drive-tbw: the terabytes (1e12 bytes) a node's NVMe drive is rated to write; 0: not given.
  double drive_tbw = 0;
  // --schedule: micro-batch or layer-major ("": the --config's zoe.schedule, else micro-batch).
  std::string schedule;
};

// The bounds of the integer options (their errors give them): a world of at most 2^20 ranks.
constexpr int64_t kMaxRanks = 1 << 20, kMaxPlanLayers = 1 << 16, kMaxPlanWidth = 1 << 16;
constexpr int64_t kMaxPlanContext = 1 << 24;
// tune searches the micro-batches dividing --micro-batch x --grad-accum (a config holds at most
// 2^20 of each): at most 2^50, whose divisors are found in 2^25 steps.
constexpr int64_t kMaxPlanMicroBatch = 1 << 30, kMaxPlanAccum = 1 << 20;

// "124439808", "7e9", "1.5B", "350M", "20K" (powers of 1000: parameter counts, not bytes).
Result<uint64_t> parse_count(const std::string& s, const char* flag);
// The model the options name (one of --preset/--layers..., --params, --hf-config).
Result<ModelDesc> model_from(const PlanOptions& o);
// --nvme-path, else $ZOE_SCRATCH, else /var/tmp: the text a written config holds.
std::string nvme_dir(const PlanOptions& o);
// The same directory on this host: --nvme-path with its placeholders and variables expanded
// (config/paths.h) and checked that it can hold files, errors naming --nvme-path and the text given;
// else $ZOE_SCRATCH or /var/tmp, unchecked.
Result<std::string> local_nvme_dir(const PlanOptions& o);
// Everything make_plan() needs; errors name the flag and the bad value.
Result<PlanInputs> plan_inputs(const PlanOptions& o);
// --device-budget B, as zoe train takes it (one rank's device memory; 0: the whole device, the
// default): sets device_mem to B x gpus_per_node. Given with --device-mem, the two must agree (else
// an error naming both).
Status apply_device_budget(PlanOptions* o);

// Registers the shared options on a CLI11 (sub)command. int_range(option, min, max) bounds an
// integer option and positive(option) a rate's, as they are parsed (zoe/cli.h's, which name the
// option in their errors).
template <class App, class IntRange, class Positive>
void add_plan_options(App& cmd, PlanOptions* o, IntRange int_range, Positive positive) {
  cmd.add_option("--preset", o->preset, "zoe's GPT: tiny, small, demo, medium, large, 2b (default: small)");
  int_range(cmd.add_option(
                "--layers", o->layers,
                "zoe's GPT: transformer blocks (overrides the preset); with --params: modules (default 32)"),
            1, kMaxPlanLayers);
  int_range(cmd.add_option("--d-model", o->d_model, "zoe's GPT: width (overrides the preset)"), 1,
            kMaxPlanWidth);
  int_range(cmd.add_option("--heads", o->heads, "zoe's GPT: attention heads (overrides the preset)"), 1,
            kMaxPlanWidth);
  int_range(cmd.add_option("--context", o->context, "zoe's GPT: positions (overrides the preset)"), 1,
            kMaxPlanContext);
  cmd.add_option("--params", o->params,
                 "A model of exactly N parameters (124439808, 7e9, 1.5B) in --layers "
                 "equal modules");
  cmd.add_option("--hf-config", o->hf_config,
                 "A Hugging Face config.json (model_type gpt2, llama, mistral, "
                 "qwen2, gpt_neox)");
  int_range(cmd.add_option("--nodes", o->nodes, "Nodes"), 1, kMaxRanks)->capture_default_str();
  int_range(cmd.add_option("--gpus-per-node", o->gpus_per_node, "Ranks (devices) per node"), 1, kMaxRanks)
      ->capture_default_str();
  cmd.add_option("--device-mem", o->device_mem,
                 "Device memory of one node, all its devices together, e.g. "
                 "640GiB (default: 64 GiB per device, the engine's default budget)");
  cmd.add_option("--device-budget", o->device_budget,
                 "One rank's device memory, e.g. 256MiB, as zoe train takes it (0: the whole device): "
                 "--device-mem of --gpus-per-node ranks; given with --device-mem, they must agree");
  cmd.add_option("--host-mem", o->host_mem, "Host RAM of one node (default: this host's MemTotal)");
  cmd.add_option("--nvme-space", o->nvme_space,
                 "NVMe space of one node (default: free space of the NVMe path)");
  cmd.add_option("--nvme-path", o->nvme_path,
                 "Directory whose free space is the default --nvme-space, and of the swap files (default "
                 "$ZOE_SCRATCH or /var/tmp); $VAR or ${VAR} (an environment variable), {rank}, {local_rank} "
                 "and {host} are expanded here for the checks and on each rank in a written config ($$ is "
                 "a $)");
  cmd.add_option("--calibration", o->calibration,
                 "Link rates from this JSON file (zoe tune --calibrate writes "
                 "one); the flags below override it");
  positive(cmd.add_option("--nvme-read-gbps", o->nvme_read_gbps, "NVMe read GB/s of one node (default 3.0)"));
  positive(
      cmd.add_option("--nvme-write-gbps", o->nvme_write_gbps, "NVMe write GB/s of one node (default 2.0)"));
  positive(cmd.add_option("--h2d-gbps", o->h2d_gbps, "Host <-> device GB/s of one rank (default 25)"));
  positive(cmd.add_option("--cpu-adam-gbps", o->cpu_adam_gbps,
                          "CPU Adam GB/s of one node, bytes of state touched "
                          "(default 20)"));
  positive(cmd.add_option("--flops", o->flops, "Sustained FLOP/s of one device (default 1e14)"));
  positive(cmd.add_option("--net-gbps", o->net_gbps, "Collective GB/s per rank across nodes (default 12.5)"));
  positive(cmd.add_option("--net-latency-us", o->net_latency_us,
                          "Microseconds each collective across nodes costs beside its bytes (default 20; "
                          "zoe bench comm's time at its smallest size)"));
  positive(
      cmd.add_option("--intra-gbps", o->intra_gbps, "Collective GB/s per rank inside a node (default 150)"));
  positive(cmd.add_option("--device-mem-gbps", o->device_mem_gbps,
                          "Device memory GB/s, for device-resident Adam "
                          "(default 1500)"));
  positive(
      cmd.add_option("--local-copy-gbps", o->local_copy_gbps,
                     "zoe's CPU device: GB/s of the engine's buffer copies and zeroing (stage-3 gathers, "
                     "partition loads) beside the compute (default 10)"));
  positive(cmd.add_option("--nvme-cpu-gbps", o->nvme_cpu_gbps,
                          "zoe's CPU device: NVMe GB (read and written) per second of CPU time the I/O takes "
                          "from the compute and the update (default 8)"));
  int_range(cmd.add_option("--micro-batch", o->micro_batch,
                           "Sequences per micro-batch per rank (default 1); given, "
                           "activations count against device memory"),
            1, kMaxPlanMicroBatch);
  int_range(cmd.add_option("--seq", o->seq,
                           "Tokens per sequence (default: the model's context); given, activations "
                           "count against device memory"),
            1, kMaxPlanContext);
  int_range(cmd.add_option("--grad-accum", o->grad_accum, "Micro-batches per optimizer step"), 1,
            kMaxPlanAccum)
      ->capture_default_str();
  cmd.add_option("--precision", o->precision,
                 "Compute precision: bf16, fp16 or fp32 (default bf16, or the "
                 "--config's)");
  cmd.add_option("--device", o->device,
                 "The engine's device: cuda (gathers on demand) or cpu (zoe's CPU "
                 "device: queued gathers, device memory is host RAM)")
      ->capture_default_str();
  cmd.add_option("--config", o->config,
                 "A DeepSpeed-style config whose other knobs every row keeps (buckets, "
                 "sub_group_size, precision, batch)");
  cmd.add_option(
      "--schedule", o->schedule,
      "The step's order with --grad-accum > 1: micro-batch or layer-major (each module's parameters "
      "read once per step; docs in include/zoe/engine.h). Each row's predicted step is for it; "
      "both schedules' are shown beside (default: the --config's zoe.schedule, else micro-batch)");
  positive(cmd.add_option("--drive-tbw", o->drive_tbw,
                          "The endurance a node's NVMe drive is rated for, in terabytes written (TBW, 1 TB = "
                          "1e12 bytes, e.g. 600): also show the steps it allows at the plan's NVMe bytes "
                          "written per step (the bytes per step and per 1,000 steps are always shown)"));
}

}  // namespace zoe::plan
