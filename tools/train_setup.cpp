// `zoe train`, the run's setup: the runtime, the engine's config (a file, or the flags), the
// activation checkpointing and its offload, the data, the engine with the model's modules, a
// resume, and the model and its trainer. Each phase refuses a bad flag or key before anything
// larger is allocated.
#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/train_run.h"

namespace zoe::cli {

using nlohmann::json;

namespace {

// The host buffers the engine sized, as one line ("" with no offload to NVMe); "(zoe's)" marks
// the sizes zoe picked because the config does not give them.
std::string buffers_line(const BufferSizes& b) {
  if (b.swap_buffer_count == 0 && b.staging_count == 0) return "";
  auto mine = [&](const char* key) {
    return std::find(b.chosen.begin(), b.chosen.end(), key) != b.chosen.end() ? " (zoe's)" : "";
  };
  std::string line = "host buffers:";
  if (b.swap_buffer_count) {
    line += fmt(" optimizer swapper %zu x %s%s + %zu write buffers;", b.swap_buffer_count,
                format_bytes(b.swap_buffer_bytes).c_str(),
                mine("zero_optimization.offload_optimizer.buffer_count"), b.swap_async_buffers);
  }
  if (b.staging_count) {
    line += fmt(" staging %zu x %s%s; partition cache %s%s;", b.staging_count,
                format_bytes(b.staging_bytes).c_str(), mine("zero_optimization.offload_param.buffer_size"),
                format_bytes(b.host_cache_bytes).c_str(), mine("zero_optimization.offload_param.max_in_cpu"));
  }
  if (b.host_share) line += fmt(" within %s of host memory", format_bytes(b.host_share).c_str());
  return line;
}

}  // namespace

// --seq: at most the model's positions (the default is all of them).
void TrainRun::check_seq() {
  T = o.seq ? o.seq : mc.seq;
  if (T > mc.seq) {
    usage_fail(
        invalid_argument("--seq %d is longer than the model allows: it has %d positions (set --context, or a "
                         "smaller --seq)",
                         T, mc.seq));
  }
}

// The runtime (this rank), and --plot's tools checked before any training.
void TrainRun::start_runtime() {
  rt = value_or_fail(Runtime::init());
  lead = rt->rank() == 0;
  stop.set_rank(rt->rank(), rt->world_size());
  if (!o.plot.empty() && lead) {
    Status ps = plot_available();
    if (!ps.is_ok()) fail(ps.with_context("checking for --plot " + o.plot + " before training"));
  }
}

// The engine's config: a file (flags given override its keys, and say so), or the flags.
void TrainRun::build_config() {
  if (!o.config.empty()) {
    cfg = value_or_fail(Config::load(o.config, rt->world_size()));
    apply_overrides(o, &cfg, lead);
  } else {
    std::vector<std::string>& dirs = nvme_dirs;
    dirs = o.nvme_path;
    if (dirs.empty()) {
      const char* env = getenv("ZOE_SCRATCH");
      dirs.push_back(env && *env ? env : "/var/tmp");
    }
    const bool on_nvme = o.offload == "nvme" || o.activation_offload == "nvme";
    if (!o.nvme_path.empty() && !on_nvme && lead) {
      fprintf(stderr, "zoe: --nvme-path has no effect without --offload nvme or --activation-offload nvme\n");
    }
    // Each --nvme-path as the user wrote it (the config's check below names the key and the expansion).
    for (const std::string& d : on_nvme ? o.nvme_path : std::vector<std::string>{}) {
      Result<std::string> dir = check_nvme_dir("--nvme-path", d);
      if (!dir.is_ok()) fail(dir.status());
    }
    auto c = flags_config(o, dirs, rt->world_size());
    if (!c.is_ok()) fail(c.status().with_context("the config built from the flags"));
    cfg = std::move(c).value();
    // The directories are the flag's (or the default's): the error names it, not only the key.
    Status paths = cfg.check_paths();
    if (!paths.is_ok()) {
      fail(paths.with_context(o.nvme_path.empty() ? "the default NVMe directory ($ZOE_SCRATCH or /var/tmp) "
                                                    "of --offload nvme; give --nvme-path"
                                                  : "--nvme-path of --offload nvme"));
    }
  }
  setup_activations();
  // From here on the config's values are the run's (bounded by Config::parse).
  o.micro_batch = static_cast<int>(cfg.micro_batch());
  check_host_memory(cfg, mc, o.micro_batch, T, ckpt);
  if (!o.save_dir.empty()) prepare_save_dir(o.save_dir);
}

// Activation checkpointing: --activation-checkpointing, or the config's activation_checkpointing
// section. --activation-offload and --activation-host-budget override zoe.activation_offload and
// zoe.activation_host_budget (with --config, said on stderr); without --config, NVMe activations go
// to the --nvme-path directories. Offload without checkpointing and NVMe without a directory are
// refused here, naming the flag or the key.
void TrainRun::setup_activations() {
  ckpt = o.activation_checkpointing || cfg.activation_checkpointing().given;
  auto check = [&](const char* flag, Status s) {
    if (!s.is_ok())
      usage_fail(
          s.with_context(o.config.empty() ? std::string(flag) : flag + (" with --config " + o.config)));
  };
  if (o.config.empty() && o.activation_offload == "nvme") {  // the directory first: the offload checks it
    std::string dirs = "[";
    for (const std::string& d : nvme_dirs) dirs += (dirs.size() > 1 ? "," : "") + json(d).dump();
    check("--nvme-path", cfg.set("zoe.activation_nvme_path", dirs + "]"));
  }
  if (o.has("--activation-offload")) {
    if (!o.config.empty() && lead) {
      fprintf(stderr, "zoe: --activation-offload %s overrides zoe.activation_offload (%s in %s)\n",
              o.activation_offload.c_str(), activation_offload_name(cfg.activation_offload()),
              o.config.c_str());
    }
    check("--activation-offload",
          cfg.set_activation_offload(parse_activation_offload(o.activation_offload).value()));
  }
  if (o.has("--activation-host-budget")) {
    if (!o.config.empty() && lead) {
      fprintf(stderr,
              "zoe: --activation-host-budget %s overrides zoe.activation_host_budget (%llu bytes in %s)\n",
              o.activation_host_budget.c_str(), static_cast<unsigned long long>(cfg.activation_host_budget()),
              o.config.c_str());
    }
    check("--activation-host-budget",
          cfg.set_activation_host_budget(parse_bytes(o.activation_host_budget).value()));
  }
  const ActivationOffload off = cfg.activation_offload();
  const std::string what = o.has("--activation-offload")
                               ? "--activation-offload " + o.activation_offload
                               : std::string("zoe.activation_offload ") + activation_offload_name(off) +
                                     " (or activation_checkpointing.cpu_checkpointing) in " + o.config;
  if (off != ActivationOffload::kNone && !ckpt) {
    usage_fail(invalid_argument(
        "%s needs activation checkpointing: give --activation-checkpointing (or an activation_checkpointing "
        "section in the config); only checkpointed activations (each block's input) are offloaded",
        what.c_str()));
  }
  if (o.has("--activation-host-budget") && off == ActivationOffload::kNone) {
    usage_fail(
        invalid_argument("--activation-host-budget %s has no effect without activation offload: give "
                         "--activation-offload cpu or nvme",
                         o.activation_host_budget.c_str()));
  }
  if (ckpt && o.config.empty()) check("--activation-checkpointing", flags_activation_share(off));
  if (off != ActivationOffload::kNvme) return;
  if (cfg.activation_nvme_paths().empty()) {
    usage_fail(invalid_argument(
        "%s has no directory for the activations: set zoe.activation_nvme_path (or an offload nvme_path) in "
        "--config %s",
        what.c_str(), o.config.c_str()));
  }
  Status paths = cfg.check_paths();
  if (!paths.is_ok()) fail(paths.with_context(what + ": its NVMe directory"));
}

// Without --config, the device's activation share (zoe.activation_device_budget), kept out of the
// placement's budget: every block input of a micro-batch without offload (or without
// --device-budget); with offload, a quarter of --device-budget, at least one block input (the last
// one never leaves the device) and at most all of them.
Status TrainRun::flags_activation_share(ActivationOffload off) {
  const double all = model::checkpoint_bytes_estimate(mc, o.micro_batch, T), one = all / mc.layers;
  double share = all;
  if (off != ActivationOffload::kNone && o.has("--device-budget")) {
    const double budget = static_cast<double>(parse_bytes(o.device_budget).value());
    if (one >= budget)
      return one_input_too_big(
          one, "is all of --device-budget " + o.device_budget + " and leaves nothing for the model");
    share = std::min(all, std::max(one, budget / 4));
  }
  if (share >= 9.0e18) return invalid_argument("block inputs of %.3g bytes per micro-batch", all);
  activation_share = share;
  return cfg.set("zoe.activation_device_budget", std::to_string(static_cast<uint64_t>(share)));
}

// In the flags' terms: one block's input, which never leaves the device (the last one saved stays
// there while the backward begins), does not fit beside what the model needs there.
Status TrainRun::one_input_too_big(double one, const std::string& why) const {
  const uint64_t b = static_cast<uint64_t>(one);
  return out_of_budget(
      "--activation-checkpointing with --activation-offload: one block's input is %llu bytes (%s: "
      "--micro-batch "
      "%d x --seq %d x width %d x 4 bytes) and must stay on the device (the last one saved is kept there), "
      "which %s; raise --device-budget (zoe plan with the same "
      "flags shows what the placement needs beside it) or lower --micro-batch or --seq",
      static_cast<unsigned long long>(b), format_bytes(b).c_str(), o.micro_batch, T, mc.d_model, why.c_str());
}

// Data next: a missing file is reported before the engine allocates anything.
void TrainRun::load_data() {
  if (!o.data.empty()) {
    // The corpus is held twice while it loads: at most a quarter of the available memory, 1 GiB.
    const uint64_t avail = host_memory_available();
    const size_t cap =
        static_cast<size_t>(std::min<uint64_t>(uint64_t{1} << 30, avail ? avail / 4 : uint64_t{1} << 30));
    auto c = data::load_text_file(o.data, static_cast<size_t>(T), 0.05, cap);
    if (!c.is_ok()) {
      // The cap explained where it was the reason; "--data" otherwise.
      const bool over_cap = c.status().message().find("more than the") != std::string::npos;
      fail(c.status().with_context(
          over_cap ? fmt("--data: the limit is a quarter of the host's available memory (%s), at most 1 GiB",
                         format_bytes(avail).c_str())
                   : std::string("--data")));
    }
    corpus = std::move(c).value();
  } else {
    corpus = data::make_arithmetic(o.seed, 200000, o.task == "add2" ? 2 : o.task == "add1" ? 1 : 3);
  }
}

// The engine, the model's modules registered and initialised from --seed.
void TrainRun::build_engine() {
  eng = value_or_fail(Engine::create(*rt, cfg));
  // A second job saving into the same --save-dir is refused now, not at its first save.
  if (!o.save_dir.empty()) {
    Status cs = eng->claim_save_dir(o.save_dir);
    if (!cs.is_ok()) fail(cs);
  }
  // The outputs, checked once --save-dir is claimed (none may lie inside it), before training.
  const std::string suffix = rt->world_size() > 1 ? "." + std::to_string(rt->rank()) : "";
  dump.emplace(o.dump_batches.empty() ? "" : o.dump_batches + suffix);
  if (!o.trace.empty()) check_output_flag("--trace", o.trace + suffix);
  if (lead) check_output_flag("--plot", o.plot);
  if (!o.trace.empty()) eng->enable_trace(true);
  {
    Status s = model::add_gpt_modules(*eng, mc);
    if (!s.is_ok()) fail(s);
  }
  progress.emplace(lead && !o.quiet);
  progress->update(fmt("initialising %llu parameters (%s of model state per rank)",
                       static_cast<unsigned long long>(mc.num_params()),
                       format_bytes(eng->model_state_bytes()).c_str()));
  const uint64_t t0 = clock_ns();
  Status s = eng->initialize(
      [&](size_t m, size_t p, float* x, size_t n) { model::gpt_init(mc, o.seed, m, p, x, n); });
  init_s = static_cast<double>(clock_ns() - t0) * 1e-9;
  if (!s.is_ok() && activation_share > 0 && o.has("--device-budget") &&
      (s.code() == StatusCode::kOutOfBudget || s.message().find("zoe.activation_device_budget") == 0)) {
    // The share the flags chose left the placement too little: said in the flags' terms.
    const double one = model::checkpoint_bytes_estimate(mc, o.micro_batch, T) / mc.layers;
    fail(one_input_too_big(one, "as the activations' share of " +
                                    format_bytes(static_cast<uint64_t>(activation_share)) +
                                    " (one input, or a quarter of --device-budget " + o.device_budget +
                                    " when more) leaves the model's placement less than it needs"));
  }
  if (!s.is_ok()) fail(s.with_context("initialising the model"));
  const std::string sizes = buffers_line(eng->buffer_sizes());
  if (!sizes.empty() && lead && !o.quiet) {
    progress->done();
    fprintf(stderr, "%s\n", sizes.c_str());
  }
}

// Resume: restore every state, continue at the saved step (--steps counts the whole run).
void TrainRun::resume() {
  if (o.resume.empty()) return;
  std::string from = o.resume == "-" ? o.save_dir : o.resume;
  if (from.empty()) fail(invalid_argument("--resume needs a directory, or --save-dir"));
  progress->update("resuming from " + from);
  std::string ts = value_or_fail(eng->load(from));
  uint64_t seed = o.seed;
  Status ts_ok = model::parse_trainer_state(ts, from, &start_step, &seed);
  if (!ts_ok.is_ok()) fail(ts_ok);
  if (seed != o.seed) {
    fail(invalid_argument("checkpoint %s was trained with --seed %llu, not %llu: the data order would differ",
                          from.c_str(), static_cast<unsigned long long>(seed),
                          static_cast<unsigned long long>(o.seed)));
  }
  if (start_step >= o.steps) {
    fail(invalid_argument(
        "checkpoint %s is at step %d; --steps %d leaves nothing to train (--steps counts the whole run)",
        from.c_str(), start_step, o.steps));
  }
}

// The model and its trainer, and the first sample from --prompt.
void TrainRun::build_model() {
  gpt = value_or_fail(model::GptCpu::create(mc, o.micro_batch, T, o.threads, ckpt));
  trainer.emplace(*eng, *gpt, mc, T);
  // Layer-major: one model per micro-batch of a step (each keeps its micro-batch's activations).
  models = {gpt.get()};
  if (eng->schedule() == "layer-major") {
    for (int64_t g = 1; g < cfg.gradient_accumulation_steps(); ++g) {
      more_gpts.push_back(value_or_fail(model::GptCpu::create(mc, o.micro_batch, T, o.threads, ckpt)));
      models.push_back(more_gpts.back().get());
    }
  }
  check_address_space(gpt->threads());
  sample_n = o.sample >= 0 ? o.sample : (o.data.empty() ? 0 : 160);
  if (sample_n > 0) take_sample(start_step);
}

}  // namespace zoe::cli
