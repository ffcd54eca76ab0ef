// The table of every config key zoe knows: path, member, default, allowed values, older spellings
// and disposition. Adding a key is adding a row here (and its member in config.h).
//
// Dispositions of the DeepSpeed keys zoe does not implement, by what they would change:
// - nothing in the results (logging, profiling, checkpoint I/O, model-side helpers, launcher
//   options): ignore() -- accepted silently, contents unchecked;
// - placement, speed or communication, not the math of the update (or only its exactness):
//   warn() -- accepted, listed in Config::unimplemented with one warning, when the value differs
//   from the one without effect;
// - what is trained, which zoe cannot do: refuse() -- an unsupported error when the value has an
//   effect. (Optimizer and scheduler types outside the choices are errors of the choice itself.)
// Booleans written as the strings "true"/"false" are read as what they spell, with one warning;
// integers accept whole doubles (5e8); comments are allowed and duplicate keys are errors (the
// reader in json_reader.h). Older DeepSpeed spellings are aliases; cpu_offload and its relatives
// are read by the rules in config_rules.cpp.
#include "config/config_table.h"

#include <limits>
#include <utility>

namespace zoe::config::detail {

Field boolean(std::string path, Member m, bool def) {
  Field f;
  f.path = std::move(path);
  f.kind = Kind::kBool;
  f.member = m;
  f.default_value = def;
  return f;
}

Field integer(std::string path, Member m, int64_t def, int64_t min, int64_t max) {
  Field f;
  f.path = std::move(path);
  f.kind = Kind::kInt;
  f.member = m;
  f.default_value = def;
  f.min = min;
  f.max = max;
  return f;
}

Field int_choice(std::string path, Member m, int def, std::vector<int> allowed) {
  Field f;
  f.path = std::move(path);
  f.kind = Kind::kIntChoice;
  f.member = m;
  f.default_value = def;
  for (int a : allowed) f.choices.emplace_back(a);
  return f;
}

Field number(std::string path, Member m, double def, Range range) {
  Field f;
  f.path = std::move(path);
  f.kind = Kind::kDouble;
  f.member = m;
  f.default_value = def;
  f.range = range;
  return f;
}

Field choice(std::string path, Member m, std::string def, std::vector<std::string> allowed, bool fold_case) {
  Field f;
  f.path = std::move(path);
  f.kind = Kind::kChoice;
  f.member = m;
  f.default_value = std::move(def);
  for (auto& a : allowed) f.choices.emplace_back(std::move(a));
  f.fold_case = fold_case;
  return f;
}

Field device(std::string path, Member m) {
  Field f;
  f.path = std::move(path);
  f.kind = Kind::kDevice;
  f.member = m;
  f.default_value = offload_name(Offload::kNone);
  for (auto d : {Offload::kNone, Offload::kCpu, Offload::kNvme}) {
    f.choices.emplace_back(offload_name(d));
  }
  return f;
}

Field bytes(std::string path, Member m) {
  Field f;
  f.path = std::move(path);
  f.kind = Kind::kBytes;
  f.member = m;
  f.default_value = 0;
  return f;
}

Field paths(std::string path, Member m) {
  Field f;
  f.path = std::move(path);
  f.kind = Kind::kPaths;
  f.member = m;
  f.default_value = nullptr;  // no directory (load_value's form)
  return f;
}

Field pair(std::string path, Member m, double first, double second, Range range, std::string expected) {
  Field f;
  f.path = std::move(path);
  f.kind = Kind::kPair;
  f.member = m;
  f.default_value = Json::array({first, second});
  f.range = range;
  f.expected = std::move(expected);
  return f;
}

Field any(std::string path) {
  Field f;
  f.path = std::move(path);
  f.kind = Kind::kAny;
  return f;
}

Field feature_block(std::string path) {
  Field f;
  f.path = std::move(path);
  f.kind = Kind::kFeatureBlock;
  f.default_value = false;
  return f;
}

namespace {

constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();
constexpr int64_t kMaxInt32 = std::numeric_limits<int>::max();
// Sane bounds (far above any real run, far below overflow of the products they enter; the
// error message gives the bound): batch sizes and accumulation steps, element counts (buffers,
// buckets, sub-groups: x 16 bytes stays far inside int64), pipeline buffers, threads.
constexpr int64_t kMaxBatch = int64_t{1} << 20;
constexpr int64_t kMaxElems = int64_t{1} << 50;
constexpr int64_t kMaxBufferCount = 1024;
constexpr int64_t kMaxThreads = 4096;
// io::IoEngine's range of the io_uring queue depth, and the largest I/O block.
constexpr int64_t kMaxQueueDepth = 4096;
constexpr int64_t kMaxBlockSize = int64_t{1} << 30;

constexpr Range kAtLeast0 = {0.0, 1e308, false, false};
constexpr Range kAbove0 = {0.0, 1e308, true, false};

bool has_scheduler(const Config& c) { return !c.scheduler.type.empty(); }
// The optimizer.params keys each optimizer.type has (config_rules.cpp refuses the others).
bool is_adam(const Config& c) { return c.optimizer.type == "Adam" || c.optimizer.type == "AdamW"; }
bool is_muon(const Config& c) { return c.optimizer.type == "Muon"; }
bool is_adam_mini(const Config& c) { return c.optimizer.type == "AdamMini"; }
bool has_betas(const Config& c) { return c.optimizer.type != "Adagrad"; }
bool has_eps(const Config& c) { return c.optimizer.type != "Lion"; }
bool has_total_steps(const Config& c) { return has_scheduler(c) && c.scheduler.total_num_steps != 0; }
bool positive(const Json& v) { return v.get<int64_t>() > 0; }

// The batch triple (resolved by the batch rule) and clipping.
void add_batch_fields(std::vector<Field>& t) {
  t.push_back(integer("train_batch_size", ZOE_MEMBER(train_batch_size), 0, 1));
  t.push_back(
      integer("train_micro_batch_size_per_gpu", ZOE_MEMBER(train_micro_batch_size_per_gpu), 1, 1, kMaxBatch));
  t.push_back(
      integer("gradient_accumulation_steps", ZOE_MEMBER(gradient_accumulation_steps), 1, 1, kMaxBatch));
  t.push_back(number("gradient_clipping", ZOE_MEMBER(gradient_clipping), 0.0, kAtLeast0));
}

// ZeRO. overlap_comm's default is stage 3's (a rule); 0 is meaningful for the stage3_* sizes
// (no prefetch, nothing persistent, release at once).
void add_zero_fields(std::vector<Field>& t) {
  const std::string z = "zero_optimization.";
  t.push_back(int_choice(z + "stage", ZOE_MEMBER(zero.stage), 0, {0, 1, 2, 3}));
  t.push_back(boolean(z + "contiguous_gradients", ZOE_MEMBER(zero.contiguous_gradients), true));
  t.push_back(boolean(z + "reduce_scatter", ZOE_MEMBER(zero.reduce_scatter), true));
  t.push_back(
      integer(z + "reduce_bucket_size", ZOE_MEMBER(zero.reduce_bucket_size), 500000000, 1, kMaxElems));
  t.push_back(boolean(z + "allgather_partitions", ZOE_MEMBER(zero.allgather_partitions), true));
  t.push_back(
      integer(z + "allgather_bucket_size", ZOE_MEMBER(zero.allgather_bucket_size), 500000000, 1, kMaxElems));
  t.push_back(boolean(z + "overlap_comm", ZOE_MEMBER(zero.overlap_comm), false));
  t.push_back(boolean(z + "round_robin_gradients", ZOE_MEMBER(zero.round_robin_gradients), false).warn());
  t.push_back(
      integer(z + "sub_group_size", ZOE_MEMBER(zero.sub_group_size), 1000000000, 1, kMaxElems).sized());
  t.push_back(integer(z + "stage3_prefetch_bucket_size", ZOE_MEMBER(zero.stage3_prefetch_bucket_size),
                      50000000, 0, kMaxElems)
                  .alias(z + "prefetch_bucket_size"));
  t.push_back(integer(z + "stage3_param_persistence_threshold",
                      ZOE_MEMBER(zero.stage3_param_persistence_threshold), 100000, 0, kMaxElems)
                  .alias(z + "param_persistence_threshold"));
  t.push_back(integer(z + "stage3_model_persistence_threshold",
                      ZOE_MEMBER(zero.stage3_model_persistence_threshold), kMaxInt, 0, kMaxInt)
                  .alias(z + "model_persistence_threshold"));
  t.push_back(integer(z + "stage3_max_live_parameters", ZOE_MEMBER(zero.stage3_max_live_parameters),
                      1000000000, 0, kMaxElems)
                  .alias(z + "max_live_parameters"));
  t.push_back(integer(z + "stage3_max_reuse_distance", ZOE_MEMBER(zero.stage3_max_reuse_distance), 1000000000,
                      0, kMaxElems)
                  .alias(z + "max_reuse_distance"));
  t.push_back(boolean(z + "stage3_gather_16bit_weights_on_model_save",
                      ZOE_MEMBER(zero.stage3_gather_16bit_weights_on_model_save), false)
                  .alias(z + "stage3_gather_fp16_weights_on_model_save")
                  .alias(z + "gather_16bit_weights_on_model_save"));
}

// zero_optimization.offload_optimizer: where the optimizer states live.
void add_offload_optimizer_fields(std::vector<Field>& t) {
  const std::string z = "zero_optimization.";
  const std::string oo = z + "offload_optimizer.";
  t.push_back(device(oo + "device", ZOE_MEMBER(zero.offload_optimizer.device)));
  t.push_back(paths(oo + "nvme_path", ZOE_MEMBER(zero.offload_optimizer.nvme_path)));
  t.push_back(boolean(oo + "pin_memory", ZOE_MEMBER(zero.offload_optimizer.pin_memory), true));
  t.push_back(
      integer(oo + "buffer_count", ZOE_MEMBER(zero.offload_optimizer.buffer_count), 4, 1, kMaxBufferCount)
          .sized());
  t.push_back(boolean(oo + "pipeline_read", ZOE_MEMBER(zero.offload_optimizer.pipeline_read), false));
  t.push_back(boolean(oo + "pipeline_write", ZOE_MEMBER(zero.offload_optimizer.pipeline_write), false));
  t.push_back(boolean(oo + "fast_init", ZOE_MEMBER(zero.offload_optimizer.fast_init), false));
  // The same setting as zoe.offload_ratio (the ratio rule), with its range [0, 1] (DeepSpeed's too).
  t.push_back(number(oo + "ratio", ZOE_MEMBER(zero.offload_optimizer.ratio), 1.0, Range{0.0, 1.0}));
}

// zero_optimization.offload_param: where stage 3's parameter partitions live.
void add_offload_param_fields(std::vector<Field>& t) {
  const std::string z = "zero_optimization.";
  const std::string op = z + "offload_param.";
  t.push_back(device(op + "device", ZOE_MEMBER(zero.offload_param.device)));
  t.push_back(paths(op + "nvme_path", ZOE_MEMBER(zero.offload_param.nvme_path)));
  t.push_back(boolean(op + "pin_memory", ZOE_MEMBER(zero.offload_param.pin_memory), true));
  t.push_back(
      integer(op + "buffer_count", ZOE_MEMBER(zero.offload_param.buffer_count), 5, 1, kMaxBufferCount));
  t.push_back(integer(op + "buffer_size", ZOE_MEMBER(zero.offload_param.buffer_size), 100000000, 1, kMaxElems)
                  .sized());
  t.push_back(integer(op + "max_in_cpu", ZOE_MEMBER(zero.offload_param.max_in_cpu), 1000000000, 0, kMaxElems)
                  .sized());
}

// DeepSpeed's deprecated booleans for cpu offload (the cpu_offload rule reads them).
void add_zero_legacy_fields(std::vector<Field>& t) {
  const std::monostate none;
  const std::string z = "zero_optimization.";
  t.push_back(boolean(z + "cpu_offload", none, false));
  t.push_back(boolean(z + "cpu_offload_params", none, false));
  t.push_back(boolean(z + "cpu_offload_use_pin_memory", none, true));
  for (const char* k : {"ignore_unused_parameters", "memory_efficient_linear", "elastic_checkpoint",
                        "load_from_fp32_weights"}) {
    t.push_back(any(z + k).ignore());
  }
  t.push_back(boolean(z + "zero_quantized_weights", none, false).warn("quantized all-gather"));
  t.push_back(boolean(z + "zero_quantized_gradients", none, false).warn("quantized reduce-scatter"));
  t.push_back(boolean(z + "zero_quantized_nontrainable_weights", none, false).warn());
  t.push_back(boolean(z + "legacy_stage1", none, false).warn());
  t.push_back(
      integer(z + "zero_hpz_partition_size", none, 1, 1, kMaxInt32).warn("hierarchical partitioning"));
  t.push_back(integer(z + "mics_shard_size", none, -1, -1, kMaxInt32).warn("MiCS sharding", positive));
}

// Asynchronous I/O.
void add_aio_fields(std::vector<Field>& t) {
  t.push_back(integer("aio.block_size", ZOE_MEMBER(aio.block_size), 1048576, 1, kMaxBlockSize));
  t.push_back(integer("aio.queue_depth", ZOE_MEMBER(aio.queue_depth), 8, 1, kMaxQueueDepth));
  t.push_back(integer("aio.intra_op_parallelism", ZOE_MEMBER(aio.intra_op_parallelism), 1, 1, kMaxThreads)
                  .alias("aio.thread_count"));
  t.push_back(boolean("aio.single_submit", ZOE_MEMBER(aio.single_submit), false));
  t.push_back(boolean("aio.overlap_events", ZOE_MEMBER(aio.overlap_events), true));
  t.push_back(boolean("aio.use_gds", ZOE_MEMBER(aio.use_gds), false));
}

// Precision. "bfloat16" is DeepSpeed's older name of the bf16 block.
void add_precision_fields(std::vector<Field>& t) {
  const std::monostate none;
  t.push_back(boolean("fp16.enabled", ZOE_MEMBER(fp16.enabled), false));
  t.push_back(number("fp16.loss_scale", ZOE_MEMBER(fp16.loss_scale), 0.0, kAtLeast0));
  t.push_back(integer("fp16.initial_scale_power", ZOE_MEMBER(fp16.initial_scale_power), 16, 0, 127));
  t.push_back(integer("fp16.loss_scale_window", ZOE_MEMBER(fp16.loss_scale_window), 1000, 1, kMaxInt32));
  t.push_back(integer("fp16.hysteresis", ZOE_MEMBER(fp16.hysteresis), 2, 1, kMaxInt32));
  t.push_back(boolean("fp16.consecutive_hysteresis", ZOE_MEMBER(fp16.consecutive_hysteresis), false));
  t.push_back(number("fp16.min_loss_scale", ZOE_MEMBER(fp16.min_loss_scale), 1.0, kAbove0));
  t.push_back(boolean("fp16.auto_cast", none, false).warn("casting the model's inputs is the caller's"));
  t.push_back(
      boolean("fp16.fp16_master_weights_and_grads", none, false).warn("zoe keeps fp32 master weights"));
  t.push_back(boolean("bf16.enabled", ZOE_MEMBER(bf16), false).alias("bfloat16.enabled"));
  for (const char* b : {"bf16.", "bfloat16."}) {
    t.push_back(any(std::string(b) + "immediate_grad_update").ignore());
    t.push_back(boolean(std::string(b) + "check_grad_overflow", none, false).warn());
  }
}

// The optimizer. adam_w_mode as read is DeepSpeed's flag; the rule makes AdamW always decoupled.
void add_optimizer_fields(std::vector<Field>& t) {
  const std::monostate none;
  const Range fraction_open = {0.0, 1.0, false, true};
  Field type = choice("optimizer.type", ZOE_MEMBER(optimizer.type), "AdamW",
                      {"Adam", "AdamW", "Lion", "Adagrad", "Muon", "AdamMini"}, true);
  type.string_type_message = true;
  // DeepSpeed's other types, refused by name with what zoe offers instead (matched without regard
  // to case, as DeepSpeed matches them).
  const std::string instead =
      "zoe runs optimizer.type \"AdamW\" (or \"Adam\"), \"Lion\", \"Adagrad\", \"Muon\" and \"AdamMini\", "
      "with "
      "zoe.optimizer_states \"int8\" or \"int4\" (AdamW) or \"bf16\" for fewer optimizer bytes";
  for (const char* t8 : {"Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb"})
    type.refused_values.emplace_back(
        t8, std::string(t8) + " (a LAMB or 1-bit communication optimizer) is not in zoe; " + instead);
  for (const char* t8 : {"MuAdam", "MuAdamW", "MuSGD"})
    type.refused_values.emplace_back(t8, std::string(t8) + " (muP's optimizers) is not in zoe; " + instead);
  t.push_back(std::move(type));
  // Lion takes lr, betas and weight_decay; Adagrad lr, eps and weight_decay (DeepSpeed's names, the
  // rules refuse the others and give Adagrad its defaults): each is written for the types it has.
  t.push_back(number("optimizer.params.lr", ZOE_MEMBER(optimizer.lr), 1e-3, kAtLeast0));
  t.push_back(pair(
                  "optimizer.params.betas",
                  +[](Config& c) {
                    return DoublePair{c.optimizer.beta1, c.optimizer.beta2};
                  },
                  0.9, 0.999, fraction_open, "[beta1, beta2], e.g. [0.9, 0.999]")
                  .written_if(has_betas));
  t.push_back(number("optimizer.params.eps", ZOE_MEMBER(optimizer.eps), 1e-8, kAbove0).written_if(has_eps));
  t.push_back(number("optimizer.params.weight_decay", ZOE_MEMBER(optimizer.weight_decay), 0.0, kAtLeast0));
  t.push_back(
      boolean("optimizer.params.adam_w_mode", ZOE_MEMBER(optimizer.adam_w_mode), true).written_if(is_adam));
  // Muon's (DeepSpeed's names; the rules give their defaults and refuse them with other types).
  t.push_back(
      number("optimizer.params.muon_lr", ZOE_MEMBER(optimizer.muon_lr), 0.02, kAtLeast0).written_if(is_muon));
  t.push_back(
      number("optimizer.params.adam_lr", ZOE_MEMBER(optimizer.adam_lr), 3e-4, kAtLeast0).written_if(is_muon));
  t.push_back(number("optimizer.params.momentum", ZOE_MEMBER(optimizer.momentum), 0.95, fraction_open)
                  .written_if(is_muon));
  // Adam-mini's (the adam-mini package's names; refused with other types by the rules).
  t.push_back(integer("optimizer.params.dim", ZOE_MEMBER(optimizer.dim), 2048, 1).written_if(is_adam_mini));
  t.push_back(
      integer("optimizer.params.n_heads", ZOE_MEMBER(optimizer.n_heads), 32, 1).written_if(is_adam_mini));
  t.push_back(integer("optimizer.params.n_kv_heads", ZOE_MEMBER(optimizer.n_kv_heads), 0, 0)
                  .written_if(is_adam_mini));
  t.push_back(boolean("optimizer.params.amsgrad", none, false).refuse("AMSGrad is not implemented"));
  t.push_back(
      boolean("optimizer.params.bias_correction", none, true).refuse("zoe's Adam always corrects the bias"));
  t.push_back(boolean("optimizer.params.maximize", none, false).refuse("zoe's Adam minimises"));
  // DeepSpeed rejects it too.
  t.push_back(
      any("optimizer.params.max_grad_norm").refuse("use the top-level gradient_clipping, as DeepSpeed asks"));
  for (const char* k : {"torch_adam", "fused", "foreach", "capturable", "differentiable"}) {
    t.push_back(any(std::string("optimizer.params.") + k).ignore());
  }
}

// The LR schedule (lr_schedule.h); written only when there is one.
void add_scheduler_fields(std::vector<Field>& t) {
  const std::monostate none;
  const std::string sp = "scheduler.params.";
  t.push_back(choice("scheduler.type", ZOE_MEMBER(scheduler.type), "", {"WarmupLR", "WarmupDecayLR"})
                  .written_if(has_scheduler));
  t.push_back(number(sp + "warmup_min_lr", ZOE_MEMBER(scheduler.warmup_min_lr), 0.0, kAtLeast0)
                  .written_if(has_scheduler));
  t.push_back(number(sp + "warmup_max_lr", ZOE_MEMBER(scheduler.warmup_max_lr), 0.001, kAtLeast0)
                  .written_if(has_scheduler));
  t.push_back(integer(sp + "warmup_num_steps", ZOE_MEMBER(scheduler.warmup_num_steps), 1000, 0)
                  .written_if(has_scheduler));
  t.push_back(choice(sp + "warmup_type", ZOE_MEMBER(scheduler.warmup_type), "log", {"log", "linear"})
                  .written_if(has_scheduler));
  t.push_back(integer(sp + "total_num_steps", ZOE_MEMBER(scheduler.total_num_steps), 0, 1)
                  .written_if(has_total_steps));
  t.push_back(
      integer(sp + "last_batch_iteration", none, -1, -1).warn("resume position comes from the checkpoint"));
}

bool has_activation_checkpointing(const Config& c) { return c.activation_checkpointing.given; }

// The activation store (zoe/activations.h). The budgets' defaults (0) are sized by the engine.
void add_zoe_activation_fields(std::vector<Field>& t) {
  t.push_back(
      choice("zoe.activation_offload", ZOE_MEMBER(zoe.activation_offload), "none", {"none", "cpu", "nvme"}));
  t.push_back(bytes("zoe.activation_host_budget", ZOE_MEMBER(zoe.activation_host_budget_bytes)));
  t.push_back(bytes("zoe.activation_device_budget", ZOE_MEMBER(zoe.activation_device_budget_bytes)));
  t.push_back(integer("zoe.activation_prefetch", ZOE_MEMBER(zoe.activation_prefetch), 2, 0, 64));
  Field min_bytes = bytes("zoe.activation_min_bytes", ZOE_MEMBER(zoe.activation_min_bytes));
  min_bytes.default_value = 262144;
  t.push_back(std::move(min_bytes));
  t.push_back(paths("zoe.activation_nvme_path", ZOE_MEMBER(zoe.activation_nvme_path)));
}

// DeepSpeed's activation_checkpointing section (written back only when it was given). The caller
// checkpoints; cpu_checkpointing sets zoe.activation_offload (a rule).
void add_activation_checkpointing_fields(std::vector<Field>& t) {
  const std::string a = "activation_checkpointing.";
  t.push_back(
      boolean(a + "partition_activations", ZOE_MEMBER(activation_checkpointing.partition_activations), false)
          .warn("zoe has no model parallelism to partition activations over")
          .written_if(has_activation_checkpointing));
  t.push_back(boolean(a + "cpu_checkpointing", ZOE_MEMBER(activation_checkpointing.cpu_checkpointing), false)
                  .written_if(has_activation_checkpointing));
  t.push_back(boolean(a + "contiguous_memory_optimization",
                      ZOE_MEMBER(activation_checkpointing.contiguous_memory_optimization), false)
                  .warn("the activation store keeps each device-tier checkpoint in its own device allocation")
                  .written_if(has_activation_checkpointing));
  t.push_back(integer(a + "number_checkpoints", ZOE_MEMBER(activation_checkpointing.number_checkpoints), 0, 0,
                      kMaxInt32)
                  .null_default()
                  .written_if(has_activation_checkpointing));
  t.push_back(boolean(a + "synchronize_checkpoint_boundary",
                      ZOE_MEMBER(activation_checkpointing.synchronize_checkpoint_boundary), false)
                  .written_if(has_activation_checkpointing));
  t.push_back(boolean(a + "profile", ZOE_MEMBER(activation_checkpointing.profile), false)
                  .warn("zoe reports the activation store's bytes and stall in StepStats, not per checkpoint")
                  .written_if(has_activation_checkpointing));
}

// zoe's own keys. host_budget is enforced by the placement planner (src/zero/placement.cpp).
void add_zoe_fields(std::vector<Field>& t) {
  t.push_back(bytes("zoe.device_budget", ZOE_MEMBER(zoe.device_budget_bytes)));
  t.push_back(bytes("zoe.host_budget", ZOE_MEMBER(zoe.host_budget_bytes)));
  t.push_back(number("zoe.offload_ratio", ZOE_MEMBER(zoe.offload_ratio), 1.0, Range{0.0, 1.0}));
  // The older spelling of zoe.optimizer_states "bf16" (the rules): read, never written.
  t.push_back(boolean("zoe.bf16_optimizer_states", ZOE_MEMBER(zoe.bf16_optimizer_states), false)
                  .written_if([](const Config&) { return false; }));
  t.push_back(choice("zoe.optimizer_states", ZOE_MEMBER(zoe.optimizer_states), "fp32",
                     {"fp32", "bf16", "int8", "int4"}, false)
                  .refuse_value("fp16", "fp16 m and v lose Adam's small second moments (use bf16 or int8)"));
  t.push_back(choice("zoe.master_weights", ZOE_MEMBER(zoe.master_weights), "fp32", {"fp32", "bf16"}, false)
                  .refuse_value("fp16",
                                "an fp16 master cannot hold both the weights and their small updates (its "
                                "exponent has 5 bits; bf16's has 8)"));
  t.push_back(
      choice("zoe.schedule", ZOE_MEMBER(zoe.schedule), "micro-batch", {"micro-batch", "layer-major"}, false));
  t.push_back(choice("zoe.device", ZOE_MEMBER(zoe.device), "auto", {"auto", "cpu", "cuda"}));
  t.push_back(integer("zoe.optimizer_threads", ZOE_MEMBER(zoe.optimizer_threads), 0, 0, kMaxThreads));
  t.push_back(boolean("zoe.overlap_step", ZOE_MEMBER(zoe.overlap_step), true));
  t.push_back(boolean("zoe.speculative_step", ZOE_MEMBER(zoe.speculative_step), false));
  t.push_back(boolean("zoe.swap_checksum", ZOE_MEMBER(zoe.swap_checksum), false));
  t.push_back(boolean("zoe.swap_hole_check", ZOE_MEMBER(zoe.swap_hole_check), true));
  t.push_back(number("zoe.comm_timeout_s", ZOE_MEMBER(zoe.comm_timeout_s), 30.0, Range{0.0, 86400.0}));
  // Reported against (zoe train's drive_endurance_used), never enforced; 0: unknown.
  t.push_back(number("zoe.drive_tbw", ZOE_MEMBER(zoe.drive_tbw), 0.0, Range{0.0, 1e9}));
  add_zoe_activation_fields(t);
}

// DeepSpeed keys without effect on what zoe computes.
void add_ignored_fields(std::vector<Field>& t) {
  const std::monostate none;
  for (const char* k : {"steps_per_print", "wall_clock_breakdown", "dump_state", "memory_breakdown",
                        "flops_profiler", "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger",
                        "timers", "autotuning", "checkpoint", "nebula", "pipeline", "dataloader_drop_last",
                        "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer"}) {
    t.push_back(any(k).ignore());
  }
  t.push_back(boolean("prescale_gradients", none, false).warn());
  t.push_back(boolean("sparse_gradients", none, false).warn());
  t.push_back(number("gradient_predivide_factor", none, 1.0, kAbove0).warn());
  t.push_back(any("communication_data_type").warn("zoe reduces in the gradients' dtype"));
  t.push_back(any("data_types.grad_accum_dtype").warn());
  t.push_back(feature_block("amp").refuse("Apex AMP; use fp16 or bf16"));
  t.push_back(feature_block("elasticity").refuse("elastic batch sizes would change the batch"));
  for (const char* k : {"curriculum_learning", "progressive_layer_drop", "data_efficiency", "eigenvalue",
                        "quantize_training", "hybrid_engine"}) {
    t.push_back(feature_block(k).refuse("it would change what is trained"));
  }
}

// The table, section by section in the order of the DeepSpeed config's documentation.
std::vector<Field> build_table() {
  std::vector<Field> t;
  add_batch_fields(t);
  add_zero_fields(t);
  add_offload_optimizer_fields(t);
  add_offload_param_fields(t);
  add_zero_legacy_fields(t);
  add_aio_fields(t);
  add_precision_fields(t);
  add_optimizer_fields(t);
  add_scheduler_fields(t);
  add_zoe_fields(t);
  add_activation_checkpointing_fields(t);
  add_ignored_fields(t);
  return t;
}

}  // namespace

const std::vector<Field>& config_fields() {
  static const std::vector<Field> table = build_table();
  return table;
}

const Field* find_field(const std::string& path) {
  for (const Field& f : config_fields()) {
    if (f.path == path) return &f;
  }
  return nullptr;
}

}  // namespace zoe::config::detail
