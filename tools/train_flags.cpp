// `zoe train`'s flags: registration, checks, and the config they build.
#include "tools/train_flags.h"

#include <cctype>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "zoe/cli.h"

namespace zoe::cli {

model::GptConfig model_config(const TrainOpts& o) {
  model::GptConfig c;
  std::string names;
  const model::GptPreset* p = model::find_gpt_preset(o.preset, &names);
  if (!p) {
    usage_fail(invalid_argument("--preset %s is not one of %s", o.preset.c_str(), names.c_str()));
  }
  // A flag given replaces the preset's value, 0 included (refused here, never ignored).
  auto shape = [&](const char* flag, int v, int preset, int max) {
    if (!o.has(flag)) return preset;
    check_flag_range(flag, v, 1, max);
    return v;
  };
  c.layers = shape("--layers", o.layers, p->layers, kMaxLayers);
  c.d_model = shape("--d-model", o.d_model, p->d_model, kMaxWidth);
  c.heads = shape("--heads", o.heads, p->heads, kMaxWidth);
  c.seq = shape("--context", o.context, p->context, kMaxContext);
  c.vocab = 256;
  Status s = c.validate();
  if (!s.is_ok()) {
    usage_fail(s.with_context("the model shape of --preset " + o.preset +
                              " with --layers/--d-model/--heads/--context"));
  }
  return c;
}

// --optimizer's value as optimizer.type spells it ("" for a value that is none of them).
static std::string optimizer_type(std::string flag) {
  for (char& c : flag) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return flag == "adamw"       ? "AdamW"
         : flag == "lion"      ? "Lion"
         : flag == "adagrad"   ? "Adagrad"
         : flag == "muon"      ? "Muon"
         : flag == "adam_mini" ? "AdamMini"
                               : "";
}

// Adam-mini's heads are the model's: optimizer.params.dim and n_heads from the GPT's shape.
static Status adam_mini_shape(const TrainOpts& o, Config* cfg) {
  const model::GptConfig mc = model_config(o);
  ZOE_RETURN_IF_ERROR(cfg->set("optimizer.params.dim", std::to_string(mc.d_model)));
  return cfg->set("optimizer.params.n_heads", std::to_string(mc.heads));
}

ComputeDType precision_flag(const std::string& p) {
  return p == "bf16" ? ComputeDType::kBF16 : p == "fp16" ? ComputeDType::kF16 : ComputeDType::kF32;
}

// The engine's config when there is no --config, from the flags: ZeRO-3, every module
// partitioned, parameters and optimizer states where --offload says.
Result<Config> flags_config(const TrainOpts& o, const std::vector<std::string>& nvme_dirs, int world_size) {
  const Offload off = o.offload == "cpu"    ? Offload::kCpu
                      : o.offload == "nvme" ? Offload::kNvme
                                            : Offload::kNone;
  Config::Builder b;
  const std::string type = o.has("--optimizer") ? optimizer_type(o.optimizer) : "AdamW";
  // Without --lr, the optimizer's DeepSpeed default: 1e-3, Adagrad's 1e-2.
  const double lr = o.has("--lr") || type != "Adagrad" ? o.lr : 1e-2;
  b.optimizer(type)
      .micro_batch(o.micro_batch)
      .lr(lr)
      .weight_decay(o.weight_decay)
      .stage(3)
      .param_persistence_threshold(0)
      .offload_optimizer(off, nvme_dirs)
      .offload_param(off, nvme_dirs)
      .precision(precision_flag(o.precision));
  if (o.has("--threads")) b.optimizer_threads(o.threads);
  if (o.has("--device-budget")) b.device_budget(parse_bytes(o.device_budget).value());
  ZOE_ASSIGN_OR_RETURN(Config cfg, b.build(world_size));
  if (o.warmup > 0) {
    // DeepSpeed's WarmupLR, linear, from lr / warmup (never a zero-rate update) up to lr.
    ZOE_RETURN_IF_ERROR(cfg.set(
        "scheduler", fmt("{\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": %.17g, \"warmup_max_lr\": "
                         "%.17g, \"warmup_num_steps\": %d, \"warmup_type\": \"linear\"}}",
                         lr / o.warmup, lr, o.warmup)));
  }
  if (o.has("--host-budget"))
    ZOE_RETURN_IF_ERROR(cfg.set("zoe.host_budget", std::to_string(parse_bytes(o.host_budget).value())));
  if (o.has("--optimizer-states"))
    ZOE_RETURN_IF_ERROR(cfg.set("zoe.optimizer_states", "\"" + o.optimizer_states + "\""));
  if (o.has("--master-weights"))
    ZOE_RETURN_IF_ERROR(cfg.set("zoe.master_weights", "\"" + o.master_weights + "\""));
  if (o.has("--schedule")) ZOE_RETURN_IF_ERROR(cfg.set("zoe.schedule", "\"" + o.schedule + "\""));
  if (type == "AdamMini") ZOE_RETURN_IF_ERROR(adam_mini_shape(o, &cfg));
  if (type == "Muon" && !o.has("--lr")) {
    // Without --lr, DeepSpeed's MuonWithAuxAdam rates: 0.02 for the matrices, 3e-4 for the rest
    // (the warmup shapes both: Config group_lr_at).
    ZOE_RETURN_IF_ERROR(cfg.set("optimizer.params.muon_lr", "0.02"));
    ZOE_RETURN_IF_ERROR(cfg.set("optimizer.params.adam_lr", "3e-4"));
  }
  return cfg;
}

// --activation-offload and --activation-host-budget on their own (their combination with the
// config's checkpointing is checked once the config is read: activation_checks()).
static void check_activation_flags(const TrainOpts& o) {
  const std::string& off = o.activation_offload;
  if (o.has("--activation-offload") && off != "none" && off != "cpu" && off != "nvme") {
    usage_fail(invalid_argument("--activation-offload %s is not none, cpu or nvme", off.c_str()));
  }
  if (o.has("--activation-host-budget") && !parse_bytes(o.activation_host_budget).is_ok()) {
    usage_fail(invalid_argument("--activation-host-budget %s is not a byte size (expected e.g. 256MiB, 4GiB)",
                                o.activation_host_budget.c_str()));
  }
}

// Checks every flag's value on its own (before anything is read or allocated): an error names the
// flag and the value, exit code 2.
void check_flags(TrainOpts& o) {
  o.seed = parse_uint_flag("--seed", o.seed_text);
  check_flag_range("--micro-batch", o.micro_batch, 1, kMaxMicroBatch);
  check_flag_range("--steps", o.steps, 1, std::numeric_limits<int>::max());
  check_flag_range("--eval-every", o.eval_every, 0, std::numeric_limits<int>::max());
  check_flag_range("--eval-batches", o.eval_batches, 1, kMaxEvalBatches);
  check_flag_range("--threads", o.threads, 0, kMaxThreads);
  check_flag_range("--save-every", o.save_every, 0, std::numeric_limits<int>::max());
  if (o.has("--seq")) check_flag_range("--seq", o.seq, 2, kMaxContext);
  // Adam computes in fp32: the rate must be a finite float; 0 is legal (nothing moves).
  if (!std::isfinite(o.lr) || o.lr < 0 || o.lr > FLT_MAX || (o.lr != 0 && o.lr < FLT_MIN)) {
    usage_fail(invalid_argument("--lr %g is not a learning rate (expected 0 or a number in [%g, %g])", o.lr,
                                static_cast<double>(FLT_MIN), static_cast<double>(FLT_MAX)));
  }
  if (o.precision != "fp32" && o.precision != "bf16" && o.precision != "fp16") {
    usage_fail(invalid_argument("--precision %s is not fp32, bf16 or fp16", o.precision.c_str()));
  }
  if (o.has("--offload") && o.offload != "none" && o.offload != "cpu" && o.offload != "nvme") {
    usage_fail(invalid_argument("--offload %s is not none, cpu or nvme", o.offload.c_str()));
  }
  check_activation_flags(o);
  if (o.has("--optimizer") && optimizer_type(o.optimizer).empty())
    usage_fail(invalid_argument("--optimizer %s is not adamw, lion, adagrad, muon or adam_mini",
                                o.optimizer.c_str()));
  if (o.has("--optimizer-states") && o.optimizer_states != "fp32" && o.optimizer_states != "bf16" &&
      o.optimizer_states != "int8" && o.optimizer_states != "int4") {
    usage_fail(invalid_argument("--optimizer-states %s is not fp32, bf16, int8 or int4",
                                o.optimizer_states.c_str()));
  }
  if (o.has("--schedule") && o.schedule != "micro-batch" && o.schedule != "layer-major")
    usage_fail(invalid_argument("--schedule %s is not micro-batch or layer-major", o.schedule.c_str()));
  if (o.has("--master-weights") && o.master_weights != "fp32" && o.master_weights != "bf16") {
    usage_fail(invalid_argument("--master-weights %s is not fp32 or bf16%s", o.master_weights.c_str(),
                                o.master_weights == "fp16"
                                    ? " (an fp16 master cannot hold both the weights and their small updates)"
                                    : ""));
  }
  for (const auto& [flag, text] :
       {std::pair<const char*, const std::string&>{"--device-budget", o.device_budget},
        {"--host-budget", o.host_budget}}) {
    if (!o.has(flag)) continue;
    auto b = parse_bytes(text);
    if (!b.is_ok()) {
      usage_fail(
          invalid_argument("%s %s is not a byte size: %s", flag, text.c_str(), b.status().message().c_str()));
    }
    if (b.value() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      usage_fail(invalid_argument("%s %s is more than zoe takes (at most %lld bytes, just under 8 EiB)", flag,
                                  text.c_str(), static_cast<long long>(std::numeric_limits<int64_t>::max())));
    }
  }
  if (!std::isfinite(o.weight_decay) || o.weight_decay < 0 || o.weight_decay > FLT_MAX) {
    usage_fail(
        invalid_argument("--weight-decay %g is not a weight decay (expected a number >= 0)", o.weight_decay));
  }
  if (o.warmup < 0 || o.warmup == 1) {
    usage_fail(invalid_argument("--warmup %d is not a warm-up (expected 0 for none, or 2 or more updates)",
                                o.warmup));
  }
  if (!o.config.empty()) {
    // Placement comes from the config file: these flags would be silently ignored.
    if (o.has("--warmup")) {
      usage_fail(
          invalid_argument("--warmup cannot be combined with --config %s: set the config's scheduler "
                           "section instead (WarmupLR, warmup_type linear, warmup_num_steps)",
                           o.config.c_str()));
    }
    if (o.has("--weight-decay")) {
      usage_fail(
          invalid_argument("--weight-decay cannot be combined with --config %s: set "
                           "optimizer.params.weight_decay in the config instead",
                           o.config.c_str()));
    }
    for (const char* f : {"--offload", "--nvme-path"}) {
      if (o.has(f)) {
        usage_fail(
            invalid_argument("%s cannot be combined with --config %s: set zero_optimization."
                             "offload_optimizer / offload_param in the config instead",
                             f, o.config.c_str()));
      }
    }
  }
  if (o.task != "add" && o.task != "add2" && o.task != "add1") {
    usage_fail(invalid_argument("--task %s is not add, add2 or add1", o.task.c_str()));
  }
  if (o.has("--task") && !o.data.empty()) {
    usage_fail(
        invalid_argument("--task %s cannot be combined with --data %s: the task is the built-in "
                         "corpus, --data replaces it",
                         o.task.c_str(), o.data.c_str()));
  }
  if (o.has("--sample")) check_flag_range("--sample", o.sample, 0, 1 << 16);
  if (!(o.temperature >= 0 && o.temperature <= 100)) {
    usage_fail(
        invalid_argument("--temperature %g is outside [0, 100] (0: the most likely byte)", o.temperature));
  }
  if (o.prompt.empty()) usage_fail(invalid_argument("--prompt is empty: give the text a sample continues"));
  for (const char* f : {"--prompt", "--temperature"}) {
    if (o.has(f) && (o.sample == 0 || (o.sample < 0 && o.data.empty()))) {
      usage_fail(
          invalid_argument("%s has no effect without a sample: give --sample N (by default only "
                           "--data samples)",
                           f));
    }
  }
  if (o.save_every > 0 && o.save_dir.empty()) {
    usage_fail(invalid_argument("--save-every %d needs --save-dir", o.save_every));
  }
  if (o.save_initial && o.save_dir.empty()) {
    usage_fail(invalid_argument("--save-initial needs --save-dir (where step-000000 is written)"));
  }
  if (o.save_initial && !o.resume.empty()) {
    usage_fail(
        invalid_argument("--save-initial cannot be combined with --resume %s: the run does not start "
                         "from the initial weights",
                         o.resume.c_str()));
  }
}

// The config file's values that flags given on the command line replace, each said in one line
// on stderr (rank 0); flags not given leave the file's values alone.
void apply_overrides(const TrainOpts& o, Config* cfg, bool lead) {
  auto say = [&](const std::string& flag, const std::string& key, const std::string& was) {
    if (lead) {
      fprintf(stderr, "zoe: %s overrides %s (%s in %s)\n", flag.c_str(), key.c_str(), was.c_str(),
              o.config.c_str());
    }
  };
  auto check = [&](const std::string& flag, Status s) {
    if (!s.is_ok()) usage_fail(s.with_context(flag + " with --config " + o.config));
  };
  if (o.has("--micro-batch")) {
    say(fmt("--micro-batch %d", o.micro_batch), "train_micro_batch_size_per_gpu",
        std::to_string(cfg->micro_batch()));
    check("--micro-batch", cfg->set_micro_batch(o.micro_batch));
  }
  if (o.has("--lr")) {
    if (!cfg->scheduler_type().empty()) {
      usage_fail(
          invalid_argument("--lr %g has no effect with --config %s: its scheduler %s sets the learning "
                           "rate (scheduler.params.warmup_max_lr); remove --lr or the scheduler",
                           o.lr, o.config.c_str(), cfg->scheduler_type().c_str()));
    }
    say(fmt("--lr %g", o.lr), "optimizer.params.lr", fmt("%g", cfg->lr()));
    check("--lr", cfg->set_lr(o.lr));
  }
  if (o.has("--optimizer")) {
    auto was = cfg->get_string("optimizer.type");
    say("--optimizer " + o.optimizer, "optimizer.type", was.is_ok() ? was.value() : "AdamW");
    check("--optimizer", cfg->set_optimizer(optimizer_type(o.optimizer)));
    // Another type before: no optimizer.params.dim/n_heads were given (the rules refuse them).
    if (optimizer_type(o.optimizer) == "AdamMini" && (!was.is_ok() || was.value() != "AdamMini"))
      check("--optimizer", adam_mini_shape(o, cfg));
  }
  if (o.has("--precision")) {
    say("--precision " + o.precision, "bf16.enabled / fp16.enabled", dtype_name(cfg->precision()));
    check("--precision", cfg->set_precision(precision_flag(o.precision)));
  }
  if (o.has("--threads")) {
    say(fmt("--threads %d", o.threads), "zoe.optimizer_threads", std::to_string(cfg->optimizer_threads()));
    check("--threads", cfg->set_optimizer_threads(o.threads));
  }
  if (o.has("--device-budget")) {
    say("--device-budget " + o.device_budget, "zoe.device_budget",
        std::to_string(cfg->device_budget()) + " bytes");
    check("--device-budget", cfg->set_device_budget(parse_bytes(o.device_budget).value()));
  }
  if (o.has("--host-budget")) {
    auto was = cfg->get("zoe.host_budget");
    say("--host-budget " + o.host_budget, "zoe.host_budget", (was.is_ok() ? was.value() : "0") + " bytes");
    check("--host-budget", cfg->set("zoe.host_budget", std::to_string(parse_bytes(o.host_budget).value())));
  }
  for (const auto& [flag, key, value] :
       {std::tuple<const char*, const char*, const std::string&>{"--optimizer-states", "zoe.optimizer_states",
                                                                 o.optimizer_states},
        {"--master-weights", "zoe.master_weights", o.master_weights},
        {"--schedule", "zoe.schedule", o.schedule}}) {
    if (!o.has(flag)) continue;
    auto was = cfg->get(key);
    say(std::string(flag) + " " + value, key,
        was.is_ok() ? was.value() : (std::string(key) == "zoe.schedule" ? "micro-batch" : "fp32"));
    check(flag, cfg->set(key, "\"" + value + "\""));
  }
}

// --optimizer, --optimizer-states and --master-weights: the update and what it stores.
static void add_state_format_options(CLI::App* cmd, TrainOpts* o) {
  cmd->add_option(
      "--optimizer", o->optimizer,
      "The update: adamw, lion, adagrad, muon or adam_mini, with DeepSpeed's defaults for its params (Lion "
      "lr 1e-3, "
      "betas (0.9, 0.999); Adagrad lr 1e-2, eps 1e-10; docs in src/optim/lion_adagrad.h; Muon on the "
      "blocks' weight matrices with momentum 0.95 and AdamW on the rest, rates 0.02 and 3e-4, or --lr for "
      "both; docs in src/optim/muon.h; adam_mini: one second moment a block (a head of q and k, a row "
      "elsewhere, docs in src/optim/adam_mini.h), AdamW's defaults); overrides optimizer.type; default "
      "adamw");
  cmd->add_option(
      "--optimizer-states", o->optimizer_states,
      "The optimizer's states (AdamW's m and v, Lion's m, Adagrad's sum) as stored in every tier: "
      "fp32, bf16, or for AdamW int8 or int4 (blockwise quantized, docs in src/optim/lowbit.h; "
      "overrides zoe.optimizer_states; default fp32)");
  cmd->add_option("--master-weights", o->master_weights,
                  "The master weights: fp32, or bf16 rounded stochastically (overrides zoe.master_weights; "
                  "default fp32)");
  cmd->add_option(
      "--schedule", o->schedule,
      "The order of a step's micro-batches (gradient_accumulation_steps in --config): micro-batch "
      "(each through every module in turn) or layer-major (each module once per step, every "
      "micro-batch through it: parameters read once per step; the same bits; overrides "
      "zoe.schedule; default micro-batch)");
}

CLI::App* add_train_options(CLI::App& app, TrainOpts* o) {
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Train the reference GPT (byte-level) through the engine. Without --data it trains on a built-in\n"
      "corpus of additions (\"4821+377=5198\") generated from --seed and reports exact-match accuracy.\n"
      "Placement comes from --config (DeepSpeed-style JSON) or from --offload/--nvme-path (ZeRO-3).\n"
      "Optimizer without --config: AdamW (decoupled decay), lr 1e-3, betas (0.9, 0.999), eps 1e-8,\n"
      "weight decay 0, no clipping: DeepSpeed's defaults for optimizer.params (--optimizer: its own),\n"
      "after a linear warm-up over the first 100 updates (--warmup; without it the demo preset at --seq\n"
      "256 meets a loss spike, 2.55 -> 12.8, in its first 25 steps, as plain PyTorch does on the same\n"
      "weights and batches). zoe keeps DeepSpeed's weight decay 0 so that a DeepSpeed config and these\n"
      "flags train alike; torch.optim.AdamW defaults to 0.01 (pass --weight-decay 0.01 to match it).\n"
      "A step whose loss or gradient norm is NaN or inf stops the run (exit 1), unless fp16's dynamic loss\n"
      "scaler (fp16.enabled, loss_scale 0) skips it.\n"
      "Progress goes to stderr; the summary (or --json) to stdout. Runs under mpirun -np N too.");
  cmd->add_option("--config", o->config, "Engine config (DeepSpeed-compatible JSON)");
  cmd->add_option("--preset", o->preset, "Model size: tiny, small, demo, medium, large, 2b")
      ->capture_default_str();
  int_range(cmd->add_option("--layers", o->layers, "Transformer blocks (overrides the preset)"), 1,
            kMaxLayers);
  int_range(cmd->add_option("--d-model", o->d_model, "Width (overrides the preset)"), 1, kMaxWidth);
  int_range(cmd->add_option("--heads", o->heads, "Attention heads (overrides the preset)"), 1, kMaxWidth);
  int_range(cmd->add_option("--context", o->context, "Positions the model has (overrides the preset)"), 1,
            kMaxContext);
  int_range(cmd->add_option("--seq", o->seq, "Tokens per training sequence (default: the model's context)"),
            2, kMaxContext);
  int_range(
      cmd->add_option(
          "--micro-batch", o->micro_batch,
          "Sequences per micro-batch per rank (default 8 without --config; with --config, the config's "
          "train_micro_batch_size_per_gpu, else train_batch_size / (gradient_accumulation_steps x ranks), "
          "else 1 as in DeepSpeed: not 8)"),
      1, kMaxMicroBatch);
  int_range(cmd->add_option("--steps", o->steps, "Optimizer steps"), 1, INT32_MAX)->capture_default_str();
  cmd->add_option("--lr", o->lr,
                  "Learning rate (default: the config's, or DeepSpeed's optimizer.params.lr: 1e-3, Adagrad's "
                  "1e-2; 0 is legal)");
  int_range(cmd->add_option(
                "--warmup", o->warmup,
                "Without --config: a linear learning-rate warm-up over the first N updates, from lr/N up to "
                "--lr (DeepSpeed's WarmupLR with warmup_type linear, warmup_min_lr lr/N, "
                "warmup_num_steps N); 0: none, a constant --lr from the first update"),
            0, INT32_MAX)
      ->capture_default_str();
  cmd->add_option("--weight-decay", o->weight_decay,
                  "Without --config: the weight decay (Adagrad's L2; default 0, DeepSpeed's "
                  "optimizer.params.weight_decay; torch.optim.AdamW's default is 0.01)");
  cmd->add_option("--seed", o->seed_text, "Seed of the initial weights, the data and the sampling")
      ->capture_default_str();
  int_range(cmd->add_option("--eval-every", o->eval_every,
                            "Evaluate on the held-out part every N steps (0: at the end)"),
            0, INT32_MAX);
  int_range(cmd->add_option("--eval-batches", o->eval_batches, "Batches per evaluation"), 1, kMaxEvalBatches)
      ->capture_default_str();
  cmd->add_option("--device-budget", o->device_budget,
                  "Device memory budget, e.g. 256MiB (overrides the config)");
  cmd->add_option("--host-budget", o->host_budget,
                  "Host memory zoe's own buffers (offload staging, optimizer swap buffers, the cache of "
                  "NVMe-homed parameters) are sized within, e.g. 512MiB; a placement that needs more is "
                  "refused (overrides zoe.host_budget; default 1/16 of this host's memory)");
  cmd->add_option("--offload", o->offload,
                  "Without --config: none, cpu or nvme for parameters and optimizer states");
  cmd->add_option(
      "--nvme-path", o->nvme_path,
      "Without --config: directory for NVMe offload, repeatable (default $ZOE_SCRATCH or /var/tmp); "
      "expanded on each rank: $VAR or ${VAR} (an environment variable, e.g. $SLURM_TMPDIR), {rank}, "
      "{local_rank}, {host} ($$ is a $)");
  cmd->add_option("--precision", o->precision, "fp32, bf16 or fp16 (default bf16, or the config's)");
  add_state_format_options(cmd, o);
  cmd->add_option("--data", o->data, "Train on this text file (bytes are tokens)");
  cmd->add_option("--task", o->task,
                  "Without --data: the built-in additions, add (operands below 1000), add2 (below 100) "
                  "or add1 (below 10: learned in a few minutes, the demo's task)")
      ->capture_default_str();
  int_range(cmd->add_option(
                "--sample", o->sample,
                "Generate N bytes from --prompt before and after training and print them, with the share "
                "of their words found in the training text (default 160 with --data, else 0)"),
            0, 1 << 16);
  cmd->add_option("--prompt", o->prompt, "The text a sample continues")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "Sampling temperature (0: always the most likely byte)")
      ->capture_default_str();
  cmd->add_option("--trace", o->trace, "Write a Chrome-trace timeline of every transfer and kernel here");
  int_range(cmd->add_option("--threads", o->threads, "CPU threads for the optimizer and the model (0: all)"),
            0, kMaxThreads);
  int_range(
      cmd->add_option("--save-every", o->save_every, "Save a checkpoint every N steps (needs --save-dir)"), 0,
      INT32_MAX);
  cmd->add_flag("--save-async", o->save_async,
                "Write checkpoints in the background, overlapping the next step's "
                "forward and backward");
  cmd->add_flag("--save-initial", o->save_initial,
                "Save the initial weights as checkpoint step-000000 in --save-dir before the first step");
  cmd->add_option("--dump-batches", o->dump_batches,
                  "Write the token ids of every micro-batch here, one JSON object a line (see "
                  "docs/train-json.md)");
  cmd->add_option("--save-dir", o->save_dir,
                  "Directory for checkpoints (D/step-NNNNNN, D/latest); created if missing");
  cmd->add_option("--resume", o->resume,
                  "Resume from this save directory or checkpoint (no value: --save-dir)")
      ->expected(0, 1)
      ->default_str("-");
  cmd->add_option("--plot", o->plot,
                  "Draw the loss and eval curves and the time per step into this PNG (python3-matplotlib)");
  cmd->add_flag("--activation-checkpointing", o->activation_checkpointing,
                "Keep only each block's input for the backward (in the engine's activation store) and "
                "recompute the block there; on too when --config has an activation_checkpointing section. "
                "Without --config the device keeps all of a micro-batch's block inputs, or with "
                "--activation-offload and --device-budget a quarter of the budget (at least one)");
  cmd->add_option("--activation-offload", o->activation_offload,
                  "none, cpu or nvme: where the activation store may move block inputs the device's "
                  "activation budget cannot hold (needs checkpointing; overrides zoe.activation_offload)");
  cmd->add_option("--activation-host-budget", o->activation_host_budget,
                  "Host bytes for offloaded activations, e.g. 2GiB; beyond them they go to NVMe (overrides "
                  "zoe.activation_host_budget)");
  cmd->add_flag("--quiet", o->quiet, "No progress on stderr");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  return cmd;
}

}  // namespace zoe::cli
